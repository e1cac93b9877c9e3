"""The live path on 8 CPU host devices standing in for v5e:2x4: the mechanics, not TPU speed."""

import dataclasses
import json
import math
from pathlib import Path

import jax
import numpy as np
import pandas as pd
import pytest
from tiny import TINY, WORKLOAD

import aoizora_lab as az
from aoizora_lab import measure
from aoizora_lab.candidates import Candidate
from aoizora_lab.cost import Predicted
from aoizora_lab.hlo import parse_hlo
from aoizora_lab.measure.microbench import _probe_program, _split_grid
from aoizora_lab.options import PlanOptions
from aoizora_lab.placement import Placement
from aoizora_lab.planner import plan
from aoizora_lab.realize import Plan

FIXTURES = Path(__file__).resolve().parent / "data"


@pytest.fixture(scope="module")
def host_slice():
    return az.Topology.simulated((2, 4), devices=jax.devices()[:8])


@pytest.fixture(scope="module")
def planned(host_slice):
    # The session's cache: test_planner plans the same workload and slice.
    return plan(WORKLOAD, host_slice, PlanOptions(budget=400))


@pytest.fixture(scope="module")
def benchmarks(host_slice):
    return measure.microbenchmarks(host_slice, sizes=[4 * 1024, 256 * 1024], repeats=2,
                                   warmup=1, inner=2)


def _timing_is_consistent(timing, steps):
    assert len(timing.samples) == steps
    assert 0 < timing.min_s <= timing.median_s <= timing.max_s
    assert timing.spread == pytest.approx((timing.max_s - timing.min_s) / timing.median_s)


def test_timing_summarises_its_samples():
    timing = measure.Timing((0.3, 0.1, 0.2))
    assert (timing.median_s, timing.min_s, timing.max_s) == (0.2, 0.1, 0.3)
    assert timing.spread == pytest.approx(1.0)
    with pytest.raises(az.AoizoraError, match="non-negative samples"):
        measure.Timing(())


def test_measuring_a_slice_without_live_devices_is_refused(host_slice):
    simulated = az.Topology.simulated((2, 4))
    with pytest.raises(az.AoizoraError, match=r"simulated slice.*Topology\.from_devices"):
        measure.microbenchmarks(simulated)
    deviceless = az.Topology.from_name("v5e:2x4", deviceless=True)
    with pytest.raises(az.AoizoraError, match=r"deviceless TPU devices compile but cannot run"):
        measure.live_devices(deviceless)
    candidate = Candidate.from_name("cfg2-ctx4", attention="blockwise")
    unplaced = Plan(WORKLOAD, simulated, candidate, Placement(tuple(range(8))),
                    Predicted(1.0, 1.0, 2.0))
    with pytest.raises(az.AoizoraError, match="simulated slice"):
        measure.time_plan(unplaced)
    # The same plan with host devices passed in runs.
    timing = measure.time_plan(unplaced, steps=2, warmup=1, devices=host_slice.devices)
    _timing_is_consistent(timing, 2)


def _compare_is_consistent(frame, plans, samples):
    assert list(frame["plan"]) == list(plans)
    assert frame["predicted_s"].tolist() == [p.predicted.total_s for p in plans.values()]
    assert (frame["measured_s"] > 0).all() and (frame["samples"] == samples).all()
    assert (frame["min_s"] <= frame["measured_s"]).all()
    assert (frame["measured_s"] <= frame["max_s"]).all()
    assert frame["measured_rank"].tolist() == frame["measured_s"].rank(method="min").tolist()
    assert -1 <= frame.attrs["spearman"] <= 1 and -1 <= frame.attrs["kendall"] <= 1
    assert frame.attrs["platform"] == "cpu"


def test_compare_plans_times_plans_in_rounds_beside_their_predictions(host_slice):
    plans = [Plan(WORKLOAD, host_slice, Candidate.from_name("cfg2-ctx4", attention="blockwise"),
                  Placement(tuple(range(8)), "plain"), Predicted(1.0, 1.0, 2.0)),
             Plan(WORKLOAD, host_slice,
                  Candidate.from_name("cfg2-ring4-fsdp", attention="blockwise"),
                  Placement((0, 2, 4, 6, 1, 3, 5, 7), "ring on y"), Predicted(1.0, 2.0, 3.0))]
    frame = measure.compare_plans(plans, rounds=2, steps=2, warmup=1)
    named = {"cfg2-ctx4 | plain": plans[0], "cfg2-ring4-fsdp | ring on y": plans[1]}
    _compare_is_consistent(frame, named, 4)
    with pytest.raises(az.AoizoraError, match="one workload"):
        other = az.Workload(model=TINY, height=32, width=32, frames=5, text_len=8)
        measure.compare_plans([plans[0], dataclasses.replace(plans[0], workload=other)])


