"""Compile the candidates that survive IR pruning; print compile time, memory and traffic.

    python benchmarks/compile_survivors.py [--cases wan2.1-t2v-14b@1280x720x81/v5e:4x4 ...] \
        [--layers 2] [--workers 2] [--cache-dir DIR]

Deviceless TPU compiles in child processes through the compile cache (a second run is warm).
Per survivor: status, compile seconds, peak memory, communication bytes and FLOPs per device,
the predicted compute time, and the communication and step time in the compact device order
(logical neighbours on physical neighbours; ``aoizora_lab.cost.predict``).
"""

from __future__ import annotations

import argparse
import concurrent.futures as cf
import math
import time
from pathlib import Path

import pandas as pd

from aoizora_lab.bench.report import add_cases_option
from aoizora_lab.cases import Case, parse_case


def survivors(case: Case | str, *, layers: int | None = None, workers: int = 2,
              cache_dir: str | Path | None = None) -> pd.DataFrame:
    """Prune ``case``'s valid candidates and compile the kept ones; one row per survivor.

    ``cache_dir``: the compile cache, with the IR cache in its ``ir`` folder (default: the
    repository's caches).
    """
    from aoizora_lab.candidates import enumerate_candidates
    from aoizora_lab.compile import compile_candidates
    from aoizora_lab.cost import predict
    from aoizora_lab.prune import prune

    case = parse_case(case)
    workload, topology = case.workload, case.topology()
    start = time.perf_counter()
    candidates = enumerate_candidates(workload, topology)
    kept = prune(candidates, workload, topology,
                 ir_cache_dir=Path(cache_dir) / "ir" if cache_dir else None).kept
    prune_s = time.perf_counter() - start
    start = time.perf_counter()
    with cf.ThreadPoolExecutor(workers) as pool:
        compiles = compile_candidates(kept, workload, topology, executor=pool,
                                      cache_dir=cache_dir, num_layers=layers)
    sweep_s = time.perf_counter() - start
    print(f"{workload.name} on {topology.name}: {len(candidates)} valid candidates, pruned to "
          f"{len(kept)} in {prune_s:.1f} s; compiled in {sweep_s:.0f} s wall "
          f"({workers} at a time, layers={layers or 'full'})")
    compact = topology.device_grid().ravel()
    predicted = [predict(r.program, topology, compact) if r.program else None
                 for r in compiles]
    table = compiles.to_frame()
    table["tflops"] = [r.program.flops / 1e12 if r.program else math.nan for r in compiles]
    table["compute_s"] = [p.compute_s if p else math.nan for p in predicted]
    table["comm_s_compact"] = [p.comm_s if p else math.nan for p in predicted]
    table["step_s_compact"] = [p.total_s if p else math.nan for p in predicted]
    return table


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_cases_option(parser, ["wan2.1-t2v-14b@1280x720x81/v5e:4x4"])
    parser.add_argument("--layers", type=int, default=None,
                        help="fold: compile this many layers and scale the layer loop")
    parser.add_argument("--workers", type=int, default=2, help="compiles at a time")
    parser.add_argument("--cache-dir", default=None,
                        help="compile cache, IR cache in its ir/ folder (default: compile/ "
                             "under $AOIZORA_LAB_CACHE_DIR, else the user's cache folder)")
    args = parser.parse_args()
    for case in args.cases:
        table = survivors(case, layers=args.layers, workers=args.workers,
                          cache_dir=args.cache_dir)
        with pd.option_context("display.width", 200, "display.max_colwidth", 80):
            print(table.to_string(index=False, float_format=lambda v: f"{v:.3g}"))


if __name__ == "__main__":
    main()
