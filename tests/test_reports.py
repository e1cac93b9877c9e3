"""Report regeneration: papermill runs, records, offline HTML pages, the index, the CLI.

The notebooks in ``tests/data`` stand in for the real ones: ``heatmap`` draws a plotly heatmap
of its parameters and records values derived from them; ``fails`` records a value, then raises.
"""

import dataclasses
import re
import shutil
import struct
import sys
from importlib import resources
from pathlib import Path

import nbformat
import numpy as np
import pytest
from browser import chromium, js_errors, require_chromium
from nbformat.v4 import new_code_cell, new_notebook, new_output

from aoizora_lab.cases import parse_case
from aoizora_lab.cli import main
from aoizora_lab.errors import AoizoraError
from aoizora_lab.notebook import RECORD_MIMETYPE, record
from aoizora_lab.progress import MARKER, PROGRESS_ENV, Ticker, note
from aoizora_lab.reports import (
    ReportSpec,
    ReportsResult,
    _for_readers,
    load_matrix,
    read_records,
    run_reports,
    select_reports,
    write_index,
)

DATA = Path(__file__).parent / "data"
REPO = Path(__file__).parent.parent
# Anything a page would fetch from the network: scripts, stylesheets, modules.
EXTERNAL = re.compile(r"""<(?:script|link)\b[^>]*(?:src|href)\s*=\s*["']?(?:https?:)?//""", re.I)


def heatmap_values(rows=2, cols=3, scale=1.0, size=(4, 2), label="default"):
    """What tests/data/heatmap.ipynb records for these parameters (its defaults here)."""
    z = [[scale * (r * cols + c) for c in range(cols)] for r in range(rows)]
    return {"cells": rows * cols, "total": sum(map(sum, z)), "label": label,
            "area": size[0] * size[1]}


GRID = {"rows": 3, "cols": 4, "scale": 2.0, "size": (5, 3), "label": "three by four",
        "steps": 2}


@pytest.fixture(scope="module")
def reports(tmp_path_factory):
    """Two reports: one runs the heatmap and the failing notebook, one only the heatmap."""
    out = tmp_path_factory.mktemp("reports")
    specs = [ReportSpec("grid-3x4", ("heatmap", "fails.ipynb"), GRID),
             ReportSpec("grid-1x2", ("heatmap",), {"rows": 1, "cols": 2})]
    result = run_reports(specs, DATA, out, progress=False)
    return result, out, write_index(result, out)


# ---- the default matrix and its validation -------------------------------------------------

def test_default_matrix_holds_the_documented_reports():
    specs = load_matrix(REPO / "data" / "reports.yaml")
    small = {"case": "wan2.1-t2v-1.3b@832x480x81/v5e:2x4"}
    assert {spec.name: dict(spec.parameters) for spec in specs} == {
        "wan-1.3b-480p-v5e-2x4": small, "wan-1.3b-480p-v5e-2x4-video": small,
        # The big ones are full searches; the main job's answers as `aoizora-lab plan` does.
        "wan2.2-a14b-720p-v6e-2x4": {"case": "wan2.2-t2v-a14b@1280x720x81/v6e:2x4",
                                     "time_limit": None},
        "wan-14b-720p-v5e-4x4": {"case": "wan2.1-t2v-14b@1280x720x81/v5e:4x4",
                                 "time_limit": None},
        "wan-14b-480p-v5e-2x4": {"case": "wan2.1-t2v-14b@832x480x81/v5e:2x4",
                                 "time_limit": None},
        "wan-1.3b-480p-v5e-8x8": {"case": "wan2.1-t2v-1.3b@832x480x81/v5e:8x8",
                                  "time_limit": None},
    }
    # The main job runs the small one's notebooks 1-5; the rest need --all or --only (README).
    assert [spec.name for spec in select_reports(specs, None)] == ["wan-1.3b-480p-v5e-2x4"]
    cases = {spec.name: parse_case(spec.parameters["case"]) for spec in specs}
    assert {name: (c.workload.model, c.workload.width, c.workload.height, c.workload.frames,
                   c.slice_name) for name, c in cases.items()} == {
        "wan-1.3b-480p-v5e-2x4": ("wan2.1-t2v-1.3b", 832, 480, 81, "v5e:2x4"),
        "wan-1.3b-480p-v5e-2x4-video": ("wan2.1-t2v-1.3b", 832, 480, 81, "v5e:2x4"),
        "wan2.2-a14b-720p-v6e-2x4": ("wan2.2-t2v-a14b", 1280, 720, 81, "v6e:2x4"),
        "wan-14b-720p-v5e-4x4": ("wan2.1-t2v-14b", 1280, 720, 81, "v5e:4x4"),
        "wan-14b-480p-v5e-2x4": ("wan2.1-t2v-14b", 832, 480, 81, "v5e:2x4"),
        "wan-1.3b-480p-v5e-8x8": ("wan2.1-t2v-1.3b", 832, 480, 81, "v5e:8x8"),
    }
    assert all(c.name == spec.parameters["case"] for c, spec in zip(cases.values(), specs,
                                                                     strict=True))
    # The small case's two reports run every numbered notebook between them, each once, the
    # whole video outside the main job; the others run every one.
    numbered = sorted(p.stem for p in (REPO / "notebooks").glob("[0-9][0-9]_*.ipynb"))
    by_name = {spec.name: spec.notebooks for spec in specs}
    main, video = by_name.pop("wan-1.3b-480p-v5e-2x4"), by_name.pop("wan-1.3b-480p-v5e-2x4-video")
    assert sorted(main + video) == numbered and video == ("06_generation",)
    assert all(notebooks == () for notebooks in by_name.values())


