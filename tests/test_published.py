"""benchmarks/published.py: the rebuilt measurements, the comparison arithmetic and the counting
of independent predictions (no compiles: runs are priced by a stand-in predictor)."""

import dataclasses
import importlib
import math
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

import aoizora_lab as az
from aoizora_lab import uncertainty
from aoizora_lab.baselines import maxdiffusion_setup, setup_keys
from aoizora_lab.cases import parse_case
from aoizora_lab.cost import Predicted, comm_seconds
from aoizora_lab.generation import maxdiffusion_vae_parts
from aoizora_lab.hardware import chip_spec

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


def test_a_lone_collective_is_one_prediction_whatever_quantity_is_read_from_it():
    same = dataclasses.replace(BIG_GATHER, key="same collective, read as a bandwidth",
                               quantity="bandwidth fraction", published=0.9)
    other = dataclasses.replace(BIG_GATHER, key="another size", total_bytes=1e6)
    rows = published.gather_rows([BIG_GATHER, same, other], topology_of=simulated)
    assert rows[0]["prediction"] == rows[1]["prediction"] != rows[2]["prediction"]
    # The statement a chip constant was taken from checks nothing.
    fitted = [m for m in published.GATHERS if m.constant_from]
    assert fitted and all(not r["independent"] for r in published.gather_rows(
        fitted, topology_of=simulated))


def test_bandwidth_fraction_is_the_books_effective_link_bandwidth():
    m = dataclasses.replace(BIG_GATHER, quantity="bandwidth fraction", total_bytes=9e6)
    # 9e6 B gathered in 100 us: 9e6 / (2 * 1e-4) = 4.5e10 B/s one way, the nominal figure.
    assert published.gather_prediction(m, 1e-4) == pytest.approx(1.0)
    assert published.gather_prediction(BIG_GATHER, 1e-4) == 1e-4


@pytest.mark.parametrize(("predicted", "published_", "sign"), [
    (30.0, 34.0, True),   # 12 % short
    (20.0, 34.0, True),   # 41 % short: right sign, outside the target
    (-5.0, 20.0, False),  # wrong sign, whatever the size
    (-25.0, -20.0, True),  # both negative: 25 % over
    (26.0, 20.0, True),   # 30 % over
])
def test_difference_check_is_sign_first_then_within_the_percentage(predicted, published_, sign):
    row = published.difference_check(np.float64(predicted), published_)
    assert row["right_sign"] is sign
    assert row["diff_error_pct"] == pytest.approx(100 * (predicted - published_) / published_)
    assert row["diff_within_target"] is (
        sign and abs(row["diff_error_pct"]) <= published.DIFFERENCE_PERCENT)
    # A wrong sign is a miss even where the relative error is small in size.
    assert published.difference_check(-published_, published_)["diff_within_target"] is False


@pytest.mark.parametrize(("predicted", "published_", "side"), [
    (1.2, 1.1, True), (0.9, 1.1, False), (0.8, 0.95, True), (1.0, 1.1, False)])
def test_ratio_side_and_error(predicted, published_, side):
    assert published.right_side(predicted, published_) is side
    row = published.ratio_check(np.float64(predicted), published_)
    assert row["ratio_error_pct"] == pytest.approx(100 * (predicted - published_) / published_)
    assert row["ratio_within_target"] is (side and abs(row["ratio_error_pct"])
                                          <= published.RATIO_PERCENT)


def _fake_predictor(step_of, seen=None):
    def run(runs):
        runs = list(runs)
        if seen is not None:
            seen.extend(runs)
        return {(case, recipe): published.RunPrediction(
            Predicted(0.8 * step_of[recipe], 0.5, step_of[recipe]), "order",
            candidate=f"cand {recipe[-8:]}", flags="flags") for case, recipe in runs}
    return run


def test_a_pair_compares_steps_times_each_sides_step_and_the_per_step_ratio():
    pair = published.PAIRS[0]
    a = dataclasses.replace(pair.a, steps=50)  # each side's own step count
    pair = dataclasses.replace(pair, a=a)
    steps = {pair.a.recipe: 3.0, pair.b.recipe: 2.5}
    predictions = _fake_predictor(steps)([pair.a.key, pair.b.key])
    row = published.pair_row(pair, predictions)
    assert row["published_diff_s"] == pytest.approx(pair.a.published_s - pair.b.published_s)
    assert row["predicted_diff_s"] == pytest.approx(50 * 3.0 - pair.b.steps * 2.5)
    assert row["predicted_ratio"] == pytest.approx(3.0 / 2.5)
    assert row["published_ratio"] == pytest.approx(pair.a.published_s / pair.b.published_s)
    side = published.run_row(pair, pair.a, predictions[pair.a.key])
    assert side["exposed_comm_s"] == pytest.approx(3.0 - 0.8 * 3.0)
    assert side["implied_non_dit_s"] == pytest.approx(pair.a.published_s - 50 * 3.0)


def test_a_scaling_pair_has_a_ratio_and_no_difference():
    pair = next(p for p in published.PAIRS if not p.difference)
    predictions = _fake_predictor({pair.a.recipe: 3.0, pair.b.recipe: 1.7})(
        [pair.a.key, pair.b.key])
    row = published.pair_row(pair, predictions)
    assert math.isnan(row["published_diff_s"]) and math.isnan(row["predicted_diff_s"])
    assert row["right_sign"] is None
    assert row["predicted_ratio"] == pytest.approx(3.0 / 1.7)


