# ruff: noqa: E501 (HLO lines are long)
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

import aoizora_lab as az
from aoizora_lab.cost import compute_seconds
from aoizora_lab.flops import attention_flops
from aoizora_lab.hlo import parse_hlo

# Shaped like the TPU compiler's output (layouts, async pairs, fusions, a scan's while loop).
HLO = """
HloModule jit_step, num_partitions=8

%add (x: f32[], y: f32[]) -> f32[] {
  %x = f32[] parameter(0)
  %y = f32[] parameter(1)
  ROOT %sum = f32[] add(f32[] %x, f32[] %y)
}

%cond_fused (p: s32[]) -> pred[] {
  %p = s32[] parameter(0)
  %constant.7 = s32[] constant(40)
  ROOT %lt = pred[] compare(s32[] %p, s32[] %constant.7), direction=LT
}

%cond (state: (s32[], bf16[4,8])) -> pred[] {
  %state = (s32[], bf16[4,8]) parameter(0)
  %i = s32[] get-tuple-element((s32[], bf16[4,8]) %state), index=0
  ROOT %fusion.c = pred[] fusion(s32[] %i), kind=kLoop, calls=%cond_fused
}

%async_ag (param_0: bf16[1,1536]) -> bf16[8,1536] {
  %param_0 = bf16[1,1536]{1,0:T(2,128)(2,1)} parameter(0)
  ROOT %all-gather.3 = bf16[8,1536]{1,0:T(8,128)(2,1)} all-gather(%param_0), channel_id=3, replica_groups=mesh['axis_0'=2,'axis_1'=4] {'axis_0','axis_1'}, dimensions={0}
}

%body (state: (s32[], bf16[4,8])) -> (s32[], bf16[4,8]) {
  %state = (s32[], bf16[4,8]) parameter(0)
  %v = bf16[4,8]{1,0:T(4,128)(2,1)S(1)} get-tuple-element((s32[], bf16[4,8]) %state), index=1
  %all-to-all.1 = bf16[4,8]{1,0:T(4,128)(2,1)} all-to-all(%v), channel_id=1, replica_groups=[4,2]<=[2,4]T(1,0), dimensions={0}
  %collective-permute-start = (bf16[4,8]{1,0}, bf16[4,8]{1,0}, u32[]{:S(2)}, u32[]{:S(2)}) collective-permute-start(%all-to-all.1), channel_id=2, source_target_pairs={{0,1},{1,0},{2,3},{3,2}}
  %collective-permute-done = bf16[4,8]{1,0} collective-permute-done(%collective-permute-start)
  %w = bf16[1,1536]{1,0} constant({...})
  %fusion.ag = bf16[8,1536]{1,0} fusion(%w), kind=kCustom, calls=%async_ag
  %i = s32[] get-tuple-element((s32[], bf16[4,8]) %state), index=0
  ROOT %out = (s32[], bf16[4,8]) tuple(%i, %collective-permute-done)
}

ENTRY %main (a: f32[16], b: bf16[4,8]) -> f32[16] {
  %a = f32[16]{0} parameter(0)
  %b = bf16[4,8]{1,0} parameter(1)
  %all-reduce.1 = (f32[16]{0}, f32[16]{0}) all-reduce(%a, %a), channel_id=4, replica_groups={{0,1,2,3},{4,5,6,7}}, to_apply=%add
  %all-gather-start = (f32[2]{0}, f32[16]{0}) all-gather-start(%a), channel_id=5, replica_groups={}, dimensions={0}
  %all-gather-done = f32[16]{0} all-gather-done(%all-gather-start)
  %zero = s32[] constant(0)
  %init = (s32[], bf16[4,8]) tuple(%zero, %b)
  %while.1 = (s32[], bf16[4,8]) while(%init), condition=%cond, body=%body
  ROOT %r = f32[16]{0} get-tuple-element((f32[16]{0}, f32[16]{0}) %all-reduce.1), index=0
}
"""