@pytest.mark.slow
def test_planned_plans_are_timed_and_ranked_against_their_predictions(planned):
    plans = measure.plans_to_compare(planned, top=2)
    labels = " ".join(plans)
    assert "rank 1" in labels and "maxdiffusion-default" in labels and "aoizora-lab" in labels
    scored = set(planned.baselines.plans)
    assert {"maxdiffusion-default", "maxdiffusion-best", "xdit-usp"} <= scored
    assert all(name in labels for name in scored)
    orders = [(p.candidate.name, p.flags.label, p.placement.order) for p in plans.values()]
    assert len(orders) == len(set(orders))  # each (candidate, flags, placement) once

    _timing_is_consistent(measure.time_plan(planned.best, steps=3, warmup=1), 3)

    _compare_is_consistent(measure.compare_plans(plans, rounds=2, steps=2, warmup=1), plans, 4)


def _renumbered(host_slice):
    """The same 8 host devices, numbered in another order (as a live VM may number its chips)."""
    shuffled = np.random.default_rng(0).permutation(8)
    return az.Topology(generation="v5e", shape=(2, 4), wrap=(False, False),
                       coords=host_slice.coords[shuffled],
                       devices=[host_slice.devices[i] for i in shuffled], source="host devices")


@pytest.mark.slow
def test_plans_to_compare_moves_every_plan_onto_the_live_slice(planned, host_slice):
    live = _renumbered(host_slice)
    plans = measure.plans_to_compare(planned, top=2)
    moved = measure.plans_to_compare(planned, top=2, topology=live)
    assert list(moved) == list(plans)
    for name, plan_here in plans.items():
        there = moved[name]
        assert there.topology is live and there.candidate == plan_here.candidate
        chips = [tuple(plan_here.topology.coords[i]) for i in plan_here.placement.order]
        assert [tuple(live.coords[i]) for i in there.placement.order] == chips


def test_a_plan_moves_onto_another_numbering_of_the_same_chips(host_slice):
    candidate = Candidate.from_name("cfg2-ctx4", attention="blockwise")
    made = Plan(WORKLOAD, az.Topology.simulated((2, 4)), candidate,
                Placement((0, 2, 4, 6, 1, 3, 5, 7), "cfg on x"), Predicted(1.0, 1.0, 2.0))
    live = _renumbered(host_slice)
    moved = measure.retarget(made, live)
    chips = [tuple(made.topology.coords[i]) for i in made.placement.order]
    assert [tuple(live.coords[i]) for i in moved.placement.order] == chips
    assert moved.placement.description == "cfg on x" and moved.topology is live
    with pytest.raises(az.AoizoraError, match="cannot move onto v5e:4x2"):
        measure.retarget(made, az.Topology.simulated((4, 2)))


def test_official_weights_are_timed_through_the_loader(host_slice):
    meta = json.loads((FIXTURES / "wan21_tiny_t2v_a.json").read_text())
    model = az.WanConfig(**meta["config"])
    workload = az.Workload(model=model, height=32, width=48, frames=5, text_len=16)
    candidate = Candidate.from_name("cfg2-ring4", attention="blockwise")
    realised = Plan(workload, host_slice, candidate, Placement(tuple(range(8))),
                    Predicted(1.0, 1.0, 2.0))
    timing = measure.time_plan(realised, steps=2, warmup=1,
                               weights=FIXTURES / "wan21_tiny_t2v_a.safetensors")
    _timing_is_consistent(timing, 2)


def test_rank_correlations():
    assert measure.rank_correlations([1, 2, 3], [10, 30, 20]) == pytest.approx((0.5, 1 / 3))
    assert all(math.isnan(v) for v in measure.rank_correlations([1, 2], [5, 5]))
    assert all(math.isnan(v) for v in measure.rank_correlations([1], [5]))


def test_probes_cover_both_directions_wraparound_and_group_shapes():
    labels = [(p.kind, p.group) for p in measure.probes(az.Topology.simulated((2, 4)))]
    assert ("collective-permute", "x +1") in labels and ("collective-permute", "y -1") in labels
    assert ("collective-permute", "y cyclic +1 (closing hop crosses the line)") in labels
    for kind in ("all-gather", "all-to-all"):
        assert [g for k, g in labels if k == kind] == [
            "x line", "y line", "2x2 block", "whole slice"]
    torus = az.Topology.simulated((4, 4), wrap=(True, False))
    by_group = {p.group: p for p in measure.probes(torus, ["collective-permute"])}
    wrapped = by_group["x cyclic +1 (wraparound)"]
    plain = by_group["y cyclic +1 (closing hop crosses the line)"]
    hops = [measure.model_terms(measure.probe_collective(torus, p, 1024), torus)[1]
            for p in (wrapped, plain)]
    assert hops == [1, 3]  # the wraparound link vs across the whole line
    assert measure.block_groups(az.Topology.simulated((2, 4)), (2, 2)).tolist() == [
        [0, 2, 1, 3], [4, 6, 5, 7]]
    with pytest.raises(az.AoizoraError, match="Unknown microbenchmark kind"):
        measure.probes(torus, ["all-reduce"])


