"""Compile the candidates that survive IR pruning; print compile time, memory and traffic.

    python benchmarks/compile_survivors.py --model wan2.1-t2v-14b --resolution 720p \
        --slice v5e:4x4 [--layers 2]

Deviceless TPU compiles in child processes through the compile cache (a second run is warm).
"""

from __future__ import annotations

import argparse
import time

import pandas as pd


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="wan2.1-t2v-14b")
    parser.add_argument("--resolution", default="720p")
    parser.add_argument("--slice", default="v5e:4x4")
    parser.add_argument("--layers", type=int, default=None,
                        help="fold: compile this many layers and scale the layer loop")
    parser.add_argument("--workers", type=int, default=2)
    args = parser.parse_args()

    import concurrent.futures as cf

    import aoizora_lab as az
    from aoizora_lab.candidates import Candidate, enumerate_candidates
    from aoizora_lab.compile import compile_candidates
    from aoizora_lab.prune import prune

    workload = az.Workload.preset(args.model, args.resolution)
    topology = az.Topology.from_name(args.slice)
    start = time.perf_counter()
    table = prune(enumerate_candidates(workload, topology), workload, topology)
    survivors = [Candidate.from_name(n) for n in table[table["keep"]]["candidate"]]
    prune_s = time.perf_counter() - start
    start = time.perf_counter()
    with cf.ThreadPoolExecutor(args.workers) as pool:
        results = compile_candidates(survivors, workload, topology, executor=pool,
                                     num_layers=args.layers)
    sweep_s = time.perf_counter() - start
    chip = az.chip_spec(topology.generation)
    rows = []
    for r in results:
        row = {"candidate": r.candidate.name, "status": r.status, "cached": r.cached,
               "compile_s": r.compile_seconds}
        if r.status == "ok":
            row |= {"peak_gib": r.memory["peak"] / 2**30,
                    "comm_gb": r.program.total_bytes / 1e9,
                    "tflops": r.program.flops / 1e12,
                    "compute_s": r.program.compute_seconds(chip),
                    "comm_s_compact": az.estimate(r.program, topology,
                                                  topology.device_grid().ravel()).seconds}
        else:
            row["message"] = r.message[:80]
        rows.append(row)
    print(f"{workload.name} on {topology.name}: {len(table)} valid candidates, pruned to "
          f"{len(survivors)} in {prune_s:.1f} s; compiled in {sweep_s:.0f} s wall "
          f"({args.workers} at a time, layers={args.layers or 'full'})")
    with pd.option_context("display.width", 200):
        print(pd.DataFrame(rows).to_string(index=False, float_format=lambda v: f"{v:.3g}"))


if __name__ == "__main__":
    main()
