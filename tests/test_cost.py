# ruff: noqa: E501 (HLO lines are long)
"""The one cost module: roofline compute, the overlap rule, and predict on programs."""

import numpy as np
import pytest

import aoizora_lab as az
from aoizora_lab.cost import (
    Predicted,
    breakdown,
    compute_seconds,
    hbm_seconds,
    op_seconds,
    predict,
    roofline_seconds,
)
from aoizora_lab.hlo import CommProgram, ComputeOp, parse_hlo
from aoizora_lab.placement import PlacementScorer

CHIP = az.chip_spec("v5e")
TOPOLOGY = az.Topology.simulated((4, 4))


@pytest.mark.parametrize(("compute", "sync", "asyn", "total"), [
    (4.0, 0.5, 1.0, 4.5),   # the gathers hide behind compute
    (4.0, 0.5, 5.0, 5.5),   # 1 s of them is exposed
    (0.0, 0.0, 2.0, 2.0),   # nothing to hide behind
    (3.0, 0.0, 3.0, 3.0),   # exactly hidden
])
def test_the_overlap_rule(compute, sync, asyn, total):
    p = Predicted.overlapped(compute, sync, asyn)
    assert (p.compute_s, p.comm_s, p.total_s) == (compute, sync + asyn, total)


def test_roofline_takes_the_slower_of_flops_and_hbm():
    flops_bound = roofline_seconds(CHIP.peak_bf16_flops, 1.0, CHIP)
    assert flops_bound == pytest.approx(1.0)
    memory_bound = roofline_seconds(1.0, CHIP.hbm_bandwidth * 2, CHIP)  # an elementwise op
    assert memory_bound == pytest.approx(2.0)
    assert roofline_seconds(CHIP.peak_bf16_flops, 0, CHIP, compute_efficiency=0.5) == \
        pytest.approx(2.0)


def _op(flops=0.0, hbm_bytes=0.0, runs=1, op_class="matmul", cycles=0.0):
    return ComputeOp(flops, hbm_bytes, runs, 0, op_class, cycles)


def test_each_op_class_runs_at_its_own_efficiency():
    # A matmul of 1 ms at peak, an attention kernel of 1 ms at peak, a norm that moves 1 ms of
    # HBM traffic (run 3 times): each slowed by its class's efficiency.
    ops = (_op(CHIP.peak_bf16_flops * 1e-3), _op(CHIP.peak_bf16_flops * 1e-3,
                                                 op_class="attention"),
           _op(10.0, CHIP.hbm_bandwidth * 1e-3, runs=3, op_class="memory"))
    program = CommProgram((), 16, ops=ops)
    expected = (1e-3 / CHIP.matmul_efficiency + 1e-3 / CHIP.attention_efficiency
                + 3 * 1e-3 / CHIP.hbm_efficiency)
    assert compute_seconds(program, CHIP, "roofline") == pytest.approx(expected)


def test_the_compiler_model_reads_the_compilers_cycles_where_it_gave_them():
    with_cycles = _op(CHIP.peak_bf16_flops * 1e-3, cycles=3e6)
    without = _op(CHIP.peak_bf16_flops * 1e-3, op_class="attention")
    assert op_seconds(with_cycles, CHIP, "compiler") == pytest.approx(3e6 / CHIP.clock_hz)
    assert op_seconds(with_cycles, CHIP, "roofline") == pytest.approx(
        1e-3 / CHIP.matmul_efficiency)
    assert op_seconds(without, CHIP, "compiler") == op_seconds(without, CHIP, "roofline")
    unknown_clock = CHIP.replace(clock_hz=None)
    assert op_seconds(with_cycles, unknown_clock) == op_seconds(with_cycles, CHIP, "roofline")
    with pytest.raises(az.AoizoraError, match="'fast'"):
        op_seconds(with_cycles, CHIP, "fast")


def test_a_collective_is_never_faster_than_its_own_hbm_traffic():
    neighbours = az.Collective("all-gather", [[0, 1]], bytes=64e6)
    assert hbm_seconds(neighbours, CHIP) == pytest.approx(
        (32e6 + 64e6) / (CHIP.hbm_bandwidth * CHIP.hbm_efficiency))
    program = CommProgram((neighbours,), 16)
    fast_links = CHIP.replace(ici_link_bandwidth=1e15)
    assert predict(program, TOPOLOGY, None, chip=fast_links).total_s == pytest.approx(
        hbm_seconds(neighbours, fast_links))


# ------------------------------------------------------------------ schedules built by hand

