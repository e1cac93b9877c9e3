"""Benchmarks of the planner itself: how good its plans are, what the search costs, how fast
placements are scored — and the Markdown report ``reports/benchmarks.md`` that collects them.

Every number comes from the real pipeline: :func:`~aoizora_lab.planner.plan` with deviceless
TPU compiles (libtpu), the compiled HLO and the ICI model. Latencies are *predictions* of that
model (nothing runs on a TPU here); the tables say so. A case, baseline or candidate that
fails is a row with its status, never an exception that ends the run.

- :func:`plan_quality`: per workload x slice, the plan's predicted one-step latency against
  every baseline, the gain of placement alone (same candidate, three device orders) and the
  compute roofline;
- :func:`search_cost`: the planner's wall time with an empty and with a filled compile cache,
  what it enumerated, traced and compiled, against an exhaustive search (every valid candidate
  compiled and placed): top-1, regret, and how well the IR estimate orders the candidates;
- :func:`placement_throughput`: placements scored per second on Wan-sized programs;
- :func:`run_all` runs them and writes the report (:func:`render_report`), with the machine,
  the versions and the date.

The scripts in ``benchmarks/`` are thin command lines over these functions, and
``aoizora-lab bench`` regenerates the report.
"""

from __future__ import annotations

import datetime
import importlib.metadata
import math
import os
import platform
import tempfile
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from aoizora_lab.errors import AoizoraError
from aoizora_lab.topology import Topology
from aoizora_lab.workload import Workload

Case = tuple[Workload | str, Topology | str]
"""A workload (a :class:`Workload` or ``"MODEL@RESOLUTION"``, e.g. ``"wan2.1-t2v-14b@720p"``)
and a slice (a :class:`Topology` or a name for :meth:`Topology.from_name`)."""

DEFAULT_MATRIX: tuple[Case, ...] = (
    ("wan2.1-t2v-1.3b@480p", "v5e:2x4"),
    ("wan2.1-t2v-1.3b@480p", "v5e:4x4"),
    ("wan2.1-t2v-14b@720p", "v5e:4x4"),
    ("wan2.1-t2v-14b@480p", "v5e:2x4"),
    # The 16-chip workloads on the other 16-chip slices libtpu describes (more HBM per chip
    # than v5e, so whatever fits a v5e:4x4 fits them).
    ("wan2.1-t2v-1.3b@480p", "v6e:4x4"),
    ("wan2.1-t2v-14b@720p", "v6e:4x4"),
    ("wan2.1-t2v-1.3b@480p", "v5p:2x2x4"),
    ("wan2.1-t2v-14b@720p", "v5p:2x2x4"),
)
"""Plan-quality matrix (issue 8)."""

SEARCH_COST_MATRIX: tuple[Case, ...] = (("wan2.1-t2v-14b@720p", "v5e:4x4"),)
"""Search-cost matrix: the headline workload, whose targets the issue states."""

QUICK_MATRIX: tuple[Case, ...] = (("wan2.1-t2v-1.3b@480p", "v5e:2x4"),)
"""``--quick``: one small workload (compiled at :data:`QUICK_LAYERS` layers)."""

QUICK_LAYERS = 2
"""Compile depth of ``--quick`` (the layer loop is folded back to the model's depth)."""

THROUGHPUT_CASES: tuple[tuple[str, str, str], ...] = (
    ("v5e:2x4", "wan2.1-t2v-1.3b@480p", "cfg2-uly4"),
    ("v5e:4x4", "wan2.1-t2v-14b@720p", "cfg2-uly8-fsdp"),
    ("v5e:8x8", "wan2.1-t2v-14b@720p", "cfg2-uly8-ring4-fsdp"),
)
"""(slice, workload, candidate) of :func:`placement_throughput`: 8, 16 and 64 chips."""

# Targets (issue 8). Predicted latencies, so "met" means "met by the model's prediction".
SPEEDUP_TARGET = 1.42
"""The plan's speedup over the best baseline, on at least one workload."""
ROOFLINE_TARGET = 1.3
"""The plan within this factor of the compute roofline, wherever it is compute-bound."""
COLD_TARGET_S = 300.0
"""Planner wall time with an empty compile cache (14B@720p on v5e:4x4, 2 cores)."""
WARM_TARGET_S = 20.0
"""Planner wall time with the cache filled by the cold run."""
COMPILE_FRACTION_TARGET = 0.25
"""Candidates the pruned search compiles, as a fraction of the valid ones."""
REGRET_TARGET_PERCENT = 0.0
"""Latency lost by pruning against the exhaustive search, per cent."""

FLOPS_SOURCE = "IR trace of the unsharded step"
"""Where the roofline's FLOPs come from: the jaxpr of the whole denoising step (both CFG
passes) traced without a mesh, counted by :func:`aoizora_lab.ir.count_function` (matmuls from
shapes, splash attention from its q/k shapes) — the useful work, without the work a sharding
repeats on several devices."""


# ----------------------------------------------------------------------------- cases


