"""Keep the candidates worth compiling: IR estimates, lower bounds, and a reason for each drop.

Rules, applied to every candidate in order (the first that applies decides):

1. **Cannot fit**: parameters plus the largest activation per device exceed the chip's usable
   HBM (15.75 GiB on v5e): compiling it would only report ``RESOURCE_EXHAUSTED``.
2. **Cannot win**: its latency *lower bound* exceeds the best *estimate* of any candidate by
   more than ``bound_margin`` (default 25 %, headroom for the estimate's error): even the
   best placement on this slice could not make it competitive.
3. **Unlikely to win**: its estimate exceeds the best estimate by more than
   ``estimate_margin`` (default 10 %: candidates that fit share most of their compute, so the
   estimates of the contenders sit within a few per cent of each other).
4. **Over the compile budget**: beyond the best ``max_fraction`` (default a quarter) of all
   candidates by estimate.
5. The ``keep`` best candidates by estimate that fit are always kept, whatever rules 2-4 say,
   so a poor estimate can never empty the compile queue.

Estimates apply the overlap rule, so when every collective hides behind compute many
candidates tie; estimates equal to 3 significant digits are ranked by their communication
estimate (the overlap rule is optimistic: less traffic is the safer bet).

A candidate whose trace fails is dropped with the error as its reason; the sweep goes on.
Example (Wan 2.1 14B at 720p on ``v5e:4x4``): ``cfg2-tp8`` has a lower bound of 6.0 s while
``cfg2-uly8-fsdp`` is estimated at 7.6 s, so rule 2 spares it (6.0 < 1.25 x 7.6), but its
estimate of 11.8 s is 1.55x the best and rule 3 drops it.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import pandas as pd

from aoizora_lab.candidates import Candidate
from aoizora_lab.errors import AoizoraError
from aoizora_lab.hardware import chip_spec
from aoizora_lab.ir import IRCacheDir, IREstimate, estimate_ir
from aoizora_lab.topology import Topology
from aoizora_lab.workload import Workload

GiB = 2**30


def estimate_candidates(candidates: Sequence[Candidate], workload: Workload,
                        topology: Topology, *, dtype: Any = None,
                        ir_cache_dir: IRCacheDir = None,
                        ) -> dict[str, IREstimate | str]:
    """IR estimate per candidate name, or the error text where tracing failed (traces cached
    under ``ir_cache_dir``, see :func:`estimate_ir`)."""
    results: dict[str, IREstimate | str] = {}
    for candidate in candidates:
        try:
            results[candidate.name] = estimate_ir(candidate, workload, topology, dtype=dtype,
                                                  cache_dir=ir_cache_dir)
        except Exception as err:  # one candidate's failure must not end the sweep
            results[candidate.name] = f"{type(err).__name__}: {err}"
    return results


PRUNING_COLUMNS = ("candidate", "estimate_s", "lower_bound_s", "compute_estimate_s",
                   "comm_estimate_s", "tflops_per_device", "comm_gb_per_device",
                   "param_gib_per_device", "memory_lower_bound_gib", "keep", "reason")
"""Columns of :func:`prune`'s table."""


