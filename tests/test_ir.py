import math

import jax
import jax.numpy as jnp
import pytest
from jax import lax
from jax.sharding import AbstractMesh, NamedSharding
from jax.sharding import PartitionSpec as P
from tiny import WORKLOAD

import aoizora_lab as az
from aoizora_lab import ir
from aoizora_lab.candidates import Candidate
from aoizora_lab.ir import count_function
from aoizora_lab.ir_estimate import estimate_ir
from aoizora_lab.models.wan import param_count


def _sds(shape):
    return jax.ShapeDtypeStruct(shape, jnp.float32)


def test_tensor_parallel_mlp_counts_flops_and_the_row_parallel_all_reduce():
    # A plain two-layer MLP, not Wan: data parallel over "dp", Megatron over "tp".
    mesh = AbstractMesh((2, 4), ("dp", "tp"))
    batch, width, hidden = 16, 32, 64

    def mlp(x, w1, w2):
        h = jax.nn.relu(x @ w1)
        h = lax.with_sharding_constraint(h, NamedSharding(mesh, P("dp", "tp")))
        return h @ w2

    counts = count_function(mlp, [_sds((batch, width)), _sds((width, hidden)),
                                  _sds((hidden, width))],
                            [P("dp", None), P(None, "tp"), P("tp", None)], {"dp": 2, "tp": 4})
    assert counts.flops == pytest.approx(2 * (2 * batch * width * hidden) / 8)
    assert [(c.kind, c.axes) for c in counts.collectives] == [("all-reduce", ("tp",))]
    assert counts.collectives[0].bytes == batch // 2 * width * 4  # output rows of one dp shard
    assert counts.param_bytes == (batch * width / 2 + 2 * width * hidden / 4) * 4


def test_resharding_implies_all_gather_and_all_to_all():
    mesh = AbstractMesh((4,), ("x",))

    def moves(a):
        b = lax.with_sharding_constraint(a, NamedSharding(mesh, P(None, "x")))  # all-to-all
        return lax.with_sharding_constraint(b * 2, NamedSharding(mesh, P()))  # all-gather

    counts = count_function(moves, [_sds((8, 16))], [P("x", None)], {"x": 4})
    kinds = [(c.kind, c.axes, c.bytes) for c in counts.collectives]
    assert kinds == [("all-to-all", ("x",), 8 * 16 * 4 / 4), ("all-gather", ("x",), 8 * 16 * 4)]


def test_loops_multiply_and_shard_map_collectives_are_read():
    mesh = AbstractMesh((4,), ("x",))

    def body(carry, _):
        local = jax.shard_map(lambda a: lax.psum(a @ a.T, "x"), mesh=mesh, in_specs=P("x"),
                              out_specs=P(), check_vma=False)(carry)
        return carry + local.sum(), None

    def looped(a):
        return lax.scan(body, a, None, length=5)[0]

    counts = count_function(looped, [_sds((8, 8))], [P("x", None)], {"x": 4})
    psums = [c for c in counts.collectives if c.source == "explicit"]
    assert [(c.kind, c.axes, c.count) for c in psums] == [("all-reduce", ("x",), 5)]
    assert psums[0].bytes == 2 * 2 * 4  # the local [2, 2] product on each device
    assert counts.flops == pytest.approx(5 * 2 * 2 * 2 * 8)  # per device, five times


@pytest.fixture(scope="module")
def wan14():
    return az.Workload.preset("wan2.1-t2v-14b", "720p"), az.Topology.from_name("v5e:4x4")


def test_wan_flops_per_device_add_up_to_the_published_total(wan14):
    workload, topology = wan14
    result = estimate_ir(Candidate.from_name("cfg2-uly8-fsdp"), workload, topology)
    # About 6.5e15 FLOPs per 14B@720p forward (matmuls + attention from the official config's
    # shapes); a CFG step runs two.
    assert result.flops * 16 == pytest.approx(2 * 6.5e15, rel=0.1)
    assert result.notes == ()  # splash attention FLOPs were counted from its shapes
    # FSDP gathers every block weight once per step over all 16 devices: ~28.6 GB in bf16.
    gathers = result.comm_bytes_by_axes[("cfg", "ulysses")]
    assert gathers == pytest.approx(2 * param_count(workload.config()), rel=0.05)
    assert 0 < result.lower_bound_seconds < result.estimate_seconds


def test_strategies_differ_where_they_should(wan14):
    workload, topology = wan14
    uly = estimate_ir(Candidate.from_name("cfg2-uly8-fsdp"), workload, topology)
    ring = estimate_ir(Candidate.from_name("cfg2-ring8-fsdp"), workload, topology)
    tp = estimate_ir(Candidate.from_name("cfg2-tp8"), workload, topology)
    # Ulysses moves q, k, v and the output once; ring moves K and V seven times.
    assert ring.comm_bytes_by_axes[("ring",)] > 2 * uly.comm_bytes_by_axes[("ulysses",)]
    permutes = sum(c.bytes * c.count for c in ring.collectives
                   if c.kind == "collective-permute" and c.axes == ("ring",))
    assert permutes > 0.95 * ring.comm_bytes_by_axes[("ring",)]
    # TP splits the block weights 8 ways (embeddings stay whole) where FSDP splits all 16 ways,
    # and all-reduces activations instead of gathering weights.
    assert 2 * uly.param_bytes < tp.param_bytes < 2.3 * uly.param_bytes
    assert any(c.kind == "all-reduce" and c.source == "partial-sum" for c in tp.collectives)
    assert tp.comm_bytes > uly.comm_bytes