def resolve_case(case: Case) -> tuple[Workload, Topology]:
    """``("wan2.1-t2v-14b@720p", "v5e:4x4")`` -> (Workload, Topology); objects pass through."""
    workload, topology = case
    if isinstance(workload, str):
        model, sep, resolution = workload.partition("@")
        if not sep:
            raise AoizoraError(
                f"Workload {workload!r} must be MODEL@RESOLUTION, e.g. 'wan2.1-t2v-14b@720p'.")
        workload = Workload.preset(model, resolution)
    if isinstance(topology, str):
        topology = Topology.from_name(topology)
    return workload, topology


def parse_case(text: str) -> Case:
    """``"wan2.1-t2v-14b@720p/v5e:4x4"`` -> ``("wan2.1-t2v-14b@720p", "v5e:4x4")`` (command
    lines name a case as WORKLOAD/SLICE)."""
    workload, sep, slice_name = str(text).partition("/")
    if not sep or "@" not in workload or not slice_name:
        raise AoizoraError(
            f"Case {text!r} must be MODEL@RESOLUTION/SLICE, e.g. 'wan2.1-t2v-14b@720p/v5e:4x4'.")
    return workload, slice_name


def _label(case: Case) -> tuple[str, str]:
    workload, topology = case
    return (workload if isinstance(workload, str) else workload.name,
            topology if isinstance(topology, str) else topology.name)


def _error(err: BaseException) -> str:
    return f"error: {type(err).__name__}: {str(err).splitlines()[0][:160] if str(err) else ''}"


# ----------------------------------------------------------------------------- plan quality


@dataclass(frozen=True, eq=False)
class PlanQuality:
    """:func:`plan_quality`'s tables."""

    summary: pd.DataFrame
    """One row per workload x slice: latencies, speedups, placement gains, roofline."""
    baselines: pd.DataFrame
    """Every case's ``PlanResult.baselines`` rows, with ``workload`` and ``slice``."""
    targets: pd.DataFrame
    """``target``, ``value``, ``met`` (see :func:`quality_targets`)."""
    config: dict[str, Any] = field(default_factory=dict)
    """How it was run (compile depth, placement budget)."""

    def markdown(self) -> str:
        """The section of the benchmark report."""
        from aoizora_lab.baselines import BASELINES

        s = self.summary
        latency = s[["workload", "slice", "status", "candidate", "placement", "plan_s",
                     "compute_s", "comm_s", *[f"{b}_s" for b in BASELINES if f"{b}_s" in s],
                     "plan_wall_s"]]
        speedup = s[["workload", "slice", *[f"vs_{b}" for b in BASELINES if f"vs_{b}" in s],
                     "best_baseline", "vs_best_baseline", "speedup_target"]]
        roofline = s[["workload", "slice", "candidate", "placement_gain_vs_plain",
                      "placement_gain_vs_make_mesh", "useful_tflops", "plan_tflops",
                      "roofline_s", "roofline_ratio", "bound", "roofline_target"]]
        return "\n\n".join([
            "## Plan quality",
            "Predicted one-step latency (seconds; both CFG passes) of the AoiZora Lab plan and "
            "of each baseline, all compiled deviceless by libtpu and scored by the same ICI "
            "model (`aoizora_lab.planner.predict`); nothing ran on a TPU. `compute_s` and "
            "`comm_s` are the plan's parts (asynchronous collectives hide behind compute); "
            "`plan_wall_s` is the planner's wall time. "
            + _config_line(self.config),
            markdown_table(latency),
            "What each baseline is (candidate and device order) and how it fared:",
            markdown_table(self.baselines.reindex(columns=[
                "workload", "slice", "baseline", "candidate", "placement", "status",
                "total_s", "speedup_of_plan"])),
            "Speedup of the plan over each baseline (baseline latency / plan latency) and over "
            f"the best baseline of the case; target: at least {SPEEDUP_TARGET:g}x on one "
            "workload.",
            markdown_table(speedup),
            "Placement alone: the plan's candidate on its best placement against the same "
            "candidate in plain device order and where `jax.make_mesh` puts it (latency "
            "ratios). Roofline: useful FLOPs / (chips x peak bf16 FLOP/s), FLOPs from the "
            f"{FLOPS_SOURCE}; `plan_tflops` is what the plan's compiled program executes on "
            "all devices together. `bound`: compute when the plan's predicted compute time is "
            f"at least its communication time; target: within {ROOFLINE_TARGET:g}x of the "
            "roofline wherever compute-bound.",
            markdown_table(roofline),
            "Targets:",
            markdown_table(self.targets),
        ])


def useful_flops(workload: Workload, attention: str) -> float:
    """FLOPs of one denoising step of ``workload``, traced unsharded (see :data:`FLOPS_SOURCE`)."""
    import jax
    import jax.numpy as jnp

    from aoizora_lab.ir import count_function
    from aoizora_lab.models.parallel import ParallelPlan
    from aoizora_lab.models.wan import abstract_params
    from aoizora_lab.workload import denoise_step

    model = workload.config()
    params = abstract_params(model, jnp.bfloat16)
    inputs = workload.abstract_inputs(jnp.bfloat16)
    plan = ParallelPlan(attention=attention)
    replicated = [None] * len(jax.tree.leaves((params, inputs)))
    counts = count_function(lambda p, i: denoise_step(p, model, plan=plan, **i),
                            (params, inputs), replicated, {})
    return float(counts.flops)