def test_every_syntax_kind_and_count_is_read():
    program = parse_hlo(HLO)
    by_name = {c.name: c for c in program.collectives}
    assert set(by_name) == {"all-reduce.1", "all-gather-start", "all-to-all.1",
                            "collective-permute-start", "all-gather.3"}
    assert program.num_devices == 8 and program.notes == ()
    ar = by_name["all-reduce.1"]
    assert (ar.kind, ar.groups, ar.bytes, ar.count) == (
        "all-reduce", ((0, 1, 2, 3), (4, 5, 6, 7)), 2 * 16 * 4, 1)
    ag = by_name["all-gather-start"]  # async: the tuple's second element is the result
    assert (ag.groups, ag.bytes) == ((tuple(range(8)),), 16 * 4)
    a2a = by_name["all-to-all.1"]  # iota [4,2]<=[2,4]T(1,0): arange(8).reshape(2,4).T
    assert a2a.groups == ((0, 4), (1, 5), (2, 6), (3, 7)) and a2a.count == 40
    cp = by_name["collective-permute-start"]
    assert cp.groups == ((0, 1), (1, 0), (2, 3), (3, 2)) and cp.bytes == 4 * 8 * 2
    fused = by_name["all-gather.3"]  # inside an async collective fusion in the loop body
    assert fused.groups == (tuple(range(8)),) and fused.count == 40
    assert fused.bytes == 8 * 1536 * 2
    assert program.total_bytes == sum(c.bytes * c.count for c in program.collectives)


@pytest.mark.parametrize(("device_ids", "ids"), [
    ("7,6,5,4,3,2,1,0", np.arange(8)[::-1]),
    ("[2,4]T(1,0)", np.arange(8).reshape(2, 4).T.ravel()),  # the form the compiler prints
])
def test_mesh_groups_honour_device_ids_and_axis_choice(device_ids, ids):
    text = HLO.replace("replica_groups=mesh['axis_0'=2,'axis_1'=4] {'axis_0','axis_1'}",
                       f"replica_groups=mesh['axis_0'=2,'axis_1'=4], device_ids=({device_ids}) "
                       "{'axis_0'}")
    fused = {c.name: c for c in parse_hlo(text).collectives}["all-gather.3"]
    grid = ids.reshape(2, 4)
    assert fused.groups == tuple(tuple(int(v) for v in grid[:, j]) for j in range(4))


def test_an_unknown_group_syntax_is_an_error_not_a_guess():
    text = HLO.replace("replica_groups=[4,2]<=[2,4]T(1,0)", "replica_groups=<weird>")
    with pytest.raises(az.AoizoraError, match=r"all-to-all\.1.*<weird>"):
        parse_hlo(text)


def test_a_loop_without_a_trip_count_is_noted():
    text = HLO.replace("%constant.7 = s32[] constant(40)", "%constant.7 = s32[] parameter(1)")
    program = parse_hlo(text)
    assert any("trip count not found" in note for note in program.notes)
    assert {c.name: c.count for c in program.collectives}["all-to-all.1"] == 1


def test_no_entry_is_a_clear_error():
    with pytest.raises(az.AoizoraError, match="ENTRY"):
        parse_hlo("HloModule empty")


def test_a_real_compiled_program_on_host_devices():
    mesh = Mesh(np.array(jax.devices()[:8]).reshape(2, 4), ("a", "b"))

    def layer(x, w):
        def body(h, w_layer):
            w_full = jax.lax.with_sharding_constraint(w_layer, NamedSharding(mesh, P()))
            return jnp.tanh(h @ w_full), None
        return jax.lax.scan(body, x, w)[0]

    x = jax.ShapeDtypeStruct((16, 64), jnp.float32, sharding=NamedSharding(mesh, P("a")))
    w = jax.ShapeDtypeStruct((3, 64, 64), jnp.float32,
                             sharding=NamedSharding(mesh, P(None, "b")))
    compiled = jax.jit(layer).lower(x, w).compile()
    program = parse_hlo(compiled.as_text())
    gathers = [c for c in program.collectives if c.kind == "all-gather"]
    assert gathers, "FSDP-style weight gathers appear"
    assert sum(c.count * c.bytes for c in gathers) >= 3 * 64 * 64 * 4  # every layer's weight
    assert all(len(g) == 4 for c in gathers for g in c.groups)  # over axis "b"