def test_the_attention_floor_is_the_efficiency_that_fills_the_published_time():
    pair = published.PAIRS[0]
    prediction = published.RunPrediction(Predicted(3.0, 0.5, 3.2), "order", attention_s=1.0,
                                         fixed_s=2.0)
    row = published.run_row(pair, pair.a, prediction)
    # fixed + attention / floor = the published generation spread over its steps
    assert 2.0 + 1.0 / row["attention_efficiency_floor"] == pytest.approx(
        pair.a.published_s / pair.a.steps)


CASE = "wan2.1-t2v-14b@1280x720x81/v6e:2x4"
FLASH, ULYSSES, RING = published.FLASH4, published.ULYSSES4, published.RING4


def _run(label, recipe, seconds, steps=40):
    return published.Run(label, CASE, recipe, steps, seconds)


def _pairs():
    """Two published pairs of the same two runs (in either order), one of another two, one
    not modelled and one whose runs rebuild to the same program."""
    return [
        published.RunPair("x", "src", "", _run("flash", FLASH, 300.0),
                          _run("ulysses", ULYSSES, 280.0)),
        published.RunPair("y", "src", "", _run("ulysses", ULYSSES, 100.0),
                          _run("flash", FLASH, 160.0)),
        published.RunPair("z", "src", "", _run("ring", RING, 200.0),
                          _run("flash", FLASH, 205.0)),
        published.RunPair("w", "src", "", _run("flash", FLASH, 1.0),
                          _run("ulysses", ULYSSES, 1.0), not_modelled="why not"),
        published.RunPair("v", "src", "", _run("online", RING, 110.0),
                          _run("fixed-m", RING, 105.0)),
    ]


def _check(pairs, step_of=None, seen=None):
    step_of = step_of or {FLASH: 3.0, ULYSSES: 2.5, RING: 3.2}
    return published.published_check(_fake_predictor(step_of, seen), gathers=[], pairs=pairs,
                                      topology_of=simulated)


def test_independent_predictions_are_distinct_pairs_of_rebuilt_runs_not_rows():
    pairs, seen = _pairs(), []
    result = _check(pairs, seen=seen)
    # Each rebuilt run is predicted once, and the same-program pair asks for nothing.
    assert sorted(seen) == sorted({(CASE, r) for r in (FLASH, ULYSSES, RING)})
    rows = result.comparisons.set_index("measurement")
    assert rows.at["x", "prediction"] == rows.at["y", "prediction"]  # a / b and b / a
    assert rows.at["z", "prediction"] not in ("", rows.at["x", "prediction"])
    assert rows.at["w", "status"] == "not modelled: why not"
    assert rows.at["v", "status"].startswith("not modelled")
    assert rows.at["w", "prediction"] == rows.at["v", "prediction"] == ""
    table = result.predictions.set_index("prediction")
    assert len(table) == len({published.prediction_key(p) for p in pairs[:3]})
    assert table.at[rows.at["x", "prediction"], "rows"] == 2
    assert table.at[rows.at["z", "prediction"], "rows"] == 1
    # Every row's checks are counted under its prediction.
    for pid, group in result.comparisons[result.comparisons["status"] == "ok"].groupby(
            "prediction"):
        assert table.at[pid, published.SIGNS_RIGHT] == group["right_sign"].sum()
        assert table.at[pid, published.DIFFERENCES_WITHIN] == group[
            "diff_within_target"].sum()


def test_a_prediction_meets_a_target_only_if_every_pair_mapped_to_it_does():
    result = _check(_pairs())
    rows = result.comparisons.set_index("measurement")
    # x: 40 x (3.0 - 2.5) = 20 s against 20 s; y: -20 s against -60 s (right sign, 67 % off);
    # z: 40 x (3.2 - 3.0) = 8 s against -5 s (wrong sign).
    assert rows.at["x", "diff_within_target"] and rows.at["y", "right_sign"]
    assert not rows.at["y", "diff_within_target"] and not rows.at["z", "right_sign"]
    targets = result.targets.set_index("target")
    predictions = result.predictions
    with_difference = predictions[predictions["difference rows"] > 0]
    for column, name in ((published.SIGNS_RIGHT, "right sign of a - b on every pair"),
                         (published.DIFFERENCES_WITHIN,
                          f"a - b within ±{published.DIFFERENCE_PERCENT:g} % of the published "
                          "difference on every pair")):
        hits = int((with_difference[column] == with_difference["difference rows"]).sum())
        assert targets.at[name, "value"].startswith(
            f"{hits} of {len(with_difference)} predictions ("
            f"{int(with_difference[column].sum())} of "
            f"{int(with_difference['difference rows'].sum())} published pairs)")
        assert targets.at[name, "met"] == ("met" if hits == len(with_difference) else "missed")
    # Here: the x / y prediction has both signs right but one difference off, z neither.
    assert targets.at["right sign of a - b on every pair", "value"].startswith("1 of 2 ")
    assert targets.loc[targets.index.str.startswith("a - b within"), "value"].iloc[0] \
        .startswith("0 of 2 predictions (1 of 3 published pairs)")
    count = targets.at["independent predictions (counted)", "value"]
    assert count.startswith(f"{len(predictions)}: {len(predictions)} pairs of rebuilt runs "
                            "(from 3 modelled published pairs; 2 more not modelled)")


