"""Per-generation TPU chip constants, each with its source, and how to override them.

A :class:`ChipSpec` holds the few numbers the planner's models need: peak bf16 compute, HBM
size and bandwidth, the one-way bandwidth of one inter-chip (ICI) link, the per-hop latency
and the fraction of nominal link bandwidth a large transfer achieves. Where public sources
disagree (ICI bandwidth: the scaling book's 4.5e10 B/s for v5e vs 5e10 from the cloud docs'
totals), the default is the scaling book's, whose measurements the communication model is
calibrated against, and the alternative is exported so a user can pick it explicitly::

    >>> chip_spec("v5e").ici_link_bandwidth
    45000000000.0
    >>> chip_spec("v5e", ici_link_bandwidth=ICI_LINK_BANDWIDTH_CLOUD["v5e"]).ici_link_bandwidth
    50000000000.0

Calibration (``measure.calibrate`` on a live slice) writes ``<generation>.json`` with field
overrides into the calibration folder (:func:`default_calibration_dir`: the user's data
folder, or the one ``$AOIZORA_LAB_CALIBRATION_DIR`` names); :func:`chip_spec` applies it
unless told not to.
Keyword overrides win over both.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from aoizora_lab.errors import AoizoraError
from aoizora_lab.versions import user_data_dir, write_atomically

GiB = 2**30

CALIBRATION_DIR_ENV = "AOIZORA_LAB_CALIBRATION_DIR"


@dataclass(frozen=True)
class ChipSpec:
    """Constants of one TPU chip generation, as the planner's models use them."""

    generation: str
    """Short generation name: ``"v4"``, ``"v5e"``, ``"v5p"``, ``"v6e"`` or ``"tpu7x"``."""
    peak_bf16_flops: float
    """Peak dense bf16 FLOP/s of one chip."""
    hbm_bytes: float
    """HBM capacity of one chip in bytes."""
    hbm_usable_bytes: float
    """HBM the compiler lets a program use (below ``hbm_bytes`` where the compiler says so)."""
    hbm_bandwidth: float
    """HBM bandwidth of one chip in bytes/s."""
    ici_link_bandwidth: float
    """One-way bandwidth of one ICI link (one direction of one neighbour pair) in bytes/s."""
    ici_hop_latency: float
    """Latency added per link a transfer crosses, in seconds."""
    ici_efficiency: float
    """Fraction of ``ici_link_bandwidth`` a large (bandwidth-bound) transfer achieves."""
    torus_ndim: int
    """Number of physical torus axes of a slice of this generation (2 or 3)."""
    intra_chip_bandwidth: float = math.inf
    """Bytes/s the devices of one chip exchange with each other, both directions together,
    on the chip's own path (never an ICI link). Only matters where a chip holds several
    devices (tpu7x: two chiplets); ``inf`` prices such transfers as free."""
    matmul_efficiency: float = 1.0
    """Fraction of peak a matmul / convolution op achieves (sources: :data:`EFFICIENCY_SOURCES`)."""
    attention_efficiency: float = 0.5
    """Fraction of peak an attention kernel (splash) achieves (sources:
    :data:`EFFICIENCY_SOURCES`)."""
    hbm_efficiency: float = 0.37
    """Fraction of HBM bandwidth a memory-bound op achieves (sources:
    :data:`EFFICIENCY_SOURCES`)."""
    clock_hz: float | None = None
    """TensorCore clock, to turn the compiler's ``estimated_cycles`` into seconds: peak bf16
    FLOP/s over the MXUs' FLOPs per cycle (``None``: unknown)."""
    source: str = "defaults"
    """Where the numbers came from: ``"defaults"``, a calibration file, or ``"overrides"``."""

    def __post_init__(self) -> None:
        self.validate()

    def validate(self) -> None:
        """Raise :class:`AoizoraError` unless every number is positive and in range."""
        for field in dataclasses.fields(self):
            value = getattr(self, field.name)
            if field.type == "float" and not (isinstance(value, int | float) and value > 0):
                raise AoizoraError(
                    f"ChipSpec.{field.name}={value!r} for {self.generation!r} must be a positive "
                    "number; fix the override or calibration file that set it."
                )
        for name in ("ici_efficiency", "matmul_efficiency", "attention_efficiency",
                     "hbm_efficiency"):
            if getattr(self, name) > 1:
                raise AoizoraError(
                    f"ChipSpec.{name}={getattr(self, name)!r} must be in (0, 1]: it is a "
                    "fraction of a nominal rate."
                )
        if self.clock_hz is not None and not self.clock_hz > 0:
            raise AoizoraError(f"ChipSpec.clock_hz={self.clock_hz!r} must be positive or None.")
        if self.hbm_usable_bytes > self.hbm_bytes:
            raise AoizoraError(
                f"ChipSpec.hbm_usable_bytes={self.hbm_usable_bytes!r} exceeds hbm_bytes="
                f"{self.hbm_bytes!r} for {self.generation!r}."
            )
        if self.torus_ndim not in (2, 3):
            raise AoizoraError(f"ChipSpec.torus_ndim={self.torus_ndim!r} must be 2 or 3.")

    def per_device(self, devices_per_chip: int) -> ChipSpec:
        """One device's share where a chip holds several (tpu7x's two chiplets, deviceless
        v4's two TensorCores): compute, HBM and HBM bandwidth split evenly; links, clock and
        efficiencies unchanged. The chip itself for one device per chip."""
        if devices_per_chip == 1:
            return self
        n = devices_per_chip
        return dataclasses.replace(self, peak_bf16_flops=self.peak_bf16_flops / n,
                                   hbm_bytes=self.hbm_bytes / n,
                                   hbm_usable_bytes=self.hbm_usable_bytes / n,
                                   hbm_bandwidth=self.hbm_bandwidth / n)

    def replace(self, *, source: str = "overrides", **overrides: float) -> ChipSpec:
        """Return a copy with some numbers replaced; unknown field names are an error."""
        names = {f.name for f in dataclasses.fields(self)} - {"generation", "torus_ndim"}
        unknown = sorted(set(overrides) - names)
        if unknown:
            raise AoizoraError(
                f"Unknown ChipSpec field(s) {unknown}; overridable fields are {sorted(names)}."
            )
        return dataclasses.replace(self, source=source, **overrides)