def _known_collectives(mesh):
    """psum, all_gather, psum_scatter, all_to_all and ppermute, inside and outside a scan."""
    from jax import lax

    def per_device(x):
        s = lax.psum(x, "b")  # all-reduce over b, outside the loop
        g = lax.all_gather(x, "a", tiled=True)  # all-gather over a

        def step(carry, _):
            r = lax.psum_scatter(carry, "b", scatter_dimension=0, tiled=True)  # reduce-scatter
            t = lax.all_to_all(carry, "b", 0, 1, tiled=True)
            p = lax.ppermute(carry, "b", [(i, (i + 1) % 4) for i in range(4)])
            return p + t.reshape(p.shape) * 0 + jnp.tile(r, (4, 1)), None

        looped, _ = lax.scan(step, x, None, length=6)
        return s + looped + g[: x.shape[0]]

    return jax.shard_map(per_device, mesh=mesh, in_specs=P(("a", "b")),
                         out_specs=P(("a", "b")), check_vma=False)


@pytest.mark.parametrize("target", ["cpu", "tpu"])
def test_known_collectives_of_a_real_compile(target):
    if target == "tpu":
        topology = az.Topology.from_name("v5e:2x4", deviceless=True)
        devices = np.array(topology.devices)[topology.device_grid().ravel()]
    else:
        devices = np.array(jax.devices()[:8])
    mesh = Mesh(devices.reshape(2, 4), ("a", "b"))
    x = jax.ShapeDtypeStruct((8 * 16, 32), jnp.float32,
                             sharding=NamedSharding(mesh, P(("a", "b"))))
    program = parse_hlo(jax.jit(_known_collectives(mesh)).lower(x).compile().as_text())
    frame = program.to_frame()
    assert program.num_devices == 8
    local = 16 * 32 * 4  # bytes of one device's [16, 32] float32 block
    rows = {kind: frame[frame["kind"] == kind] for kind in az.COLLECTIVE_KINDS}
    # Outside the loop: one all-reduce over b (groups of 4) and one all-gather over a (2).
    outside = frame[frame["loop_depth"] == 0]
    assert set(outside["kind"]) >= {"all-reduce", "all-gather"}
    assert (rows["all-gather"]["group_size"] == 2).any()
    assert (rows["all-gather"]["bytes"] == 2 * local).any()
    # Inside the scan of 6: a permute along b with the whole block, six times.
    permutes = rows["collective-permute"]
    assert (permutes["count"] == 6).all() and (permutes["bytes"] == local).all()
    pairs = {c.groups for c in program.collectives if c.kind == "collective-permute"}
    ring = {tuple((4 * a + i, 4 * a + (i + 1) % 4) for a in range(2) for i in range(4))}
    assert pairs == ring
    # The all-to-all over b runs six times on the whole block.
    assert (rows["all-to-all"]["count"] == 6).all()
    assert (rows["all-to-all"]["group_size"] == 4).all()
    # psum_scatter: a reduce-scatter or an all-reduce the compiler split, inside the loop.
    inside = frame[(frame["loop_depth"] == 1) & frame["kind"].isin(["reduce-scatter",
                                                                     "all-reduce"])]
    assert (inside["count"] == 6).all() and len(inside) >= 1


def test_compute_estimate_counts_matmul_flops():
    a = jax.ShapeDtypeStruct((64, 128), jnp.float32)
    b = jax.ShapeDtypeStruct((128, 256), jnp.float32)
    text = jax.jit(lambda a, b: jnp.tanh(a @ b)).lower(a, b).compile().as_text()
    program = parse_hlo(text, num_devices=1)
    assert program.flops == 2 * 64 * 128 * 256
    chip = az.chip_spec("v5e")
    assert compute_seconds(program, chip) >= program.flops / chip.peak_bf16_flops


def test_an_attention_custom_call_counts_the_flops_the_ir_counts():
    q, k = "bf16[1,4,128,64]{3,2,1,0}", "bf16[1,4,256,64]{3,2,1,0}"
    text = f"""
HloModule jit_attention, num_partitions=1

ENTRY %main (q: bf16[1,4,128,64], k: bf16[1,4,256,64], v: bf16[1,4,256,64]) -> bf16[1,4,128,64] {{
  %q = {q} parameter(0)
  %k = {k} parameter(1)
  %v = {k} parameter(2)
  ROOT %splash_mha = {q} custom-call({q} %q, {k} %k, {k} %v), custom_call_target="tpu_custom_call", operand_layout_constraints={{{q}, {k}, {k}}}
}}
"""
    flops = attention_flops((1, 4, 128, 64), (1, 4, 256, 64))
    # Q K^T and P V: 2 x (4 heads x 128 queries x 256 keys x 64) multiply-adds, 2 FLOPs each.
    assert flops == 4 * 4 * 128 * 256 * 64
    assert parse_hlo(text).flops == flops


