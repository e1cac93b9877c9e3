"""Quick plans: what a compile budget buys and loses against the full search.

:func:`quick_plans` plans each case in full (the compile cache as it is: warm after the
search-cost benchmark), then again with ``PlanOptions(max_compiled=k, systems=False)`` for k = 1,
2, ...: the IR's best k survivors, each with the flag sets worth it, and no existing
system's setup. Each row is that plan, its regret against the full search's own best
(``PlanResult.searched``: a quick plan compiles no system's setup, so it is measured against
what the same search finds, not against a system's setup the full plan may recommend) and its
compiles. A cold quick plan (an empty cache) is timed for the smallest k that found the full
search's own best and for the k before it: the budget a user would have needed, known only
afterwards (the IR ties on compute-bound cases, so no rule picks k in advance), and what
one less would have lost. Then ``PlanOptions(time_limit_s=t)`` (the systems' setups sharing the
limit) from an empty cache for each t of ``time_limits``, and again on the caches it
filled: the budget a user does know in advance, their patience (the command line's default,
:data:`~aoizora_lab.options.INTERACTIVE_TIME_LIMIT_S`).
What each budget found, per case: ``reports/benchmarks.md``, "Quick plans".
"""

from __future__ import annotations

import math
import tempfile
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import pandas as pd

from aoizora_lab.bench.report import case_row, config_line, markdown_table, met
from aoizora_lab.bench.search import (
    REGRET_TARGET_PERCENT,
    SEARCH_COST_MATRIX,
    WARM_TARGET_S,
)
from aoizora_lab.cases import Case
from aoizora_lab.compile import Compiles
from aoizora_lab.errors import AoizoraError
from aoizora_lab.options import INTERACTIVE_TIME_LIMIT_S
from aoizora_lab.topology import Topology
from aoizora_lab.versions import cache_root_at
from aoizora_lab.workload import Workload

QUICK_PLAN_MATRIX: tuple[str, ...] = (SEARCH_COST_MATRIX[0], "wan2.1-t2v-14b@832x480x81/v5e:4x8",
                                      "wan2.1-t2v-1.3b@832x480x81/v5e:2x4")
"""Quick-plan cases: the search-cost targets' case, where the time-limited order was developed,
and two it was not developed on (a new user's first try and the README's example, also a
search-cost case), so its regret is checked where it could be lost."""
QUICK_PLAN_MAX = 8
"""Largest compile budget k tried (fewer where pruning keeps fewer)."""
TIME_LIMITS: tuple[float, ...] = (INTERACTIVE_TIME_LIMIT_S,)
"""Time limits tried from an empty cache: ``aoizora-lab plan``'s default, the cold-plan
target (5 minutes)."""

_COLUMNS = ["workload", "slice", "status", "max_compiled", "candidate", "flags", "plan_s",
            "regret_percent", "compiles", "compiled_now", "cold_s"]
_TIMED_COLUMNS = ["workload", "slice", "status", "time_limit_s", "candidate", "flags",
                  "plan_s", "regret_percent", "compiled", "unstarted", "vs_best_system",
                  "systems_partial", "cold_s", "warm_s"]