GROUPS = "{{0,1,2,3},{4,5,6,7},{8,9,10,11},{12,13,14,15}}"
GATHER = az.Collective("all-gather", [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9, 10, 11],
                                      [12, 13, 14, 15]], bytes=2 * 1024 * 1024)


def _module(body: str) -> str:
    """A scheduled module on 16 devices: ``body`` is the entry's schedule after parameters."""
    return f"""
HloModule sched, is_scheduled=true, num_partitions=16

%fused_dot (p0: bf16[1024,1024], p1: bf16[1024,1024]) -> bf16[1024,1024] {{
  %p0 = bf16[1024,1024]{{1,0}} parameter(0)
  %p1 = bf16[1024,1024]{{1,0}} parameter(1)
  ROOT %dot.1 = bf16[1024,1024]{{1,0}} dot(%p0, %p1), lhs_contracting_dims={{1}}, rhs_contracting_dims={{0}}
}}

ENTRY %main (a: bf16[1024,1024], w: bf16[256,1024], v: bf16[256,1024]) -> bf16[1024,1024] {{
  %a = bf16[1024,1024]{{1,0}} parameter(0)
  %w = bf16[256,1024]{{1,0}} parameter(1)
  %v = bf16[256,1024]{{1,0}} parameter(2)
{body}
}}
"""


def _gather_start(name="ag", source="w", channel=1):
    return (f"  %{name}-start = (bf16[256,1024]{{1,0}}, bf16[1024,1024]{{1,0}}) all-gather-start("
            f"%{source}), channel_id={channel}, replica_groups={GROUPS}, dimensions={{0}}")


def _gather_done(name="ag"):
    return f"  %{name}-done = bf16[1024,1024]{{1,0}} all-gather-done(%{name}-start)"


def _matmul(name, seconds, root=False):
    cycles = round(seconds * CHIP.clock_hz)
    return (f"  {'ROOT ' if root else ''}%{name} = bf16[1024,1024]{{1,0}} fusion(%a, %a), "
            f'kind=kOutput, calls=%fused_dot, backend_config={{"estimated_cycles":"{cycles}"}}')


def _alone() -> float:
    """One run of GATHER on the row-major placement, as the cost model prices it alone."""
    return max(az.estimate(GATHER, TOPOLOGY).seconds, hbm_seconds(GATHER, CHIP))


@pytest.mark.parametrize("window", [0.25, 0.5, 2.0])
def test_a_gather_hides_only_behind_the_matmul_between_its_start_and_done(window):
    t = _alone()
    text = _module("\n".join([_gather_start(), _matmul("inside", window * t), _gather_done(),
                              _matmul("after", 5 * t, root=True)]))
    program = parse_hlo(text)
    [site] = program.sites
    assert site.asynchronous and site.done > site.start
    p = predict(program, TOPOLOGY, None)
    # The matmul after the done is no help, however long.
    assert p.compute_s == pytest.approx((window + 5) * t, rel=1e-4)
    assert p.exposed_s == pytest.approx(max(0.0, t - window * t), rel=1e-4, abs=1e-12)
    frame = breakdown(program, TOPOLOGY, None)
    assert frame["hidden_s"][0] + frame["exposed_s"][0] == pytest.approx(frame["seconds"][0])
    assert frame["exposed_s"][0] == pytest.approx(p.exposed_s)


def test_two_gathers_in_flight_on_the_same_links_share_them():
    t = _alone()
    one = az.estimate(GATHER, TOPOLOGY)
    joint = 2 * one.bandwidth_seconds + one.latency_seconds  # same links: loads add up
    window = 1.5 * t
    text = _module("\n".join([_gather_start("ag1", "w", 1), _gather_start("ag2", "v", 2),
                              _matmul("inside", window), _gather_done("ag1"),
                              _gather_done("ag2"), _matmul("after", t, root=True)]))
    program = parse_hlo(text)
    assert len(program.collectives) == 2 and all(s.asynchronous for s in program.sites)
    p = predict(program, TOPOLOGY, None)
    assert p.exposed_s == pytest.approx(max(0.0, joint - window), rel=1e-4)
    # Priced apart, each would have hidden entirely behind the 1.5 t window.
    assert t < window < joint