def test_microbenchmark_programs_run_the_intended_physical_groups(host_slice):
    # The compiled program's replica groups, mapped through the mesh's device order, are the
    # groups the model prices.
    for probe in measure.probes(host_slice):
        program, _ = _probe_program(host_slice, probe, host_slice.devices, 16, 1)
        (compiled,) = parse_hlo(program.as_text()).collectives
        mesh_order = _split_grid(host_slice, probe.block).ravel()
        expected = measure.probe_collective(host_slice, probe, 64)
        mapped = [tuple(int(mesh_order[i]) for i in g) for g in compiled.groups]
        if probe.kind == "collective-permute":
            assert sorted(mapped) == sorted(expected.groups), probe.group
        else:
            assert sorted(map(sorted, mapped)) == sorted(map(sorted, expected.groups))
        assert (compiled.kind, compiled.bytes) == (expected.kind, expected.bytes)


def test_microbenchmarks_time_every_probe_and_price_it(host_slice, benchmarks):
    probes = measure.probes(host_slice)
    assert len(benchmarks) == 2 * len(probes)
    assert (benchmarks["seconds"] > 0).all() and (benchmarks["predicted_s"] > 0).all()
    assert set(benchmarks["platform"]) == {"cpu"}
    for _, row in benchmarks.iterrows():
        assert row["predicted_s"] == pytest.approx(
            az.estimate(row["collective"], host_slice).seconds)
        assert row["bytes"] == row["collective"].bytes
    assert set(benchmarks["bytes"]) == {4 * 1024, 256 * 1024}  # both divide every group


def test_cpu_measurements_calibrate_but_are_not_written_by_default(host_slice, benchmarks,
                                                                   tmp_path):
    calibration = measure.calibrate(benchmarks, host_slice)
    assert calibration.points == len(benchmarks) and calibration.platform == "cpu"
    assert np.isfinite(calibration.rms_relative_error)
    assert calibration.max_relative_error >= calibration.rms_relative_error
    assert any("say nothing about TPU links" in n for n in calibration.notes)
    with pytest.raises(az.AoizoraError, match="allow_non_tpu"):
        measure.write_calibration(calibration, tmp_path / "out")
    assert not (tmp_path / "out").exists()


def _synthetic(topology, chip):
    """Exactly linear 'measurements': the model itself with known constants."""
    rows = []
    for probe in measure.probes(topology):
        for size in (4e3, 6.4e4, 1e6, 1.6e7, 6.4e7):
            collective = measure.probe_collective(topology, probe, size)
            rows.append({"collective": collective, "platform": "tpu",
                         "seconds": az.estimate(collective, topology, chip=chip).seconds})
    return pd.DataFrame(rows)


def test_the_fitter_recovers_known_constants_and_chip_spec_applies_them(
        _no_user_calibration, tmp_path):
    topology = az.Topology.simulated((4, 4))
    truth = az.chip_spec("v5e", calibrated=False, ici_efficiency=0.8, ici_hop_latency=2e-6)
    calibration = measure.calibrate(_synthetic(topology, truth), topology)
    assert calibration.effective_bandwidth == pytest.approx(0.8 * 4.5e10, rel=1e-9)
    assert calibration.hop_latency == pytest.approx(2e-6, rel=1e-9)
    assert calibration.rms_relative_error < 1e-9 and calibration.max_relative_error < 1e-9
    assert calibration.overrides == pytest.approx(
        {"ici_link_bandwidth": 4.5e10, "ici_efficiency": 0.8, "ici_hop_latency": 2e-6})

    # Written to the folder $AOIZORA_LAB_CALIBRATION_DIR names (the conftest's empty one).
    path = measure.write_calibration(calibration)
    assert path == _no_user_calibration / "v5e.json"
    spec = az.chip_spec("v5e")
    assert (spec.ici_efficiency, spec.ici_hop_latency) == pytest.approx((0.8, 2e-6))
    assert "v5e.json" in spec.source
    assert az.chip_spec("v5e", calibrated=False).ici_efficiency == 0.95
    ag = measure.probe_collective(topology, measure.probes(topology)[-1], 1e6)
    assert az.estimate(ag, topology).seconds == pytest.approx(
        az.estimate(ag, topology, chip=truth).seconds)

    # A slice faster than the published link: the bandwidth moves, efficiency is 1.
    fast = az.chip_spec("v5e", calibrated=False, ici_link_bandwidth=6e10, ici_efficiency=1.0)
    faster = measure.calibrate(_synthetic(topology, fast), topology)
    assert faster.overrides["ici_link_bandwidth"] == pytest.approx(6e10)
    assert faster.overrides["ici_efficiency"] == pytest.approx(1.0)
    written = measure.write_calibration(faster, tmp_path / "elsewhere")
    assert json.loads(written.read_text())["slice"] == "v5e:4x4"
    assert az.chip_spec("v5e", calibration_dir=written.parent).ici_link_bandwidth == (
        pytest.approx(6e10))