# Sources: Google Cloud TPU docs (v4, v5e, v5p, v6e system architecture pages) for FLOP/s and
# HBM; "How to Scale Your Model" (jax-ml scaling book), TPU chapter, for ICI link bandwidth
# and the ~1 us per-hop latency (an older text of the book says 0.5 us).
_DEFAULTS: dict[str, ChipSpec] = {
    "v4": ChipSpec(
        generation="v4",
        peak_bf16_flops=2.75e14,  # cloud docs
        hbm_bytes=32 * GiB,  # cloud docs: 32 GiB
        hbm_usable_bytes=32 * GiB,  # no compiler figure known: assume all of it
        hbm_bandwidth=1.2e12,  # cloud docs
        ici_link_bandwidth=4.5e10,  # scaling book, one-way per link
        ici_hop_latency=1e-6,  # scaling book
        ici_efficiency=0.95,  # scaling book, measured on v5e (same link generation assumed)
        torus_ndim=3,
        # Default (free): deviceless v4 has a device per TensorCore, but both share one HBM
        # and run as one "megacore" in practice (MaxText's v4 chip config).
    ),
    "v5e": ChipSpec(
        generation="v5e",
        peak_bf16_flops=1.97e14,  # cloud docs
        hbm_bytes=16 * GiB,  # cloud docs: 16 GB (GiB: the compiler allows 15.75 GiB of it)
        hbm_usable_bytes=15.75 * GiB,  # compiler: "exceeds available HBM (15.75G)"
        hbm_bandwidth=8.19e11,  # cloud docs
        ici_link_bandwidth=4.5e10,  # scaling book, one-way per link
        ici_hop_latency=1e-6,  # scaling book
        ici_efficiency=0.95,  # scaling book: ~95 % of nominal for >= ~10 MB all-gathers, 8x16
        torus_ndim=2,
        # cloud docs: one TensorCore with four MXUs; scaling book: an MXU is 128 x 128 MACs
        clock_hz=1.97e14 / (4 * 128 * 128 * 2),
    ),
    "v5p": ChipSpec(
        generation="v5p",
        peak_bf16_flops=4.59e14,  # cloud docs
        hbm_bytes=95 * GiB,  # cloud docs: 95 GB (GiB assumed, as for v5e)
        hbm_usable_bytes=95 * GiB,  # no compiler figure known: assume all of it
        hbm_bandwidth=2.765e12,  # cloud docs
        ici_link_bandwidth=9e10,  # scaling book, one-way per link
        ici_hop_latency=1e-6,  # scaling book
        ici_efficiency=0.95,  # scaling book's v5e figure, assumed to carry over
        torus_ndim=3,
    ),
    "v6e": ChipSpec(
        generation="v6e",
        peak_bf16_flops=9.18e14,  # cloud docs
        hbm_bytes=32 * GiB,  # cloud docs: 32 GB (GiB assumed, as for v5e)
        hbm_usable_bytes=32 * GiB,  # no compiler figure known: assume all of it
        hbm_bandwidth=1.638e12,  # cloud docs
        ici_link_bandwidth=9e10,  # scaling book, one-way per link
        ici_hop_latency=1e-6,  # scaling book
        ici_efficiency=0.95,  # scaling book's v5e figure, assumed to carry over
        torus_ndim=2,
        # cloud docs: 918 TFLOP/s from "two 256 x 256 MXUs"; the compiler's estimated_cycles
        # reach 423k matmul FLOPs per cycle on v6e (Wan 14B@720p, v6e:2x4), above two MXUs'
        # 262k, so its cycle is that of 4 x 256^2 MACs at peak: 1.75 GHz
        clock_hz=9.18e14 / (4 * 256 * 256 * 2),
    ),
    "tpu7x": ChipSpec(
        # Ironwood. Cloud docs: TPU7x page, system architecture table (the Ironwood
        # announcement agrees: 192 GB HBM, 7.37 TB/s, 9.6 Tb/s = 1.2 TB/s ICI per chip).
        generation="tpu7x",
        peak_bf16_flops=2.307e15,  # cloud docs: 2307 TFLOPs bf16 per chip
        hbm_bytes=192 * GiB,  # cloud docs: 192 GiB per chip
        hbm_usable_bytes=192 * GiB,  # no compiler figure known: assume all of it
        hbm_bandwidth=7.38e12,  # cloud docs: 7380 GB/s per chip
        # No scaling-book figure for TPU7x. The cloud docs give it the same per-chip ICI total
        # as v5p (1200 GB/s bidirectional), so the book's v5p per-link figure is the default,
        # as for v5p; the docs' total over 6 links x 2 directions (1e11) is the alternative.
        ici_link_bandwidth=9e10,
        ici_hop_latency=1e-6,  # scaling book (per hop, all generations)
        ici_efficiency=0.95,  # scaling book's v5e figure, assumed to carry over
        torus_ndim=3,  # cloud docs: 3D torus, 4x4x4 cubes joined by optical switches
        # No published die-to-die bandwidth found (cloud docs, Ironwood announcement, Hot
        # Chips 2025 coverage, scaling book). Derived upper bound: each chiplet has half the
        # chip's HBM bandwidth (8 HBM3E stacks per chip, Hot Chips 2025; an even split
        # assumed); a byte moved between the chiplets is read from one chiplet's HBM and
        # written to the other's, so each HBM serves every exchanged byte once and the
        # exchange, both directions together, is at most 7.38e12 / 2 = 3.69e12 B/s.
        # Calibrate on a live slice.
        intra_chip_bandwidth=7.38e12 / 2,
        # The compiler's estimated_cycles on tpu7x reach the same 423k matmul FLOPs per cycle
        # per device as on v6e (Wan 14B@720p, tpu7x:2x2x1): 4 x 256^2 MACs per device per
        # cycle; two devices share the chip's 2307 TFLOP/s, so the cycle is 2.2 GHz
        clock_hz=2.307e15 / (2 * 4 * 256 * 256 * 2),
    ),
}

