"""Placement throughput: placements the placement search scores per second.

:func:`placement_throughput` times :class:`~aoizora_lab.placement.PlacementScorer` on the
search's own workload (every structured placement, then batches of pairwise swaps of the best
ones) on Wan-sized compiled programs, for :data:`THROUGHPUT_CASES` (8, 16, 64 and 256 chips);
:func:`throughput_markdown` is its section of the report, with :data:`THROUGHPUT_TARGETS`
checked (:func:`throughput_targets`).
"""

from __future__ import annotations

import functools
import math
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from aoizora_lab.bench.report import case_row, markdown_table, met
from aoizora_lab.cases import Case
from aoizora_lab.compile import CompileStatus
from aoizora_lab.topology import Topology
from aoizora_lab.workload import Workload

THROUGHPUT_CASES: tuple[tuple[str, str], ...] = (
    ("wan2.1-t2v-1.3b@832x480x81/v5e:2x4", "cfg2-uly4"),
    ("wan2.1-t2v-14b@1280x720x81/v5e:4x4", "cfg2-uly8-fsdp"),
    ("wan2.1-t2v-14b@1280x720x81/v5e:8x8", "cfg2-uly8-ring4-fsdp"),
    ("wan2.1-t2v-14b@1280x720x81/v5e:16x16", "cfg2-uly8-ring16-fsdp"),
)
"""(case, candidate) of :func:`placement_throughput`: 8, 16, 64 and 256 chips (what each
program's compile costs: the section's `compile_s` and `compile host_gib`)."""

THROUGHPUT_TARGETS: dict[int, float] = {64: 20_000.0, 256: 5_000.0}
"""Chips -> the least swap evaluations per second (`placements/s`) the search should score:
a 64-chip budget of 20,000 evaluations in about a second, and the 256-chip search within a few
seconds per program."""

WHOLE_BATCH = 1_000
"""Swapped placements priced from scratch for the comparison column."""

THROUGHPUT_LAYERS = 2
"""Compile depth of the programs scored. Folding to the model's depth changes how often each
collective runs, not which ones run, so the scorer does the full model's work."""


def placement_throughput(evaluations: int = 20_000,
                         cases: Sequence[tuple[Case | str, str]] = THROUGHPUT_CASES, *,
                         num_layers: int = THROUGHPUT_LAYERS,
                         cache_dir: str | Path | None = None) -> pd.DataFrame:
    """Placements scored per second on the search's own workload, one row per case.

    Per case (case spec, candidate): compile the candidate at ``num_layers`` layers
    (or take it from the compile cache), build its CommProgram, then time the scorer on every
    structured placement followed by batches of pairwise swaps of the best four, until at
    least ``evaluations`` placements are scored.
    """
    return pd.DataFrame([
        case_row(case, functools.partial(_throughput_row, name=name, evaluations=evaluations,
                                         num_layers=num_layers, cache_dir=cache_dir),
                 candidate=name)
        for case, name in cases])