def plan_quality(cases: Iterable[Case] = DEFAULT_MATRIX, *, num_layers: int | None = None,
                 budget: int = 20_000, cache_dir: str | Path | None = None,
                 timeout_s: float = 900.0,
                 progress: Callable[[str], None] | None = None) -> PlanQuality:
    """Plan every case and compare the plan with the baselines, its placement and the roofline.

    Per case (columns of ``summary``): the plan's ``candidate``, ``placement`` and predicted
    ``plan_s`` (``compute_s`` + ``comm_s`` under the overlap rule); ``<baseline>_s`` and
    ``vs_<baseline>`` (baseline / plan) for every baseline, ``best_baseline`` and
    ``vs_best_baseline``; ``plain_order_s`` and ``make_mesh_s``: the plan's candidate and
    program in plain device order and in ``jax.make_mesh``'s order, and the gains
    ``placement_gain_vs_*`` (those / ``plan_s``); ``useful_tflops`` (see :data:`FLOPS_SOURCE`),
    ``plan_tflops`` (the compiled program on all devices), ``roofline_s`` = useful FLOPs /
    (chips x peak), ``roofline_ratio`` = ``plan_s / roofline_s``, ``bound`` and the target
    columns; ``plan_wall_s``: the planner's wall time. A case that fails has its ``status``.
    """
    from aoizora_lab.baselines import BASELINES

    rows, baseline_rows = [], []
    for case in cases:
        workload_label, slice_label = _label(case)
        if progress:
            progress(f"plan quality: {workload_label} on {slice_label}")
        row: dict[str, Any] = {"workload": workload_label, "slice": slice_label}
        try:
            workload, topology = resolve_case(case)
            row["workload"], row["slice"] = workload.name, topology.name
            row |= _quality_row(workload, topology, num_layers=num_layers, budget=budget,
                                cache_dir=cache_dir, timeout_s=timeout_s,
                                baseline_rows=baseline_rows)
        except Exception as err:  # a case that fails is a row, not the end of the run
            row["status"] = _error(err)
        rows.append(row)
    columns = ["workload", "slice", "status", "candidate", "placement", "plan_s", "compute_s",
               "comm_s", *[f"{b}_s" for b in BASELINES], *[f"vs_{b}" for b in BASELINES],
               "best_baseline", "vs_best_baseline", "speedup_target", "plain_order_s",
               "make_mesh_s", "placement_gain_vs_plain", "placement_gain_vs_make_mesh",
               "useful_tflops", "plan_tflops", "roofline_s", "roofline_ratio", "bound",
               "roofline_target", "plan_wall_s"]
    summary = pd.DataFrame(rows).reindex(columns=columns)
    baselines = pd.DataFrame(baseline_rows)
    config = {"num_layers": num_layers or "full depth", "budget": budget}
    return PlanQuality(summary, baselines, quality_targets(summary), config)


def _quality_row(workload: Workload, topology: Topology, *, num_layers: int | None,
                 budget: int, cache_dir: str | Path | None, timeout_s: float,
                 baseline_rows: list[dict[str, Any]]) -> dict[str, Any]:
    from aoizora_lab import baselines as known
    from aoizora_lab.hardware import chip_spec
    from aoizora_lab.placement import Placement
    from aoizora_lab.planner import plan, predict

    start = time.perf_counter()
    result = plan(workload, topology, budget=budget, num_layers=num_layers,
                  cache_dir=cache_dir, timeout_s=timeout_s)
    wall = time.perf_counter() - start
    best = result.best
    plan_s = best.predicted.total_s
    row: dict[str, Any] = {
        "status": "ok", "candidate": best.candidate.name,
        "placement": best.placement.description, "plan_s": plan_s,
        "compute_s": best.predicted.compute_s, "comm_s": best.predicted.comm_s,
        "plan_wall_s": wall}
    table = result.baselines
    for _, b in table.iterrows():
        baseline_rows.append({"workload": workload.name, "slice": topology.name, **b.to_dict()})
    scored = table[(table["baseline"] != "aoizora-lab") & (table["status"] == "ok")]
    for _, b in table[table["baseline"] != "aoizora-lab"].iterrows():
        ok = b["status"] == "ok"
        row[f"{b['baseline']}_s"] = b["total_s"] if ok else math.nan
        row[f"vs_{b['baseline']}"] = b["total_s"] / plan_s if ok else math.nan
    if not scored.empty:
        top = scored.loc[scored["total_s"].idxmin()]
        row["best_baseline"] = top["baseline"]
        row["vs_best_baseline"] = top["total_s"] / plan_s
        row["speedup_target"] = _met(row["vs_best_baseline"] >= SPEEDUP_TARGET)
    else:
        row["best_baseline"], row["speedup_target"] = "none scored", "n/a"

    # Placement only: the same candidate and compiled program, other device orders.
    plain = Placement(tuple(range(topology.num_devices)), "plain device order")
    row["plain_order_s"] = predict(best.program, topology, plain).total_s
    row["placement_gain_vs_plain"] = row["plain_order_s"] / plan_s
    try:
        make_mesh = known.jax_default(best.candidate, topology)
        row["make_mesh_s"] = predict(best.program, topology, make_mesh).total_s
        row["placement_gain_vs_make_mesh"] = row["make_mesh_s"] / plan_s
    except Exception:  # no devices, or make_mesh refuses the shape on this slice
        row["make_mesh_s"] = row["placement_gain_vs_make_mesh"] = math.nan

    chip = chip_spec(topology.generation)
    flops = useful_flops(workload, best.candidate.attention)
    row["useful_tflops"] = flops / 1e12
    row["plan_tflops"] = best.program.flops * best.candidate.num_devices / 1e12
    row["roofline_s"] = flops / (topology.num_chips * chip.peak_bf16_flops)
    row["roofline_ratio"] = plan_s / row["roofline_s"] if row["roofline_s"] > 0 else math.nan
    compute_bound = best.predicted.compute_s >= best.predicted.comm_s
    row["bound"] = "compute" if compute_bound else "communication"
    row["roofline_target"] = (_met(row["roofline_ratio"] <= ROOFLINE_TARGET) if compute_bound
                              else "n/a")
    return row


