"""benchmarks/published.py: the rebuilt measurements and the comparison arithmetic (no compiles:
runs are priced by a stand-in predictor)."""

import dataclasses
import importlib
import math
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

import aoizora_lab as az
from aoizora_lab.baselines import maxdiffusion_setup, setup_keys
from aoizora_lab.cases import parse_case
from aoizora_lab.cost import Predicted

# Imported by name (dataclasses need the module in sys.modules).
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
published = importlib.import_module("published")
BIG_GATHER = published.GATHERS[0]


def simulated(name):
    return az.Topology.from_name(name, deviceless=False)


def test_scaling_book_gather_is_rebuilt_on_the_length_4_axis_without_wraparound():
    collective, topo, placement = published.rebuild_gather(BIG_GATHER,
                                                           simulated(BIG_GATHER.slice_name))
    assert topo.shape == (4, 8) and topo.wrap == (False, False)
    assert collective.kind == "all-gather"
    assert collective.bytes == 2048 * 8192 * 2  # the gathered bf16[2048, 8192]
    assert len(collective.groups) == 8
    for group in collective.groups:
        chips = topo.coords[placement[list(group)]]
        assert sorted(chips[:, 0]) == [0, 1, 2, 3]  # spans the physical axis of length 4
        assert len(set(chips[:, 1])) == 1  # on one line of it


def test_gather_rows_price_the_lone_collective_with_the_ici_model():
    rows = published.gather_rows([BIG_GATHER], topology_of=simulated)
    collective, topo, placement = published.rebuild_gather(BIG_GATHER,
                                                           simulated(BIG_GATHER.slice_name))
    assert rows[0]["predicted"] == pytest.approx(az.estimate(collective, topo,
                                                             placement).seconds)
    assert rows[0]["error_pct"] == pytest.approx(
        100 * (rows[0]["predicted"] / BIG_GATHER.published - 1))


def test_bandwidth_fraction_is_the_books_effective_link_bandwidth():
    m = dataclasses.replace(BIG_GATHER, quantity="bandwidth fraction", total_bytes=9e6)
    # 9e6 B gathered in 100 us: 9e6 / (2 * 1e-4) = 4.5e10 B/s one way, the nominal figure.
    assert published.gather_prediction(m, 1e-4) == pytest.approx(1.0)
    assert published.gather_prediction(BIG_GATHER, 1e-4) == 1e-4


@pytest.mark.parametrize(("predicted", "published_", "side"), [
    (1.2, 1.1, True), (0.9, 1.1, False), (0.8, 0.95, True), (1.0, 1.1, False)])
def test_ratio_side_and_error(predicted, published_, side):
    assert published.right_side(predicted, published_) is side
    row = published.comparison("m", "src", "ratio", published_, predicted, ratio=True)
    assert row["error_pct"] == pytest.approx(100 * (predicted - published_) / published_)
    assert row["within_target"] is (side and abs(row["error_pct"]) <= published.TARGET_PERCENT)


def test_targets_count_the_rows_whatever_number_types_the_model_returns():
    # numpy floats, as a cost model may return them (numpy bools do not add up in pandas)
    rows = [published.comparison("m", "src", "a / b ratio", 1.1, np.float64(p), ratio=True)
            for p in (1.12, 1.08)]
    rows.append(published.not_modelled("n", "src", "a / b ratio", 1.1, "not modelled: why"))
    targets = published.published_targets(pd.DataFrame(rows))
    assert list(targets["value"]) == ["2 of 2 (1 of 3 ratios not modelled)"] * 2
    assert list(targets["met"]) == ["met", "met"]


def _fake_predictor(step_of):
    def run(runs):
        return {(case, cand): published.RunPrediction(Predicted(0.8 * step_of[cand], 0.5,
                                                                step_of[cand]), "order")
                for case, cand in runs}
    return run


def test_pairs_compare_ratio_of_steps_and_difference_over_the_steps():
    pair = published.PAIRS[0]
    steps = {pair.a.recipe: 3.0, pair.b.recipe: 2.5}
    predictions = _fake_predictor(steps)([(r.case, r.recipe) for r in (pair.a, pair.b)])
    ratio, difference = published.pair_rows(pair, predictions)
    assert ratio["predicted"] == pytest.approx(3.0 / 2.5)
    assert ratio["published"] == pytest.approx(pair.a.published_s / pair.b.published_s)
    assert difference["predicted"] == pytest.approx(pair.a.steps * 0.5)
    assert difference["published"] == pytest.approx(pair.a.published_s - pair.b.published_s)
    side = published.run_row(pair, pair.a, predictions[(pair.a.case, pair.a.recipe)])
    assert side["exposed_comm_s"] == pytest.approx(3.0 - 0.8 * 3.0)
    assert side["implied_non_dit_s"] == pytest.approx(pair.a.published_s - pair.a.steps * 3.0)