def test_flags_that_make_all_to_all_asynchronous_let_the_estimate_hide_it(wan14):
    from aoizora_lab.compile import FLAG_SETS
    from aoizora_lab.ir_estimate import ASYNC_KINDS

    workload, topology = wan14
    candidate = Candidate.from_name("cfg2-uly8-fsdp")
    ulysses = FLAG_SETS["maxdiffusion-ulysses"].async_kinds
    assert ulysses == {"all-to-all"} and FLAG_SETS["maxdiffusion-wan"].async_kinds == set()
    plain = estimate_ir(candidate, workload, topology, cache_dir=False)
    searched = estimate_ir(candidate, workload, topology, cache_dir=False,
                           flag_async=(frozenset(), ulysses))
    assert plain.async_kinds == ASYNC_KINDS and "all-to-all" in searched.async_kinds
    # Synchronous, the all-to-alls add to the compute; asynchronous, they hide under it: all
    # that stays exposed is the small synchronous rest (the guidance all-reduce).
    assert any(c.kind == "all-to-all" for c in plain.collectives)
    exposed = plain.estimate_seconds - plain.compute_estimate_seconds
    assert plain.compute_estimate_seconds <= searched.estimate_seconds
    assert plain.estimate_seconds - searched.estimate_seconds > 0.9 * exposed > 0
    assert searched.lower_bound_seconds < plain.lower_bound_seconds
    assert searched.lower_bound_seconds <= searched.estimate_seconds
    # Each flag set's own estimate is kept: a setup compiled with libtpu's defaults reads
    # the synchronous one, the Ulysses set's the lowest.
    assert searched.estimate_under(frozenset()) == pytest.approx(plain.estimate_seconds)
    assert searched.estimate_under(ulysses) == searched.estimate_seconds
    # A candidate without all-to-alls estimates the same whichever flags, at libtpu's kinds.
    tp = Candidate.from_name("cfg2-tp8")
    alone, both, reversed_ = (
        estimate_ir(tp, workload, topology, cache_dir=False, flag_async=f)
        for f in ((frozenset(),), (frozenset(), ulysses), (ulysses, frozenset())))
    assert not any(c.kind == "all-to-all" for c in alone.collectives)
    for e in (both, reversed_):  # whichever order the flag sets come in
        assert (e.estimate_seconds, e.lower_bound_seconds, e.async_kinds) == (
            alone.estimate_seconds, alone.lower_bound_seconds, ASYNC_KINDS)
    for bad in (({"all-to-all"},), (frozenset({"all-to-al"}),), ()):
        with pytest.raises(az.AoizoraError, match="flag_async"):
            estimate_ir(candidate, workload, topology, flag_async=bad)


@pytest.mark.parametrize(("old", "new", "spec", "expected"), [
    ((4, 6), (24,), (("x",), ()), (("x",),)),  # merge keeps the major dim's axes
    ((1, 8), (8,), ((), ("x",)), (("x",),)),  # a unit dim does not hide the real one
    ((8,), (1, 2, 4), (("x",),), ((), ("x",), ())),  # split: the major non-unit part
    ((2, 3, 4), (2, 12), ((), ("y",), ()), ((), ("y",))),
])
def test_reshape_carries_axes_to_the_major_dim(old, new, spec, expected):
    assert ir._reshape_spec(old, new, spec) == expected


def test_the_module_docstring_example_holds():
    mesh = AbstractMesh((2, 4), ("dp", "tp"))

    def project(x, w):
        return lax.with_sharding_constraint(x @ w, NamedSharding(mesh, P("dp", None)))

    counts = count_function(project, [_sds((16, 32)), _sds((32, 64))],
                            [P("dp", None), P(None, "tp")], {"dp": 2, "tp": 4})
    assert (counts.flops, counts.hbm_bytes, counts.param_bytes) == (8192, 3584, 3072)
    assert counts.largest_activation_bytes == 2048
    assert counts.collectives == [ir.IRCollective("all-gather", ("tp",), 2048, 1, "reshard")]


def test_a_registered_rule_reads_its_primitive(monkeypatch):
    def sine(reader, eqn, specs, *, multiplier, local):  # 10 FLOPs per element, say
        elements = math.prod(eqn.outvars[0].aval.shape) / reader.shards(specs[0])
        reader.counts.flops += multiplier * 10 * elements
        return specs

    def looped(a):
        return lax.scan(lambda c, _: (jnp.sin(c), None), a, None, length=3)[0]

    args, specs, sizes = [_sds((8, 16))], [P("x", None)], {"x": 4}
    assert count_function(looped, args, specs, sizes).flops == 0  # the default: no FLOPs
    monkeypatch.setitem(ir.RULES, "sin", sine)
    counts = count_function(looped, args, specs, sizes)
    assert counts.flops == 3 * 10 * 8 * 16 / 4


