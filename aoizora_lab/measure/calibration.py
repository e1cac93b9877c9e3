"""Calibrating the models: the ICI model's link bandwidth and per-hop latency fitted to
microbenchmarks, the compute efficiencies fitted to timed steps.

**Calibration** (:func:`calibrate`): the model is linear in its two constants. For one
collective it predicts ``t = critical_bytes / (bandwidth * efficiency) + hops * latency``, where
``critical_bytes`` (bytes on the busiest link, summed over the algorithm's phases) and ``hops``
depend only on the groups and the routing. A non-negative least-squares fit of the measured
seconds, each row weighted by ``1 / measured`` so microsecond and millisecond points count
alike, gives ``1 / (bandwidth * efficiency)`` and ``latency``. Only their product is
identifiable, so the published link bandwidth is kept and the efficiency is fitted, unless the
slice beats the published figure. Example: a fit of ``bandwidth * efficiency = 4.0e10 B/s``
and 1.2 us per hop on v5e (nominal 4.5e10) writes ``ici_efficiency = 0.889`` and
``ici_hop_latency = 1.2e-6``; a fit of 5.2e10 writes ``ici_link_bandwidth = 5.2e10`` with
``ici_efficiency = 1``. :func:`write_calibration` stores them in
``<generation>.json`` of :func:`~aoizora_lab.hardware.default_calibration_dir` (the user's
data folder, or ``$AOIZORA_LAB_CALIBRATION_DIR``), where
:func:`~aoizora_lab.chip_spec` applies them from then on (``calibrated=False`` ignores them).

**Compute** (:func:`calibrate_compute`): a timed step is its exposed communication, the ops
the compiler estimated, and per op class a term at efficiency 1 divided by the class's
efficiency (:func:`compute_terms`); the same relative non-negative least squares fits
``1 / efficiency`` for the classes the steps exercise. :func:`write_calibration` writes
either kind, merged into the generation's file.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import jax
import numpy as np
import pandas as pd

from aoizora_lab.comm_model import ModelOptions
from aoizora_lab.cost import DEFAULT_COMPUTE_MODEL, op_seconds, predict
from aoizora_lab.errors import AoizoraError
from aoizora_lab.hardware import chip_spec, device_spec, save_calibration
from aoizora_lab.measure.microbench import model_terms
from aoizora_lab.topology import Topology


@dataclass(frozen=True, eq=False)
class Calibration:
    """ICI constants fitted to microbenchmarks, the fit's error, and what to write."""

    generation: str
    """Chip generation the constants are for."""
    slice: str
    """The slice measured, e.g. ``"v5e:2x4"``."""
    platform: str
    """Platform of the measured devices (``"tpu"``; anything else is a test of mechanics)."""
    effective_bandwidth: float
    """Fitted ``ici_link_bandwidth * ici_efficiency`` in bytes/s (``inf`` if unresolved)."""
    hop_latency: float
    """Fitted seconds per hop (0 if unresolved)."""
    overrides: dict[str, float]
    """The :class:`~aoizora_lab.ChipSpec` fields to write (resolved constants only)."""
    rms_relative_error: float
    """Root mean square of ``(fitted - measured) / measured`` over the points."""
    max_relative_error: float
    """Largest ``|fitted - measured| / measured``."""
    points: int
    """Number of measurements fitted."""
    notes: tuple[str, ...] = ()
    """What the fit could not determine, or other facts a reader should know."""
    table: pd.DataFrame | None = field(default=None, repr=False)
    """The measurements with ``critical_bytes``, ``hops``, ``fitted_s`` and ``relative_error``."""