def quality_targets(summary: pd.DataFrame) -> pd.DataFrame:
    """The issue's plan-quality targets against a :func:`plan_quality` summary."""
    ok = summary[summary["status"] == "ok"]
    speedups = ok["vs_best_baseline"].dropna()
    top = ok.loc[speedups.idxmax()] if not speedups.empty else None
    bound = ok[(ok["bound"] == "compute") & ok["roofline_ratio"].notna()]
    worst = bound.loc[bound["roofline_ratio"].idxmax()] if not bound.empty else None
    return pd.DataFrame([
        {"target": f">= {SPEEDUP_TARGET:g}x over the best baseline on at least one workload",
         "value": (f"{top['vs_best_baseline']:.3g}x ({top['workload']} on {top['slice']})"
                   if top is not None else "no case scored"),
         "met": _met(top is not None and top["vs_best_baseline"] >= SPEEDUP_TARGET)},
        {"target": f"within {ROOFLINE_TARGET:g}x of the compute roofline wherever "
                   "compute-bound",
         "value": (f"worst {worst['roofline_ratio']:.3g}x ({worst['workload']} on "
                   f"{worst['slice']}); {len(bound)} of {len(ok)} cases compute-bound"
                   if worst is not None else f"no compute-bound case of {len(ok)}"),
         "met": ("n/a" if worst is None
                 else _met(bool((bound["roofline_ratio"] <= ROOFLINE_TARGET).all())))},
    ])


def _met(condition: Any) -> str:
    return "met" if bool(condition) else "missed"


# ----------------------------------------------------------------------------- search cost


@dataclass(frozen=True, eq=False)
class SearchCost:
    """:func:`search_cost`'s tables."""

    summary: pd.DataFrame
    """One row per case: cold and warm planner, counts, exhaustive comparison, targets."""
    candidates: pd.DataFrame
    """Per case and valid candidate: IR estimate, kept by pruning, compile status and the best
    predicted latency (exhaustive search), ranked by it."""
    targets: pd.DataFrame
    """``workload``, ``slice``, ``target``, ``value``, ``met``."""
    config: dict[str, Any] = field(default_factory=dict)

    def markdown(self) -> str:
        """The section of the benchmark report."""
        s = self.summary
        cost = s[["workload", "slice", "status", "cold_s", "warm_s", "enumerated", "valid",
                  "ir_traced", "compiled", "compiled_fraction", "baseline_compiles",
                  "compile_s"]]
        exhaustive = s[["workload", "slice", "exhaustive_status", "exhaustive_wall_s",
                        "exhaustive_compiled_ok", "exhaustive_compile_s", "plan_s",
                        "exhaustive_best_s", "exhaustive_best", "top1_equal", "regret_percent",
                        "kendall_tau"]]
        parts = [
            "## Search cost",
            "Planner wall time with an empty compile cache (a fresh temporary folder, "
            "`jax.clear_caches()` first; libtpu already loaded) and again with the cache it "
            "filled; what it enumerated (every role-degree combination x fsdp), found valid, "
            "traced (IR) and compiled (pruning survivors; the baselines' own candidates "
            "compiled on top are counted apart); `compile_s` sums the compiles' own times "
            f"(they run {os.cpu_count()} at a time). " + _config_line(self.config),
            markdown_table(cost),
        ]
        if (s["exhaustive_status"] == "ok").any():
            top = self.candidates.groupby(["workload", "slice"], sort=False).head(10)
            parts += [
                "Against the exhaustive search: every valid candidate compiled (survivors "
                "come from the cache the pruned search filled; `exhaustive_compile_s` sums "
                "every compile's own time) and placed by the same search (every structured "
                "placement, the same extra orders and local search), plus the same baseline "
                "pairs. `regret_percent`: latency the pruned plan loses against the exhaustive "
                "best; `kendall_tau`: rank correlation of the IR estimate and the compiled "
                "prediction over the candidates that compiled.",
                markdown_table(exhaustive),
                "The ten best candidates of the exhaustive search and whether pruning kept "
                "them:",
                markdown_table(top),
            ]
        else:
            why = sorted(set(s["exhaustive_status"].dropna().astype(str))) or ["no planner run"]
            parts.append(f"The exhaustive comparison did not run ({', '.join(why)}).")
        return "\n\n".join([
            *parts,
            "Targets (stated for 14B@720p on v5e:4x4 on a 2-core machine; checked on every "
            "case):",
            markdown_table(self.targets),
        ])


