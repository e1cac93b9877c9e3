"""The benchmark scripts and the report, on tiny configurations (so they cannot rot)."""

import importlib.util
import json
import math
import sys
from pathlib import Path

import pandas as pd
import pytest
from tiny import TINY, WORKLOAD

import aoizora_lab as az
from aoizora_lab import bench
from aoizora_lab.baselines import SYSTEMS
from aoizora_lab.candidates import enumerate_candidates
from aoizora_lab.cases import Case, parse_case
from aoizora_lab.cli import build_parser, main
from aoizora_lab.prune import MAX_FRACTION
from aoizora_lab.versions import code_versions

# 6 tokens, one pass: 7 valid candidates on 4 chips, so the exhaustive search stays short.
SMALL = az.Workload(model=TINY, height=32, width=48, frames=1, text_len=8, cfg=False)
EPS = 1e-9


def script(name):
    """Import ``benchmarks/<name>.py`` as a module."""
    path = Path(__file__).resolve().parents[1] / "benchmarks" / f"{name}.py"
    spec = importlib.util.spec_from_file_location(f"benchmark_{name}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def slice_2x2():
    return az.Topology.from_name("v5e:2x2", deviceless=True)


@pytest.fixture(scope="module")
def cache(tmp_path_factory):
    return tmp_path_factory.mktemp("cache")


@pytest.fixture(scope="module")
def quality(slice_2x2, cache):
    return script("plan_quality").run([Case(WORKLOAD, slice_2x2.name)], budget=300,
                                      cache_dir=cache)


@pytest.fixture(scope="module")
def cost(slice_2x2):
    return script("search_cost").run([Case(SMALL, slice_2x2.name)], budget=300)


@pytest.fixture(scope="module")
def throughput(slice_2x2, cache):
    return script("placement_throughput").run(
        500, cases=[(Case(WORKLOAD, slice_2x2.name), "cfg2-uly2")], cache_dir=cache)


@pytest.mark.slow
def test_plan_quality_compares_the_plan_with_every_existing_system(quality):
    row = quality.summary.iloc[0]
    assert row["status"] == "ok", row["status"]
    systems = row[[f"{b}_s" for b in SYSTEMS]].astype(float)
    assert systems.notna().all()  # every system builds on a 2x2 slice
    assert row["best_system"] == systems.idxmin()[:-2]
    # The headline: the search's own best against the systems; the plan recommended is
    # never slower than either.
    assert row["vs_best_system"] == pytest.approx(systems.min() / row["searched_s"])
    assert row["plan_s"] <= min(systems.min(), row["searched_s"]) * (1 + EPS)
    assert row["placement_gain_vs_plain"] == pytest.approx(row["plain_order_s"] / row["plan_s"])
    assert row["placement_gain_vs_plain"] >= 1 - EPS
    assert row["strategy_gain"] == pytest.approx(systems.min() / row["strategy_s"])
    assert row["strategy_s"] >= row["plan_s"] * (1 - EPS)  # plain order is one placement
    assert 0 < row["useful_tflops"] <= row["plan_tflops"] * (1 + EPS)
    chip = az.chip_spec("v5e")
    assert row["roofline_s"] == pytest.approx(row["useful_tflops"] * 1e12
                                              / (4 * chip.peak_bf16_flops))
    assert row["roofline_ratio"] >= 1 - EPS  # no prediction beats the roofline
    assert row["bound"] in ("compute", "communication")
    # How sure: the headline's interval brackets the draws' median, the odds are a share.
    assert row["vs_best_system_p10"] <= row["vs_best_system_p90"]
    assert row["searched_p10_s"] <= row["searched_p90_s"]
    assert 0 <= row["p_plan_faster"] <= 1
    slack = 1 / 256  # the quantiles interpolate between draws
    if row["vs_best_system_p10"] > 1:  # 90 % of draws faster at least
        assert row["p_plan_faster"] >= 0.9 - slack
    if row["vs_best_system_p90"] < 1:
        assert row["p_plan_faster"] <= 0.1 + slack
    assert row["robust_choice"] and row["median_winner"] and row["least_regret_choice"]
    # The robust choice has the lowest 90th percentile, so it never loses there to the plan.
    assert row["robust_p90_change"] <= 1e-12
    assert (row["robust_median_change"] == 0) == (row["robust_p90_change"] == 0)
    section = quality.markdown()
    assert "**The robust choice.**" in section and "p_plan_faster" in section
    assert set(quality.targets["met"]) <= {"met", "missed", "n/a"}
    assert len(quality.targets) == 2
    assert list(quality.baselines["baseline"]) == list(SYSTEMS)
    assert set(quality.trials["baseline"]) == set(SYSTEMS)
    assert quality.trials.groupby("baseline")["chosen"].sum().eq(1).all()


def test_quick_plans_refuse_a_bad_time_limit_before_planning(monkeypatch):
    monkeypatch.setattr(bench.quick, "_measure", lambda *a, **k: pytest.fail("planned"))
    for bad in ([0], [300, -1], [float("inf")], [True]):
        with pytest.raises(az.AoizoraError, match=r"time_limits=.*positive number of seconds"):
            bench.quick_plans(["wan2.1-t2v-1.3b@832x480x81/v5e:2x2"], time_limits=bad)


@pytest.mark.slow
def test_quick_plans_price_a_compile_budget_against_the_full_search(cost, slice_2x2):
    # After the search-cost fixture, whose compiles the full search reads back.
    quick = script("quick_plans").run([Case(SMALL, slice_2x2.name)], budget=300, max_k=3,
                                      time_limits=[1e-3])  # over after the first round
    full = quick.full.iloc[0]
    assert full["status"] == "ok" and full["full_compiles"] >= 1
    assert full["plan_s"] == pytest.approx(cost.summary.iloc[0]["plan_s"])
    budgets = quick.budgets
    assert list(budgets["max_compiled"]) == list(range(1, len(budgets) + 1))
    assert 1 <= len(budgets) <= 3 and (budgets["status"] == "ok").all()
    # Fewer programs to choose from, the same search: never better than the full search's
    # own best, which is what the regret is taken against (a quick plan compiles no system).
    assert full["searched_s"] >= full["plan_s"] - 1e-12
    assert (budgets["regret_percent"] >= -1e-6).all()
    assert budgets["regret_percent"].to_numpy() == pytest.approx(
        100 * (budgets["plan_s"].to_numpy() / full["searched_s"] - 1))
    assert (budgets["compiles"] >= budgets["max_compiled"]).all()
    exact = budgets.index[budgets["regret_percent"] <= 1e-9]
    timed = budgets.index[budgets["cold_s"].notna()]
    if len(exact):  # the first budget that found the full plan is timed cold, and the one before
        assert list(timed) == [i for i in (exact[0] - 1, exact[0]) if i >= 0]
        assert (budgets.loc[timed, "cold_s"] > 0).all()
    else:
        assert timed.empty
    timed = quick.timed.iloc[0]
    assert len(quick.timed) == 1 and timed["time_limit_s"] == 1e-3 and timed["cold_s"] > 0
    assert timed["compiled"] >= 1 and timed["regret_percent"] >= -1e-6
    assert timed["regret_percent"] == pytest.approx(100 * (timed["plan_s"] / full["plan_s"] - 1))
    # The systems share the limit: after the first round, their other setups are left out.
    partial = timed["systems_partial"].split(", ")
    assert timed["unstarted"] >= 1 and set(partial) <= set(SYSTEMS) and partial[0] != "none"
    assert math.isnan(timed["vs_best_system"]) or timed["vs_best_system"] > 0
    targets = quick.targets
    assert timed["warm_s"] > 0
    assert list(targets["met"]) == [  # a 1 ms limit cannot hold: the first round compiles
        "missed", "met" if timed["regret_percent"] <= 1e-9 else "missed",
        "met" if timed["warm_s"] <= bench.WARM_TARGET_S else "missed"]
    text = quick.markdown()
    assert text.startswith("## Quick plans") and "max_compiled" in text
    assert "time_limit_s" in text and "unstarted" in text and "ends within it" in text


@pytest.mark.slow
def test_search_cost_compares_pruned_and_exhaustive_search(cost):
    row = cost.summary.iloc[0]
    assert row["status"] == "ok" and row["exhaustive_status"] == "ok"
    # Warm reuses every compile the cold run made (what makes it fast; the wall times are
    # the benchmark's to report, not a test's to race).
    assert row["warm_all_cached"] and row["warm_s"] > 0 and row["cold_s"] > 0
    assert row["enumerated"] >= row["valid"] == row["ir_traced"] >= row["compiled"] >= 1
    assert row["compiled_fraction"] == pytest.approx(row["compiled"] / row["valid"])
    assert row["compile_s"] > 0 and row["exhaustive_compile_s"] >= row["compile_s"] * 0.5
    # The cold run's compiles were kept for the exhaustive search, which read them back.
    assert row["compiles"] <= row["exhaustive_cached"] <= len(cost.candidates)
    assert row["regret_percent"] >= -EPS
    assert row["exhaustive_best_s"] <= row["plan_s"] * (1 + EPS)
    assert -1 <= row["kendall_tau"] <= 1
    if row["top1_equal"]:
        assert row["regret_percent"] == pytest.approx(0, abs=1e-6)
    candidates = cost.candidates
    flag_sets = candidates["flags"].nunique()  # one row per candidate and flag set
    assert len(candidates) == row["valid"] * flag_sets
    # Further flag sets only for candidates whose compute could still win (planner).
    assert row["compiled"] <= row["compiles"] <= row["compiled"] * flag_sets
    assert candidates["kept"].sum() == row["compiled"] * flag_sets
    assert candidates["best_total_s"].dropna().is_monotonic_increasing
    assert set(cost.targets["met"]) <= {"met", "missed", "n/a", "cap"}
    assert len(cost.targets) == 4
    # The share compiled is pruning's cap (rule 4, or the `keep` best where that is more).
    assert list(cost.targets["met"]).count("cap") == 1
    assert row["compiled"] <= max(3, math.ceil(MAX_FRACTION * row["valid"]))


@pytest.mark.slow
def test_placement_throughput_scores_placements(throughput):
    row = throughput.iloc[0]
    assert row["status"] == "ok"
    assert row["evaluated"] >= 500 and row["placements/s"] > 0 and row["whole placements/s"] > 0
    assert row["structures"] <= row["hlo collectives"]
    assert row["compile_s"] > 0 and row["compile host_gib"] > 0.1  # jax alone is more
    assert 0 < row["lower bound_s"] <= row["best exposed_s"] and row["gap"] >= 1
    assert row["predict_s"] > 0 and row["ensemble_s"] > 0


def test_throughput_targets_check_each_chip_count():
    from aoizora_lab.bench.throughput import THROUGHPUT_TARGETS, throughput_targets

    (small, least_small), (large, least_large) = sorted(THROUGHPUT_TARGETS.items())
    table = pd.DataFrame({"chips": [8, small, large],
                          "placements/s": [1.0, least_small * 1.01, least_large * 0.99]})

    def verdicts(frame):
        targets = throughput_targets(frame)
        return {int(t.split()[-2]): m
                for t, m in zip(targets["target"], targets["met"], strict=True)}

    assert verdicts(table) == {small: "met", large: "missed"}
    # A chip count whose row failed (no rate) misses its target instead of passing unseen.
    failed = table.assign(**{"placements/s": [1.0, math.nan, least_large * 2]})
    assert verdicts(failed) == {small: "missed", large: "met"}
    assert "no result" in set(throughput_targets(failed)["value"])


@pytest.mark.slow
def test_compile_survivors_prices_every_survivor(quality, slice_2x2, cache):
    # After the plan-quality fixture, whose planner pruned and compiled the same survivors.
    table = script("compile_survivors").survivors(Case(WORKLOAD, slice_2x2.name),
                                                  cache_dir=cache)
    assert len(table) >= 1 and (table["status"] == "ok").all(), table["message"].tolist()
    assert table["cached"].all()
    assert (table["tflops"] > 0).all() and (table["compute_s"] > 0).all()
    # The overlap rule: the step is at least its compute, at most compute + communication.
    assert (table["step_s_compact"] >= table["compute_s"] * (1 - EPS)).all()
    assert (table["step_s_compact"]
            <= (table["compute_s"] + table["comm_s_compact"]) * (1 + EPS)).all()


@pytest.mark.slow
def test_ir_vs_compiled_pairs_every_candidate(slice_2x2, cache, capsys):
    table = script("ir_vs_compiled").compare(Case(SMALL, slice_2x2.name), layers=1,
                                             cache_dir=cache)
    names = {c.name for c in enumerate_candidates(SMALL, slice_2x2)}
    assert set(table["candidate"]) == names and len(table) == len(names)
    assert (table["status"] == "ok").sum() >= 2
    assert table["ir_estimate_s"].is_monotonic_increasing
    assert (table[["ir_comm_gb", "compiled_comm_gb"]].dropna() >= 0).all().all()
    out = capsys.readouterr().out
    assert "1 layers" in out and "rank correlation IR vs compiled comm bytes" in out


@pytest.mark.slow
def test_bench_command_writes_the_report(quality, cost, throughput, slice_2x2, cache,
                                         tmp_path, monkeypatch, capsys):
    # The tiny case instead of the real matrix; the cache the fixtures filled keeps it short
    # (search cost always starts cold, so its section is checked from the fixture's tables).
    monkeypatch.setattr(bench, "QUICK_MATRIX", (Case(WORKLOAD, slice_2x2.name),))
    monkeypatch.setattr(bench, "THROUGHPUT_CASES",
                        ((Case(WORKLOAD, slice_2x2.name), "cfg2-uly2"),))
    out = tmp_path / "reports" / "benchmarks.md"
    assert main(["bench", "--quick", "--out", str(out), "--cache-dir", str(cache), "--quiet",
                 "--only", "plan-quality", "placement-throughput"]) == 0
    text = out.read_text()
    assert text.startswith("# AoiZora Lab benchmarks\n")
    assert (f"`aoizora-lab bench --quick --out {out} --only plan-quality "
            f"placement-throughput --cache-dir {cache}`") in text
    for heading in ("## Plan quality", "## Placement throughput"):
        assert f"\n{heading}\n" in text
    assert "**jax**: " in text and "**libtpu**: " in text and " cores, " in text
    assert "| workload | slice | status | record | ici_model | candidate |" in text
    assert "custom@48x32x5" in text
    assert "| target | value | met |" in text
    assert capsys.readouterr().out.endswith(f"report written to {out}\n")
    section = cost.markdown()
    assert section.startswith("## Search cost\n") and "| regret 0 % |" in section
    assert "\n## Search cost\n" in bench.render_report([quality.markdown(), section])


def test_a_report_regenerated_in_part_keeps_its_other_sections(tmp_path):
    path = tmp_path / "benchmarks.md"
    full = bench.ReportFile(path)
    for title, body in (("Plan quality", "old plans"), ("Search cost", "old search")):
        full.add(f"## {title}\n\n{body}\n")
    part = bench.ReportFile(path, keep=True, command="python benchmarks/plan_quality.py")
    part.add("## Plan quality\n\nnew plans\n")
    part.add("## Published measurements\n\nrows\n")
    text = path.read_text()
    assert "old search" in text and "old plans" not in text and "new plans" in text
    assert text.index("## Plan quality") < text.index("## Search cost") < text.index(
        "## Published measurements")  # replaced in place, new ones after
    assert text.count("_Regenerated on ") == 2
    # Each part says which code made it (the header says it for the whole).
    code = code_versions("aoizora_lab.bench")["code"]
    assert text.count(f"(code `{code}`, jax ") == 2 and f"- **code**: {code}" in text
    with pytest.raises(az.AoizoraError, match="'Plan quality'"):
        part.add("Plan quality\n")


def test_two_runs_writing_one_report_keep_each_others_sections(tmp_path):
    path = tmp_path / "benchmarks.md"
    quality = bench.ReportFile(path, keep=True, command="aoizora-lab bench --only plan-quality")
    throughput = bench.ReportFile(path, keep=True, command="python benchmarks/throughput.py")
    quality.add("## Plan quality\n\ncase 1\n")
    throughput.add("## Placement throughput\n\nall chips\n")
    quality.add("## Plan quality\n\ncases 1 and 2\n")  # started before the other wrote
    text = path.read_text()
    assert "all chips" in text and "cases 1 and 2" in text and "case 1\n" not in text


def test_failed_cases_are_rows_not_crashes():
    quality = bench.plan_quality(["wan2.1-t2v-14b@1080p/v5e:2x2"])
    assert quality.summary.iloc[0]["status"].startswith("error: AoizoraError")
    assert quality.targets.iloc[0]["met"] == "missed"
    assert "## Plan quality" in quality.markdown()
    cost = bench.search_cost(["wan2.1-t2v-14b/v5e:2x2"])
    assert "MODEL@WIDTHxHEIGHT" in cost.summary.iloc[0]["status"]
    assert cost.targets.iloc[0]["met"] == "missed"
    assert "did not run (no planner run)" in cost.markdown()


def test_markdown_table_formats_numbers_and_escapes_cells():
    frame = pd.DataFrame({"name": ["a | b", "c"], "seconds": [1.23456789, math.nan],
                          "ok": [True, False], "count": [3, 40]})
    assert bench.markdown_table(frame).splitlines() == [
        "| name | seconds | ok | count |",
        "|---|---:|---|---:|",
        "| a \\| b | 1.235 | yes | 3 |",
        "| c | – | no | 40 |",
    ]


def test_cases_and_the_bench_command_line():
    case = parse_case("wan2.1-t2v-14b@720p/v5e:4x4")
    assert case.name == "wan2.1-t2v-14b@1280x720x81/v5e:4x4" and case.name in bench.DEFAULT_MATRIX
    with pytest.raises(az.AoizoraError, match="WORKLOAD/SLICE"):
        parse_case("wan2.1-t2v-14b@720p")
    args = build_parser().parse_args(["bench", "--quick", "--out", "x.md"])
    assert args.quick and args.out == "x.md" and not args.skip_exhaustive
    with pytest.raises(az.AoizoraError, match="Unknown benchmarks"):
        bench.run_all(only=["speed"])
    args = build_parser().parse_args(["bench", "--cases", "wan2.1-t2v-1.3b@480p/v5e:2x4",
                                      "--search-cases", "wan2.1-t2v-1.3b@480p/v5e:2x2"])
    assert args.cases == ["wan2.1-t2v-1.3b@480p/v5e:2x4"]
    assert args.search_cases == ["wan2.1-t2v-1.3b@480p/v5e:2x2"]
    with pytest.raises(az.AoizoraError, match="WORKLOAD/SLICE"):
        bench.run_all(only=["plan-quality"], cases=["v5e:2x4"])  # refused before any work


def test_an_interrupted_bench_keeps_the_benchmarks_that_finished(tmp_path, monkeypatch):
    class Finished:
        def markdown(self):
            return "## Plan quality\n\nfinished table\n"

    def interrupted(*_, **__):
        raise KeyboardInterrupt

    monkeypatch.setattr(bench, "plan_quality", lambda *_, **__: Finished())
    monkeypatch.setattr(bench, "search_cost", interrupted)
    out = tmp_path / "benchmarks.md"
    with pytest.raises(KeyboardInterrupt):
        bench.run_all(quick=True, out=out, only=["plan-quality", "search-cost"])
    text = out.read_text()
    assert "## Plan quality\n\nfinished table" in text and "## Search cost" not in text


def test_bench_refuses_a_bad_case_before_any_benchmark_runs(tmp_path, monkeypatch):
    def must_not_run(*_, **__):
        raise AssertionError("a benchmark ran before every case spec was checked")

    monkeypatch.setattr(bench, "plan_quality", must_not_run)
    out = tmp_path / "reports" / "benchmarks.md"
    with pytest.raises(az.AoizoraError, match="WORKLOAD/SLICE"):
        bench.run_all(out=out, only=["plan-quality", "search-cost"], search_cases=["v5e:2x4"])
    assert not out.parent.exists()


@pytest.mark.parametrize("name, argv", [
    ("plan_quality", ["--cases", "v5e:2x4"]),
    ("search_cost", ["--cases", "v5e:2x4"]),
    ("quick_plans", ["--cases", "v5e:2x4"]),
    ("compile_survivors", ["--cases", "v5e:2x4"]),
    ("ir_vs_compiled", ["--cases", "v5e:2x4"]),
    ("placement_throughput", ["--case", "v5e:2x4", "cfg2-uly4"]),
])
def test_the_scripts_refuse_a_bad_case_spec_with_its_fix(name, argv, monkeypatch, capsys):
    monkeypatch.setattr(sys, "argv", [f"{name}.py", *argv])
    with pytest.raises(SystemExit) as exited:
        script(name).main()
    assert exited.value.code == 2  # argparse's usage error, before any work
    assert "'v5e:2x4' must be WORKLOAD/SLICE, e.g. 'wan2.1-t2v-14b" in capsys.readouterr().err


@pytest.mark.slow
def test_plan_quality_records_each_case_and_resumes_from_the_records(quality, slice_2x2, cache,
                                                                      tmp_path, monkeypatch):
    case = Case(WORKLOAD, slice_2x2.name)
    first = bench.plan_quality([case], budget=300, cache_dir=cache, records=tmp_path)
    (record,) = tmp_path.glob("*.json")
    assert record.name == bench.quality.record_name(WORKLOAD.name, slice_2x2.name)
    assert ":" not in record.name and "@" not in record.name

    def must_not_plan(*_, **__):
        raise AssertionError("a recorded case was planned again")

    monkeypatch.setattr(bench.quality, "_quality_row", must_not_plan)
    again = bench.plan_quality([case], budget=300, records=tmp_path, resume=True)
    for table in ("summary", "baselines", "trials"):
        pd.testing.assert_frame_equal(getattr(first, table), getattr(again, table),
                                      check_dtype=False)
    assert "cases read from records = 1 (planned " in again.markdown()
    assert "cases read from records" not in first.markdown()
    # Records only: nothing planned; a case without a record says so.
    assembled = bench.plan_quality([case, "wan2.1-t2v-1.3b@832x480x81/v5e:2x4"], budget=300,
                                   records=tmp_path, resume=True, plan_missing=False)
    assert list(assembled.summary["status"]) == [
        "ok", "not run yet (no record at this depth and budget)"]
    assert "cases done = 1 of 2" in assembled.markdown()
    # Another budget is another experiment: planned again (here: the guard above fails it).
    other = bench.plan_quality([case], budget=301, records=tmp_path, resume=True)
    assert other.summary.iloc[0]["status"].startswith("error: AssertionError")
    assert len(list(tmp_path.glob("*.json"))) == 1  # a failed case is not recorded
    # A record knows the ICI model and code that priced it; one made by other code is shown
    # as stale with its date, and planned again by a resumed run.
    assert list(first.summary["record"]) == list(again.summary["record"]) == ["current"]
    stored = json.loads(record.read_text())
    assert stored["ici_model"] == bench.quality.ici_model()
    assert set(stored["code"]) >= {"jax", "libtpu", "code"}
    assert stored["code"]["code"].startswith("aoizora_lab.bench.quality@")
    assert first.summary.iloc[0]["ici_model"] == az.ModelOptions().order
    assert "| ici_model |" in first.markdown()
    del stored["ici_model"]  # as records were written before the model saw device orders
    stored["code"]["code"] = "aoizora_lab.bench.quality@0000"  # and by other code
    record.write_text(json.dumps(stored))
    old = bench.plan_quality([case], budget=300, records=tmp_path, resume=True,
                             plan_missing=False)
    assert old.summary.iloc[0]["ici_model"] == "physical"
    assert old.summary.iloc[0]["record"] == f"stale: planned {stored['date'][:10]}"
    assert first.summary.iloc[0]["speedup_target"] in ("met", "missed", "n/a")
    assert old.summary.iloc[0]["speedup_target"] == "stale"  # not a target of today's code
    assert "| record |" in old.markdown()
    replanned = bench.plan_quality([case], budget=300, records=tmp_path, resume=True)
    assert replanned.summary.iloc[0]["status"].startswith("error: AssertionError")


@pytest.mark.slow
def test_interactive_speed_times_the_main_job_cold_then_every_notebook_warm(tmp_path):
    matrix = tmp_path / "reports.yaml"
    matrix.write_text("reports:\n"
                      "  - {name: small, notebooks: [heatmap], parameters: {rows: 3}}\n"
                      "  - {name: big, notebooks: [heatmap], default: false}\n")
    before = az.versions.cache_root()
    table = bench.interactive_speed(matrix, Path(__file__).parent / "data", progress=False)
    assert az.versions.cache_root() == before  # the empty cache was only for the run
    assert table[["report", "notebook"]].values.tolist() == [["small", "heatmap"]]
    assert (table[["cold_s", "warm_s"]] > 0).all().all()
    assert table[["cold_status", "warm_status"]].values.tolist() == [["ok", "ok"]]
    text = bench.interactive_markdown(table)
    assert text.startswith("## Interactive speed") and "| small | heatmap |" in text
    assert "main job <= 600 s on empty caches" in text and "Every notebook ran." in text



@pytest.mark.slow
def test_device_order_plan_rows_search_and_price_each_plan_under_every_order_model(
        quality, slice_2x2, cache):
    from aoizora_lab.bench.order import plan_rows

    rows = plan_rows([Case(WORKLOAD, slice_2x2.name)], num_layers=None, budget=300,
                     cache_dir=cache)
    (row,) = rows.to_dict("records")
    assert row["candidate"] == quality.summary.iloc[0]["candidate"]  # the same plan
    for model in az.comm_model.ORDER_MODELS:
        # The search's best under a model is never slower than plain order under it.
        assert row[f"{model}: vs plain"] >= 1 - 1e-9
    assert 0 <= row["their share of comm"] <= 1
    assert row["collectives following their order"] >= 0


def test_the_generation_rows_compare_absolute_seconds_and_count_the_targets():
    import math

    from tiny import priced_part

    from aoizora_lab.bench.generation import (
        MEASUREMENTS,
        TARGET_PCT,
        GenerationCheck,
        measurement_row,
        targets,
    )

    m = MEASUREMENTS[0]
    near = measurement_row(m, priced_part(m.part, m.published_s * (1 + TARGET_PCT / 200)), None)
    far = measurement_row(m, priced_part(m.part, m.published_s * (1 + 2 * TARGET_PCT / 100)),
                          None)
    failed = measurement_row(MEASUREMENTS[-1], priced_part(MEASUREMENTS[-1].part, math.nan),
                             None)
    assert near["error_pct"] == pytest.approx(TARGET_PCT / 2)
    assert (near["within_target"], far["within_target"], failed["within_target"]) == (
        "yes", "no", "–")
    assert "RESOURCE_EXHAUSTED" in failed["note"]
    frame = pd.DataFrame([near, far, failed])
    table = targets(frame).set_index("rows")
    assert table.loc["primary (MaxDiffusion's configs)", f"within ±{TARGET_PCT:g} %"] == "1 of 2"
    assert table.loc["all", "priced"] == "2 of 3" and (table["met"] == "missed").all()
    assert "## Generation" in GenerationCheck(frame, targets(frame)).markdown()


def test_the_plan_quality_targets_count_only_cases_planned_by_todays_code():
    from aoizora_lab.bench.quality import SPEEDUP_TARGET, quality_targets

    rows = pd.DataFrame([
        {"workload": "a", "slice": "v5e:2x4", "status": "ok", "record": "current",
         "vs_best_system": 1.0, "bound": "compute", "roofline_ratio": 1.2},
        {"workload": "b", "slice": "v5e:8x8", "status": "ok",
         "record": "stale: planned 2026-12-04", "vs_best_system": 2 * SPEEDUP_TARGET,
         "bound": "compute", "roofline_ratio": 9.0}])
    targets = quality_targets(rows).set_index("target")["met"].tolist()
    values = quality_targets(rows)["value"].tolist()
    # The stale row would meet the speedup target and miss the roofline one: neither counts.
    assert targets == ["missed", "met"], values
    assert all(v.endswith("; 1 stale cases not counted") for v in values)
    assert quality_targets(rows.iloc[:1])["value"].str.contains("stale").sum() == 0


def test_the_robust_note_names_where_the_plan_is_not_the_robust_choice():
    a, b = "cfg2-uly4 (default)", "uly8 (maxdiffusion-ulysses)"
    robust = pd.DataFrame([
        {"workload": "w1", "slice": "s1", "median_winner": a, "robust_choice": a,
         "least_regret_choice": a, "plan": a},
        {"workload": "w2", "slice": "s2", "median_winner": a, "robust_choice": b,
         "least_regret_choice": a, "plan": a},
        {"workload": "w3", "slice": "s3", "median_winner": None, "robust_choice": None,
         "least_regret_choice": None, "plan": b}])  # no ensemble: not assessed
    note = bench.quality._robust_differs(robust)
    assert "They differ on 1 of 2 cases assessed: w2 on s2." in note
    assert "The plan recommended is not the robust choice on 1: w2 on s2." in note
    agreeing = bench.quality._robust_differs(robust.iloc[:1])
    assert "agree on all 1" in agreeing and "robust choice on all 1" in agreeing


def test_a_kept_section_made_by_other_code_says_it_is_stale(tmp_path, monkeypatch):
    path = tmp_path / "benchmarks.md"
    bench.ReportFile(path).add("## Plan quality\n\nrows\n")  # a report to keep sections of
    report = bench.ReportFile(path, keep=True, command="aoizora-lab bench --only search-cost")
    today = bench.report.code_versions
    search = today("aoizora_lab.bench.search")["code"]
    # The search-cost section as other code made it (its module's digest then):
    monkeypatch.setattr(bench.report, "code_versions", lambda module: {
        **today(module), "code": f"{module}@0000"})
    report.add("## Search cost\n\nold rows\n", module="aoizora_lab.bench.search")
    monkeypatch.setattr(bench.report, "code_versions", today)
    report.add("## Placement throughput\n\nrows\n", module="aoizora_lab.bench.throughput")
    text = path.read_text()
    assert text.count("**Stale:** ") == 1  # the search-cost section only
    note = text[text.index("**Stale:** "):].split("\n")[0]
    assert "`aoizora_lab.bench.search@0000`" in note and f"`{search}`" in note
    assert "`aoizora-lab bench --only search-cost`" in note
    assert text.index("## Search cost") < text.index(note) < text.index("old rows")
    report.add("## Placement throughput\n\nrows again\n")  # another write: one note still
    assert path.read_text().count("**Stale:** ") == 1
    report.add("## Search cost\n\nnew rows\n", module="aoizora_lab.bench.search")  # current
    text = path.read_text()
    assert "**Stale:** " not in text and "new rows" in text and "\n\n\n" not in text
    assert f"(code `{search}`, jax " in text
    assert bench.report.stale_note("## Search cost\n\nno stamp\n") is None
    older = "## Quick plans\n\n_Regenerated on 2026-12-05 20:55 UTC by `x --only quick`._\n"
    assert "before sections recorded the code" in bench.report.stale_note(older)
    gone = "## X\n\n_Regenerated on 2026 by `x` (code `aoizora_lab.gone@1`, jax 0)._\nrows"
    assert "today's is `none`" in bench.report.stale_note(gone)
    # The note goes in its own paragraph even where the body follows the stamp at once.
    assert bench.report._marked(gone).split("\n")[3:6] == [
        "", bench.report.stale_note(gone), ""]