def calibrate(measurements: pd.DataFrame, topology: Topology, *, generation: str | None = None,
              options: ModelOptions | None = None) -> Calibration:
    """Fit the ICI model's bandwidth and per-hop latency to ``measurements`` (module docstring).

    ``measurements`` needs a ``collective`` column (:class:`Collective` over ``topology``'s
    device indices) and a ``seconds`` column, as :func:`microbenchmarks` returns; a
    ``platform`` column is carried into the result. The regressors are recomputed with
    ``options``, so a fit can be tried under each modelling choice. Use sizes from latency- to
    bandwidth-bound and groups of several hop counts, or one constant stays undetermined (a
    note says so and it is left out of ``overrides``).
    """
    from scipy.optimize import nnls

    nominal = chip_spec(generation or topology.generation, calibrated=False)
    missing = {"collective", "seconds"} - set(measurements.columns)
    if missing or measurements.empty:
        raise AoizoraError(
            f"calibrate needs measurements with 'collective' and 'seconds' columns (as "
            f"microbenchmarks() returns); got {len(measurements)} rows, missing {sorted(missing)}."
        )
    table = measurements.copy()
    seconds = table["seconds"].to_numpy(dtype=float)
    if not (np.isfinite(seconds).all() and (seconds > 0).all()):
        raise AoizoraError("calibrate: every measured 'seconds' must be a positive number.")
    terms = np.array([model_terms(c, topology, options=options) for c in table["collective"]])
    table["critical_bytes"], table["hops"] = terms[:, 0], terms[:, 1]
    # Relative least squares: each row divided by its measurement; columns scaled to unit
    # norm so bytes (1e3..1e8) and hops (1..10) are solved with equal precision.
    rows = terms / seconds[:, None]
    scale = np.linalg.norm(rows, axis=0)
    scale[scale == 0] = 1.0
    solution, _ = nnls(rows / scale, np.ones(len(seconds)))
    per_byte, latency = (float(v) for v in solution / scale)
    fitted = terms @ np.array([per_byte, latency])
    relative = (fitted - seconds) / seconds
    table["fitted_s"], table["relative_error"] = fitted, relative
    effective = 1.0 / per_byte if per_byte > 0 else math.inf
    overrides: dict[str, float] = {}
    notes: list[str] = []
    if math.isfinite(effective):
        # Only bandwidth x efficiency is identifiable: keep the published bandwidth unless the
        # slice beats it.
        bandwidth = max(nominal.ici_link_bandwidth, effective)
        overrides["ici_link_bandwidth"] = bandwidth
        overrides["ici_efficiency"] = effective / bandwidth
    else:
        notes.append("bandwidth not determined (fitted seconds per byte is 0): add "
                     "bandwidth-bound sizes (MiB and more); the default is kept")
    if latency > 0:
        overrides["ici_hop_latency"] = latency
    else:
        notes.append("per-hop latency not determined (fitted 0): add latency-bound sizes "
                     "(a few KiB) and groups of several hop counts; the default is kept")
    platforms = sorted(set(table["platform"])) if "platform" in table else ["unknown"]
    if platforms != ["tpu"]:
        notes.append(f"measured on {'/'.join(map(str, platforms))} devices: these constants "
                     "say nothing about TPU links")
    return Calibration(
        generation=nominal.generation, slice=topology.name, platform="/".join(platforms),
        effective_bandwidth=effective, hop_latency=latency, overrides=overrides,
        rms_relative_error=float(np.sqrt(np.mean(relative**2))),
        max_relative_error=float(np.abs(relative).max()), points=len(seconds),
        notes=tuple(notes), table=table)


def is_writer() -> bool:
    """Whether this process writes shared results: process 0 of a multi-host run (or the
    only process). Every process runs the measurements; one writes the files."""
    return jax.process_index() == 0


def write_calibration(calibration: Calibration | ComputeCalibration,
                      directory: str | Path | None = None, *,
                      allow_non_tpu: bool = False) -> Path | None:
    """Write ``calibration`` (ICI or compute) to ``<directory>/<generation>.json`` for
    :func:`chip_spec`, merged with the constants already there.

    ``directory`` defaults to :func:`~aoizora_lab.hardware.default_calibration_dir`. Only
    process 0 writes (:func:`is_writer`); the others return ``None``. A calibration measured on
    anything but TPU devices is refused unless ``allow_non_tpu`` (tests of the mechanics):
    written to the default folder it would silently change every prediction.
    """
    if calibration.platform != "tpu" and not allow_non_tpu:
        raise AoizoraError(
            f"This calibration was measured on {calibration.platform!r} devices, whose "
            "timings say nothing about TPU links; measure on a TPU VM, or pass "
            "allow_non_tpu=True with a scratch directory to test the mechanics."
        )
    if not calibration.overrides:
        raise AoizoraError(
            f"The calibration determined no constant ({'; '.join(calibration.notes)}); "
            "nothing to write."
        )
    if not is_writer():
        return None
    return save_calibration(
        calibration.generation, calibration.overrides, directory, slice=calibration.slice,
        platform=calibration.platform, points=calibration.points,
        rms_relative_error=calibration.rms_relative_error,
        max_relative_error=calibration.max_relative_error, notes=list(calibration.notes),
        date=time.strftime("%Y-%m-%dT%H:%M:%S%z"))


# ----------------------------------------------------------------------------- compute


@dataclass(frozen=True, eq=False)
class ComputeCalibration:
    """Compute efficiencies fitted to timed steps, the fit's error, and what to write."""

    generation: str
    """Chip generation the constants are for."""
    slice: str
    """The slice(s) measured."""
    platform: str
    """Platform of the measured devices (``"tpu"``; anything else is a test of mechanics)."""
    compute_model: str
    """The compute model fitted (:data:`aoizora_lab.cost.COMPUTE_MODELS`)."""
    overrides: dict[str, float]
    """The :class:`~aoizora_lab.ChipSpec` efficiencies to write."""
    rms_relative_error: float
    """Root mean square of ``(fitted - measured) / measured`` over the steps."""
    max_relative_error: float
    """Largest ``|fitted - measured| / measured``."""
    points: int
    """Number of steps fitted."""
    notes: tuple[str, ...] = ()
    """What the fit could not determine, or other facts a reader should know."""
    table: pd.DataFrame | None = field(default=None, repr=False)
    """The steps with their fixed part, per-class terms, ``fitted_s`` and ``relative_error``."""


_CLASS_FIELDS = {"matmul": "matmul_efficiency", "attention": "attention_efficiency",
                 "memory": "hbm_efficiency"}


