"""Calibrating the ICI model: fit its link bandwidth and per-hop latency to microbenchmarks.

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
``data/calibration/<generation>.json`` (or ``$AOIZORA_LAB_CALIBRATION_DIR``), where
:func:`~aoizora_lab.chip_spec` applies them from then on (``calibrated=False`` ignores them).
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import jax
import numpy as np

from aoizora_lab.comm_model import ModelOptions
from aoizora_lab.errors import AoizoraError
from aoizora_lab.hardware import chip_spec, save_calibration
from aoizora_lab.measure.microbench import model_terms
from aoizora_lab.topology import Topology

if TYPE_CHECKING:
    import pandas as pd


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


def write_calibration(calibration: Calibration, directory: str | Path | None = None, *,
                      allow_non_tpu: bool = False) -> Path | None:
    """Write ``calibration`` to ``<directory>/<generation>.json`` for :func:`chip_spec`.

    ``directory`` defaults to ``$AOIZORA_LAB_CALIBRATION_DIR`` or ``data/calibration``. Only
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
