"""Benchmarks of the planner itself: how good its plans are, what the search costs, how fast
placements are scored — and the Markdown report ``reports/benchmarks.md`` that collects them.

Every number comes from the real pipeline: :func:`~aoizora_lab.planner.plan` with deviceless
TPU compiles (libtpu), the compiled HLO and the ICI model. Latencies are *predictions* of that
model (nothing runs on a TPU here); the tables say so. A case, baseline or candidate that
fails is a row with its status, never an exception that ends the run. Cases are case specs
(:mod:`aoizora_lab.cases`, e.g. ``wan2.1-t2v-14b@1280x720x81/v5e:4x4``) or
:class:`~aoizora_lab.cases.Case` objects.

One module per benchmark, each with its matrix, its targets and its section of the report:

- :mod:`~aoizora_lab.bench.quality` — :func:`plan_quality`: per workload x slice, the plan's
  predicted one-step latency against every baseline, the gain of placement alone (same
  candidate, other device orders) and the compute roofline;
- :mod:`~aoizora_lab.bench.search` — :func:`search_cost`: the planner's wall time with an
  empty and with a filled compile cache, what it enumerated, traced and compiled, against an
  exhaustive search (every valid candidate compiled and placed): top-1, regret, and how well
  the IR estimate orders the candidates;
- :mod:`~aoizora_lab.bench.quick` — :func:`quick_plans`: plans with a compile budget
  (``PlanOptions(max_compiled=k, systems=False)``) or a time limit (``PlanOptions(time_limit_s=t)``)
  against the full search: regret and cold time;
- :mod:`~aoizora_lab.bench.throughput` — :func:`placement_throughput`: placements scored per
  second on Wan-sized programs;
- :mod:`~aoizora_lab.bench.interactive` — :func:`interactive_speed`: the main job from empty
  caches and every notebook re-run with warm ones;
- :mod:`~aoizora_lab.bench.report` — what they share: a case's row, Markdown tables, the
  report's header (machine, versions, date) and the report file.

:func:`run_all` (here) runs the chosen benchmarks and rewrites the report after each one.
The package sits on top of the pipeline: it imports the planner and its stages, and nothing
in the pipeline imports it. The scripts in ``benchmarks/`` are thin command lines over these
functions, and ``aoizora-lab bench`` calls :func:`run_all`.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path

from aoizora_lab.bench.interactive import (
    MAIN_JOB_TARGET_S,
    RERUN_TARGET_S,
    interactive_markdown,
    interactive_speed,
)
from aoizora_lab.bench.quality import (
    DEFAULT_MATRIX,
    FLOPS_SOURCE,
    QUICK_LAYERS,
    QUICK_MATRIX,
    ROOFLINE_TARGET,
    SPEEDUP_TARGET,
    PlanQuality,
    plan_quality,
    quality_targets,
    useful_flops,
)
from aoizora_lab.bench.quick import (
    QUICK_PLAN_MATRIX,
    QUICK_PLAN_MAX,
    TIME_LIMITS,
    QuickPlans,
    quick_plans,
)
from aoizora_lab.bench.report import (
    ReportFile,
    environment,
    markdown_table,
    render_report,
)
from aoizora_lab.bench.search import (
    COLD_TARGET_S,
    REGRET_TARGET_PERCENT,
    SEARCH_COST_MATRIX,
    WARM_TARGET_S,
    SearchCost,
    search_cost,
)
from aoizora_lab.bench.throughput import (
    THROUGHPUT_CASES,
    THROUGHPUT_LAYERS,
    placement_throughput,
    throughput_markdown,
)
from aoizora_lab.cases import Case, parse_case
from aoizora_lab.errors import AoizoraError

__all__ = [
    "BENCHMARKS",
    "COLD_TARGET_S",
    "DEFAULT_MATRIX",
    "FLOPS_SOURCE",
    "MAIN_JOB_TARGET_S",
    "QUICK_LAYERS",
    "QUICK_MATRIX",
    "QUICK_PLAN_MATRIX",
    "QUICK_PLAN_MAX",
    "REGRET_TARGET_PERCENT",
    "RERUN_TARGET_S",
    "ROOFLINE_TARGET",
    "SEARCH_COST_MATRIX",
    "SPEEDUP_TARGET",
    "THROUGHPUT_CASES",
    "THROUGHPUT_LAYERS",
    "TIME_LIMITS",
    "WARM_TARGET_S",
    "PlanQuality",
    "QuickPlans",
    "ReportFile",
    "SearchCost",
    "environment",
    "interactive_markdown",
    "interactive_speed",
    "markdown_table",
    "placement_throughput",
    "plan_quality",
    "quality_targets",
    "quick_plans",
    "render_report",
    "run_all",
    "search_cost",
    "throughput_markdown",
    "useful_flops",
]

BENCHMARKS = ("plan-quality", "search-cost", "quick-plans", "placement-throughput",
              "interactive")
"""The benchmarks :func:`run_all` knows, in the order it runs them."""


def run_all(*, quick: bool = False, out: str | Path = "reports/benchmarks.md",
            only: Sequence[str] | None = None, num_layers: int | None = None,
            skip_exhaustive: bool = False, evaluations: int | None = None,
            cache_dir: str | Path | None = None, cases: Sequence[Case | str] | None = None,
            search_cases: Sequence[Case | str] | None = None,
            command: str = "aoizora-lab bench", resume: bool = False,
            records_only: bool = False,
            progress: Callable[[str], None] | None = None) -> Path:
    """Run the benchmarks (``only``: a subset of :data:`BENCHMARKS`) and write the report to
    ``out`` after each one, so that an interrupted run keeps the finished ones; sections it
    does not regenerate (``only``, or written by ``benchmarks/published.py``) stay as they
    are, and each regenerated one says when.

    ``quick``: :data:`QUICK_MATRIX` for plan quality and search cost, compiled at
    :data:`QUICK_LAYERS` layers unless ``num_layers`` says otherwise, and 2,000 placement
    evaluations on the first of :data:`THROUGHPUT_CASES` (8 chips); otherwise
    :data:`DEFAULT_MATRIX`, :data:`SEARCH_COST_MATRIX`, :data:`QUICK_PLAN_MATRIX` at the
    planner's depth (full unless ``num_layers``) and 20,000 evaluations. ``cases`` /
    ``search_cases`` (case specs) replace the plan-quality / search-cost and quick-plans
    matrices; a bad spec is refused before any benchmark runs.
    ``cache_dir``: the compile cache of plan quality and placement throughput (default
    ``compile/`` under :func:`~aoizora_lab.versions.cache_root`; search cost always starts
    from an empty one). Plan quality records
    each finished case in ``plan-quality/`` beside ``out``; ``resume`` reads back the cases
    recorded there at the same depth and budget instead of planning them again;
    ``records_only`` plans nothing and writes the section from the records.
    """
    # The matrices and benchmark functions are read from this module when called, so that
    # what a caller (or a test) sets on ``aoizora_lab.bench`` is what runs.
    chosen = list(only or BENCHMARKS)
    unknown = sorted(set(chosen) - set(BENCHMARKS))
    if unknown:
        raise AoizoraError(f"Unknown benchmarks {unknown}; choose from {list(BENCHMARKS)}.")
    quality_matrix = ([parse_case(c) for c in cases] if cases
                      else QUICK_MATRIX if quick else DEFAULT_MATRIX)
    search_matrix = ([parse_case(c) for c in search_cases] if search_cases
                     else QUICK_MATRIX if quick else SEARCH_COST_MATRIX)
    layers = num_layers if num_layers is not None else (QUICK_LAYERS if quick else None)
    evaluations = evaluations or (2_000 if quick else 20_000)
    # The report keeps sections other commands wrote (benchmarks/published.py) and, with
    # ``only``, the benchmarks not rerun.
    report = ReportFile(out, command=command, keep=True)

    if "plan-quality" in chosen:
        report.add(plan_quality(quality_matrix, num_layers=layers, cache_dir=cache_dir,
                                progress=progress, resume=resume or records_only,
                                plan_missing=not records_only,
                                records=Path(out).parent / "plan-quality",
                                on_case=lambda partial: report.add(
                                    partial.markdown(), module="aoizora_lab.bench.quality")
                                ).markdown(), module="aoizora_lab.bench.quality")
    if "search-cost" in chosen:
        report.add(search_cost(search_matrix, num_layers=layers, exhaustive=not skip_exhaustive,
                               progress=progress).markdown(), module="aoizora_lab.bench.search")
    if "quick-plans" in chosen:  # after search cost, whose exhaustive compiles it reads back
        quick_matrix = ([parse_case(c) for c in search_cases] if search_cases
                        else QUICK_MATRIX if quick else QUICK_PLAN_MATRIX)
        report.add(quick_plans(quick_matrix, num_layers=layers,
                               max_k=3 if quick else QUICK_PLAN_MAX,
                               time_limits=() if quick else TIME_LIMITS,
                               progress=progress).markdown(), module="aoizora_lab.bench.quick")
    if "placement-throughput" in chosen:
        if progress:
            progress("placement throughput")
        table = placement_throughput(evaluations,
                                     THROUGHPUT_CASES[:1] if quick else THROUGHPUT_CASES,
                                     cache_dir=cache_dir)
        report.add(throughput_markdown(table, evaluations),
                   module="aoizora_lab.bench.throughput")
    if "interactive" in chosen:
        if progress:
            progress("interactive speed: the main job on empty caches, then warm")
        report.add(interactive_markdown(interactive_speed(progress=progress is not None)),
                   module="aoizora_lab.bench.interactive")
    return report.path