def search_cost(cases: Iterable[Case] = SEARCH_COST_MATRIX, *, num_layers: int | None = None,
                budget: int = 20_000, exhaustive: bool = True, timeout_s: float = 900.0,
                progress: Callable[[str], None] | None = None) -> SearchCost:
    """Time the planner cold and warm on each case; compare with the exhaustive search.

    Columns of ``summary``: ``cold_s`` (empty compile and IR caches: a fresh temporary folder,
    and ``jax.clear_caches()``), ``warm_s`` (the same cache again) and ``warm_all_cached``;
    ``enumerated``, ``valid``, ``ir_traced``, ``compiled`` (pruning survivors),
    ``compiled_fraction`` (of the valid), ``baseline_compiles`` (the baselines' candidates
    beyond the survivors), ``compile_s`` (the compiles' own seconds, survivors and baselines);
    with ``exhaustive``: ``exhaustive_wall_s``, ``exhaustive_compiled_ok``,
    ``exhaustive_compile_s``, ``plan_s``, ``exhaustive_best`` / ``exhaustive_best_s``,
    ``top1_equal``, ``regret_percent`` and ``kendall_tau`` (IR estimate vs best compiled
    prediction per candidate). ``num_layers``: compile depth (default: the planner's, full).
    """
    rows, candidate_frames, target_rows = [], [], []
    for case in cases:
        workload_label, slice_label = _label(case)
        row: dict[str, Any] = {"workload": workload_label, "slice": slice_label}
        try:
            workload, topology = resolve_case(case)
            row["workload"], row["slice"] = workload.name, topology.name
            with tempfile.TemporaryDirectory(prefix="aoizora-bench-cache-") as cache:
                row |= _search_row(workload, topology, cache, num_layers=num_layers,
                                   budget=budget, exhaustive=exhaustive, timeout_s=timeout_s,
                                   candidate_frames=candidate_frames, progress=progress)
        except Exception as err:  # a case that fails is a row, not the end of the run
            row["status"] = _error(err)
        rows.append(row)
        target_rows += _search_targets(row)
    columns = ["workload", "slice", "status", "cold_s", "warm_s", "warm_all_cached",
               "enumerated", "valid", "ir_traced", "compiled", "compiled_fraction",
               "baseline_compiles", "compile_s", "exhaustive_status", "exhaustive_wall_s",
               "exhaustive_compiled_ok", "exhaustive_compile_s", "plan_candidate", "plan_s",
               "exhaustive_best", "exhaustive_best_s", "top1_equal", "regret_percent",
               "kendall_tau"]
    summary = pd.DataFrame(rows).reindex(columns=columns)
    frame = (pd.concat(candidate_frames, ignore_index=True) if candidate_frames
             else pd.DataFrame())
    config = {"num_layers": num_layers or "full depth", "budget": budget,
              "exhaustive": exhaustive}
    return SearchCost(summary, frame, pd.DataFrame(target_rows), config)


def _search_row(workload: Workload, topology: Topology, cache: str, *,
                num_layers: int | None, budget: int, exhaustive: bool, timeout_s: float,
                candidate_frames: list[pd.DataFrame],
                progress: Callable[[str], None] | None) -> dict[str, Any]:
    import jax

    from aoizora_lab.candidates import Candidate, default_attention
    from aoizora_lab.compile import CACHED_STATUSES, compile_candidates
    from aoizora_lab.planner import plan

    def run() -> tuple[Any, float]:
        start = time.perf_counter()
        result = plan(workload, topology, budget=budget, num_layers=num_layers,
                      cache_dir=cache, ir_cache_dir=Path(cache) / "ir", timeout_s=timeout_s)
        return result, time.perf_counter() - start

    if progress:
        progress(f"search cost: {workload.name} on {topology.name}, cold")
    jax.clear_caches()
    cold, cold_s = run()
    if progress:
        progress(f"search cost: {workload.name} on {topology.name}, warm")
    warm, warm_s = run()
    valid = int(cold.candidates["valid"].sum())
    traced = int((~cold.pruning["reason"].astype(str).str.startswith("trace failed")).sum())
    survivors = set(cold.compiled["candidate"])
    extra = cold.baselines[~cold.baselines["candidate"].isin([*survivors, "-"])]
    extra_names = list(dict.fromkeys(extra[extra["status"].isin(CACHED_STATUSES)]["candidate"]))
    attention = default_attention(topology)
    # Cached by the cold run: read back for their compile seconds, nothing recompiles.
    extra_results = compile_candidates(
        [Candidate.from_name(n, attention=attention) for n in extra_names], workload,
        topology, cache_dir=cache, num_layers=num_layers, timeout_s=timeout_s)
    row: dict[str, Any] = {
        "status": "ok", "cold_s": cold_s, "warm_s": warm_s,
        "warm_all_cached": bool(warm.compiled["cached"].all()),
        "enumerated": len(cold.candidates), "valid": valid, "ir_traced": traced,
        "compiled": len(cold.compiled),
        "compiled_fraction": len(cold.compiled) / valid if valid else math.nan,
        "baseline_compiles": len(set(extra["candidate"])),
        "compile_s": float(cold.compiled["compile_s"].sum()
                           + sum(r.compile_seconds for r in extra_results)),
        "plan_candidate": cold.best.candidate.name, "plan_s": cold.best.predicted.total_s,
    }
    if not exhaustive:
        row["exhaustive_status"] = "skipped"
        return row
    if progress:
        progress(f"search cost: {workload.name} on {topology.name}, exhaustive")
    try:
        row |= _exhaustive(workload, topology, cold, cache, num_layers=num_layers,
                           budget=budget, timeout_s=timeout_s,
                           candidate_frames=candidate_frames)
    except Exception as err:  # the comparison failing must not lose the timings
        row["exhaustive_status"] = _error(err)
    return row