def prune(candidates: Sequence[Candidate], workload: Workload, topology: Topology, *,
          keep: int = 3, bound_margin: float = 0.25, estimate_margin: float = 0.1,
          max_fraction: float = 0.25, estimates: dict[str, IREstimate | str] | None = None,
          dtype: Any = None, ir_cache_dir: IRCacheDir = None,
          ) -> pd.DataFrame:
    """One row per candidate, best estimate first: IR figures, ``keep`` and ``reason``."""
    if keep < 1 or bound_margin < 0 or estimate_margin < 0 or not 0 < max_fraction <= 1:
        raise AoizoraError(
            f"prune needs keep >= 1, non-negative margins and 0 < max_fraction <= 1; got "
            f"keep={keep}, bound_margin={bound_margin}, estimate_margin={estimate_margin}, "
            f"max_fraction={max_fraction}."
        )
    budget = max(keep, math.floor(max_fraction * len(candidates)))
    estimates = estimates or estimate_candidates(candidates, workload, topology, dtype=dtype,
                                                 ir_cache_dir=ir_cache_dir)
    usable = chip_spec(topology.generation).hbm_usable_bytes
    rows = []
    for candidate in candidates:
        result = estimates[candidate.name]
        if isinstance(result, str):
            rows.append({"candidate": candidate.name, "keep": False,
                         "reason": f"trace failed: {result}"})
            continue
        rows.append({
            "candidate": candidate.name,
            "estimate_s": result.estimate_seconds,
            "lower_bound_s": result.lower_bound_seconds,
            "compute_estimate_s": result.compute_estimate_seconds,
            "comm_estimate_s": result.comm_estimate_seconds,
            "tflops_per_device": result.flops / 1e12,
            "comm_gb_per_device": result.comm_bytes / 1e9,
            "param_gib_per_device": result.param_bytes / GiB,
            "memory_lower_bound_gib": result.memory_lower_bound_bytes / GiB,
            "keep": True, "reason": "",
        })
    table = pd.DataFrame(rows, columns=PRUNING_COLUMNS)  # every column, even if no trace ran
    traced = table["reason"] == ""
    fits = traced & (table["memory_lower_bound_gib"] * GiB <= usable)
    table.loc[traced & ~fits, "keep"] = False
    table.loc[traced & ~fits, "reason"] = table.loc[traced & ~fits].apply(
        lambda r: f"cannot fit: needs >= {r.memory_lower_bound_gib:.2f} GiB per device "
                  f"(parameters + largest activation) > {usable / GiB:.2f} GiB usable HBM",
        axis=1)
    if fits.any():
        ranked = _ranked(table[fits]).index
        best = table.loc[ranked[0]]
        best_s = best["estimate_s"]
        for i in table[fits].index:
            row = table.loc[i]
            if i in ranked[:keep]:
                table.loc[i, "reason"] = f"kept: among the {keep} best estimates"
            elif row.lower_bound_s > (1 + bound_margin) * best_s:
                table.loc[i, ["keep", "reason"]] = [False, (
                    f"cannot win: lower bound {row.lower_bound_s:.3g} s > "
                    f"{1 + bound_margin:g} x best estimate {best_s:.3g} s ({best.candidate})")]
            elif row.estimate_s > (1 + estimate_margin) * best_s:
                table.loc[i, ["keep", "reason"]] = [False, (
                    f"unlikely to win: estimate {row.estimate_s:.3g} s is "
                    f"{row.estimate_s / best_s:.2f} x the best ({best.candidate})")]
            elif i not in ranked[:budget]:
                table.loc[i, ["keep", "reason"]] = [False, (
                    f"over the compile budget: not among the best {budget} of "
                    f"{len(candidates)} estimates")]
            else:
                table.loc[i, "reason"] = (f"kept: estimate within {1 + estimate_margin:g} x "
                                          "the best")
    return pd.concat([_ranked(table[traced]), table[~traced]]).reset_index(drop=True)


def survivors(candidates: Sequence[Candidate], pruning: pd.DataFrame) -> list[Candidate]:
    """The candidates ``pruning`` (a :func:`prune` table) kept, in ``candidates``' order:
    what the compile stage compiles."""
    kept = set(pruning.loc[pruning["keep"].astype(bool), "candidate"])
    return [c for c in candidates if c.name in kept]


def _ranked(table: pd.DataFrame) -> pd.DataFrame:
    """Best estimate first; estimates equal to 3 significant digits go to less communication."""
    tie = table["estimate_s"].map(lambda v: float(f"{v:.3g}"))
    order = pd.DataFrame({"tie": tie, "comm": table["comm_estimate_s"]}).sort_values(
        ["tie", "comm"], kind="stable").index
    return table.loc[order]