@pytest.mark.parametrize(("text", "expected"), [
    ("reprots: []", ["unknown key(s) ['reprots']", "'notebooks', 'reports'"]),
    ("reports: []", ["non-empty list"]),
    ("reports: [{name: a, params: {}}]", ["reports[0]", "['params']", "'parameters'"]),
    ("reports: [{parameters: {}}]", ["reports[0]", "'name'"]),
    ("reports: [{name: a}, {name: a}]", ["unique", "['a']"]),
    ("reports: [{name: a b}]", ["'a b'", "letters, digits"]),
    ("reports: [{name: a, notebooks: 01_x}]", ["list of names"]),
    ("reports: [{name: a, notebooks: [n1, n1.ipynb]}]", ["name one twice"]),
    ("reports: [{name: a, parameters: {case: 'wan3@832x480x81/v5e:2x4'}}]",
     ["'wan3'", "wan2.1-t2v-14b"]),
    ("reports: [{name: a, parameters: {case: 'wan2.1-t2v-14b@832x480x81'}}]",
     ["'wan2.1-t2v-14b@832x480x81'", "WORKLOAD/SLICE"]),
    ("reports: [{name: a, parameters: {case: [832, 480]}}]", ["[832, 480]", "case spec"]),
    ("reports: [{name: a, parameters: {case: 'wan2.1-t2v-14b@830x480x81/v5e:2x4'}}]",
     ["830x480", "multiples of 16"]),
    ("reports: [{name: a, parameters: {case: 'wan2.1-t2v-14b@832x480x80/v5e:2x4'}}]",
     ["frames=80"]),
    ("reports: [{name: a, parameters: {case: 'wan2.1-t2v-14b@832x480x81/v5e:3x3'}}]",
     ["'3x3'"]),
    ("reports: [{name: a, parameters: {2x: 1}}]", ["'2x'", "Python variable"]),
    ("reports: [a, b", ["not valid YAML"]),
])
def test_bad_matrices_name_the_entry_the_value_and_the_fix(tmp_path, text, expected):
    path = tmp_path / "matrix.yaml"
    path.write_text(text)
    with pytest.raises(AoizoraError) as err:
        load_matrix(path)
    for fragment in expected:
        assert fragment in str(err.value)


def test_missing_matrix_file_is_a_clear_error(tmp_path):
    with pytest.raises(AoizoraError, match="does not exist"):
        load_matrix(tmp_path / "nope.yaml")


def test_parameters_are_made_injectable_or_refused():
    spec = ReportSpec("r", parameters={"size": (832, 480), "nested": {"a": (1, 2)}})
    assert spec.parameters == {"size": [832, 480], "nested": {"a": [1, 2]}}
    with pytest.raises(TypeError):
        spec.parameters["size"] = [1, 1]  # read-only
    with pytest.raises(AoizoraError, match=r"parameter 'when'.*cannot be injected"):
        ReportSpec("r", parameters={"when": object()})


