"""Interactive speed: the main job from empty caches, and notebooks re-run with warm ones.

:func:`interactive_speed` runs the main job (``aoizora-lab reports``: the reports of the
matrix not marked ``default: false``) the way a fresh machine runs it, every cache in an empty
temporary folder (:func:`~aoizora_lab.versions.cache_root_at`), and then every notebook again
with the caches it filled: what a user waits for after changing a parameter back to a case
already explored. Pages go to a temporary folder; ``reports/`` is never touched. Plan wall
times, cold and warm, are the search-cost section's (:mod:`aoizora_lab.bench.search`).
:func:`interactive_markdown` is its section of the report.
"""

from __future__ import annotations

import tempfile
from pathlib import Path

import pandas as pd

from aoizora_lab.bench.report import markdown_table, met
from aoizora_lab.versions import cache_root_at

MAIN_JOB_TARGET_S = 600.0
"""The main job on a fresh 2-core machine, empty caches (installation not counted)."""

RERUN_TARGET_S = 30.0
"""One notebook re-run with a warm cache."""


def interactive_speed(matrix: str | Path = "data/reports.yaml",
                      notebooks: str | Path = "notebooks", *,
                      progress: bool = True) -> pd.DataFrame:
    """One row per notebook of the main job: ``report``, ``notebook``, ``cold_s`` (empty
    caches), ``warm_s`` (run again on the caches the cold run filled), ``cold_status`` and
    ``warm_status`` (``ok`` or ``failed``: the error's first line)."""
    from aoizora_lab.reports import load_matrix, run_reports, select_reports

    specs = select_reports(load_matrix(matrix), None)
    with (tempfile.TemporaryDirectory(prefix="aoizora-interactive-") as folder,
          cache_root_at(Path(folder) / "cache")):
        cold = run_reports(specs, notebooks, Path(folder) / "cold", progress=progress)
        warm = run_reports(specs, notebooks, Path(folder) / "warm", progress=progress)
    rows = []
    for first, again in zip(cold.runs, warm.runs, strict=True):
        rows.append({"report": first.report, "notebook": first.notebook,
                     "cold_s": first.seconds, "warm_s": again.seconds,
                     "cold_status": _status(first), "warm_status": _status(again)})
    return pd.DataFrame(rows, columns=["report", "notebook", "cold_s", "warm_s",
                                       "cold_status", "warm_status"])


def _status(run) -> str:
    return run.status if run.error is None else f"{run.status}: {run.error.splitlines()[0]}"


def interactive_markdown(table: pd.DataFrame) -> str:
    """The report's section: the table, the main job's total and the targets."""
    total_cold, slowest = table["cold_s"].sum(), table["warm_s"].max()
    failed = int((table["cold_status"] != "ok").sum() + (table["warm_status"] != "ok").sum())
    targets = pd.DataFrame([
        {"target": f"main job <= {MAIN_JOB_TARGET_S:.0f} s on empty caches",
         "value": f"{total_cold:.0f} s", "met": met(total_cold <= MAIN_JOB_TARGET_S)},
        {"target": f"each notebook re-run <= {RERUN_TARGET_S:.0f} s with warm caches",
         "value": f"slowest {slowest:.0f} s", "met": met(slowest <= RERUN_TARGET_S)},
    ])
    return "\n\n".join([
        "## Interactive speed",
        "The main job (`aoizora-lab reports`: the reports of `data/reports.yaml` not marked "
        "`default: false`) with every cache in an empty temporary folder, as on a fresh "
        "machine after installation, then every notebook again on the caches that run "
        "filled (a user back on a case already explored). Wall time per notebook, kernel "
        "start included; plan wall times cold and warm are in the search-cost section. "
        + (f"{failed} notebook run(s) failed: see the status columns." if failed else
           "Every notebook ran."),
        markdown_table(table.round(1)),
        markdown_table(targets),
    ])