def test_lone_collectives_are_counted_beside_the_pairs():
    result = published.published_check(
        _fake_predictor({FLASH: 3.0, ULYSSES: 2.5, RING: 3.2}), pairs=_pairs()[:1],
        topology_of=simulated)
    lone = result.gathers["prediction"].nunique()
    assert lone == len({published.gather_key(m) for m in published.GATHERS})
    count = result.targets.set_index("target").at["independent predictions (counted)", "value"]
    dependent = sum(bool(m.constant_from) for m in published.GATHERS)
    assert 0 < dependent < lone  # a check of both sides
    assert count.startswith(f"{len(result.predictions) + lone - dependent}: ")
    assert f"+ {lone - dependent} lone collectives; {dependent} more lone collective" in count
    assert count.endswith("not independent of the chip constants, not counted")


def test_compute_models_are_compared_on_the_same_pairs():
    recipes = sorted({r.recipe for p in published.PAIRS for r in (p.a, p.b)})
    checks = {model: published.published_check(
        _fake_predictor({c: 1.0 + (i + 1) * scale for i, c in enumerate(recipes)}),
        gathers=[], topology_of=simulated) for model, scale in (("a", 0.1), ("b", 0.01))}
    table = published.compare_models(checks).set_index("compute model")
    for model, check in checks.items():
        done = check.comparisons[check.comparisons["status"] == "ok"]
        assert table.loc[model, "mean abs difference error %"] == pytest.approx(
            done["diff_error_pct"].abs().mean())
        assert table.loc[model, "mean abs ratio error %"] == pytest.approx(
            done["ratio_error_pct"].abs().mean())
        assert table.loc[model, "predictions"] == len(check.predictions)
    assert "agrees better" in dataclasses.replace(checks["a"], models=table.reset_index()
                                                  ).markdown()


def test_a_missing_generation_is_found_when_called_and_becomes_the_rows_reason():
    assert published.missing_generation("wan2.1-t2v-14b@1280x720x81/v6e:2x4") is None
    reason = published.missing_generation("wan2.1-t2v-14b@1280x720x81/v99:2x2")
    assert reason.startswith("not modelled yet: v99 generation missing")
    run = published.Run("a", "wan2.1-t2v-14b@1280x720x81/v99:2x2", published.FLASH4, 40, 100.0)
    pair = published.RunPair("k", "src", "what", run,
                             dataclasses.replace(run, label="b", recipe=published.ULYSSES4))
    row = published.pair_row(pair, {run.key: published.RunPrediction(reason=reason)})
    assert row["status"] == reason
    assert math.isnan(row["predicted_diff_s"]) and math.isnan(row["predicted_ratio"])


def test_the_floor_summary_names_the_highest_floor_and_the_models_efficiency():
    runs = pd.DataFrame([
        {"measurement": "m1", "run": "a", "case": "w@1280x720x81/v6e:2x4", "status": "ok",
         "timed": published.WHOLE_GENERATION, "attention_efficiency_floor": 0.3,
         "kernel": "splash"},
        {"measurement": "m2", "run": "b", "case": "w@1280x720x81/tpu7x:2x2x1", "status": "ok",
         "timed": published.DENOISE_LOOP, "attention_efficiency_floor": 0.9,
         "kernel": "splash"},
        {"measurement": "m4", "run": "d", "case": "w@1280x720x81/tpu7x:2x2x1", "status": "ok",
         "timed": published.DENOISE_LOOP, "attention_efficiency_floor": 0.31,
         "kernel": "tokamax"},
        {"measurement": "m3", "run": "c", "case": "w@1280x720x81/v6e:2x4",
         "status": "not compiled", "timed": published.WHOLE_GENERATION,
         "attention_efficiency_floor": 5.0, "kernel": "splash"}])
    text = published.floor_summary(runs)
    model = chip_spec("tpu7x").attention_efficiency
    assert "the highest is 0.9, m2, run b" in text
    assert f"attention_efficiency {model:g} for tpu7x" in text
    above = sum(f > chip_spec(g).attention_efficiency
                for f, g in ((0.3, "v6e"), (0.9, "tpu7x"), (0.31, "tpu7x")))
    assert f"{above} of 3 floors lie above" in text
    # Each floor against its own kernel's sourced range, not the point model's.
    spreads = {s.kernel: s for s in uncertainty.SPREADS if s.kernel}
    for kernel, floors in (("splash", (0.3, 0.9)), ("tokamax", (0.31,))):
        s = spreads[kernel]
        over = [f for f in floors if f > s.high]
        assert (f"{kernel} ({s.low:g}-{s.high:g}): {len(over)} of {len(floors)} floors above "
                "its top") in text
    assert "m2 b 0.9)" in text  # splash's top is below 0.9: the run that cannot be reached