def test_select_reports_keeps_matrix_order_and_names_unknown_ones():
    specs = [ReportSpec("a"), ReportSpec("b", default=False), ReportSpec("c")]
    assert [s.name for s in select_reports(specs, ["c", "b", "a"])] == ["a", "b", "c"]
    assert [s.name for s in select_reports(specs, None)] == ["a", "c"]  # the main job's
    assert select_reports(specs, None, everything=True) == specs
    with pytest.raises(AoizoraError, match=r"\['z'\].*\['a', 'b', 'c'\]"):
        select_reports(specs, ["a", "z"])


def test_a_matrix_marks_reports_outside_the_main_job(tmp_path):
    path = tmp_path / "matrix.yaml"
    path.write_text("reports: [{name: a}, {name: big, default: false}]")
    assert [spec.default for spec in load_matrix(path)] == [True, False]
    path.write_text("reports: [{name: big, default: maybe}]")
    with pytest.raises(AoizoraError, match=r"reports\[0\].*'maybe'.*true or false"):
        load_matrix(path)


def test_progress_lines_follow_their_setting_and_a_ticker_spaces_them(monkeypatch, capsys):
    monkeypatch.delitem(sys.modules, "ipykernel", raising=False)  # not inside a kernel
    for setting, shown in ((None, ""), ("0", ""), ("1", f"{MARKER}compiling\n")):
        if setting is None:
            monkeypatch.delenv(PROGRESS_ENV, raising=False)
        else:
            monkeypatch.setenv(PROGRESS_ENV, setting)
        note("compiling")
        assert capsys.readouterr().err == shown, setting
    for seconds, lines in ((0.0, 3), (3600.0, 0)):
        ticker = Ticker(seconds)
        for i in range(3):
            ticker.note(f"step {i}")
        assert capsys.readouterr().err.count(MARKER) == lines


def test_progress_lines_are_left_out_of_the_pages():
    cell = new_code_cell("")
    cell.outputs = [new_output("stream", name="stderr",
                               text=f"{MARKER}compile 1 of 2\nwarning: kept\n"),
                    new_output("stream", name="stderr", text=f"{MARKER}only progress\n")]
    notebook = new_notebook(cells=[cell])
    shown = _for_readers(notebook).cells[0].outputs
    assert [o.text for o in shown] == ["warning: kept\n"]
    assert len(notebook.cells[0].outputs) == 2  # the executed notebook keeps them


def test_undeclared_parameters_and_missing_notebooks_fail_before_anything_runs(tmp_path):
    out = tmp_path / "out"
    with pytest.raises(AoizoraError, match=r"\['rowz'\].*declared there: \['cols', 'label'"):
        run_reports([ReportSpec("r", ("heatmap",), {"rowz": 3})], DATA, out)
    with pytest.raises(AoizoraError, match=r"\['heatmapp'\] not found.*'fails.ipynb'"):
        run_reports([ReportSpec("r", ("heatmapp",))], DATA, out)
    with pytest.raises(AoizoraError, match="no numbered notebooks"):
        run_reports([ReportSpec("r")], DATA, out)
    assert not out.exists()


# ---- record / read_records -------------------------------------------------------------------

def test_record_outputs_json_and_read_records_reads_them_back(capsys):
    record("latency_s", np.float32(0.5))  # outside a kernel: its text form is printed
    assert capsys.readouterr().out.strip() == "recorded latency_s = 0.5"
    nb = new_notebook(cells=[
        new_code_cell(outputs=[new_output("display_data", {RECORD_MIMETYPE: {"a": 1}})]),
        new_code_cell(outputs=[new_output("stream", name="stdout", text="hi"),
                               new_output("display_data", {RECORD_MIMETYPE: {"a": 2, "b": [1]}})]),
    ])
    assert read_records(nb) == {"a": 2, "b": [1]}


@pytest.mark.parametrize(("name", "value", "match"), [
    ("", 1, "non-empty string"),
    ("x", float("nan"), "not JSON-able.*None for a missing number"),
    ("x", object(), "not JSON-able"),
])
def test_record_refuses_what_json_cannot_hold(name, value, match):
    with pytest.raises(AoizoraError, match=match):
        record(name, value)


