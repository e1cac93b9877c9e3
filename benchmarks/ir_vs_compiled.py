"""How well the IR estimate orders candidates: IR vs compiled communication bytes.

For every valid candidate of a case, trace the step (IR) and compile it for the TPU without a
TPU (deviceless libtpu, in child processes through the compile cache), both at the same
reduced depth, then compare the communication bytes per device that each predicts: Spearman
and Kendall rank correlations.

    python benchmarks/ir_vs_compiled.py [--cases wan2.1-t2v-1.3b@832x480x81/v5e:2x4 ...] \
        [--layers 2] [--workers 2] [--cache-dir DIR]
"""

from __future__ import annotations

import argparse
import concurrent.futures as cf
import dataclasses
import math
import time
from pathlib import Path

import pandas as pd
from scipy import stats

from aoizora_lab.bench.report import add_cases_option
from aoizora_lab.cases import Case, parse_case


def compare(case: Case | str, *, layers: int = 2, workers: int = 2,
            cache_dir: str | Path | None = None) -> pd.DataFrame:
    """One row per valid candidate of ``case``: IR estimate and compiled program, both of the
    model cut to ``layers`` layers; prints the rank correlations of their comm bytes.

    ``cache_dir``: the compile cache, with the IR cache in its ``ir`` folder (default: the
    repository's caches).
    """
    from aoizora_lab.candidates import enumerate_candidates
    from aoizora_lab.compile import compile_candidates
    from aoizora_lab.prune import estimate_candidates

    case = parse_case(case)
    topology = case.topology()
    # The same shallow model for both: no folding on either side, so only the IR reading
    # and the compiler differ.
    workload = dataclasses.replace(case.workload,
                                   model=case.workload.config().with_layers(layers))
    candidates = enumerate_candidates(workload, topology)
    start = time.perf_counter()
    estimates = estimate_candidates(candidates, workload, topology,
                                    ir_cache_dir=Path(cache_dir) / "ir" if cache_dir else None)
    ir_seconds = time.perf_counter() - start
    with cf.ThreadPoolExecutor(workers) as pool:
        compiles = compile_candidates(candidates, workload, topology, executor=pool,
                                      cache_dir=cache_dir)
    table = compiles.to_frame().rename(columns={"comm_gb": "compiled_comm_gb"})
    traced = [estimates[c.name] for c in candidates]
    table["ir_comm_gb"] = [math.nan if isinstance(e, str) else e.comm_bytes / 1e9
                           for e in traced]
    table["ir_estimate_s"] = [math.nan if isinstance(e, str) else e.estimate_seconds
                              for e in traced]
    table = table.sort_values("ir_estimate_s", na_position="last", kind="stable")
    done = table.dropna(subset=["compiled_comm_gb", "ir_comm_gb"])
    print(f"{case.name}, {layers} layers: {len(candidates)} candidates traced in "
          f"{ir_seconds:.1f} s; {len(done)} traced and compiled "
          f"({table['compile_s'].sum():.0f} s of compile time)")
    if len(done) >= 2:
        spearman = stats.spearmanr(done["ir_comm_gb"], done["compiled_comm_gb"]).statistic
        kendall = stats.kendalltau(done["ir_comm_gb"], done["compiled_comm_gb"]).statistic
        print(f"rank correlation IR vs compiled comm bytes: Spearman {spearman:.3f}, "
              f"Kendall {kendall:.3f}")
    return table


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_cases_option(parser, ["wan2.1-t2v-1.3b@832x480x81/v5e:2x4"])
    parser.add_argument("--layers", type=int, default=2, help="depth of both sides")
    parser.add_argument("--workers", type=int, default=2, help="compiles at a time")
    parser.add_argument("--cache-dir", default=None,
                        help="compile cache, IR cache in its ir/ folder (default: compile/ "
                             "under $AOIZORA_LAB_CACHE_DIR, else the user's cache folder)")
    args = parser.parse_args()
    for case in args.cases:
        table = compare(case, layers=args.layers, workers=args.workers,
                        cache_dir=args.cache_dir)
        with pd.option_context("display.width", 200, "display.max_colwidth", 80):
            print(table.to_string(index=False, float_format=lambda v: f"{v:.3g}"))


if __name__ == "__main__":
    main()