def test_the_published_runs_are_built_as_maxdiffusion_builds_them():
    case = parse_case(published.V6E_720P_I2V)
    assert case.workload.model == "wan2.2-i2v-a14b"  # PR #376 ran Wan2.2 I2V A14B
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


def test_pr_430s_2d_ring_is_ulysses_2_on_a_chip_times_ring_2_across_chips():
    pair = next(p for p in published.PAIRS if p.source == published.PR_430)
    assert pair.timed == published.DENOISE_LOOP and pair.difference
    assert (pair.a.published_s, pair.b.published_s) == (
        published.PR430_ULYSSES_DENOISE, published.PR430_2D_RING_DENOISE)
    assert pair.a.steps == pair.b.steps == 40  # base_wan_27b.yml's num_inference_steps
    case = parse_case(pair.b.case)
    topology = case.topology()
    assert topology.num_devices == 8 and topology.devices_per_chip == 2  # v7x-8
    keys = setup_keys(pair.b.recipe)
    assert (keys["attention"], keys["ulysses_shards"], keys["ici_context_parallelism"],
            keys["ici_data_parallelism"]) == ("ulysses_ring", 2, 4, 2)
    setup = maxdiffusion_setup(case.workload, topology, **keys)
    degrees = {role: setup.candidate.degree(role) for role in ("cfg", "ulysses", "ring")}
    assert degrees == {"cfg": 2, "ulysses": 2, "ring": 2}
    assert setup.flags.name == "maxdiffusion-ulysses"
    # MaxDiffusion's README: "an intra-chip Ulysses axis and a cross-chip ring axis".
    roles = [axis.role for axis in setup.candidate.axes]
    grid = np.asarray(setup.placement.order).reshape([a.size for a in setup.candidate.axes])
    chip = topology.device_chip
    uly = np.moveaxis(grid, roles.index("ulysses"), -1).reshape(-1, 2)
    ring = np.moveaxis(grid, roles.index("ring"), -1).reshape(-1, 2)
    assert all(chip[a] == chip[b] for a, b in uly)
    assert all(chip[a] != chip[b] for a, b in ring)
    # Its Ulysses side is the README's v7x-8 Ulysses recipe on the T2V model (the README's
    # is I2V): the same setup, another program.
    readme = next(p for p in published.PAIRS if p.key == "README Ulysses ~10 % on v7x-8")
    assert pair.a.recipe == readme.b.recipe and pair.a.case != readme.b.case
    assert parse_case(pair.a.case).workload.model == "wan2.2-t2v-a14b"


def test_pr_452s_kernel_change_is_not_compared_but_each_run_is_checked_absolutely():
    pair = next(p for p in published.PAIRS if p.source == published.PR_452)
    assert pair.a.key == pair.b.key and pair.not_modelled and pair.runs_rebuilt
    seen = []
    result = _check([pair], step_of={published.ULYSSES_RING4: 2.6}, seen=seen)
    assert seen == [pair.a.key] and result.predictions.empty  # one program, no comparison
    assert result.comparisons["status"].iloc[0].startswith("not modelled")
    runs = result.runs.set_index("run")
    for run in (pair.a, pair.b):  # one prediction, each published time against it
        assert runs.at[run.label, "tpu_s"] == pytest.approx(40 * 2.6)
        assert runs.at[run.label, "tpu_error_pct"] == pytest.approx(
            (40 * 2.6 / run.published_s - 1) * 100)


def test_runs_that_are_not_rebuilt_ask_for_nothing_and_have_no_rows():
    batch2 = next(p for p in published.PAIRS if p.key.endswith("batch 2"))
    assert batch2.not_modelled and not batch2.runs_rebuilt
    seen = []
    result = _check([batch2], seen=seen)
    assert seen == [] and result.runs.empty


def test_pr_430s_inference_totals_check_the_denoise_pairs_prediction_with_n_left_in():
    loop, whole = (p for p in published.PAIRS if p.source == published.PR_430)
    assert loop.timed == published.DENOISE_LOOP and whole.timed == published.WHOLE_GENERATION
    assert published.prediction_key(loop) == published.prediction_key(whole)
    # Each run's inference total is its denoise total plus the rest of the generation.
    assert whole.a.published_s > loop.a.published_s and whole.b.published_s > loop.b.published_s
    result = _check([loop, whole], step_of={published.ULYSSES4: 3.0,
                                            published.ULYSSES_RING4: 2.7})
    rows = result.comparisons.set_index("measurement")
    assert rows.at[loop.key, "prediction"] == rows.at[whole.key, "prediction"] != ""
    assert len(result.predictions) == 1  # one prediction, two published pairs
    runs = result.runs.set_index(["measurement", "run"])
    # Only the whole generation leaves room for the decode (unknown here: no VAE predictor).
    assert runs.loc[(loop.key, "ulysses"), "decode_s"] == 0
    assert math.isnan(runs.loc[(whole.key, "ulysses"), "decode_s"])


def test_every_published_pair_keeps_its_source_and_the_section_says_what_was_fitted():
    sources = {published.PR_376, published.README, published.PR_430, published.PR_452}
    assert {p.source for p in published.PAIRS} == sources
    recipes = sorted({r.recipe for p in published.PAIRS for r in (p.a, p.b)})
    result = published.published_check(
        _fake_predictor({c: 1.0 + i / 10 for i, c in enumerate(recipes)}),
        topology_of=simulated)
    text = result.markdown()
    assert published.SECTION in text and "What was fitted and what was not" in text
    assert published.floor_summary(result.runs) in text
    assert all(url in text for url in sources)


