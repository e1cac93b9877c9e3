"""The six notebooks, run headless through papermill with small parameters, and what they call
that no other test covers (``Plan.compiled_program``, notebook 5's check)."""

import re
import struct
from pathlib import Path

import jax
import numpy as np
import pytest
from browser import chromium, js_errors, require_chromium

import aoizora_lab as az
from aoizora_lab.candidates import Candidate, explain_candidates
from aoizora_lab.compile import compile_candidates
from aoizora_lab.cost import Predicted
from aoizora_lab.notebook import notebook_inputs
from aoizora_lab.placement import Placement
from aoizora_lab.realize import Plan, compare_realised
from aoizora_lab.reports import ReportSpec, run_reports, write_index

NOTEBOOKS = Path(__file__).resolve().parents[1] / "notebooks"
# Real Wan sizes take long to trace and compile: a 128 x 128 video of 5 frames on 4 chips.
SMALL = {"case": "wan2.1-t2v-1.3b@128x128x5/v5e:2x2", "layers": 2, "budget": 300}


@pytest.fixture(scope="module")
def report(tmp_path_factory):
    out = tmp_path_factory.mktemp("reports")
    result = run_reports([ReportSpec("small", parameters=SMALL)], NOTEBOOKS, out,
                         progress=False)
    write_index(result, out)
    return result, out


@pytest.mark.slow
def test_every_notebook_runs_and_saves_values_the_library_agrees_with(report):
    result, _ = report
    assert result.failed == 0, result.to_frame().to_string()
    records = {run.notebook: run.records for run in result.runs}
    inputs = notebook_inputs(case=SMALL["case"])
    space = explain_candidates(inputs.workload, inputs.topology)
    table = space.to_frame()
    assert records["01_candidates"]["combinations"] == len(table)
    assert records["01_candidates"]["valid_candidates"] == int(table["valid"].sum())
    assert records["01_candidates"]["exclusion_reasons"] == len(
        {reason for option in space for reason in option.reasons})
    pruning = records["02_ir_pruning"]
    assert pruning["traced_candidates"] == int(table["valid"].sum())
    assert 1 <= pruning["kept_candidates"] < pruning["traced_candidates"]
    assert pruning["best_estimate_s"] > 0
    compiles = records["03_compile"]
    # The plan's compiles: every survivor's first flag set, run or left out by the limit,
    # beside the systems' setups.
    assert compiles["compiled"] + compiles["not_run"] >= pruning["kept_candidates"]
    assert 1 <= compiles["compiled_ok"] <= compiles["compiled"]
    assert compiles["search"] == "time limit 300 s"  # the notebooks' default, as the CLI's
    ranking = records["04_placement_ranking"]
    # The search's own best against the systems (below 1 where a system wins); the two
    # ablations (the plan's program in plain order, the best survivor in plain order) beside.
    # Known unless the limit left a system's setup that could win uncompiled (a loaded machine).
    assert (ranking["speedup_over_best_existing_system"] is None) == bool(
        ranking["systems_not_known"])
    assert ranking["systems_not_known"] or ranking["speedup_over_best_existing_system"] > 0
    assert ranking["placement_gain_vs_plain"] > 0
    assert ranking["strategy_gain"] > 0
    assert ranking["best_flags"]
    assert ranking["predicted_step_s"] > 0
    # How sure: the odds against the best system (None only where none was priced) and a
    # robust choice among the compiled programs.
    odds = ranking["p_plan_faster_than_best_system"]
    assert odds is None or 0 <= odds <= 1
    assert ranking["robust_choice"]
    assert 0 < ranking["predicted_step_p10_s"] <= ranking["predicted_step_p90_s"]
    assert (ranking["speedup_p10"] is None) == (odds is None)
    assert odds is None or 0 < ranking["speedup_p10"] <= ranking["speedup_p90"]
    realised = records["05_realize_and_measure"]
    assert realised["plan_candidate"] == ranking["best_candidate"]
    assert realised["realised_collectives_match"] is True
    assert realised["platform"] == "cpu"
    video = records["06_generation"]
    # The whole video around the same plan: the official steps, every part priced.
    assert video["steps"] == az.models.wan.SAMPLING["wan2.1-t2v-1.3b"].steps
    assert video["expert_steps"] == [video["steps"], 0]
    assert video["total_s"] == pytest.approx(video["encode_s"] + video["decode_s"]
                                             + video["steps"] * ranking["predicted_step_s"])
    assert video["decode_split"] and video["decode_splits_tried"] >= 1


