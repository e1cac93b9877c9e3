"""Running compiled programs on live devices and reading the wall clock.

Everything :mod:`aoizora_lab.measure` measures runs the real program on the devices of a
:class:`~aoizora_lab.Topology` and reads the wall clock. On a TPU VM those are the chips the
planner modelled; on CPU host devices (``Topology.simulated((2, 4), devices=jax.devices()[:8])``)
the same code runs, which is how the tests prove the mechanics, but **CPU numbers mean nothing
for a TPU**: a CPU "collective" is a memory copy, so neither a ranking nor a calibration
measured there says anything about ICI links. A deviceless (libtpu) or simulated topology
compiles but cannot run: :func:`live_devices` refuses it with an error that says how to get
live devices.

:func:`timed` discards ``warmup`` runs, then times ``steps`` runs one by one, each up to
``block_until_ready``; a :class:`Timing` keeps every sample.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import jax

from aoizora_lab.errors import AoizoraError, is_whole
from aoizora_lab.topology import Topology


@dataclass(frozen=True)
class Timing:
    """Wall-clock seconds of repeated runs of one program, each to ``block_until_ready``."""

    samples: tuple[float, ...]
    """Every timed run, in the order they ran (warm-up runs excluded)."""

    def __post_init__(self) -> None:
        samples = tuple(float(s) for s in self.samples)
        if not samples or min(samples) < 0:
            raise AoizoraError(f"Timing needs one or more non-negative samples, got {samples!r}.")
        object.__setattr__(self, "samples", samples)

    @property
    def median_s(self) -> float:
        """Median seconds: the figure plans are compared by (robust to a stray slow run)."""
        return statistics.median(self.samples)

    @property
    def min_s(self) -> float:
        """Fastest run."""
        return min(self.samples)

    @property
    def max_s(self) -> float:
        """Slowest run."""
        return max(self.samples)

    @property
    def spread(self) -> float:
        """``(max - min) / median``: 0.05 means the runs lie within 5 % of the median."""
        median = self.median_s
        return (self.max_s - self.min_s) / median if median > 0 else 0.0


def timed(call: Callable[[], Any], *, steps: int, warmup: int) -> Timing:
    """Run ``call`` ``warmup`` times untimed, then ``steps`` times timed to completion."""
    for _ in range(warmup):
        call().block_until_ready()
    samples = []
    for _ in range(steps):
        start = time.perf_counter()
        call().block_until_ready()
        samples.append(time.perf_counter() - start)
    return Timing(tuple(samples))


def check_counts(**counts: int) -> None:
    """Raise naming any count that is not a whole number: ``warmup`` >= 0, the others >= 1."""
    for name, value in counts.items():
        minimum = 0 if name == "warmup" else 1
        if not is_whole(value, minimum):
            raise AoizoraError(f"{name}={value!r} must be an integer >= {minimum}.")


def live_devices(topology: Topology, devices: Sequence[Any] | None = None) -> list[Any]:
    """The devices to run on: ``devices`` or the topology's, refused unless they can run.

    A simulated topology has no devices and a deviceless (libtpu) one has devices that only
    compile; both are an error saying how to get live ones.
    """
    pool = list(devices) if devices is not None else topology.devices
    if pool is None:
        raise AoizoraError(
            f"{topology.name} is a simulated slice ({topology.note or 'no devices'}): there is "
            "nothing to run or time. On a TPU VM move the plan onto the live slice: "
            "retarget(plan, Topology.from_devices(jax.devices())), or for a plan file "
            "Plan.from_json(path, Topology.from_devices(jax.devices())); on CPU "
            f"host devices use Topology.simulated({topology.shape}, devices=jax.devices()"
            f"[:{topology.num_devices}]) — CPU timings prove the mechanics, not TPU speed."
        )
    if len(pool) != topology.num_devices:
        raise AoizoraError(
            f"{topology.name} has {topology.num_devices} devices but {len(pool)} were passed; "
            "pass one device per row of topology.coords, in that order."
        )
    running = set(jax.devices())
    if not all(d in running for d in pool):
        raise AoizoraError(
            f"The devices of {topology.name} ({topology.source}) are not devices this process "
            f"runs on ({jax.devices()[0].platform} x {len(running)}): deviceless TPU devices "
            "compile but cannot run. On a TPU VM move the plan onto the live slice: "
            "retarget(plan, Topology.from_devices(jax.devices())), or for a plan file "
            "Plan.from_json(path, Topology.from_devices(jax.devices())); or pass devices= "
            "with one live device per row of topology.coords."
        )
    return pool