# ----------------------------------------------------------------------------- calibration

SMALL = az.uncertainty.Ensemble(count=64)


def _drawing_predictor(draws_of):
    """Runs priced by their median step, with the given draws (one array per recipe)."""
    def run(runs):
        return {(case, recipe): published.RunPrediction(
            Predicted(float(np.median(draws_of[recipe])), 0.0,
                      float(np.median(draws_of[recipe]))), "order",
            draws=dict.fromkeys(az.uncertainty.KERNELS, draws_of[recipe]))
            for case, recipe in runs}
    return run


def _correlated_draws(count=SMALL.count):
    """Steps that share a wide common part (flash = Ulysses + 0.5 s; ring = flash - 0.125 s)
    and differ by little noise: a - b is narrow draw by draw, wide across independent
    quantiles."""
    rng = np.random.default_rng(1)
    base = rng.uniform(2.0, 4.0, count)
    flash = base + 0.5 + rng.normal(0.0, 0.05, count)
    return {FLASH: flash, ULYSSES: base + rng.normal(0.0, 0.05, count),
            RING: flash - 0.125 + rng.normal(0.0, 0.01, count)}


def _calibrated(draws_of, pairs=None, **kwargs):
    return published.published_check(_drawing_predictor(draws_of), gathers=[],
                                      pairs=_pairs() if pairs is None else pairs,
                                      topology_of=simulated, ensemble=SMALL, **kwargs)


def test_the_interval_and_the_quantile_are_read_from_the_draws():
    draws = np.arange(1.0, 101.0)
    above = published.interval(draws, 1000.0)
    assert above["quantile"] == 1.0 and not above["inside_80"]
    assert (above["p10"], above["p50"], above["p90"]) == pytest.approx(
        tuple(np.quantile(draws, [0.1, 0.5, 0.9])))
    assert published.interval(draws, 0.5)["quantile"] == 0.0
    middle = published.interval(draws, 30.5)
    assert middle["quantile"] == pytest.approx(0.3) and middle["inside_80"]
    assert not published.interval(draws, 5.0)["inside_80"]  # below p10 = 10.9
    # Through the check: a published difference above every draw of a - b.
    draws_of = _correlated_draws()
    pair = published.RunPair("far", "src", "", _run("flash", FLASH, 400.0),
                             _run("ulysses", ULYSSES, 280.0))
    table = _calibrated(draws_of, [pair]).calibration.table.set_index("kind")
    row = table.loc["difference"]
    assert row["published"] == 120.0 > (40 * (draws_of[FLASH] - draws_of[ULYSSES])).max()
    assert row["quantile"] == 1.0 and not row["inside_80"]
    assert row["point"] == pytest.approx(40 * (np.median(draws_of[FLASH])
                                               - np.median(draws_of[ULYSSES])))


def test_drivers_name_what_moves_the_draws_and_which_way_would_reach_a_value():
    frame = SMALL.draws_frame(simulated("v6e:2x4"))
    roofline = (frame["compute_model"] == "roofline").to_numpy()
    draws = -3.0 * frame["attention_efficiency"].to_numpy() + 0.01 * roofline
    found = published.drivers(draws, frame, SMALL)
    assert found[0].name == "attention_efficiency"
    assert found[0].effect == pytest.approx(-1.0, abs=0.05)
    assert found[0].toward(higher=True) == "attention_efficiency lower"
    choice = published.Driver("compute_model", 0.5, ("compiler", "roofline"))
    assert choice.toward(higher=True) == "compute_model toward roofline"
    assert choice.toward(higher=False) == "compute_model toward compiler"
    assert str(choice) == "compute_model (compiler -> roofline) +0.50"
    with pytest.raises(ValueError, match="draws"):
        published.drivers(draws[:10], frame, SMALL)


def test_a_pairs_interval_is_taken_draw_by_draw():
    draws_of = _correlated_draws()
    pair = _pairs()[0]  # flash 300 s - Ulysses 280 s over 40 steps each
    table = _calibrated(draws_of, [pair]).calibration.table.set_index("kind")
    a, b = draws_of[FLASH], draws_of[ULYSSES]
    paired = np.quantile(40 * (a - b), [0.1, 0.5, 0.9])
    row = table.loc["difference"]
    assert (row["p10"], row["p50"], row["p90"]) == pytest.approx(tuple(paired))
    assert row["inside_80"] and row["published"] == 20.0
    # Subtracting each run's own quantiles (as if drawn apart) spans the shared part too.
    apart = 40 * (np.quantile(a, 0.9) - np.quantile(b, 0.1)) - 40 * (
        np.quantile(a, 0.1) - np.quantile(b, 0.9))
    assert row["p90"] - row["p10"] < 0.1 * apart
    ratio = table.loc["ratio"]
    assert (ratio["p10"], ratio["p90"]) == pytest.approx(tuple(np.quantile(a / b, [0.1, 0.9])))
    # A whole-generation ratio is diluted toward 1: between 1 and the interval is allowed.
    assert ratio["inside_diluted"] == (1.0 <= ratio["published"] <= ratio["p90"])
    assert "diluted" in ratio["note"]


