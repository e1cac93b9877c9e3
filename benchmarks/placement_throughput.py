"""Placements scored per second by the placement search, on Wan-sized programs.

    python benchmarks/placement_throughput.py [--evaluations 20000] [--cache-dir DIR]

For each slice, compiles (or takes from the compile cache) a Wan 2.1 candidate, builds its
CommProgram, and times the scorer on the search's own workload: every structured placement,
then local-search neighbourhoods (pairwise swaps of the best ones), in batches. The
measurement lives in :func:`aoizora_lab.bench.placement_throughput` (8, 16 and 64 chips).
"""

from __future__ import annotations

import argparse
from pathlib import Path

import pandas as pd


def run(evaluations: int = 20_000, *, cases: list | None = None,
        cache_dir: str | Path | None = None) -> pd.DataFrame:
    """One row per slice: collectives, structures, placements evaluated, seconds, per second.

    ``cases``: (slice, workload, candidate) triples, default
    ``aoizora_lab.bench.THROUGHPUT_CASES``; ``cache_dir``: the compile cache.
    """
    from aoizora_lab.bench import THROUGHPUT_CASES, placement_throughput

    return placement_throughput(evaluations, cases or THROUGHPUT_CASES, cache_dir=cache_dir)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--evaluations", type=int, default=20_000,
                        help="placements to score per slice")
    parser.add_argument("--cache-dir", default=None, help="compile cache (default: the repo's)")
    args = parser.parse_args()
    table = run(args.evaluations, cache_dir=args.cache_dir)
    print(table.to_string(index=False, float_format=lambda v: f"{v:.3g}"))


if __name__ == "__main__":
    main()