def test_a_synchronous_all_to_all_inside_a_gathers_window_waits_and_shares_links():
    a2a = (f"  %a2a = bf16[1024,1024]{{1,0}} all-to-all(%a), channel_id=3, "
           f"replica_groups={GROUPS}, dimensions={{0}}")
    t = _alone()
    window = 0.5 * t
    text = _module("\n".join([_gather_start(), a2a, _matmul("inside", window), _gather_done(),
                              _matmul("after", t, root=True)]))
    program = parse_hlo(text)
    by_kind = {c.kind: (c, s) for c, s in zip(program.collectives, program.sites, strict=True)}
    assert not by_kind["all-to-all"][1].asynchronous
    sync = max(az.estimate(by_kind["all-to-all"][0], TOPOLOGY).seconds,
               hbm_seconds(by_kind["all-to-all"][0], CHIP))
    parts = az.estimate(program, TOPOLOGY).parts
    joint = max(t, sync, float(sum(q.link_bytes for q in parts).max())
                / (CHIP.ici_link_bandwidth * CHIP.ici_efficiency)
                + max(q.latency_seconds for q in parts))
    p = predict(program, TOPOLOGY, None)
    assert p.exposed_s == pytest.approx(max(window + sync, joint) - window, rel=1e-4)
    assert p.exposed_s >= sync


def test_a_done_in_the_next_iteration_wraps_around_the_loop_body():
    t = _alone()
    # In the loop body: the gather starts after "late" and is waited for before "early" of
    # the next iteration: both matmuls run while it is in flight, the one between does not.
    body = "\n".join([
        "  %state = (s32[], bf16[256,1024]) parameter(0)",
        "  %w = bf16[256,1024]{1,0} get-tuple-element(%state), index=1",
        "  %a = bf16[1024,1024]{1,0} broadcast(%w), dimensions={}",
        _matmul("early", 0.25 * t), _gather_done(), _matmul("between", 4 * t),
        _gather_start(), _matmul("late", 0.5 * t),
        "  %i = s32[] get-tuple-element(%state), index=0",
        "  ROOT %out = (s32[], bf16[256,1024]) tuple(%i, %w)"])
    text = _module("").replace("ENTRY", f"""%cond (s: (s32[], bf16[256,1024])) -> pred[] {{
  %s = (s32[], bf16[256,1024]) parameter(0)
  %n = s32[] get-tuple-element(%s), index=0
  %c = s32[] constant(10)
  ROOT %lt = pred[] compare(%n, %c), direction=LT
}}

%body (state: (s32[], bf16[256,1024])) -> (s32[], bf16[256,1024]) {{
{body}
}}

ENTRY""").replace("  %v = bf16[256,1024]{1,0} parameter(2)\n", """  %v = bf16[256,1024]{1,0} parameter(2)
  %z = s32[] constant(0)
  %init = (s32[], bf16[256,1024]) tuple(%z, %w)
  ROOT %loop = (s32[], bf16[256,1024]) while(%init), condition=%cond, body=%body""")
    program = parse_hlo(text)
    [collective], [site] = program.collectives, program.sites
    assert collective.count == 10 and site.done < site.start
    p = predict(program, TOPOLOGY, None)
    assert p.exposed_s == pytest.approx(10 * max(0.0, t - 0.75 * t), rel=1e-4)


def test_an_async_collective_fusion_is_one_transfer_and_its_middle_fusions_compute():
    t = _alone()
    def fused(name, root):
        return f"""%{name} (param: bf16[256,1024]) -> bf16[1024,1024] {{
  %param = bf16[256,1024]{{1,0}} parameter(0)
  %g = bf16[1024,1024]{{1,0}} all-gather(%param), channel_id=7, replica_groups={GROUPS}, dimensions={{0}}
  ROOT %r = bf16[1024,1024]{{1,0}} custom-call(%g), custom_call_target="{root}"
}}
"""

    middle = f"""%middle (param: bf16[256,1024], x: bf16[1024,1024]) -> bf16[1024,1024] {{
  %param = bf16[256,1024]{{1,0}} parameter(0)
  %x = bf16[1024,1024]{{1,0}} parameter(1)
  %g = bf16[1024,1024]{{1,0}} all-gather(%param), channel_id=7, replica_groups={GROUPS}, dimensions={{0}}
  ROOT %d = bf16[1024,1024]{{1,0}} dot(%x, %x), lhs_contracting_dims={{1}}, rhs_contracting_dims={{0}}
}}
"""
    cycles = round(2 * t * CHIP.clock_hz)
    body = "\n".join([
        "  %s = bf16[1024,1024]{1,0} fusion(%w), kind=kCustom, calls=%start_c",
        f"  %m = bf16[1024,1024]{{1,0}} fusion(%w, %a), kind=kOutput, calls=%middle, "
        f'backend_config={{"estimated_cycles":"{cycles}"}}',
        "  ROOT %e = bf16[1024,1024]{1,0} fusion(%w), kind=kCustom, calls=%done_c"])
    text = _module(body).replace("ENTRY", fused("start_c", "AsyncCollectiveStart")
                                 + fused("done_c", "AsyncCollectiveDone") + middle + "ENTRY")
    program = parse_hlo(text)
    [collective], [site] = program.collectives, program.sites  # one transfer, not three
    assert collective.bytes == GATHER.bytes and site.asynchronous
    assert [op.estimated_cycles for op in program.ops] == [cycles]  # the middle one computes
    assert predict(program, TOPOLOGY, None).exposed_s == pytest.approx(0.0, abs=1e-12)