def test_coverage_counts_a_prediction_only_if_all_its_pairs_are_inside_and_only_independent():
    # x (flash - Ulysses = 20 s) inside, y (Ulysses - flash = -60 s) outside: one prediction,
    # not covered; z (ring - flash = -5 s) inside.
    result = _calibrated(_correlated_draws(), range_sources=())
    table = result.calibration.table
    differences = table[table["kind"] == "difference"].set_index("measurement")
    assert differences.at["x", "inside_80"] and not differences.at["y", "inside_80"]
    assert differences.at["z", "inside_80"]
    assert differences.at["x", "prediction"] == differences.at["y", "prediction"]
    coverage = result.calibration.coverage().set_index("check")
    assert coverage.at["differences", "inside"] == 1
    assert coverage.at["differences", "independent predictions"] == 2
    assert coverage.at["differences", "outside (independent)"] == differences.at["x",
                                                                                "prediction"]
    # Ratios may also hold between 1 and their interval (diluted), beside the 80 % count.
    ratios = table[table["kind"] == "ratio"]
    held = (ratios["inside_80"] | ratios["inside_diluted"].eq(True)).groupby(
        ratios["prediction"]).all()
    assert coverage.at["ratios", "inside or diluted (independent)"] == held.sum()
    assert coverage.at["ratios", "inside"] == ratios.groupby("prediction")["inside_80"].all().sum()
    # The range z's figure set: z's prediction checks nothing and leaves the counted coverage,
    # the count over all predictions keeps it.
    sources = [published.RangeSource("z", "attention_efficiency", "high")]
    dependent = _calibrated(_correlated_draws(), range_sources=sources).calibration
    rows = dependent.table.set_index("measurement")
    assert not rows.loc["z", "independent"].any() and rows.loc["x", "independent"].all()
    assert "attention_efficiency high end 0.72 (from z)" in rows.loc["z", "range_from"].iloc[0]
    coverage = dependent.coverage().set_index("check")
    assert (coverage.at["differences", "inside"],
            coverage.at["differences", "independent predictions"]) == (0, 1)
    assert (coverage.at["differences", "inside, all predictions"],
            coverage.at["differences", "all predictions"]) == (1, 2)
    assert "0 of 1 (differences)" in dependent.headline()
    assert "far too" not in coverage.at["differences", "verdict"]  # 0 of 1 is no evidence


@pytest.mark.parametrize(("inside", "n", "far"), [(0, 4, "too narrow"), (4, 5, None),
                                                  (5, 5, None), (0, 1, None), (40, 40, "too wide")])
def test_coverage_is_called_far_from_80_percent_only_on_evidence(inside, n, far):
    verdict = published.coverage_verdict(inside, n, 0.5)
    assert (far in verdict) if far else "far too" not in verdict
    assert "too wide to check much" in published.coverage_verdict(5, 5, 3.0)


def test_the_gathers_ensemble_is_comm_seconds_at_the_default_constants():
    collapsed = az.uncertainty.Ensemble(count=4, spreads=(), choices=())
    for m in published.GATHERS:
        collective, topo, placement = published.rebuild_gather(m, simulated(m.slice_name))
        expected = published.gather_prediction(m, comm_seconds([collective], topo, placement))
        assert published.gather_draws(m, topo, collapsed) == pytest.approx(np.full(4, expected))
    # Under the drawn ensemble the rows keep gather_rows' point and its prediction ids.
    result = published.published_check(_fake_predictor({}), pairs=[], topology_of=simulated,
                                        ensemble=SMALL)
    rows = result.calibration.table.set_index("prediction")
    points = result.gathers.set_index("prediction")["predicted"]
    assert rows["point"].to_dict() == pytest.approx(points.to_dict())
    assert set(rows["kind"]) == {"collective"} and not rows["independent"].any()


def test_the_ranges_published_figures_set_are_named_and_leave_their_predictions_out():
    keys = {m.key for m in published.GATHERS} | {p.key for p in published.PAIRS}
    assert {s.measurement for s in published.RANGE_SOURCES} <= keys
    assert {s.spread for s in published.RANGE_SOURCES} <= {s.name for s in az.uncertainty.SPREADS}
    with pytest.raises(ValueError, match=r"uncertainty\.SPREADS"):
        published.RangeSource("x", "no_such_constant", "low")
    # The README's ~20 s on v6e-8 set attention_efficiency's high end: its prediction (with
    # PR #376's batch 1, the same two runs) is not independent; the v7x-8 one is.
    recipes = sorted({r.recipe for p in published.PAIRS for r in (p.a, p.b)})
    rng = np.random.default_rng(2)
    draws_of = {r: 1.0 + i / 10 + rng.uniform(0, 0.01, SMALL.count)
                for i, r in enumerate(recipes)}
    result = published.published_check(_drawing_predictor(draws_of), topology_of=simulated,
                                        ensemble=SMALL)
    table = result.calibration.table.set_index("measurement")
    assert not table.loc["PR #376 v6e-8 flash / Ulysses, batch 1", "independent"].any()
    assert table.loc["README Ulysses ~10 % on v7x-8", "independent"].all()
    text = result.markdown()
    assert result.calibration.headline() in text and "ici_hop_latency" in text
    assert published.markdown_table(az.uncertainty.sources()) in text