@dataclass(frozen=True, eq=False)
class QuickPlans:
    """:func:`quick_plans`' tables."""

    full: pd.DataFrame
    """One row per case: the full search's plan, its compiles and wall time (this run)."""
    budgets: pd.DataFrame
    """One row per case and k: the quick plan, its regret, its compiles and, where timed,
    its wall time from an empty cache."""
    timed: pd.DataFrame = field(default_factory=lambda: pd.DataFrame(columns=_TIMED_COLUMNS))
    """One row per case and time limit: the time-limited plan from an empty cache, its
    regret, its compiles (started, and left unstarted by the limit) and its wall time."""
    config: dict[str, Any] = field(default_factory=dict)
    """How it was run."""

    @property
    def targets(self) -> pd.DataFrame:
        """Each time-limited plan against its limit and the regret target (``workload``,
        ``slice``, ``target``, ``value``, ``met``)."""
        rows = []
        for _, r in self.timed.iterrows():
            where = {"workload": r["workload"], "slice": r["slice"]}
            rows += [{**where, "target": f"cold plan with --time-limit {r['time_limit_s']:g} "
                      f"ends within it", "value": f"{r['cold_s']:.1f} s",
                      "met": met(r["cold_s"] <= r["time_limit_s"])},
                     {**where, "target": f"its regret {REGRET_TARGET_PERCENT:g} % (against "
                      "the full search)", "value": f"{r['regret_percent']:.3g} %",
                      "met": met(r["regret_percent"] <= REGRET_TARGET_PERCENT + 1e-9)},
                     {**where, "target": f"the same plan warm <= {WARM_TARGET_S:g} s",
                      "value": f"{r['warm_s']:.1f} s", "met": met(r["warm_s"] <= WARM_TARGET_S)}]
        return pd.DataFrame(rows, columns=["workload", "slice", "target", "value", "met"])

    def markdown(self) -> str:
        """The section of the benchmark report."""
        return "\n\n".join([
            "## Quick plans",
            "`PlanOptions(max_compiled=k, systems=False)` (`aoizora-lab plan CASE --max-compiled k "
            "--no-systems`): only the IR's best k survivors compiled, each with the flag sets "
            "worth it, and no existing system's setup, against the full search on the same "
            "case (its plan, `full_compiles`: survivors x flag sets plus the systems' setups, "
            "and `full_wall_s`, this run's, on the compile cache as it was: `all_cached` "
            "says whether anything compiled). `regret_percent`: the quick plan's step over "
            "the full search's own best (`searched_s`: before a system's setup may replace "
            "it, since a quick plan compiles none); `compiled_now`: compiles the full "
            "search had not made (the budget changes which further flag sets could still "
            "win); `cold_s`: the quick plan from an empty cache, timed for the smallest k "
            "that found the full search's own best and the k before it. That k is known "
            "only afterwards: where the IR estimates tie, no rule picks it in advance. "
            + config_line(self.config),
            markdown_table(self.full),
            markdown_table(self.budgets),
            *self._timed_markdown(),
        ])

    def _timed_markdown(self) -> list[str]:
        if self.timed.empty:
            return []
        return [
            "`PlanOptions(time_limit_s=t)` (`aoizora-lab plan CASE --time-limit t`) from an empty "
            "cache: survivors compile best IR estimate first, each with its further flag "
            "sets before the next ones, each system's best-estimate setup right after the "
            "first survivor and its others among the survivors by estimate, and none starts "
            "that would end after the limit, each program placed as it comes back. "
            "`compiled` / `unstarted`: survivors' and systems' compiles started and left out "
            "by the limit; `vs_best_system`: the headline (best system / plan), or – where "
            "a system's setups that could beat the plan were left out, so who is faster is "
            "not known within the limit and the plan claims nothing (`systems_partial`: the "
            "systems with setups left out); `cold_s`: the whole plan's wall time, IR traces "
            "included; `warm_s`: "
            "the same plan again on the caches it filled (what it read back is charged what "
            "it cost, so it stops where it stopped cold).",
            markdown_table(self.timed),
            markdown_table(self.targets),
        ]


def quick_plans(cases: Iterable[Case | str] = QUICK_PLAN_MATRIX, *,
                num_layers: int | None = None, budget: int = 20_000,
                max_k: int = QUICK_PLAN_MAX, time_limits: Sequence[float] = TIME_LIMITS,
                progress: Callable[[str], None] | None = None) -> QuickPlans:
    """The full search, quick plans for k = 1..``max_k`` and time-limited plans for each of
    ``time_limits`` on each case (module docstring)."""
    from aoizora_lab.options import check_time_limit

    try:  # before the full search's minutes
        for limit in time_limits:
            check_time_limit(limit)
    except AoizoraError as err:
        raise AoizoraError(f"quick_plans(time_limits={list(time_limits)!r}): {err} Give e.g. "
                           "[300], or [] for none.") from None
    fulls: list[dict[str, Any]] = []
    budgets: list[dict[str, Any]] = []
    timed: list[dict[str, Any]] = []

    def measure(workload: Workload, topology: Topology) -> dict[str, Any]:
        row, rows, limited = _measure(workload, topology, num_layers=num_layers,
                                      budget=budget, max_k=max_k, time_limits=time_limits,
                                      progress=progress)
        budgets.extend(rows)
        timed.extend(limited)
        return row

    for case in cases:
        fulls.append(case_row(case, measure))
    full = pd.DataFrame(fulls).reindex(columns=[
        "workload", "slice", "status", "candidate", "flags", "plan_s", "searched_s",
        "full_compiles", "full_wall_s", "all_cached"])
    config = {"num_layers": num_layers or "full depth", "budget": budget, "max_k": max_k,
              "time_limits": ", ".join(f"{t:g} s" for t in time_limits) or "none"}
    return QuickPlans(full, pd.DataFrame(budgets).reindex(columns=_COLUMNS),
                      pd.DataFrame(timed).reindex(columns=_TIMED_COLUMNS), config)


