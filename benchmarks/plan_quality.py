"""Plan quality: the AoiZora Lab plan against every baseline, placement alone, the roofline.

    python benchmarks/plan_quality.py [--cases wan2.1-t2v-14b@1280x720x81/v5e:4x4 ...] \
        [--num-layers 2] [--budget 20000] [--cache-dir DIR]

For each case (default: ``aoizora_lab.bench.DEFAULT_MATRIX``) runs the planner (deviceless TPU
compiles through the compile cache: the first run takes tens of minutes on 2 cores, a second
is warm) and prints the predicted one-step latency of the plan and of each baseline, the
speedups, the placement-only gain and the compute roofline, then the targets. The measurement
lives in :mod:`aoizora_lab.bench.quality`.
"""

from __future__ import annotations

import argparse
from collections.abc import Iterable
from pathlib import Path

from aoizora_lab.bench import DEFAULT_MATRIX, PlanQuality, plan_quality
from aoizora_lab.bench.report import add_cases_option
from aoizora_lab.cases import Case


def run(cases: Iterable[Case | str] = DEFAULT_MATRIX, *, num_layers: int | None = None,
        budget: int = 20_000, cache_dir: str | Path | None = None) -> PlanQuality:
    """:func:`aoizora_lab.bench.plan_quality` (tables: ``summary``, ``baselines``, ``targets``)."""
    return plan_quality(cases, num_layers=num_layers, budget=budget, cache_dir=cache_dir,
                        progress=print)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_cases_option(parser, DEFAULT_MATRIX,
                     f"the {len(DEFAULT_MATRIX)} cases of aoizora_lab.bench.DEFAULT_MATRIX, "
                     "8 to 256 chips on v5e, v6e, v5p and TPU7x")
    parser.add_argument("--num-layers", type=int, default=None,
                        help="compile this many layers and fold the layer loop (default: full)")
    parser.add_argument("--budget", type=int, default=20_000,
                        help="placement evaluations per candidate")
    parser.add_argument("--cache-dir", default=None,
                        help="compile cache (default: compile/ under "
                             "$AOIZORA_LAB_CACHE_DIR, else the user's cache folder)")
    args = parser.parse_args()

    import pandas as pd

    result = run(args.cases, num_layers=args.num_layers, budget=args.budget,
                 cache_dir=args.cache_dir)
    with pd.option_context("display.width", 250, "display.max_columns", 40,
                           "display.max_colwidth", 60):
        print(result.summary.T.to_string(float_format=lambda v: f"{v:.4g}"))
        print("\nBaselines (predicted seconds per step, same compiler and model):")
        print(result.baselines.to_string(index=False, float_format=lambda v: f"{v:.4g}"))
        print("\nTargets:")
        print(result.targets.to_string(index=False))


if __name__ == "__main__":
    main()
