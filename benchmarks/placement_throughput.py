"""Placements scored per second by the placement search, on Wan-sized programs.

    python benchmarks/placement_throughput.py [--evaluations 20000] [--cache-dir DIR] \
        [--case wan2.1-t2v-14b@1280x720x81/v5e:4x4 cfg2-uly8-fsdp ...]

For each case and candidate (default: ``aoizora_lab.bench.THROUGHPUT_CASES``, 8, 16, 64 and 256
chips), compiles the candidate (or takes it from the compile cache), builds its CommProgram,
and times the scorer on the search's own workload: every structured placement, then
local-search neighbourhoods (pairwise swaps of the best ones), in batches. The measurement
lives in :mod:`aoizora_lab.bench.throughput`.
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from pathlib import Path

import pandas as pd

from aoizora_lab.bench import THROUGHPUT_CASES, placement_throughput
from aoizora_lab.cases import Case, parse_case
from aoizora_lab.errors import AoizoraError


def run(evaluations: int = 20_000, *, cases: Sequence[tuple[Case | str, str]] | None = None,
        cache_dir: str | Path | None = None) -> pd.DataFrame:
    """One row per case: collectives, structures, placements evaluated, seconds, per second.

    ``cases``: (case, candidate name) pairs, default :data:`aoizora_lab.bench.THROUGHPUT_CASES`;
    ``cache_dir``: the compile cache.
    """
    return placement_throughput(evaluations, cases or THROUGHPUT_CASES, cache_dir=cache_dir)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--evaluations", type=int, default=20_000,
                        help="placements to score per case")
    parser.add_argument("--case", nargs=2, action="append", metavar=("CASE", "CANDIDATE"),
                        help="a case spec and the candidate to compile for it, e.g. "
                             "wan2.1-t2v-14b@1280x720x81/v5e:4x4 cfg2-uly8-fsdp; repeat for "
                             "more (default: aoizora_lab.bench.THROUGHPUT_CASES)")
    parser.add_argument("--cache-dir", default=None,
                        help="compile cache (default: compile/ under "
                             "$AOIZORA_LAB_CACHE_DIR, else the user's cache folder)")
    args = parser.parse_args()
    try:
        cases = [(parse_case(spec), name) for spec, name in args.case or []]
    except AoizoraError as err:
        parser.error(str(err))
    table = run(args.evaluations, cases=cases, cache_dir=args.cache_dir)
    print(table.to_string(index=False, float_format=lambda v: f"{v:.3g}"))


if __name__ == "__main__":
    main()
