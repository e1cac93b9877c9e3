"""Live measurements: time realised plans, microbenchmark collectives, calibrate the ICI model.

Every measurement runs the real program on live devices and reads the wall clock; simulated
and deviceless slices are refused, and CPU host devices prove the mechanics, not TPU speed.

- :mod:`~aoizora_lab.measure.clock`: which devices can run (:func:`live_devices`) and the
  wall-clock samples of repeated runs (:class:`Timing`);
- :mod:`~aoizora_lab.measure.timing`: one plan timed (:func:`time_plan`), plans timed side by
  side with their predictions (:func:`compare_plans`, :func:`plans_to_compare`), a deviceless
  plan moved onto the live slice (:func:`retarget`);
- :mod:`~aoizora_lab.measure.microbench`: collectives over physical groups of the slice, timed
  and priced by the ICI model (:func:`microbenchmarks`, :func:`probes`);
- :mod:`~aoizora_lab.measure.calibration`: the ICI model's bandwidth and per-hop latency fitted
  to microbenchmarks (:func:`calibrate`), the compute efficiencies fitted to timed steps
  (:func:`calibrate_compute`), both written for :func:`~aoizora_lab.chip_spec`
  (:func:`write_calibration`).

Timing never depends on microbenchmarks or calibration; calibration uses the microbenchmarks'
model terms; all three run programs through ``clock``.

**Slices larger than one host** (e.g. ``v5e:4x4`` = 4 hosts of 2x2 chips): JAX runs one
process per host and every process must run the same program (SPMD), or the collectives wait
forever. Call ``jax.distributed.initialize()`` first on every host, then run the same code
(script or notebook) on all of them with the same plan file and calibration folder; the
timings are global programs, so every process measures the same steps. Files are written by
process 0 only (:func:`is_writer`, used by :func:`write_calibration`); copy the calibration
file to the other hosts (or point ``$AOIZORA_LAB_CALIBRATION_DIR`` at a shared folder) before
planning there, so every process plans with the same constants.
"""

from aoizora_lab.measure.calibration import (
    Calibration,
    ComputeCalibration,
    calibrate,
    calibrate_compute,
    compute_terms,
    is_writer,
    write_calibration,
)
from aoizora_lab.measure.clock import Timing, live_devices
from aoizora_lab.measure.microbench import (
    DEFAULT_SIZES,
    MICROBENCHMARK_KINDS,
    KiB,
    Probe,
    block_groups,
    microbenchmarks,
    model_terms,
    probe_collective,
    probes,
)
from aoizora_lab.measure.timing import (
    WeightsSource,
    compare_plans,
    plans_to_compare,
    rank_correlations,
    retarget,
    time_plan,
)

__all__ = [
    "DEFAULT_SIZES",
    "MICROBENCHMARK_KINDS",
    "Calibration",
    "ComputeCalibration",
    "KiB",
    "Probe",
    "Timing",
    "WeightsSource",
    "block_groups",
    "calibrate",
    "calibrate_compute",
    "compare_plans",
    "compute_terms",
    "is_writer",
    "live_devices",
    "microbenchmarks",
    "model_terms",
    "plans_to_compare",
    "probe_collective",
    "probes",
    "rank_correlations",
    "retarget",
    "time_plan",
    "write_calibration",
]
