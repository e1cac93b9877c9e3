"""The one cost module: roofline compute, the overlap rule, and predict on programs."""

import numpy as np
import pytest

import aoizora_lab as az
from aoizora_lab.cost import (
    Predicted,
    breakdown,
    comm_seconds,
    compute_seconds,
    predict,
    roofline_seconds,
)
from aoizora_lab.hlo import CollectiveSite, CommProgram

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


def test_a_memory_bound_op_is_priced_by_its_bytes():
    # (FLOPs, HBM bytes, runs, loop trips): a matmul at peak for 1 ms, and a norm that moves
    # 1 ms of HBM traffic but does almost no arithmetic, run 3 times.
    ops = ((CHIP.peak_bf16_flops * 1e-3, 0.0, 1, 0), (10.0, CHIP.hbm_bandwidth * 1e-3, 3, 0))
    program = CommProgram((), 16, ops=ops)
    assert compute_seconds(program, CHIP) == pytest.approx(1e-3 + 3e-3)


def _gather(count, asynchronous):
    groups = az.mesh_axis_groups((4, 4), [1])
    return (az.Collective("all-gather", groups, bytes=32e6, count=count),
            CollectiveSite((), "", asynchronous=asynchronous))


def test_predict_hides_only_the_asynchronous_collectives():
    sync, sync_site = _gather(2, False)
    asyn, async_site = _gather(3, True)
    placement = TOPOLOGY.device_grid().ravel()
    one = comm_seconds([sync], TOPOLOGY, placement, chip=CHIP) / 2  # per run
    for compute_s in (0.5 * one, 10 * one):  # async exposed, then hidden
        program = CommProgram((sync, asyn), 16, sites=(sync_site, async_site),
                              ops=((CHIP.peak_bf16_flops * compute_s, 0.0, 1, 0),))
        p = predict(program, TOPOLOGY, placement)
        assert p.compute_s == pytest.approx(compute_s)
        assert p.comm_s == pytest.approx(5 * one)
        assert p.total_s == pytest.approx(compute_s + 2 * one + max(0, 3 * one - compute_s))
    frame = breakdown(program, TOPOLOGY, placement)
    assert list(frame["asynchronous"]) == [True, False]  # heaviest (3 runs) first
    assert frame["seconds"].sum() == pytest.approx(5 * one)


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
    # predict = the overlap rule over the parts priced independently
    placement = np.arange(8)
    sync = [c for c, s in zip(program.collectives, program.sites, strict=True)
            if not s.asynchronous]
    asyn = [c for c, s in zip(program.collectives, program.sites, strict=True)
            if s.asynchronous]
    chip = az.chip_spec("v5e")
    compute = sum(runs * max(f / chip.peak_bf16_flops, b / chip.hbm_bandwidth)
                  for f, b, runs, _ in program.ops)
    sync_s = az.estimate(sync, topology, placement).seconds
    async_s = az.estimate(asyn, topology, placement).seconds
    p = predict(program, topology, placement)
    assert p.compute_s == pytest.approx(compute)
    assert p.total_s == pytest.approx(compute + sync_s + max(0.0, async_s - compute))