@pytest.mark.parametrize("overlap", [1.0, 0.8])
def test_the_placement_scorer_prices_what_predict_prices(overlap):
    text = _module("\n".join([_gather_start("ag1", "w", 1), _gather_start("ag2", "v", 2),
                              _matmul("inside", 1e-4), _gather_done("ag1"),
                              _gather_done("ag2"), _gather_start("ag3", "w", 3),
                              _matmul("after", 1e-2), _gather_done("ag3"),
                              _matmul("last", 1e-4, root=True)]))
    program = parse_hlo(text)
    options = az.ModelOptions(overlap=overlap)
    scorer = PlacementScorer(program, TOPOLOGY, options=options)
    orders = [np.random.default_rng(seed).permutation(16) for seed in range(6)]
    expected = [predict(program, TOPOLOGY, order, options=options).exposed_s
                for order in orders]
    assert scorer.scores(orders) == pytest.approx(expected, rel=1e-9)
    assert len(set(np.round(expected, 12))) > 1  # the placements really differ
    if overlap < 1:  # the long window no longer hides all of the third gather
        assert min(expected) > min(predict(program, TOPOLOGY, order).exposed_s
                                   for order in orders)


@pytest.mark.slow
def test_overlap_and_asynchronous_flags_on_a_real_compiled_program(tmp_path):
    import re

    from aoizora_lab.candidates import Candidate
    from aoizora_lab.compile import compile_candidates

    tiny = az.WanConfig(dim=128, ffn_dim=256, num_heads=4, num_layers=2, text_dim=32,
                        text_len=8, freq_dim=32)
    workload = az.Workload(model=tiny, height=64, width=64, frames=5, text_len=8)
    topology = az.Topology.from_name("v5e:2x4", deviceless=True)
    [result] = compile_candidates([Candidate.from_name("cfg2-uly4-fsdp")], workload, topology,
                                  cache_dir=tmp_path)
    assert result.status == "ok", result.message
    program, text = result.program, result.hlo_text
    # Read each collective's op from the HLO text itself, apart from the parser.
    op_of = dict(re.findall(r"%([\w.\-]+) = [^=]*?\b(all-gather-start|all-gather|all-to-all|"
                            r"all-reduce-start|all-reduce|collective-permute-start|"
                            r"collective-permute|reduce-scatter)\(", text))
    names = {c.name for c in program.collectives}
    assert any(op_of.get(n, "").endswith("-start") for n in names)  # both checks below bite
    assert any(op_of.get(n) == "all-to-all" for n in names)
    kinds = {c.kind for c in program.collectives}
    assert {"all-gather", "all-to-all"} <= kinds  # FSDP weight gathers, Ulysses exchanges
    for collective, site in zip(program.collectives, program.sites, strict=True):
        if op_of.get(collective.name, "").endswith("-start"):
            assert site.asynchronous, collective.name
        if op_of.get(collective.name) == "all-to-all":
            assert not site.asynchronous, collective.name  # the schedule waits for it
    assert any(s.asynchronous for s in program.sites)
    # predict = compute + what the schedule leaves exposed, collective by collective
    placement = np.arange(8)
    p = predict(program, topology, placement)
    frame = breakdown(program, topology, placement)
    assert p.compute_s == pytest.approx(compute_seconds(program, az.chip_spec("v5e")))
    assert p.total_s == pytest.approx(p.compute_s + frame["exposed_s"].sum())
    assert (frame["hidden_s"] >= -1e-12).all() and (frame["exposed_s"] >= 0).all()
    assert frame.loc[~frame["asynchronous"], "exposed_s"].sum() == pytest.approx(
        frame.loc[~frame["asynchronous"], "seconds"].sum())  # nothing hides a wait
