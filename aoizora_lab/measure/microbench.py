"""Collective microbenchmarks: physical groups of the slice, timed and priced by the ICI model.

**Microbenchmarks** (:func:`microbenchmarks`): collectives over physical groups of the slice,
each built with ``shard_map`` over a ``Mesh`` whose device order makes the mesh axes physical
axes, so a group is exactly the intended chips. On ``v5e:2x4`` (x: 2, y: 4, no wraparound):

- ``collective-permute``: shift +1 and -1 along x and along y (one hop each, the end of a line
  sends nothing), and the cyclic shifts along y (the closing transfer crosses the line; on an
  axis with wraparound it takes the wraparound link);
- ``all-gather`` and ``all-to-all`` over x lines (2 chips), y lines (4), 2x2 blocks and the
  whole slice (8);

each at every size of ``sizes`` (default 4 KiB .. 64 MiB result per device: latency-bound to
bandwidth-bound). A program runs the collective ``inner`` times in a loop (so one dispatch is
spread over many collectives); the table has the measured seconds per collective and the ICI
model's prediction for the same :class:`~aoizora_lab.Collective` on the same devices, with
the model's terms (:func:`model_terms`) that :func:`~aoizora_lab.measure.calibrate` fits.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from aoizora_lab.comm_model import Collective, CommEstimate, ModelOptions, estimate
from aoizora_lab.errors import AoizoraError
from aoizora_lab.hardware import ChipSpec, chip_spec
from aoizora_lab.measure.clock import check_counts, live_devices, timed
from aoizora_lab.topology import Topology

if TYPE_CHECKING:
    import pandas as pd

KiB = 2**10

DEFAULT_SIZES: tuple[int, ...] = tuple(4 * KiB * 4**i for i in range(8))
"""Result bytes per device of each microbenchmark: 4 KiB, 16 KiB, ... 64 MiB."""

MICROBENCHMARK_KINDS: tuple[str, ...] = ("collective-permute", "all-gather", "all-to-all")

_AXES = "xyz"


@dataclass(frozen=True)
class Probe:
    """One microbenchmark: a collective over groups of physically placed chips."""

    kind: str
    """``"collective-permute"``, ``"all-gather"`` or ``"all-to-all"``."""
    group: str
    """What the groups are, for people: ``"y line"``, ``"2x2 block"``, ``"y +1"``..."""
    block: tuple[int, ...]
    """Chips per physical axis in one group; the groups tile the slice (a line along y of
    ``v5e:2x4`` is ``(1, 4)``)."""
    shift: tuple[tuple[int, int], ...] = ()
    """For a permute: (source, target) positions along the group's one long axis."""

    @property
    def group_size(self) -> int:
        """Chips in one group (2 for a permute: a source and its target)."""
        return 2 if self.kind == "collective-permute" else math.prod(self.block)


def probes(topology: Topology, kinds: Sequence[str] = MICROBENCHMARK_KINDS) -> list[Probe]:
    """The microbenchmarks of ``topology`` (module docstring), in a fixed order.

    Permutes: per axis longer than 1, shift +1 and -1 within each line, and for an axis longer
    than 2 the cyclic shifts (the closing transfer takes the wraparound link where the axis
    wraps and crosses the whole line where it does not). Gathers and all-to-alls: per axis
    longer than 1 its lines, a 2x2 block of the first two axes where both are even and the
    block is not the whole slice, and the whole slice when it is more than one line.
    """
    unknown = sorted(set(kinds) - set(MICROBENCHMARK_KINDS))
    if unknown:
        raise AoizoraError(
            f"Unknown microbenchmark kind(s) {unknown}; kinds are {list(MICROBENCHMARK_KINDS)}."
        )
    shape = topology.shape
    long_axes = [a for a, n in enumerate(shape) if n > 1]

    def line(axis: int) -> tuple[int, ...]:
        return tuple(n if a == axis else 1 for a, n in enumerate(shape))

    out: list[Probe] = []
    if "collective-permute" in kinds:
        for a in long_axes:
            n, name = shape[a], _AXES[a]
            out.append(Probe("collective-permute", f"{name} +1", line(a),
                             tuple((i, i + 1) for i in range(n - 1))))
            out.append(Probe("collective-permute", f"{name} -1", line(a),
                             tuple((i + 1, i) for i in range(n - 1))))
            if n > 2:
                closing = "wraparound" if topology.wrap[a] else "closing hop crosses the line"
                for step in (1, -1):
                    out.append(Probe("collective-permute", f"{name} cyclic {step:+d} ({closing})",
                                     line(a), tuple((i, (i + step) % n) for i in range(n))))
    blocks = [(f"{_AXES[a]} line", line(a)) for a in long_axes]
    square = (2, 2) + (1,) * (len(shape) - 2)
    if len(shape) >= 2 and all(n % 2 == 0 for n in shape[:2]) and square != shape:
        blocks.append(("2x2 block", square))
    if len(long_axes) > 1:
        blocks.append(("whole slice", shape))
    for kind in ("all-gather", "all-to-all"):
        if kind in kinds:
            out.extend(Probe(kind, label, block) for label, block in blocks)
    return out