def test_the_attention_floor_is_the_efficiency_that_fills_the_published_time():
    pair = published.PAIRS[0]
    prediction = published.RunPrediction(Predicted(3.0, 0.5, 3.2), "order", attention_s=1.0,
                                         fixed_s=2.0)
    row = published.run_row(pair, pair.a, prediction)
    # fixed + attention / floor = the published generation spread over its steps
    assert 2.0 + 1.0 / row["attention_efficiency_floor"] == pytest.approx(
        pair.a.published_s / pair.a.steps)


def test_compute_models_are_compared_on_the_same_ratio_rows():
    candidates = sorted({r.recipe for p in published.PAIRS for r in (p.a, p.b)})
    checks = {model: published.published_check(
        _fake_predictor({c: 1.0 + (i + 1) * scale for i, c in enumerate(candidates)}),
        gathers=[], topology_of=simulated) for model, scale in (("a", 0.1), ("b", 0.01))}
    table = published.compare_models(checks).set_index("compute model")
    for model, check in checks.items():
        ratios = check.comparisons[check.comparisons["compared"].str.endswith("ratio")]
        assert table.loc[model, "mean abs error %"] == pytest.approx(
            ratios["error_pct"].abs().mean())
    assert "agrees better" in dataclasses.replace(checks["a"], models=table.reset_index()
                                                  ).markdown()


def test_a_missing_generation_is_found_when_called_and_becomes_the_rows_reason():
    assert published.missing_generation("wan2.1-t2v-14b@1280x720x81/v6e:2x4") is None
    reason = published.missing_generation("wan2.1-t2v-14b@1280x720x81/v99:2x2")
    assert reason.startswith("not modelled yet: v99 generation missing")
    run = published.Run("a", "wan2.1-t2v-14b@1280x720x81/v99:2x2", published.FLASH4, 40, 100.0)
    pair = published.RunPair("k", "src", "what", run, dataclasses.replace(run, label="b"))
    rows = published.pair_rows(pair, {(run.case, run.recipe):
                                      published.RunPrediction(reason=reason)})
    assert [r["status"] for r in rows] == [reason, reason]
    assert all(math.isnan(r["predicted"]) for r in rows)


def test_check_counts_only_modelled_ratios_toward_the_target():
    step_of = {c: 1.0 + i / 10 for i, c in enumerate(
        sorted({r.recipe for p in published.PAIRS for r in (p.a, p.b)}))}
    result = published.published_check(_fake_predictor(step_of), gathers=[],
                                        topology_of=simulated)
    ratios = result.comparisons[result.comparisons["compared"].str.endswith("ratio")]
    modelled = ratios[ratios["status"] == "ok"]
    assert len(modelled) == len([p for p in published.PAIRS if not p.not_modelled])
    for target, column in zip(result.targets["value"], ["right_side", "within_target"],
                              strict=True):
        assert target.startswith(f"{sum(map(bool, modelled[column]))} of {len(modelled)}")
    assert published.SECTION in result.markdown()


def test_the_published_runs_are_built_as_maxdiffusion_builds_them():
    case = parse_case(published.V6E_720P)
    workload, topology = case.workload, case.topology()
    built = {r: maxdiffusion_setup(workload, topology, **setup_keys(r))
             for r in (published.FLASH4, published.ULYSSES4, published.RING4)}
    # PR #376's dp 2 x context 4: CFG on data, weights over context only.
    assert {r: s.candidate.name for r, s in built.items()} == {
        published.FLASH4: "cfg2-ctx4-fsdpseq", published.ULYSSES4: "cfg2-uly4-fsdpseq",
        published.RING4: "cfg2-ring4-fsdpseq"}
    # Ulysses gets the README's asynchronous all-to-all; flash and ring the Wan flags.
    assert built[published.ULYSSES4].flags.name == "maxdiffusion-ulysses"
    assert {built[r].flags.name for r in (published.FLASH4, published.RING4)} == {
        "maxdiffusion-wan"}