def test_known_turns_a_missing_number_into_what_record_takes(capsys):
    from aoizora_lab.notebook import known

    record("total_s", known(float("nan")))
    record("decode_s", known(np.float64(1.5)))
    assert capsys.readouterr().out.split("\n")[:2] == ["recorded total_s = null",
                                                      "recorded decode_s = 1.5"]


# ---- running the notebooks -------------------------------------------------------------------

@pytest.mark.slow
def test_every_notebook_runs_and_its_records_follow_its_parameters(reports):
    result, out, _ = reports
    runs = {(run.report, run.notebook): run for run in result.runs}
    assert list(runs) == [("grid-3x4", "heatmap"), ("grid-3x4", "fails"),
                          ("grid-1x2", "heatmap")]
    grid, small = runs["grid-3x4", "heatmap"], runs["grid-1x2", "heatmap"]
    assert grid.records == heatmap_values(**{k: GRID[k] for k in ("rows", "cols", "scale",
                                                                    "size", "label")})
    assert grid.records["total"] == 132.0
    assert small.records == heatmap_values(rows=1, cols=2)
    # Each notebook gets the parameters its parameters cell declares, nothing else.
    assert runs["grid-3x4", "fails"].parameters == {"steps": 2}
    assert grid.parameters["size"] == [5, 3]
    for run in (grid, small):
        assert run.status == "ok" and run.error is None and run.seconds > 0
        assert run.executed == out / run.report / "heatmap.ipynb"
        assert read_records(run.executed) == run.records
        assert run.page == out / run.report / "heatmap.html" and run.page.exists()


@pytest.mark.slow
def test_a_failing_notebook_keeps_its_partial_run_and_the_others_finish(reports):
    result, _, index = reports
    assert result.failed == 1
    failed = [run for run in result.runs if run.status == "failed"]
    assert [(run.report, run.notebook) for run in failed] == [("grid-3x4", "fails")]
    run = failed[0]
    assert run.error == "RuntimeError: deliberate failure after 2 step(s)"
    assert run.records == {"before_failure": 2}  # recorded before the failure
    executed = nbformat.read(run.executed, as_version=4)
    code = [cell for cell in executed.cells if cell.cell_type == "code"]
    assert any(o.output_type == "error" for o in code[-2].outputs)
    assert code[-1].outputs == []  # never reached
    page = run.page.read_text()
    assert "deliberate failure after 2 step(s)" in page and "An Exception was encountered" in page
    index_html = index.read_text()
    assert "RuntimeError: deliberate failure after 2 step(s)" in index_html
    assert 'href="grid-3x4/fails.ipynb">partial notebook</a>' in index_html
    assert result.to_frame()["status"].tolist() == ["ok", "failed", "ok"]


@pytest.mark.slow
def test_pages_show_outputs_without_code_and_load_only_the_shared_plotly_js(reports):
    result, out, _ = reports
    shared = out / "assets" / "plotly.min.js"
    plotly_js = (resources.files("plotly") / "package_data" / "plotly.min.js").read_bytes()
    assert shared.read_bytes() == plotly_js
    css = (out / "assets" / "notebook.css").read_text()
    assert ".jp-OutputArea" in css and "<style" not in css
    for run in result.runs:
        page = run.page.read_text()
        head = page[:page.index("</head>")]
        assert '<script src="../assets/plotly.min.js"></script>' in head
        assert not EXTERNAL.findall(page), EXTERNAL.findall(page)
        assert "cdnjs" not in page and "unpkg" not in page and "require.js" not in page
        assert len(page) < len(plotly_js) / 8  # plotly.js is not inlined
        assert 'href="../assets/notebook.css"' in head
        assert "Jupyter Development Team" not in page  # nor nbconvert's style sheet
        assert "from aoizora_lab.notebook import record" not in page  # no code cells
        assert "jp-InputPrompt jp-InputArea-prompt" not in page
        assert "recorded " not in page and RECORD_MIMETYPE not in page
        assert "celltag_parameters" not in page and "celltag_injected-parameters" not in page
    page = (out / "grid-3x4" / "heatmap.html").read_text()
    assert "<strong>Parameters:</strong>" in page and "<code>rows = 3</code>" in page
    assert page.index("plotly.min.js") < page.index('class="plotly-graph-div"')
    assert '"type":"heatmap"' in page and "heatmap three by four" in page
    assert '"z":[[0.0,2.0,4.0,6.0],[8.0,10.0,12.0,14.0],[16.0,18.0,20.0,22.0]]' in page
    assert "total of the heatmap: 132.0" in page  # printed output stays