GENERATIONS: tuple[str, ...] = tuple(_DEFAULTS)

EFFICIENCY_SOURCES: dict[str, str] = {
    "matmul_efficiency": (
        "fitted to the TPU compiler's own per-op estimates (estimated_cycles over clock_hz): "
        "the matmul-class ops of 12 compiled Wan 2.1 steps on v5e (libtpu of jax 0.10.2) "
        "take 0.96x their FLOP/HBM roofline in total, i.e. no slowdown; capped at 1"),
    "attention_efficiency": (
        "an assumption, checked against published runs: the compiler estimates no Pallas "
        "kernel and no per-step time is published, only whole generations (DiT steps plus "
        "text encoding and VAE decoding). Each measured generation bounds it from below "
        "(attention_efficiency_floor in the Published measurements section of "
        "reports/benchmarks.md, which lists every run's floor). Most floors lie below 0.5; "
        "the README's approximate v6e-8 Ulysses figures and MaxDiffusion PR #430's "
        "denoise-loop times on v7x-8 lie above it, so there the model's steps alone take "
        "longer than the published time: a miss the section shows, not refitted here. "
        "measure.calibrate_compute fits it to timed steps on a TPU VM"),
    "hbm_efficiency": (
        "fitted like matmul_efficiency: the compiler prices the memory-class ops (elementwise "
        "f32 math, norms, copies, RoPE) of the same steps at 2.7x their HBM roofline (0.37): "
        "vector-unit work the roofline does not see"),
}
"""Where each compute efficiency default comes from; ``measure.calibrate`` can refit them on a
TPU VM (the calibration file overrides them like any other field)."""