def _exhaustive(workload: Workload, topology: Topology, result: Any, cache: str, *,
                num_layers: int | None, budget: int, timeout_s: float,
                candidate_frames: list[pd.DataFrame]) -> dict[str, Any]:
    """Every valid candidate compiled and placed exactly as the planner places survivors."""
    from scipy import stats

    from aoizora_lab.candidates import candidates_from_table, default_attention
    from aoizora_lab.compile import compile_candidates
    from aoizora_lab.placement import search_placements
    from aoizora_lab.planner import TOP_PLACEMENTS, predict, search_starts

    valid = candidates_from_table(result.candidates, default_attention(topology))
    start = time.perf_counter()
    compiled = compile_candidates(valid, workload, topology, cache_dir=cache,
                                  num_layers=num_layers, timeout_s=timeout_s)
    pruning = result.pruning.set_index("candidate")
    rows = []
    for r in compiled:
        name = r.candidate.name
        row = {"workload": workload.name, "slice": topology.name, "candidate": name,
               "ir_estimate_s": (pruning.loc[name, "estimate_s"]
                                 if "estimate_s" in pruning else math.nan),
               "kept": bool(pruning.loc[name, "keep"]), "status": r.status,
               "compile_s": r.compile_seconds, "best_total_s": math.nan, "placement": ""}
        if r.status == "ok":
            try:  # placed exactly as the planner places its survivors
                found = search_placements(r.program, r.candidate.mesh_shape, topology,
                                          budget=budget, axis_names=r.candidate.axis_names,
                                          extra=search_starts(r.candidate, topology))
                priced = [(predict(r.program, topology, p).total_s, p.description)
                          for p in found.head(TOP_PLACEMENTS)["placement"]]
                row["best_total_s"], row["placement"] = min(priced)
            except Exception as err:  # one candidate's failure is its row's status
                row["status"] = _error(err)
        rows.append(row)
    wall = time.perf_counter() - start
    frame = pd.DataFrame(rows).sort_values("best_total_s", na_position="last",
                                           kind="stable").reset_index(drop=True)
    frame.insert(2, "rank", np.arange(1, len(frame) + 1))
    candidate_frames.append(frame)
    # The pool the planner chooses from also holds the baseline pairs (a baseline that beats
    # the search becomes the plan), so the exhaustive best is taken over them too.
    pool = [(t, n) for t, n in zip(frame["best_total_s"], frame["candidate"], strict=True)
            if np.isfinite(t)]
    base = result.baselines[(result.baselines["baseline"] != "aoizora-lab")
                            & (result.baselines["status"] == "ok")]
    pool += [(float(t), n) for t, n in zip(base["total_s"], base["candidate"], strict=True)]
    best_s, best_name = min(pool)
    plan_s = result.best.predicted.total_s
    ok = frame[np.isfinite(frame["best_total_s"]) & np.isfinite(frame["ir_estimate_s"])]
    tau = (float(stats.kendalltau(ok["ir_estimate_s"], ok["best_total_s"]).statistic)
           if len(ok) >= 2 else math.nan)
    return {
        "exhaustive_status": "ok", "exhaustive_wall_s": wall,
        "exhaustive_compiled_ok": int((frame["status"] == "ok").sum()),
        "exhaustive_compile_s": float(frame["compile_s"].sum()),
        "exhaustive_best": best_name, "exhaustive_best_s": best_s,
        "top1_equal": bool(best_name == result.best.candidate.name
                           and math.isclose(best_s, plan_s, rel_tol=1e-9)),
        "regret_percent": 100.0 * (plan_s / best_s - 1.0),
        "kendall_tau": tau,
    }