@pytest.mark.slow
def test_index_links_every_page_and_lists_the_records(reports):
    _, out, index = reports
    text = index.read_text()
    assert "<script" not in text and not EXTERNAL.findall(text)
    links = re.findall(r'href="([^"]+)"', text)
    assert sorted(links) == sorted(["grid-3x4/heatmap.html", "grid-3x4/fails.html",
                                    "grid-3x4/fails.ipynb", "grid-1x2/heatmap.html"])
    assert all((out / link).is_file() for link in links)
    assert "3 notebook runs in 2 reports: 2 ok, 1 failed" in text
    assert "<b>cells</b>: 12<br><b>total</b>: 132<br><b>label</b>: three by four" in text
    assert 'class="parameters">rows = 3, cols = 4, scale = 2, size = [5, 3], label = three' in text


def test_regenerating_some_reports_keeps_the_others_in_the_index(reports, tmp_path):
    result, out, _ = reports
    copy = tmp_path / "reports"
    shutil.copytree(out, copy)
    # Paths as if the runs had written into the copy.
    moved = tuple(dataclasses.replace(
        run, page=copy / run.page.relative_to(out) if run.page else None,
        executed=copy / run.executed.relative_to(out) if run.executed else None)
        for run in result.runs)
    write_index(ReportsResult(moved), copy)
    again = [dataclasses.replace(run, seconds=99.0) for run in moved if run.report == "grid-1x2"]
    text = write_index(ReportsResult(tuple(again)), copy).read_text()
    assert "grid-3x4/heatmap.html" in text and "grid-3x4/fails.ipynb" in text
    assert "99.0 s" in text and "1 report kept from earlier runs" in text
    assert "3 notebook runs in 2 reports: 2 ok, 1 failed" in text
    assert text.index('id="grid-3x4"') < text.index('id="grid-1x2"')  # earlier order kept
    # A report whose pages are gone is dropped from the index.
    shutil.rmtree(copy / "grid-3x4")
    text = write_index(ReportsResult(tuple(again)), copy).read_text()
    assert "grid-3x4" not in text and "1 notebook runs in 1 report" in text


@pytest.mark.slow
def test_notebooks_run_in_this_interpreter_whatever_python3_kernelspec_is_installed(
        tmp_path, monkeypatch):
    # A fresh venv may find a 'python3' kernelspec of another interpreter first.
    spec_dir = tmp_path / "jupyter" / "kernels" / "python3"
    spec_dir.mkdir(parents=True)
    (spec_dir / "kernel.json").write_text(
        '{"argv": ["/nonexistent/python", "-m", "ipykernel_launcher", "-f", '
        '"{connection_file}"], "display_name": "elsewhere", "language": "python"}')
    monkeypatch.setenv("JUPYTER_PATH", str(tmp_path / "jupyter"))
    spec = [ReportSpec("r", ("heatmap",))]
    ours = run_reports(spec, DATA, tmp_path / "ours", progress=False)
    assert ours.failed == 0 and ours.runs[0].records == heatmap_values()
    named = run_reports(spec, DATA, tmp_path / "named", kernel_name="python3", progress=False)
    assert named.failed == 1 and "nonexistent" in named.runs[0].error