def _throughput_row(workload: Workload, topology: Topology, *, name: str, evaluations: int,
                    num_layers: int, cache_dir: str | Path | None) -> dict[str, Any]:
    from aoizora_lab.candidates import Candidate, default_attention
    from aoizora_lab.compile import compile_candidates
    from aoizora_lab.cost import predict
    from aoizora_lab.placement import (
        LOCAL_SEARCH_CHAINS,
        LOCAL_SEARCH_STARTS,
        SWAPS_PER_STEP,
        PlacementScorer,
        anneal,
        structured_placements,
    )
    from aoizora_lab.uncertainty import DEFAULT_ENSEMBLE, price

    candidate = Candidate.from_name(name, attention=default_attention(topology))
    [compiled] = compile_candidates([candidate], workload, topology, num_layers=num_layers,
                                    cache_dir=cache_dir)
    if compiled.status is not CompileStatus.OK:
        return {"status": compiled.status}
    scorer = PlacementScorer(compiled.program, topology)
    structured = np.array([p.order for p in structured_placements(candidate.mesh_shape,
                                                                  topology)])
    rng = np.random.default_rng(0)
    # The scorer's compiled loops load (or compile, the first time on a machine) before the
    # clock starts, on a scorer of its own.
    PlacementScorer(compiled.program, topology).swap_scores(structured[:1], [0], [1])
    start = time.perf_counter()
    scores = scorer.scores(structured)
    starts = structured[np.argsort(scores)[:LOCAL_SEARCH_STARTS]]
    chains = np.repeat(starts, LOCAL_SEARCH_CHAINS, axis=0)
    steps = -(-max(0, evaluations - scorer.evaluations) // (SWAPS_PER_STEP * len(chains)))
    ends = anneal(scorer, chains, SWAPS_PER_STEP * steps, rng)
    elapsed = time.perf_counter() - start
    done = scorer.evaluations
    best_s = min(float(scores.min()), float(scorer.scores(ends).min()))
    bound_s = scorer.lower_bound()
    # For comparison: swaps of the same starts priced as whole placements (no kept terms).
    whole = PlacementScorer(compiled.program, topology)
    batch = np.repeat(starts, WHOLE_BATCH // len(starts), axis=0)
    i, j = rng.integers(0, topology.num_devices, size=(2, len(batch)))
    index = np.arange(len(batch))
    batch[index, i], batch[index, j] = batch[index, j], batch[index, i]
    whole.scores(batch[:8])  # chip sets of the starts worked out outside the timing
    whole_start = time.perf_counter()
    whole.scores(batch)
    whole_s = time.perf_counter() - whole_start
    # How sure, on the best start: one model, then the ensemble (its other device-order
    # choice is estimated here, cold).
    predict_start = time.perf_counter()
    predict(compiled.program, topology, starts[0])
    predict_s = time.perf_counter() - predict_start
    ensemble_start = time.perf_counter()
    price(compiled.program, topology, starts[0], DEFAULT_ENSEMBLE)
    ensemble_s = time.perf_counter() - ensemble_start
    return {"status": "ok", "chips": topology.num_chips,
            "compile_s": compiled.compile_seconds,
            "compile host_gib": compiled.host_peak_bytes / 2**30,
            "hlo collectives": len(compiled.program.collectives),
            "structures": len(scorer.structures), "structured": len(structured),
            "evaluated": done, "seconds": elapsed, "placements/s": done / elapsed,
            "whole placements/s": len(batch) / whole_s,
            "best exposed_s": best_s, "lower bound_s": bound_s,
            "gap": best_s / bound_s if bound_s > 0 else math.nan,
            "group layouts modelled": scorer.group_layouts_modelled,
            "predict_s": predict_s, "ensemble_s": ensemble_s}


def throughput_markdown(table: pd.DataFrame, evaluations: int) -> str:
    """The placement-throughput section of the benchmark report."""
    from aoizora_lab.placement import LOCAL_SEARCH_CHAINS, LOCAL_SEARCH_STARTS, SWAPS_PER_STEP
    from aoizora_lab.uncertainty import DEFAULT_ENSEMBLE

    return "\n\n".join([
        "## Placement throughput",
        "Placements scored per second by `PlacementScorer` (one core; numpy, its inner loops "
        "compiled by numba) on the search's own workload: every structured placement, then "
        "the local search "
        f"(`placement.anneal`) from the best {LOCAL_SEARCH_STARTS}, {LOCAL_SEARCH_CHAINS} "
        f"chains each, {SWAPS_PER_STEP} swaps per chain and step "
        f"priced by `swap_scores`, at least {evaluations:,} evaluations per case; programs "
        f"compiled at {THROUGHPUT_LAYERS} layers and folded to the model's depth. `whole "
        f"placements/s`: {WHOLE_BATCH} such swaps priced from scratch (`scores`), for "
        "comparison. `compile_s` / `compile host_gib`: the deviceless compile of the program "
        "(2 layers, one child process) and that process's peak resident memory, as recorded "
        "when it compiled (a cached program keeps its record). `best exposed_s`: the least "
        "exposed communication found; `lower "
        "bound_s`: what no placement can beat (`PlacementScorer.lower_bound`: every "
        "collective at its per-chip injection bound, all-to-alls also at their average link "
        "load; loose where gathers' routes are long); `gap` = best / bound. `predict_s`: "
        "the best start priced in full by `cost.predict` (one model, cold); `ensemble_s`: "
        f"the same placement under the {DEFAULT_ENSEMBLE.count} draws of "
        "`uncertainty.DEFAULT_ENSEMBLE` "
        "(`uncertainty.price`, its other device-order choice estimated cold): what a plan's "
        "uncertainty costs per program.",
        markdown_table(table),
        "Targets (swap evaluations, `placements/s`, on the machine above):",
        markdown_table(throughput_targets(table)),
    ])


def throughput_targets(table: pd.DataFrame) -> pd.DataFrame:
    """Each :data:`THROUGHPUT_TARGETS` entry against the rows of ``table`` with that many
    chips (a missing or failed row misses it)."""
    rows = []
    for chips, least in THROUGHPUT_TARGETS.items():
        rates = (table.loc[table["chips"] == chips, "placements/s"].dropna()
                 if {"chips", "placements/s"} <= set(table.columns) else pd.Series(dtype=float))
        rows.append({"target": f">= {least:,.0f} placements/s at {chips} chips",
                     "value": ", ".join(f"{r:,.0f}/s" for r in rates) or "no result",
                     "met": met(len(rates) and (rates >= least).all())})
    return pd.DataFrame(rows, columns=["target", "value", "met"])
