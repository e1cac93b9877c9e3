"""Quick plans: a compile budget's regret and cold time against the full search.

    python benchmarks/quick_plans.py [--cases wan2.1-t2v-14b@1280x720x81/v5e:4x4 ...] \
        [--num-layers 2] [--max-k 8] [--time-limits 300]

The full search runs on the compile cache as it is (warm after ``search_cost.py``); each
``plan(max_compiled=k, systems=False)`` after it reads the same cache; the smallest k that
finds the full search's plan, and the k before it, are timed again from an empty cache, and
so is ``plan(time_limit_s=t)`` for each time limit. The measurement lives in
:mod:`aoizora_lab.bench.quick`.
"""

from __future__ import annotations

import argparse
from collections.abc import Iterable

from aoizora_lab.bench import (
    QUICK_PLAN_MATRIX,
    QUICK_PLAN_MAX,
    TIME_LIMITS,
    QuickPlans,
    quick_plans,
)
from aoizora_lab.bench.report import add_cases_option
from aoizora_lab.cases import Case


def run(cases: Iterable[Case | str] = QUICK_PLAN_MATRIX, *, num_layers: int | None = None,
        budget: int = 20_000, max_k: int = QUICK_PLAN_MAX,
        time_limits: Iterable[float] = TIME_LIMITS) -> QuickPlans:
    """:func:`aoizora_lab.bench.quick_plans` (tables: ``full``, ``budgets``, ``timed``)."""
    return quick_plans(cases, num_layers=num_layers, budget=budget, max_k=max_k,
                       time_limits=tuple(time_limits), progress=print)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_cases_option(parser, QUICK_PLAN_MATRIX,
                     "the search-cost case and two more (bench.quick.QUICK_PLAN_MATRIX)")
    parser.add_argument("--num-layers", type=int, default=None,
                        help="compile depth (default: the planner's, the full model)")
    parser.add_argument("--budget", type=int, default=20_000,
                        help="placement evaluations per candidate")
    parser.add_argument("--max-k", type=int, default=QUICK_PLAN_MAX,
                        help="largest compile budget tried")
    parser.add_argument("--time-limits", type=float, nargs="*", default=list(TIME_LIMITS),
                        metavar="SECONDS", help="time limits tried from an empty cache")
    args = parser.parse_args()
    result = run(args.cases, num_layers=args.num_layers, budget=args.budget, max_k=args.max_k,
                 time_limits=args.time_limits)
    print(result.full.to_string(index=False))
    print(result.budgets.to_string(index=False, float_format=lambda v: f"{v:.4g}"))
    print(result.timed.to_string(index=False, float_format=lambda v: f"{v:.4g}"))


if __name__ == "__main__":
    main()