def block_groups(topology: Topology, block: Sequence[int]) -> np.ndarray:
    """Device indices of every group tiling the slice in blocks of ``block`` chips.

    ``int`` array ``[groups, members]``, members in row-major order over the block's axes (the
    order ``shard_map`` collectives use over those mesh axes); several devices on one chip
    (deviceless v4) belong to different groups. Example: on ``Topology.simulated((2, 4))``
    (device 1 is chip (1, 0)), block ``(2, 2)`` gives ``[[0, 2, 1, 3], [4, 6, 5, 7]]``.
    """
    grid = _split_grid(topology, block)
    ndim = topology.ndim
    outer = [2 * a for a in range(ndim)] + [2 * ndim]
    inner = [2 * a + 1 for a in range(ndim)]
    return grid.transpose(outer + inner).reshape(-1, math.prod(block))


def _split_grid(topology: Topology, block: Sequence[int]) -> np.ndarray:
    """The device grid with each axis split into (outer, inner = block), then cores."""
    block = tuple(int(b) for b in block)
    if len(block) != topology.ndim or any(n % b for n, b in zip(topology.shape, block,
                                                                    strict=True)):
        raise AoizoraError(
            f"Block {block} must have one entry per axis of {topology.name} and divide its "
            f"shape {topology.shape}."
        )
    split = [d for n, b in zip(topology.shape, block, strict=True) for d in (n // b, b)]
    return topology.device_grid().reshape(*split, topology.devices_per_chip)


def probe_collective(topology: Topology, probe: Probe, size: float) -> Collective:
    """The :class:`Collective` ``probe`` runs with ``size`` result bytes per device.

    Device ids are the topology's device indices, so :func:`~aoizora_lab.estimate` prices it
    with the identity placement.
    """
    groups = block_groups(topology, probe.block)
    if probe.kind == "collective-permute":
        pairs = [(int(g[s]), int(g[t])) for g in groups for s, t in probe.shift]
        return Collective("collective-permute", pairs, size, name=probe.group)
    return Collective(probe.kind, groups.tolist(), size, name=probe.group)


def model_terms(collective: Collective, topology: Topology, *,
                options: ModelOptions | None = None) -> tuple[float, float]:
    """(critical bytes, hops) of ``collective``: the model's time is
    ``critical_bytes / (ici_link_bandwidth * ici_efficiency) + hops * ici_hop_latency``."""
    chip = chip_spec(topology.generation, calibrated=False)
    return _terms(estimate(collective, topology, chip=chip, options=options), chip)


def _terms(result: CommEstimate, chip: ChipSpec) -> tuple[float, float]:
    return (result.bandwidth_seconds * chip.ici_link_bandwidth * chip.ici_efficiency,
            result.latency_seconds / chip.ici_hop_latency)


def _probe_program(topology: Topology, probe: Probe, pool: Sequence[Any], elements: int,
                   inner: int) -> tuple[Any, Any]:
    """The compiled ``inner``-times loop of ``probe`` and its (zero) input array."""
    grid = _split_grid(topology, probe.block)
    names = tuple(n for a in range(topology.ndim) for n in (f"{_AXES[a]}_outer", _AXES[a]))
    names += ("core",)
    devices = np.empty(grid.size, dtype=object)
    devices[:] = [pool[i] for i in grid.ravel()]
    mesh = Mesh(devices.reshape(grid.shape), names)
    members = tuple(_AXES[a] for a, b in enumerate(probe.block) if b > 1)

    def once(x: jax.Array) -> jax.Array:
        if probe.kind == "collective-permute":
            return jax.lax.ppermute(x, members[0], list(probe.shift))
        if probe.kind == "all-to-all":
            return jax.lax.all_to_all(x, members, 0, 0, tiled=True)
        # Keep one member's slice so the loop carries a fixed shape; every gather is needed.
        return jax.lax.all_gather(x, members, tiled=True)[: x.shape[0]]

    def loop(x: jax.Array) -> jax.Array:
        return jax.lax.fori_loop(0, inner, lambda _, y: once(y), x)

    local = elements // (probe.group_size if probe.kind == "all-gather" else 1)
    sharding = NamedSharding(mesh, P(names))
    # Made sharded: the global array of a 64 MiB probe on 256 chips would not fit one chip.
    x = jax.jit(lambda: jnp.zeros((local * topology.num_devices,), jnp.float32),
                out_shardings=sharding)()
    program = jax.jit(jax.shard_map(loop, mesh=mesh, in_specs=P(names), out_specs=P(names),
                                    check_vma=False))
    return program.lower(x).compile(), x


def microbenchmarks(topology: Topology, *, sizes: Sequence[float] = DEFAULT_SIZES,
                    kinds: Sequence[str] = MICROBENCHMARK_KINDS, repeats: int = 5,
                    warmup: int = 2, inner: int = 10, chip: ChipSpec | None = None,
                    options: ModelOptions | None = None,
                    devices: Sequence[Any] | None = None) -> pd.DataFrame:
    """Time every :func:`probes` collective at every size on the live slice; add predictions.

    Each (probe, size) program runs its collective ``inner`` times in a loop; after
    ``warmup`` untimed runs, ``repeats`` runs are timed and ``seconds`` is the median divided
    by ``inner``. Sizes are result bytes per device (float32 elements, rounded down to a
    whole number per member: the ``bytes`` column is the size actually moved). Columns:
    ``kind``, ``group``, ``group_size``, ``num_groups``, ``bytes``, ``seconds``, ``spread``,
    ``predicted_s`` (the ICI model with ``chip``, default ``chip_spec(topology.generation)``),
    ``critical_bytes`` and ``hops`` (:func:`model_terms`), ``platform`` and ``collective``
    (the :class:`Collective`, device ids = topology device indices) for :func:`calibrate`.
    Example (tests, CPU): ``microbenchmarks(topo, sizes=[4096, 65536], repeats=2, inner=2)``.
    """
    import pandas as pd

    check_counts(repeats=repeats, warmup=warmup, inner=inner)
    pool = live_devices(topology, devices)
    chip = chip or chip_spec(topology.generation)
    itemsize = 4  # float32
    rows = []
    for probe in probes(topology, kinds):
        per_member = probe.group_size if probe.kind != "collective-permute" else 1
        for size in sizes:
            elements = max(1, int(size) // (itemsize * per_member)) * per_member
            collective = probe_collective(topology, probe, elements * itemsize)
            program, x = _probe_program(topology, probe, pool, elements, inner)
            timing = timed(lambda p=program, a=x: p(a), steps=repeats, warmup=warmup)
            result = estimate(collective, topology, chip=chip, options=options)
            critical, hops = _terms(result, chip)
            rows.append({"kind": probe.kind, "group": probe.group,
                         "group_size": probe.group_size, "num_groups": len(collective.groups),
                         "bytes": collective.bytes, "seconds": timing.median_s / inner,
                         "spread": timing.spread, "predicted_s": result.seconds,
                         "critical_bytes": critical, "hops": hops,
                         "platform": pool[0].platform, "collective": collective})
    return pd.DataFrame(rows)