def test_primitives_outside_the_rule_table_go_to_the_default(monkeypatch):
    workload = WORKLOAD
    candidate, topology = Candidate.from_name("cfg2-ring4-fsdp"), az.Topology.simulated((2, 4))
    plain = estimate_ir(candidate, workload, topology, cache_dir=False)
    seen, defaulted = set(), set()
    equation, default_rule = ir.Reader.equation, ir.default_rule

    def recording_equation(reader, eqn, specs, **kwargs):
        seen.add(eqn.primitive.name)
        return equation(reader, eqn, specs, **kwargs)

    def recording_default(reader, eqn, specs, **kwargs):
        defaulted.add(eqn.primitive.name)
        return default_rule(reader, eqn, specs, **kwargs)

    monkeypatch.setattr(ir.Reader, "equation", recording_equation)
    monkeypatch.setattr(ir, "default_rule", recording_default)
    recorded = estimate_ir(candidate, workload, topology, cache_dir=False)
    assert defaulted == seen - set(ir.RULES)
    assert {"dot_general", "pallas_call", "scan", "ppermute"} <= seen - defaulted
    assert {"exp", "mul", "reduce_sum"} <= defaulted  # elementwise ops and a reduction
    assert recorded.collectives == plain.collectives and recorded.flops == plain.flops


def test_traces_are_cached_per_candidate_and_a_damaged_entry_is_retraced(tmp_path):
    workload = az.Workload.preset("wan2.1-t2v-1.3b", "480p")
    topology = az.Topology.simulated((2, 4))
    candidate = Candidate.from_name("cfg2-uly4")
    fresh = estimate_ir(candidate, workload, topology, cache_dir=False)
    first = estimate_ir(candidate, workload, topology, cache_dir=tmp_path)
    [entry] = tmp_path.glob("*.json")
    again = estimate_ir(candidate, workload, topology, cache_dir=tmp_path)
    for result in (first, again):
        assert result.collectives == fresh.collectives
        assert result.estimate_seconds == fresh.estimate_seconds
    # The bounds are derived for the slice asked for, not read from the cache.
    faster = az.Topology.simulated((2, 4), generation="v6e")
    on_faster = estimate_ir(candidate, workload, faster, cache_dir=tmp_path)
    assert on_faster.lower_bound_seconds < fresh.lower_bound_seconds
    for bound in ("lower_bound_seconds", "estimate_seconds"):
        assert getattr(on_faster, bound) == getattr(
            estimate_ir(candidate, workload, faster, cache_dir=False), bound)
    assert len(list(tmp_path.glob("*.json"))) == 1
    entry.write_text(entry.read_text()[:40])  # truncated
    repaired = estimate_ir(candidate, workload, topology, cache_dir=tmp_path)
    assert repaired.collectives == fresh.collectives
    assert entry.read_text().endswith("}")
    other = estimate_ir(Candidate.from_name("cfg2-ring4"), workload, topology,
                        cache_dir=tmp_path)
    assert other.collectives != fresh.collectives
    assert len(list(tmp_path.glob("*.json"))) == 2


def test_an_ir_cache_that_cannot_be_written_costs_a_retrace_not_the_estimate(tmp_path,
                                                                            monkeypatch):
    workload = az.Workload.preset("wan2.1-t2v-1.3b", "480p")
    candidate, topology = Candidate.from_name("cfg2-uly4"), az.Topology.simulated((2, 4))
    fresh = estimate_ir(candidate, workload, topology, cache_dir=False)

    def disk_full(*_, **__):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr("os.replace", disk_full)
    estimate = estimate_ir(candidate, workload, topology, cache_dir=tmp_path / "ir")
    assert estimate.collectives == fresh.collectives
    assert list((tmp_path / "ir").iterdir()) == []  # no entry, no temporary file left


def test_the_default_caches_follow_the_cache_root(tmp_path, monkeypatch):
    import jax

    from aoizora_lab.versions import cache_root

    monkeypatch.setenv("AOIZORA_LAB_CACHE_DIR", str(tmp_path))
    assert cache_root() == tmp_path
    workload = WORKLOAD
    host = az.Topology.simulated((2, 4), devices=jax.devices()[:8])
    estimate_ir(Candidate.from_name("cfg2-uly4", attention="blockwise"), workload, host)
    assert len(list((tmp_path / "ir").glob("*.json"))) == 1
    monkeypatch.delenv("AOIZORA_LAB_CACHE_DIR")
    assert cache_root().name == "aoizora-lab"  # the user's cache folder
    assert az.__file__.rpartition("/")[0] not in str(cache_root())  # never the package's