def _measure(workload: Workload, topology: Topology, *, num_layers: int | None, budget: int,
             max_k: int, time_limits: Sequence[float],
             progress: Callable[[str], None] | None
             ) -> tuple[dict[str, Any], list[dict[str, Any]], list[dict[str, Any]]]:
    import jax

    from aoizora_lab.options import FULL_SEARCH
    from aoizora_lab.planner import plan

    def run(**options: Any) -> tuple[Any, float]:
        start = time.perf_counter()
        result = plan(workload, topology, FULL_SEARCH.replace(
            budget=budget, num_layers=num_layers, **options))
        return result, time.perf_counter() - start

    def cold(again: bool = False, **options: Any) -> tuple[Any, float, float]:
        """From empty caches (every one: compiles, IR traces, searches), and ``again`` on
        the caches that filled: the result and both wall times."""
        jax.clear_caches()
        with (tempfile.TemporaryDirectory(prefix="aoizora-quick-") as cache,
              cache_root_at(cache)):
            result, wall_s = run(**options)
            return result, wall_s, run(**options)[1] if again else math.nan

    where = {"workload": workload.name, "slice": topology.name}
    if progress:
        progress(f"quick plans: {workload.name} on {topology.name}, the full search")
    full, full_s = run()
    full_s_step = full.best.predicted.total_s
    own_s = full.searched.predicted.total_s  # what a search without systems can reach
    compiles = [*full.compiled, *full.baseline_compiles]
    done = {r.key for r in compiles}
    row = {"status": "ok", "candidate": full.best.candidate.name,
           "flags": full.best.flags.label, "plan_s": full_s_step, "searched_s": own_s,
           "full_compiles": len(compiles), "full_wall_s": full_s,
           "all_cached": all(r.cached for r in compiles)}
    rows = []
    for k in range(1, min(max_k, len(full.pruning.kept)) + 1):
        if progress:
            progress(f"quick plans: {workload.name} on {topology.name}, max_compiled={k}")
        quick, _ = run(max_compiled=k, systems=False)
        rows.append({**where, "status": "ok", "max_compiled": k,
                     "candidate": quick.best.candidate.name, "flags": quick.best.flags.label,
                     "plan_s": quick.best.predicted.total_s,
                     "regret_percent": 100.0 * (quick.best.predicted.total_s / own_s - 1),
                     "compiles": len(quick.compiled.ran),
                     "compiled_now": sum(r.key not in done for r in quick.compiled.ran),
                     "cold_s": math.nan})
    found = [i for i, r in enumerate(rows) if r["regret_percent"] <= 1e-9]
    for i in ([found[0] - 1, found[0]] if found else []):
        if i < 0:
            continue
        if progress:
            progress(f"quick plans: {workload.name} on {topology.name}, "
                     f"max_compiled={rows[i]['max_compiled']} from an empty cache")
        _, rows[i]["cold_s"], _ = cold(max_compiled=rows[i]["max_compiled"], systems=False)
    limited = []
    for limit in time_limits:
        if progress:
            progress(f"quick plans: {workload.name} on {topology.name}, time_limit_s={limit:g} "
                     "from an empty cache")
        timed, wall_s, warm_s = cold(again=True, time_limit_s=limit)
        step = timed.best.predicted.total_s
        every = Compiles([*timed.compiled, *timed.baseline_compiles])
        limited.append({**where, "status": "ok", "time_limit_s": limit,
                        "candidate": timed.best.candidate.name,
                        "flags": timed.best.flags.label, "plan_s": step,
                        "regret_percent": 100.0 * (step / full_s_step - 1),
                        "compiled": len(every.ran), "unstarted": len(every.not_run),
                        "vs_best_system": timed.headline.vs_existing,
                        "systems_partial": ", ".join(timed.headline.partial) or "none",
                        "cold_s": wall_s, "warm_s": warm_s})
    return row, rows, limited