# The other published ICI figure: the Google Cloud TPU docs' per-chip totals divided by the
# ports. Pass it as an override to model with it instead of the scaling book's number.
ICI_LINK_BANDWIDTH_CLOUD: dict[str, float] = {"v5e": 5e10, "v5p": 1e11, "v6e": 1e11,
                                              "tpu7x": 1e11}


def default_calibration_dir() -> Path:
    """Folder holding ``<generation>.json`` calibration files.

    ``$AOIZORA_LAB_CALIBRATION_DIR`` when set, else ``calibration/`` in the user's data folder
    (``~/.local/share/aoizora-lab/calibration`` on Linux), whatever the checkout or install.
    """
    env = os.environ.get(CALIBRATION_DIR_ENV)
    if env:
        return Path(env)
    return user_data_dir() / "calibration"


def check_generation(generation: str) -> str:
    """Return ``generation`` normalised (``"V5E"`` -> ``"v5e"``) or raise naming the valid ones."""
    normalised = str(generation).strip().lower()
    if normalised not in _DEFAULTS:
        hint = " (TPU v7x / Ironwood is 'tpu7x', as libtpu names it)" if "7" in normalised else ""
        raise AoizoraError(
            f"Unknown TPU generation {generation!r}; known generations are "
            f"{list(GENERATIONS)}{hint}."
        )
    return normalised


def load_calibration(generation: str, calibration_dir: Path | None = None) -> dict[str, Any]:
    """The field overrides in ``<calibration_dir>/<generation>.json``, or ``{}`` if none.

    The file is ``{"generation": "v5e", "overrides": {"ici_link_bandwidth": 4.3e10, ...}, ...}``;
    other keys (fit error, date, slice) are kept for people and ignored here.
    """
    generation = check_generation(generation)
    path = (calibration_dir or default_calibration_dir()) / f"{generation}.json"
    if not path.exists():
        return {}
    try:
        payload = json.loads(path.read_text())
        overrides = payload["overrides"]
        if payload.get("generation", generation) != generation or not isinstance(overrides, dict):
            raise ValueError("generation mismatch or overrides is not a mapping")
    except (ValueError, KeyError, TypeError) as err:
        raise AoizoraError(
            f"Calibration file {path} is not valid ({err}); it must hold "
            '{"generation": "' + generation + '", "overrides": {field: value}}. '
            "Fix or delete it, or pass calibrated=False."
        ) from err
    return {"path": str(path), "overrides": overrides}


def save_calibration(generation: str, overrides: dict[str, float],
                     calibration_dir: Path | str | None = None, **info: Any) -> Path:
    """Write ``<calibration_dir>/<generation>.json`` as :func:`load_calibration` reads it,
    ``overrides`` merged over the ones already in it.

    ``overrides`` are checked against the defaults first (an unknown field or a value
    :class:`ChipSpec` refuses is an error, never a file that breaks :func:`chip_spec` later);
    ``info`` (fit error, slice, date) is stored beside them for people. The file is written
    whole and renamed into place, so a reader never sees half of it.
    """
    generation = check_generation(generation)
    folder = Path(calibration_dir) if calibration_dir is not None else default_calibration_dir()
    path = folder / f"{generation}.json"
    # An ICI calibration and a compute calibration each keep the other's constants.
    overrides = {**(load_calibration(generation, folder).get("overrides", {})
                    if path.exists() else {}), **overrides}
    _DEFAULTS[generation].replace(**overrides)
    write_atomically(path, json.dumps({**info, "generation": generation,
                                       "overrides": dict(overrides)}, indent=1))
    return path


def chip_spec(
    generation: str,
    *,
    calibrated: bool = True,
    calibration_dir: Path | None = None,
    **overrides: float,
) -> ChipSpec:
    """The :class:`ChipSpec` for ``generation``: defaults, then calibration, then ``overrides``.

    Example: ``chip_spec("v5e", calibrated=False, ici_hop_latency=0.5e-6)`` models v5e with the
    book's older 0.5 us hop latency and ignores any calibration file.
    """
    spec = _DEFAULTS[check_generation(generation)]
    if calibrated:
        calibration = load_calibration(generation, calibration_dir)
        if calibration:
            spec = spec.replace(source=f"calibration {calibration['path']}",
                                **calibration["overrides"])
    if overrides:
        spec = spec.replace(**overrides)
    return spec


def device_spec(topology: Any, chip: ChipSpec | None = None) -> ChipSpec:
    """What one device of ``topology`` (a :class:`~aoizora_lab.Topology`) computes and holds:
    ``chip`` (default: its generation's spec) shared among the devices of a chip
    (:meth:`ChipSpec.per_device`). Programs are per device, so their compute and memory are
    priced with this."""
    return (chip or chip_spec(topology.generation)).per_device(topology.devices_per_chip)
