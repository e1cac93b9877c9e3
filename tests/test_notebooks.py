"""The five notebooks, run headless through papermill with small parameters."""

import os
import re
import struct
from pathlib import Path

import pytest
from browser import CHROMIUM, chromium, js_errors

from aoizora_lab.candidates import explain_candidates
from aoizora_lab.notebook import notebook_inputs
from aoizora_lab.reports import ReportSpec, run_reports, write_index

NOTEBOOKS = Path(__file__).resolve().parents[1] / "notebooks"
SMALL = {"model": "wan2.1-t2v-1.3b", "size": [128, 128], "frames": 5, "topology": "v5e:2x2",
         "layers": 2, "budget": 300}

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def report(tmp_path_factory):
    out = tmp_path_factory.mktemp("reports")
    result = run_reports([ReportSpec("small", parameters=SMALL)], NOTEBOOKS, out,
                         progress=False)
    write_index(result, out)
    return result, out


def test_every_notebook_runs_and_saves_values_the_library_agrees_with(report):
    result, _ = report
    assert result.failed == 0, result.to_frame().to_string()
    records = {run.notebook: run.records for run in result.runs}
    inputs = notebook_inputs(**{k: SMALL[k] for k in ("model", "size", "frames", "topology")})
    table = explain_candidates(inputs.workload, inputs.topology)
    assert records["01_candidates"]["combinations"] == len(table)
    assert records["01_candidates"]["valid_candidates"] == int(table["valid"].sum())
    pruning = records["02_ir_pruning"]
    assert pruning["traced_candidates"] == int(table["valid"].sum())
    assert 1 <= pruning["kept_candidates"] < pruning["traced_candidates"]
    assert records["03_compile"]["compiled"] == pruning["kept_candidates"]
    ranking = records["04_placement_ranking"]
    assert ranking["speedup_over_best_baseline"] >= 1 - 1e-9  # never worse than a baseline
    assert ranking["predicted_step_s"] > 0
    realised = records["05_realize_and_measure"]
    assert realised["plan_candidate"] == ranking["best_candidate"]
    assert realised["realised_collectives_match"] is True
    assert realised["platform"] == "cpu"


def test_pages_carry_the_heatmaps_offline(report):
    _, out = report
    page = (out / "small" / "04_placement_ranking.html").read_text()
    assert "bytes per link per step" in page and "customdata" in page  # the torus heatmap
    assert "Plotly.newPlot" in page and "../assets/plotly.min.js" in page
    assert not re.search(r"<script[^>]+src=[\"']?(https?:)?//", page)
    timing = (out / "small" / "05_realize_and_measure.html").read_text()
    assert "Timing needs TPU devices" in timing


@pytest.mark.skipif(not os.access(CHROMIUM, os.X_OK),
                    reason="Chromium is not installed at /usr/bin/chromium "
                           "(`apt-get install chromium`, as .ci/run does)")
def test_the_ranking_page_draws_its_heatmaps_in_chromium(report, tmp_path):
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