def _search_targets(row: dict[str, Any]) -> list[dict[str, Any]]:
    where = {"workload": row["workload"], "slice": row["slice"]}
    if row.get("status") != "ok":
        return [{**where, "target": "planner runs", "value": row.get("status"),
                 "met": "missed"}]
    checks = [
        (f"cold <= {COLD_TARGET_S:g} s", f"{row['cold_s']:.1f} s",
         row["cold_s"] <= COLD_TARGET_S),
        (f"warm <= {WARM_TARGET_S:g} s", f"{row['warm_s']:.1f} s",
         row["warm_s"] <= WARM_TARGET_S),
        (f"pruned search compiles <= {COMPILE_FRACTION_TARGET:.0%} of valid candidates",
         f"{row['compiled']} of {row['valid']} ({row['compiled_fraction']:.0%})",
         row["compiled_fraction"] <= COMPILE_FRACTION_TARGET),
    ]
    out = [{**where, "target": t, "value": v, "met": _met(m)} for t, v, m in checks]
    if row.get("exhaustive_status") == "ok":
        out.append({**where, "target": f"regret {REGRET_TARGET_PERCENT:g} %",
                    "value": f"{row['regret_percent']:.3g} %",
                    "met": _met(row["regret_percent"] <= REGRET_TARGET_PERCENT + 1e-9)})
    else:
        out.append({**where, "target": f"regret {REGRET_TARGET_PERCENT:g} %",
                    "value": f"exhaustive {row.get('exhaustive_status')}", "met": "n/a"})
    return out


# ----------------------------------------------------------------------------- throughput


def placement_throughput(evaluations: int = 20_000,
                         cases: Sequence[tuple[Topology | str, Workload | str, str]] =
                         THROUGHPUT_CASES, *, num_layers: int = 2,
                         cache_dir: str | Path | None = None) -> pd.DataFrame:
    """Placements scored per second on the search's own workload, one row per case.

    Per case (slice, workload, candidate): compile the candidate at ``num_layers`` layers
    (or take it from the compile cache), build its CommProgram, then time the scorer on every
    structured placement followed by batches of pairwise swaps of the best four, until at
    least ``evaluations`` placements are scored.
    """
    from aoizora_lab.candidates import Candidate, default_attention
    from aoizora_lab.compile import compile_candidates
    from aoizora_lab.placement import PlacementScorer, structured_placements

    rows = []
    for slice_case, workload_case, name in cases:
        workload_label, slice_label = _label((workload_case, slice_case))
        try:
            workload, topology = resolve_case((workload_case, slice_case))
            candidate = Candidate.from_name(name, attention=default_attention(topology))
            [compiled] = compile_candidates([candidate], workload, topology,
                                            num_layers=num_layers, cache_dir=cache_dir)
        except Exception as err:  # a case that fails is a row, not the end of the run
            rows.append({"slice": slice_label, "workload": workload_label, "candidate": name,
                         "status": _error(err)})
            continue
        if compiled.status != "ok":
            rows.append({"slice": topology.name, "workload": workload.name, "candidate": name,
                         "status": compiled.status})
            continue
        scorer = PlacementScorer(compiled.program, topology)
        structured = np.array([p.order for p in structured_placements(
            candidate.mesh_shape, topology)])
        rng = np.random.default_rng(0)
        start = time.perf_counter()
        scores = scorer.scores(structured)
        best = structured[np.argsort(scores)[:4]]
        done = len(structured)
        while done < evaluations:
            batch = np.repeat(best, 64, axis=0)
            i, j = rng.integers(0, topology.num_devices, size=(2, len(batch)))
            index = np.arange(len(batch))
            batch[index, i], batch[index, j] = batch[index, j], batch[index, i]
            scorer.scores(batch)
            done += len(batch)
        elapsed = time.perf_counter() - start
        rows.append({"slice": topology.name, "workload": workload.name, "candidate": name,
                     "status": "ok", "chips": topology.num_chips,
                     "hlo collectives": len(compiled.program.collectives),
                     "structures": len(scorer.structures), "structured": len(structured),
                     "evaluated": done, "seconds": elapsed, "placements/s": done / elapsed,
                     "group layouts modelled": scorer.group_layouts_modelled})
    return pd.DataFrame(rows)


def throughput_markdown(table: pd.DataFrame, evaluations: int) -> str:
    """The placement-throughput section of the benchmark report."""
    return "\n\n".join([
        "## Placement throughput",
        "Placements scored per second by `PlacementScorer` (one core, numpy) on the search's "
        "own workload: every structured placement, then batches of pairwise swaps of the best "
        f"four, at least {evaluations:,} evaluations per case; programs compiled at 2 layers "
        "and folded to the model's depth.",
        markdown_table(table),
    ])


# ----------------------------------------------------------------------------- the report


def markdown_table(frame: pd.DataFrame, *, digits: int = 4) -> str:
    """``frame`` as a GitHub Markdown table: floats to ``digits`` significant digits, numbers
    right-aligned, NaN as ``–``, ``|`` escaped. (``DataFrame.to_markdown`` needs ``tabulate``,
    which is not a dependency.)"""
    if frame.empty and not len(frame.columns):
        return "_(no rows)_"

    def cell(value: Any) -> str:
        if value is None or (isinstance(value, float) and math.isnan(value)):
            return "–"
        if isinstance(value, bool | np.bool_):
            return "yes" if value else "no"
        if isinstance(value, float | np.floating):
            return f"{value:.{digits}g}"
        return str(value).replace("|", "\\|").replace("\n", " ")

    numeric = [pd.api.types.is_numeric_dtype(frame[c]) and not pd.api.types.is_bool_dtype(
        frame[c]) for c in frame.columns]
    lines = ["| " + " | ".join(str(c).replace("|", "\\|") for c in frame.columns) + " |",
             "|" + "|".join("---:" if n else "---" for n in numeric) + "|"]
    lines += ["| " + " | ".join(cell(v) for v in row) + " |"
              for row in frame.itertuples(index=False)]
    return "\n".join(lines)