def test_the_absolute_check_adds_maxdiffusions_decode_to_whole_generations_only():
    from tiny import priced_part

    decode_s = 4.0
    asked = []

    def vaes(cases):
        cases = list(cases)
        asked.extend(cases)
        return {c: {"decode": priced_part(_maxdiffusion_decode(c), decode_s)} for c in cases}

    loop = published.RunPair("loop", "src", "", _run("ulysses", ULYSSES, 100.0),
                             _run("flash", FLASH, 125.0), timed=published.DENOISE_LOOP)
    whole = published.RunPair("whole", "src", "", _run("flash", FLASH, 300.0),
                              _run("ulysses", ULYSSES, 280.0))
    step_of = {FLASH: 3.0, ULYSSES: 2.5}
    result = published.published_check(_fake_predictor(step_of), gathers=[],
                                        pairs=[loop, whole], topology_of=simulated,
                                        vaes=vaes)
    assert set(asked) == {CASE}  # the whole generations' slices only
    runs = result.runs.set_index(["measurement", "run"])
    # A whole generation: steps + the decode; its host time is what is left.
    row = runs.loc[("whole", "flash")]
    assert row["tpu_s"] == pytest.approx(40 * 3.0 + decode_s)
    assert row["host_left_s"] == pytest.approx(300.0 - row["tpu_s"])
    assert row["tpu_error_pct"] == pytest.approx((row["tpu_s"] / 300.0 - 1) * 100)
    assert row["vae_status"] == "ok" and row["video_encode_s"] == 0  # text-to-video
    # A denoise loop is the steps alone.
    assert runs.loc[("loop", "ulysses"), "tpu_s"] == pytest.approx(40 * 2.5)
    target = result.targets.iloc[-1]
    inside = sum(abs(e) <= published.ABSOLUTE_PERCENT
                 for e in result.runs.drop_duplicates(["run", "published_s"])["tpu_error_pct"])
    assert target["target"].startswith("absolute")
    assert target["value"].startswith(f"{inside} of 4 runs (")
    assert target["met"] == ("met" if inside == 4 else "missed")


def test_a_decode_that_did_not_compile_leaves_the_run_unchecked_and_says_why():
    from tiny import priced_part

    pair = published.RunPair("whole", "src", "", _run("flash", FLASH, 300.0),
                             _run("ulysses", ULYSSES, 280.0))
    prediction = _fake_predictor({FLASH: 3.0})([pair.a.key])[pair.a.key]
    failed = priced_part(_maxdiffusion_decode(CASE), math.nan)
    row = published.run_row(pair, pair.a, prediction, {"decode": failed})
    assert math.isnan(row["tpu_s"]) and row["vae_status"].startswith("decode: oom: RESOURCE")


def test_image_to_video_adds_maxdiffusions_encode_of_the_condition_video():
    from tiny import priced_part

    from aoizora_lab.parts import VideoEncodePart

    case = "wan2.2-i2v-a14b@1280x720x81/v6e:2x4"
    parsed = parse_case(case)
    vae = maxdiffusion_vae_parts(parsed.workload, parsed.topology())
    encode = vae["video_encode"]
    assert type(encode) is VideoEncodePart and encode.latent == vae["decode"].latent
    assert (encode.rows, encode.cols, encode.chunk) == (1, 8, 1)  # as MaxDiffusion's decode
    t2v = parse_case("wan2.2-t2v-a14b@1280x720x81/v6e:2x4")
    assert set(maxdiffusion_vae_parts(t2v.workload, t2v.topology())) == {"decode"}
    pair = published.RunPair("whole", "src", "", _run("flash", FLASH, 300.0),
                             _run("ulysses", ULYSSES, 280.0))
    prediction = _fake_predictor({FLASH: 3.0})([pair.a.key])[pair.a.key]
    priced = {"decode": priced_part(vae["decode"], 4.0),
              "video_encode": priced_part(encode, 1.5)}
    row = published.run_row(pair, pair.a, prediction, priced)
    assert row["tpu_s"] == pytest.approx(40 * 3.0 + 4.0 + 1.5)
    assert (row["decode_s"], row["video_encode_s"], row["vae_status"]) == (4.0, 1.5, "ok")
    priced["video_encode"] = priced_part(encode, math.nan)
    row = published.run_row(pair, pair.a, prediction, priced)
    assert math.isnan(row["tpu_s"]) and row["vae_status"].startswith("video_encode: oom")


def _maxdiffusion_decode(case):
    parsed = parse_case(case)
    return maxdiffusion_vae_parts(parsed.workload, parsed.topology())["decode"]


def test_maxdiffusions_decode_is_the_width_over_every_device_frame_by_frame():
    part = _maxdiffusion_decode("wan2.1-t2v-14b@1280x720x81/tpu7x:2x2x2")
    assert (part.latent, part.rows, part.cols, part.chunk, part.dtype, part.vae) == (
        (1, 16, 21, 90, 160), 1, 16, 1, "float32", "wan2.1")
    ti2v = _maxdiffusion_decode("wan2.2-ti2v-5b@1280x704x121/v6e:2x4")
    assert ti2v.vae == "wan2.2" and ti2v.latent == (1, 48, 31, 44, 80)


