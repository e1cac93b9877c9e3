"""Placements scored per second by the placement search, on Wan-sized programs.

    python benchmarks/placement_throughput.py [--evaluations 20000]

For each slice, compiles (or takes from the compile cache) a Wan 2.1 candidate, builds its
CommProgram, and times the scorer on the search's own workload: every structured placement,
then local-search neighbourhoods (pairwise swaps of the best ones), in batches.
"""

from __future__ import annotations

import argparse
import time


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--evaluations", type=int, default=20_000)
    args = parser.parse_args()

    import numpy as np
    import pandas as pd

    import aoizora_lab as az
    from aoizora_lab.candidates import Candidate
    from aoizora_lab.compile import compile_candidates
    from aoizora_lab.placement import PlacementScorer, structured_placements

    cases = [("v5e:2x4", "wan2.1-t2v-1.3b", "480p", "cfg2-uly4"),
             ("v5e:4x4", "wan2.1-t2v-14b", "720p", "cfg2-uly8-fsdp"),
             ("v5e:8x8", "wan2.1-t2v-14b", "720p", "cfg2-uly8-ring4-fsdp")]
    rows = []
    for slice_name, model, resolution, name in cases:
        topology = az.Topology.from_name(slice_name)
        candidate = Candidate.from_name(name)
        [compiled] = compile_candidates([candidate], az.Workload.preset(model, resolution),
                                        topology, num_layers=2)
        if compiled.status != "ok":
            rows.append({"slice": slice_name, "candidate": name, "status": compiled.status})
            continue
        scorer = PlacementScorer(compiled.program, topology)
        structured = np.array([p.order for p in structured_placements(
            candidate.mesh_shape, topology)])
        rng = np.random.default_rng(0)
        start = time.perf_counter()
        scores = scorer.scores(structured)
        best = structured[np.argsort(scores)[:4]]
        done = len(structured)
        while done < args.evaluations:
            batch = np.repeat(best, 64, axis=0)
            i, j = rng.integers(0, topology.num_devices, size=(2, len(batch)))
            rows_ = np.arange(len(batch))
            batch[rows_, i], batch[rows_, j] = batch[rows_, j], batch[rows_, i]
            scorer.scores(batch)
            done += len(batch)
        elapsed = time.perf_counter() - start
        rows.append({"slice": slice_name, "chips": topology.num_chips, "candidate": name,
                     "hlo collectives": len(compiled.program.collectives),
                     "structures": len(scorer.structures), "structured": len(structured),
                     "evaluated": done, "seconds": elapsed, "placements/s": done / elapsed,
                     "group layouts modelled": scorer.group_layouts_modelled})
    print(pd.DataFrame(rows).to_string(index=False, float_format=lambda v: f"{v:.3g}"))


if __name__ == "__main__":
    main()
