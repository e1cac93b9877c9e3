"""How well the IR estimate orders candidates: IR vs compiled communication bytes.

For every valid candidate of a workload on a slice, trace the step (IR) and compile it for the
TPU without a TPU (deviceless libtpu), both at the same reduced depth, then compare the
communication bytes per device that each predicts: Spearman and Kendall rank correlations.
Compiles run in child processes (some TPU compiles abort their process).

    python benchmarks/ir_vs_compiled.py --model wan2.1-t2v-1.3b --resolution 480p \
        --slice v5e:2x4 --layers 2
"""

from __future__ import annotations

import argparse
import concurrent.futures as cf
import multiprocessing
import time

import pandas as pd
from scipy import stats


def _compile(slice_name: str, model: str, resolution: str, name: str, layers: int) -> dict:
    import numpy as np

    import aoizora_lab as az
    from aoizora_lab.candidates import Candidate
    from aoizora_lab.hlo import parse_hlo

    topology = az.Topology.from_name(slice_name, deviceless=True)
    plan = Candidate.from_name(name).plan(np.array(topology.devices)[
        topology.device_grid().ravel()])
    start = time.perf_counter()
    compiled = az.lower_step(az.Workload.preset(model, resolution), plan,
                             num_layers=layers).compile()
    program = parse_hlo(compiled.as_text())
    return {"candidate": name, "compile_s": time.perf_counter() - start,
            "compiled_comm_gb": program.total_bytes / 1e9,
            "peak_gib": compiled.memory_analysis().peak_memory_in_bytes / 2**30}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="wan2.1-t2v-1.3b")
    parser.add_argument("--resolution", default="480p")
    parser.add_argument("--slice", default="v5e:2x4")
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--workers", type=int, default=2)
    args = parser.parse_args()

    import aoizora_lab as az
    from aoizora_lab.candidates import enumerate_candidates
    from aoizora_lab.ir_estimate import estimate_ir

    workload = az.Workload.preset(args.model, args.resolution)
    topology = az.Topology.from_name(args.slice)
    candidates = enumerate_candidates(workload, topology)
    start = time.perf_counter()
    estimates = {c.name: estimate_ir(c, workload, topology, num_layers=args.layers)
                 for c in candidates}
    ir_seconds = time.perf_counter() - start
    rows = []
    context = multiprocessing.get_context("spawn")
    with cf.ProcessPoolExecutor(args.workers, mp_context=context) as pool:
        futures = {pool.submit(_compile, args.slice, args.model, args.resolution, c.name,
                               args.layers): c.name for c in candidates}
        for future in cf.as_completed(futures):
            name = futures[future]
            try:
                row = future.result()
            except Exception as err:  # a crashed compile is a row, not the end of the run
                row = {"candidate": name, "error": f"{type(err).__name__}: {err}"}
            row["ir_comm_gb"] = estimates[name].comm_bytes / 1e9
            row["ir_estimate_s"] = estimates[name].estimate_seconds
            rows.append(row)
    table = pd.DataFrame(rows).sort_values("ir_estimate_s")
    done = table.dropna(subset=["compiled_comm_gb"])
    spearman = stats.spearmanr(done["ir_comm_gb"], done["compiled_comm_gb"]).statistic
    kendall = stats.kendalltau(done["ir_comm_gb"], done["compiled_comm_gb"]).statistic
    print(f"{workload.name} on {args.slice}, {args.layers} layers: {len(candidates)} "
          f"candidates traced in {ir_seconds:.1f} s; {len(done)} compiled "
          f"({table['compile_s'].sum():.0f} s of compile time)")
    print(table.to_string(index=False, float_format=lambda v: f"{v:.3g}"))
    print(f"rank correlation IR vs compiled comm bytes: Spearman {spearman:.3f}, "
          f"Kendall {kendall:.3f}")


if __name__ == "__main__":
    main()