def test_nested_loops_multiply_their_trip_counts():
    from jax import lax

    mesh = Mesh(np.array(jax.devices()[:4]), ("x",))

    def per_device(a):
        def outer(c, _):
            def inner(d, _):
                return lax.psum(d, "x") * 0.5, None
            return lax.scan(inner, c, None, length=4)[0], None
        return lax.scan(outer, a, None, length=3)[0]

    fn = jax.shard_map(per_device, mesh=mesh, in_specs=P("x"), out_specs=P("x"),
                       check_vma=False)
    x = jax.ShapeDtypeStruct((16, 8), jnp.float32, sharding=NamedSharding(mesh, P("x")))
    program = parse_hlo(jax.jit(fn).lower(x).compile().as_text())
    [psum] = [c for c in program.collectives if c.kind == "all-reduce"]
    assert psum.count == 12 and psum.bytes == 4 * 8 * 4
    assert program.to_frame()["loop_depth"].tolist() == [2]


def test_a_loop_counting_in_steps_of_two_runs_half_as_often():
    # A windowed einsum's loop: the counter goes 0, 2 while it is below 4: two trips.
    text = """
HloModule windowed, num_partitions=2

%cond (s: (u32[], f32[8])) -> pred[] {
  %s = (u32[], f32[8]) parameter(0)
  %n = u32[] get-tuple-element(%s), index=0
  %four = u32[] constant(4)
  ROOT %lt = pred[] compare(%n, %four), direction=LT
}

%body (s: (u32[], f32[8])) -> (u32[], f32[8]) {
  %s = (u32[], f32[8]) parameter(0)
  %n = u32[] get-tuple-element(%s), index=0
  %one = u32[] constant(1)
  %other = u32[] add(%n, %one)
  %v = f32[8] get-tuple-element(%s), index=1
  %p = f32[8] collective-permute(%v), channel_id=1, source_target_pairs={{0,1},{1,0}}
  %two = u32[] constant(STEP)
  %next = u32[] add(%n, %two)
  ROOT %out = (u32[], f32[8]) tuple(%next, %p)
}

ENTRY %main (a: f32[8]) -> (u32[], f32[8]) {
  %a = f32[8] parameter(0)
  %z = u32[] constant(0)
  %init = (u32[], f32[8]) tuple(%z, %a)
  ROOT %w = (u32[], f32[8]) while(%init), condition=%cond, body=%body
}
"""
    for step, trips in ((1, 4), (2, 2), (3, 2)):
        [permute] = parse_hlo(text.replace("STEP", str(step))).collectives
        assert permute.count == trips


def test_a_loop_reads_one_layer_of_its_stacked_weights_per_trip():
    # A scan over stacked weights: each trip's fusion slices one [64, 64] layer out of the
    # [L, 64, 64] stack, so its reads do not grow with L.
    def text(layers):
        return f"""
HloModule stacked, num_partitions=1

%slice_mul (w: f32[{layers},64,64], i: s32[], x: f32[64,64]) -> f32[64,64] {{
  %w = f32[{layers},64,64] parameter(0)
  %i = s32[] parameter(1)
  %x = f32[64,64] parameter(2)
  %z = s32[] constant(0)
  %layer = f32[1,64,64] dynamic-slice(%w, %i, %z, %z), dynamic_slice_sizes={{1,64,64}}
  %r = f32[64,64] reshape(%layer)
  ROOT %m = f32[64,64] multiply(%r, %x)
}}

ENTRY %main (w: f32[{layers},64,64], i: s32[], x: f32[64,64]) -> f32[64,64] {{
  %w = f32[{layers},64,64] parameter(0)
  %i = s32[] parameter(1)
  %x = f32[64,64] parameter(2)
  ROOT %f = f32[64,64] fusion(%w, %i, %x), kind=kLoop, calls=%slice_mul
}}
"""
    [shallow], [deep] = parse_hlo(text(2)).ops, parse_hlo(text(40)).ops
    layer = 64 * 64 * 4
    assert shallow.hbm_bytes == deep.hbm_bytes == layer + 4 + layer + layer  # w, i, x, out
