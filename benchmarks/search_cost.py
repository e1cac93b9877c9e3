"""Search cost: planner wall time cold and warm, what it compiles, against exhaustive search.

    python benchmarks/search_cost.py [--cases wan2.1-t2v-14b@1280x720x81/v5e:4x4 ...] \
        [--num-layers 2] [--budget 20000] [--skip-exhaustive]

Cold = an empty compile cache (a fresh temporary folder); warm = the same cache again. The
exhaustive search compiles every valid candidate and places each exactly as the planner places
its survivors; it reports whether the top plan is the same, the regret of pruning and the
Kendall tau of the IR estimate against the compiled prediction. The exhaustive search
takes hours on 2 cores from empty caches (what it took: ``reports/benchmarks.md``, "Search
cost"); ``--num-layers 2`` folds the compiles.
The measurement lives in :mod:`aoizora_lab.bench.search`.
"""

from __future__ import annotations

import argparse
from collections.abc import Iterable

from aoizora_lab.bench import SEARCH_COST_MATRIX, SearchCost, search_cost
from aoizora_lab.bench.report import add_cases_option
from aoizora_lab.cases import Case


def run(cases: Iterable[Case | str] = SEARCH_COST_MATRIX, *, num_layers: int | None = None,
        budget: int = 20_000, exhaustive: bool = True) -> SearchCost:
    """:func:`aoizora_lab.bench.search_cost` (tables: ``summary``, ``candidates``,
    ``targets``)."""
    return search_cost(cases, num_layers=num_layers, budget=budget, exhaustive=exhaustive,
                       progress=print)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_cases_option(parser, SEARCH_COST_MATRIX,
                     "14B@720p on v5e:4x4 (the case the targets are stated for) and the two "
                     "8-chip Wan 2.1 cases")
    parser.add_argument("--num-layers", type=int, default=None,
                        help="compile depth (default: the planner's, the full model)")
    parser.add_argument("--budget", type=int, default=20_000,
                        help="placement evaluations per candidate")
    parser.add_argument("--skip-exhaustive", action="store_true",
                        help="only the planner's cold and warm runs")
    args = parser.parse_args()

    import pandas as pd

    result = run(args.cases, num_layers=args.num_layers, budget=args.budget,
                 exhaustive=not args.skip_exhaustive)
    with pd.option_context("display.width", 250, "display.max_columns", 40,
                           "display.max_colwidth", 60):
        print(result.summary.T.to_string(float_format=lambda v: f"{v:.4g}"))
        if not result.candidates.empty:
            print("\nExhaustive search, best first (IR estimate, kept by pruning, prediction):")
            print(result.candidates.to_string(index=False, float_format=lambda v: f"{v:.4g}"))
        print("\nTargets:")
        print(result.targets.to_string(index=False))


if __name__ == "__main__":
    main()