def test_a_vae_part_shared_by_several_runs_is_priced_once(monkeypatch):
    from tiny import priced_part

    from aoizora_lab import parts

    asked = []
    monkeypatch.setattr(parts, "price_part",
                        lambda part, topology, **_: asked.append(part) or priced_part(part, 1.0))
    cases = [f"{model}@1280x720x81/v6e:2x4" for model in
             ("wan2.1-t2v-14b", "wan2.2-t2v-a14b", "wan2.2-i2v-a14b")]
    vaes = published.vae_predictor()([*cases, "wan2.1-t2v-14b@832x480x81/v6e:2x4"])
    assert set(vaes) == {*cases, "wan2.1-t2v-14b@832x480x81/v6e:2x4"}
    # One latent, one decode; the I2V case adds its encode.
    assert len(asked) == 3 and vaes[cases[0]]["decode"] is vaes[cases[2]]["decode"]
    assert set(vaes[cases[2]]) == {"decode", "video_encode"}


def test_runs_of_one_program_are_one_prediction():
    # A Wan 2.2 T2V-A14B expert is Wan 2.1 T2V-14B's model: the same compiled program.
    t2v = published.Run("flash", "wan2.2-t2v-a14b@1280x720x81/tpu7x:2x2x1", published.FLASH4,
                        40, 1.0)
    wan21 = dataclasses.replace(t2v, case="wan2.1-t2v-14b@1280x720x81/tpu7x:2x2x1", steps=50)
    i2v = dataclasses.replace(t2v, case="wan2.2-i2v-a14b@1280x720x81/tpu7x:2x2x1")
    assert t2v.key == wan21.key == (wan21.case, published.FLASH4)
    assert i2v.key == (i2v.case, published.FLASH4)  # 36 channels in, no CLIP: its own program
    ring = [p for p in published.PAIRS if p.key.startswith("README v7x-8 Wan 2.")]
    assert len(ring) == 2 and published.prediction_key(ring[0]) == published.prediction_key(
        ring[1])


def test_each_published_run_draws_the_efficiency_of_the_kernel_it_ran():
    # The README's ring table ran Tokamax's kernels, PR #430's 2D ring MaxDiffusion's own;
    # flash and ulysses (PR #376, the Ulysses section) jax's splash.
    kernels = {(p.key, r.label): r.kernel for p in published.PAIRS for r in (p.a, p.b)}
    assert kernels[("README v7x-8 Wan 2.1 ring / flash", "ring")] == "tokamax"
    assert kernels[("README v7x-8 Wan 2.1 ring / flash", "flash")] == "tokamax"
    assert kernels[("PR #430 v7x-8 Ulysses / 2D ring (U=2, R=2)", "2D ring")] == "ring-custom"
    assert kernels[("PR #376 v6e-8 flash / Ulysses, batch 1", "flash")] == "splash"
    assert set(kernels.values()) <= set(az.uncertainty.KERNELS)
    with pytest.raises(ValueError, match=r"kernel='tokamax_flash'.*splash"):
        published.Run("x", CASE, FLASH, 40, 1.0, "tokamax_flash")
    # A pair of two kernels reads each run's own draws: tokamax steps twice the splash ones.
    draws_of = _correlated_draws()
    steps = {FLASH: draws_of[FLASH], ULYSSES: draws_of[ULYSSES]}

    def predictor(runs):
        return {(case, recipe): published.RunPrediction(
            Predicted(1.0, 0.0, 1.0), "order",
            draws={k: steps[recipe] * (2.0 if k == "tokamax" else 1.0)
                   for k in az.uncertainty.KERNELS}) for case, recipe in runs}

    pair = published.RunPair("k", "src", "", published.Run("flash", CASE, FLASH, 40, 300.0),
                             published.Run("ulysses", CASE, ULYSSES, 40, 280.0, "tokamax"))
    table = published.published_check(predictor, gathers=[], pairs=[pair], topology_of=simulated,
                                      ensemble=SMALL).calibration.table.set_index("kind")
    expected = np.median(40 * (steps[FLASH] - 2.0 * steps[ULYSSES]))
    assert table.loc["difference", "p50"] == pytest.approx(expected)
    # Its drivers name each kernel's efficiency apart.
    frame = published.kernel_frame(SMALL, simulated("v6e:2x4"), ("splash", "tokamax"))
    assert {"attention_efficiency (splash)", "attention_efficiency (tokamax)"} <= set(frame)
    assert "attention_efficiency" not in frame
    found = published.drivers(-frame["attention_efficiency (tokamax)"].to_numpy(), frame, SMALL)
    assert found[0].name == "attention_efficiency (tokamax)" and found[0].effect < -0.95
    text = published.pulls(["attention_efficiency (tokamax) lower, compute_model toward "
                            "roofline", "attention_efficiency (tokamax) higher"])
    assert "attention_efficiency (tokamax) (1 lower, 1 higher)" in text
    assert "compute_model (1 toward roofline)" in text