def test_an_undetermined_constant_is_noted_and_not_written():
    topology = az.Topology.simulated((2, 4))
    frame = _synthetic(topology, az.chip_spec("v5e"))
    frame = frame[[c.bytes >= 1e6 for c in frame["collective"]]].copy()
    # Exactly linear with a negative latency: the best non-negative one is exactly 0.
    terms = np.array([measure.model_terms(c, topology) for c in frame["collective"]])
    frame["seconds"] = terms[:, 0] / 4e10 - 1e-7 * terms[:, 1]
    calibration = measure.calibrate(frame, topology)
    assert calibration.hop_latency == 0
    assert "ici_hop_latency" not in calibration.overrides
    assert any("latency not determined" in n for n in calibration.notes)
    with pytest.raises(az.AoizoraError, match="'collective' and 'seconds'"):
        measure.calibrate(pd.DataFrame({"seconds": [1.0]}), topology)


def test_only_process_zero_writes(monkeypatch, tmp_path):
    topology = az.Topology.simulated((2, 4))
    calibration = measure.calibrate(_synthetic(topology, az.chip_spec("v5e")), topology)
    assert measure.is_writer()
    monkeypatch.setattr(jax, "process_index", lambda: 1)
    assert not measure.is_writer()
    assert measure.write_calibration(calibration, tmp_path / "out") is None
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("counts", [{"steps": 0}, {"steps": True}, {"warmup": -1},
                                    {"steps": 2.5}])
def test_bad_repeat_counts_are_named_before_anything_runs(host_slice, counts):
    candidate = Candidate.from_name("cfg2-ctx4", attention="blockwise")
    realised = Plan(WORKLOAD, host_slice, candidate, Placement(tuple(range(8))),
                    Predicted(1.0, 1.0, 2.0))
    name, value = next(iter(counts.items()))
    with pytest.raises(az.AoizoraError, match=rf"{name}={value!r} must be an integer"):
        measure.time_plan(realised, **counts)


def _steps(topology, attention_efficiency):
    """Programs of one attention kernel and one compiler-estimated matmul each, and their
    steps as the cost model prices them at a known attention efficiency."""
    from aoizora_lab.cost import predict
    from aoizora_lab.hlo import CommProgram, ComputeOp

    truth = az.chip_spec("v5e", calibrated=False, attention_efficiency=attention_efficiency)
    rows = []
    for scale in (1.0, 2.5, 6.0):
        ops = (ComputeOp(truth.peak_bf16_flops * 1e-3 * scale, 0.0, 4, 0, "attention"),
               ComputeOp(1e9, 1e6, 4, 0, "matmul", estimated_cycles=2e6 / scale))
        program = CommProgram((), topology.num_devices, ops=ops)
        rows.append({"program": program, "topology": topology, "placement": None,
                     "platform": "tpu",
                     "seconds": predict(program, topology, None, chip=truth).total_s})
    return pd.DataFrame(rows)


def test_the_compute_fit_recovers_a_known_attention_efficiency(_no_user_calibration):
    topology = az.Topology.simulated((2, 4))
    fit = measure.calibrate_compute(_steps(topology, 0.35))
    assert fit.overrides == pytest.approx({"attention_efficiency": 0.35}, rel=1e-9)
    assert fit.rms_relative_error < 1e-9 and fit.points == 3
    # Written beside an ICI calibration, both stay.
    az.hardware.save_calibration("v5e", {"ici_efficiency": 0.8})
    measure.write_calibration(fit)
    spec = az.chip_spec("v5e")
    assert (spec.ici_efficiency, spec.attention_efficiency) == pytest.approx((0.8, 0.35))
    # Faster than peak is capped with a note; steps of CPU devices are said to be no TPU's.
    fast = _steps(topology, 1.0).assign(seconds=lambda f: f["seconds"] * 0.5, platform="cpu")
    capped = measure.calibrate_compute(fast)
    assert capped.overrides["attention_efficiency"] == 1.0
    assert any("capped at 1" in n for n in capped.notes)
    assert any("say nothing about TPU" in n for n in capped.notes)
    with pytest.raises(az.AoizoraError, match="'seconds'"):
        measure.calibrate_compute(fast.drop(columns="seconds"))