def environment() -> dict[str, str]:
    """The machine (cores, CPU model, memory), the versions that matter, and the date."""
    cpu = platform.processor() or platform.machine()
    memory = ""
    try:
        text = Path("/proc/cpuinfo").read_text()
        names = [line.split(":", 1)[1].strip() for line in text.splitlines()
                 if line.startswith("model name")]
        cpu = names[0] if names else cpu
        meminfo = Path("/proc/meminfo").read_text().split()
        memory = f"{int(meminfo[meminfo.index('MemTotal:') + 1]) / 2**20:.1f} GiB"
    except (OSError, ValueError, IndexError):
        pass
    info = {"date": datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC"),
            "machine": f"{os.cpu_count()} cores, {cpu}" + (f", {memory} RAM" if memory else ""),
            "python": platform.python_version()}
    for package in ("aoizora-lab", "jax", "jaxlib", "libtpu", "numpy"):
        try:
            info[package] = importlib.metadata.version(package)
        except importlib.metadata.PackageNotFoundError:
            info[package] = "absent"
    return info


def render_report(sections: Sequence[str], env: dict[str, str] | None = None, *,
                  command: str = "aoizora-lab bench") -> str:
    """The whole report: title, how it was made (command, machine, versions, date), sections."""
    env = env or environment()
    header = "\n".join([
        "# AoiZora Lab benchmarks",
        "",
        f"Generated by `{command}` on {env['date']}. Regenerate it with the same command; "
        "never edit by hand.",
        "",
        *[f"- **{key}**: {value}" for key, value in env.items() if key != "date"],
    ])
    return "\n\n".join([header, *sections]) + "\n"


def _config_line(config: dict[str, Any]) -> str:
    return ("Run with " + ", ".join(f"{k} = {v}" for k, v in config.items()) + "."
            if config else "")


def run_all(*, quick: bool = False, out: str | Path = "reports/benchmarks.md",
            only: Sequence[str] | None = None, num_layers: int | None = None,
            skip_exhaustive: bool = False, evaluations: int | None = None,
            cache_dir: str | Path | None = None, cases: Sequence[str] | None = None,
            search_cases: Sequence[str] | None = None, command: str = "aoizora-lab bench",
            progress: Callable[[str], None] | None = None) -> Path:
    """Run the benchmarks (``only``: a subset of ``plan-quality``, ``search-cost``,
    ``placement-throughput``) and write the report to ``out``.

    ``quick``: :data:`QUICK_MATRIX` for plan quality and search cost, compiled at
    :data:`QUICK_LAYERS` layers unless ``num_layers`` says otherwise, and 2,000 placement
    evaluations on the first of :data:`THROUGHPUT_CASES` (8 chips); otherwise
    :data:`DEFAULT_MATRIX`, :data:`SEARCH_COST_MATRIX` at the planner's depth (full unless
    ``num_layers``) and 20,000 evaluations. ``cases`` / ``search_cases``
    (``"MODEL@RES/SLICE"``) replace the plan-quality / search-cost matrix. ``cache_dir``: the
    compile cache of plan quality and placement throughput (default ``data/cache/compile``;
    search cost always starts from an empty one).
    """
    names = ("plan-quality", "search-cost", "placement-throughput")
    chosen = list(only or names)
    unknown = sorted(set(chosen) - set(names))
    if unknown:
        raise AoizoraError(f"Unknown benchmarks {unknown}; choose from {list(names)}.")
    layers = num_layers if num_layers is not None else (QUICK_LAYERS if quick else None)
    evaluations = evaluations or (2_000 if quick else 20_000)
    path = Path(out)
    path.parent.mkdir(parents=True, exist_ok=True)
    sections: list[str] = []

    def add(section: str) -> None:
        # Written after every benchmark, so an interrupted run keeps the finished ones.
        sections.append(section)
        path.write_text(render_report(sections, command=command))

    if "plan-quality" in chosen:
        matrix = ([parse_case(c) for c in cases] if cases
                  else QUICK_MATRIX if quick else DEFAULT_MATRIX)
        add(plan_quality(matrix, num_layers=layers, cache_dir=cache_dir,
                         progress=progress).markdown())
    if "search-cost" in chosen:
        matrix = ([parse_case(c) for c in search_cases] if search_cases
                  else QUICK_MATRIX if quick else SEARCH_COST_MATRIX)
        add(search_cost(matrix, num_layers=layers, exhaustive=not skip_exhaustive,
                        progress=progress).markdown())
    if "placement-throughput" in chosen:
        if progress:
            progress("placement throughput")
        table = placement_throughput(evaluations,
                                     THROUGHPUT_CASES[:1] if quick else THROUGHPUT_CASES,
                                     cache_dir=cache_dir)
        add(throughput_markdown(table, evaluations))
    return path