@pytest.mark.slow
def test_pages_carry_the_heatmaps_offline(report):
    _, out = report
    page = (out / "small" / "04_placement_ranking.html").read_text()
    assert "bytes per link per step" in page and "customdata" in page  # the torus heatmap
    assert "Plotly.newPlot" in page and "../assets/plotly.min.js" in page
    assert "How sure: each option" in page  # the bands of every option's step
    assert "existing systems" in page and "placement gain" in page and "strategy gain" in page
    assert "No setup of yours given" in page  # compare left empty: one line, no search
    assert not re.search(r"<script[^>]+src=[\"']?(https?:)?//", page)
    timing = (out / "small" / "05_realize_and_measure.html").read_text()
    assert "Timing needs TPU devices" in timing
    whole = (out / "small" / "06_generation.html").read_text()
    assert "Where a video&#x27;s time goes" in whole or "Where a video's time goes" in whole
    assert "bytes per link" in whole  # the decode's halo traffic on the torus


@pytest.mark.slow
def test_the_ranking_page_draws_its_heatmaps_in_chromium(report, tmp_path):
    require_chromium()
    _, out = report
    url = (out / "small" / "04_placement_ranking.html").as_uri()
    dom, log = chromium(tmp_path, url, "--dump-dom")
    assert not js_errors(log), js_errors(log)
    assert dom.count('class="main-svg"') >= 5  # every figure drew (SVG layers present)
    assert "bytes per link per step" in dom
    screenshot = tmp_path / "ranking.png"
    chromium(tmp_path, url, f"--screenshot={screenshot}", "--window-size=1280,3000")
    png = screenshot.read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and struct.unpack(">II", png[16:24]) == (1280, 3000)


TINY = az.WanConfig(dim=64, ffn_dim=128, num_heads=8, num_layers=4, text_dim=32, text_len=8,
                    freq_dim=32)
TINY_WORKLOAD = az.Workload(model=TINY, height=32, width=48, frames=5, text_len=8)


@pytest.mark.slow  # compiles three times
def test_a_plans_compiled_program_is_the_one_the_compile_sweep_scored(tmp_path):
    host = az.Topology.simulated((2, 4), devices=jax.devices()[:8])
    candidate = Candidate.from_name("cfg2-uly4", attention="blockwise")
    shuffled = Placement(tuple(np.random.default_rng(0).permutation(8).tolist()), "shuffled")
    plan = Plan(TINY_WORKLOAD, host, candidate, shuffled, Predicted(1.0, 0.1, 1.0))
    # The sweep compiles in a child process on plain device order: another path entirely.
    [swept] = compile_candidates([candidate], TINY_WORKLOAD, host, cache_dir=tmp_path,
                                 num_layers=2)

    folded = plan.compiled_program(num_layers=2)
    full = plan.compiled_program()

    check = compare_realised(plan, folded, swept.program)  # groups included, shuffled order
    assert check.equal, check.to_frame().to_string()
    # Folding gives the full depth's collectives and the layer loop's compute (one layer of
    # the stacked weights read per trip); ops outside the loop that touch the whole stack
    # (here on CPU) do not fold, so the time may differ.
    deeper = compare_realised(plan, full, swept.program)
    assert {d.what for d in deeper.differences} <= {"time"}, deeper.to_frame().to_string()
    assert folded.num_devices == 8 and any(c.kind == "all-to-all" for c in folded.collectives)
    # The layer loop runs 4 times per step: its collectives count 4x what one layer runs.
    assert max(c.count for c in folded.collectives) >= 4
    with pytest.raises(az.AoizoraError, match="num_layers=9"):
        plan.compiled_program(num_layers=9)


@pytest.mark.slow
def test_a_headline_a_time_limit_leaves_unknown_is_recorded_as_none(tmp_path, monkeypatch):
    # Cold caches and a limit no compile fits: a system's setup that could win is left
    # uncompiled, so the speedup is not known (NaN in the library, None in the record).
    monkeypatch.setenv("AOIZORA_LAB_CACHE_DIR", str(tmp_path / "cache"))
    result = run_reports([ReportSpec("limited", notebooks=("04_placement_ranking",),
                                     parameters={**SMALL, "time_limit": 1})],
                         NOTEBOOKS, tmp_path / "out", progress=False)
    assert result.failed == 0, result.to_frame().to_string()
    [run] = result.runs
    assert run.records["speedup_over_best_existing_system"] is None
    assert run.records["systems_not_known"]  # named
    assert run.records["p_plan_faster_than_best_system"] is None  # nor its odds
    assert run.records["speedup_p10"] is None and run.records["speedup_p90"] is None
    assert run.records["predicted_step_p90_s"] > 0  # the plan's own interval is known
    assert run.records["predicted_step_s"] > 0  # the plan itself is known