@pytest.mark.slow
def test_cli_runs_the_matrix_and_exits_with_the_number_of_failures(tmp_path, monkeypatch,
                                                                    capsys):
    # A project folder, relative paths and the CLI's defaults (papermill changes directory
    # to the notebooks' folder while it runs: outputs must still land in reports/).
    monkeypatch.chdir(tmp_path)
    (tmp_path / "notebooks").mkdir()
    for name in ("heatmap.ipynb", "fails.ipynb"):
        shutil.copy(DATA / name, tmp_path / "notebooks" / name)
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "reports.yaml").write_text(
        "reports:\n"
        "  - {name: fine, notebooks: [heatmap], parameters: {rows: 4}}\n"
        "  - {name: broken, notebooks: [fails], parameters: {steps: 7}}\n")
    assert main(["reports", "--quiet"]) == 1
    printed = capsys.readouterr().out
    assert re.search(r"broken\s+fails\s+failed\s+[\d.]+\s+RuntimeError: deliberate failure "
                     r"after 7 step", printed)
    assert "1 of 2 notebooks ok; index: reports/index.html" in printed
    for path in ("index.html", "assets/plotly.min.js", "fine/heatmap.html",
                 "fine/heatmap.ipynb", "broken/fails.ipynb"):
        assert (tmp_path / "reports" / path).is_file(), path
    assert sorted(p.name for p in (tmp_path / "notebooks").iterdir()) == [
        "fails.ipynb", "heatmap.ipynb"]
    assert main(["reports", "--quiet", "--out", "only", "--only", "fine"]) == 0
    assert (tmp_path / "only" / "fine").is_dir() and not (tmp_path / "only" / "broken").exists()
    assert main(["reports", "--only", "nope"]) == 2
    assert "Unknown report(s) ['nope']" in capsys.readouterr().err


@pytest.mark.slow
def test_the_runner_says_what_runs_forwards_kernel_progress_and_estimates_time_left(
        tmp_path, capsys):
    from aoizora_lab.versions import cache_root_at

    spec = [ReportSpec("r", ("heatmap",), {"rows": 2, "cols": 5})]
    cache = tmp_path / "cache"  # empty: every run below starts cold until one compile is kept
    with cache_root_at(cache):
        write_index(run_reports(spec, DATA, tmp_path), tmp_path)
    first = capsys.readouterr().err
    assert "[1/1] r / heatmap: running\n" in first  # never run here: nothing to estimate from
    assert "    heatmap of 10 cells drawn" in first  # the kernel's line, forwarded
    assert re.search(r"    ok in \d+ s", first)
    page = (tmp_path / "r" / "heatmap.html").read_text()
    assert "cells drawn" not in page and MARKER not in page
    assert "cells drawn" in (tmp_path / "r" / "heatmap.ipynb").read_text()
    with cache_root_at(cache):
        write_index(run_reports(spec, DATA, tmp_path), tmp_path)
    assert re.search(r"\[1/1\] r / heatmap: running \(last time \d+ s; about \d+ s left\)",
                     capsys.readouterr().err)
    # A cold run's minutes are no estimate for a warm one (nor the reverse).
    (cache / "compile" / "an-entry").mkdir(parents=True)
    with cache_root_at(cache):
        run_reports(spec, DATA, tmp_path)
    warm = capsys.readouterr().err
    assert "r / heatmap: running (no time recorded with a warm cache)" in warm, warm
    assert "left" not in warm.splitlines()[0]
    run_reports(spec, DATA, tmp_path / "quiet", progress=False)
    assert capsys.readouterr().err == ""


# ---- the page in a browser, offline ----------------------------------------------------------

@pytest.mark.slow
def test_report_page_renders_the_figure_offline_in_chromium(reports, tmp_path):
    require_chromium()
    _, out, _ = reports
    url = (out / "grid-3x4" / "heatmap.html").as_uri()
    dom, log = chromium(tmp_path, url, "--dump-dom")
    assert not js_errors(log), js_errors(log)
    figure = re.search(r'<div class="plotly-graph-div[^"]*"[^>]*id="heatmap".*?</svg>', dom, re.S)
    assert figure, "plotly did not draw the figure into its div"
    assert 'class="main-svg"' in figure.group(0) and "js-plotly-plot" in figure.group(0)
    assert "heatmaplayer" in dom  # the heatmap trace itself, not only the axes

    screenshot = tmp_path / "report.png"
    chromium(tmp_path, url, f"--screenshot={screenshot}", "--window-size=1280,2000")
    png = screenshot.read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n"
    assert struct.unpack(">II", png[16:24]) == (1280, 2000)

    # The check above can fail: a page whose plotly.js is missing logs an Uncaught error.
    broken = tmp_path / "broken.html"  # no ../assets/plotly.min.js beside it
    broken.write_text((out / "grid-3x4" / "heatmap.html").read_text())
    _, log = chromium(tmp_path, broken.as_uri(), "--dump-dom")
    assert any("Plotly is not defined" in line for line in js_errors(log))