def compute_terms(program: Any, topology: Topology, placement: Any, *,
                  compute_model: str | None = None) -> dict[str, float]:
    """What a step's predicted time is made of, for :func:`calibrate_compute`: the part the
    fit keeps (``fixed_s``: exposed communication, and under the ``"compiler"`` model the ops
    the compiler estimated) and per op class the seconds at efficiency 1 that the class's
    efficiency divides (FLOPs at peak for matmul and attention ops, bytes at HBM bandwidth
    for memory-bound ones)."""
    chip = device_spec(topology)
    predicted = predict(program, topology, placement, compute_model=compute_model)
    terms = {"fixed_s": predicted.exposed_s, **{name: 0.0 for name in _CLASS_FIELDS}}
    for op in program.ops:
        if ((compute_model or DEFAULT_COMPUTE_MODEL) == "compiler" and op.estimated_cycles
                and chip.clock_hz):
            terms["fixed_s"] += op.runs * op_seconds(op, chip, "compiler")
        elif op.op_class == "memory":
            terms["memory"] += op.runs * op.hbm_bytes / chip.hbm_bandwidth
        else:
            terms[op.op_class] += op.runs * op.flops / chip.peak_bf16_flops
    return terms


def calibrate_compute(measurements: pd.DataFrame, *,
                      compute_model: str | None = None) -> ComputeCalibration:
    """Fit the compute efficiencies to timed steps of compiled programs.

    ``measurements`` has columns ``program`` (the :class:`~aoizora_lab.hlo.CommProgram` a
    plan compiles to, e.g. ``Plan.compiled_program()``), ``topology``, ``placement`` and
    ``seconds`` (the measured step, e.g. ``time_plan(plan).median``), optionally
    ``platform``. Each step is ``fixed + sum over classes of term / efficiency``
    (:func:`compute_terms`); a non-negative least-squares fit relative to each measurement
    gives ``1 / efficiency`` per class that the steps exercise (under the default
    ``"compiler"`` model only the attention kernels, which the compiler does not estimate).
    An efficiency above 1 is capped with a note; the exposed communication is taken at the
    current constants (fit again after writing to iterate).
    """
    from scipy.optimize import nnls

    missing = {"program", "topology", "placement", "seconds"} - set(measurements.columns)
    if missing or measurements.empty:
        raise AoizoraError(
            f"calibrate_compute needs rows with 'program', 'topology', 'placement' and "
            f"'seconds'; got {len(measurements)} rows, missing {sorted(missing)}.")
    seconds = measurements["seconds"].to_numpy(dtype=float)
    if not (np.isfinite(seconds).all() and (seconds > 0).all()):
        raise AoizoraError("calibrate_compute: every measured 'seconds' must be positive.")
    terms = pd.DataFrame([compute_terms(p, t, o, compute_model=compute_model) for p, t, o in
                          zip(measurements["program"], measurements["topology"],
                              measurements["placement"], strict=True)])
    classes = [c for c in _CLASS_FIELDS if (terms[c] > 0).any()]
    notes: list[str] = []
    if not classes:
        raise AoizoraError("calibrate_compute: no op of these steps depends on an efficiency "
                           "(every op has a compiler estimate); nothing to fit.")
    rows = terms[classes].to_numpy() / seconds[:, None]
    target = 1.0 - terms["fixed_s"].to_numpy() / seconds
    inverse, _ = nnls(rows, target)
    overrides = {}
    for name, value in zip(classes, inverse, strict=True):
        if value <= 0:
            notes.append(f"{_CLASS_FIELDS[name]} not determined (fitted 0); the default is kept")
            continue
        if value < 1:
            notes.append(f"{_CLASS_FIELDS[name]} fitted {1 / value:.3g} > 1, capped at 1")
        overrides[_CLASS_FIELDS[name]] = min(1.0, 1.0 / value)
    fitted = terms["fixed_s"].to_numpy() + rows @ inverse * seconds
    relative = (fitted - seconds) / seconds
    table = measurements.drop(columns=["program"]).assign(**terms, fitted_s=fitted,
                                                          relative_error=relative)
    topologies = list(dict.fromkeys(t.name for t in measurements["topology"]))
    generations = {t.generation for t in measurements["topology"]}
    if len(generations) != 1:
        raise AoizoraError(f"calibrate_compute: steps of one generation at a time, got "
                           f"{sorted(generations)}.")
    platforms = (sorted(set(measurements["platform"])) if "platform" in measurements
                 else ["unknown"])
    if platforms != ["tpu"]:
        notes.append(f"measured on {'/'.join(map(str, platforms))}: these efficiencies say "
                     "nothing about TPU chips")
    return ComputeCalibration(
        generation=generations.pop(), slice=",".join(topologies),
        platform="/".join(map(str, platforms)),
        compute_model=compute_model or DEFAULT_COMPUTE_MODEL, overrides=overrides,
        rms_relative_error=float(np.sqrt(np.mean(relative**2))),
        max_relative_error=float(np.abs(relative).max()), points=len(seconds),
        notes=tuple(notes), table=table)
