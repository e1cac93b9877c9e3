"""The topology-aware ICI model: what a collective costs when its groups sit on real links.

The XLA auto-sharding cost model gives each logical mesh axis one latency/bandwidth pair and
knows neither wraparound nor link contention. This model instead routes every transfer a
collective's algorithm makes over the directed links of the :class:`~aoizora_lab.Topology`,
adds up the bytes per link across *all* groups of the collective (they run at the same time
and contend), and turns the busiest link's load into time::

    seconds = count * (sum over phases of busiest-link bytes / (link_bandwidth * efficiency)
                       + hop_latency * hops)

where ``hops`` is the farthest any byte of the collective travels (the largest hop distance
between two members of one group; for a group run as a ring in its order, the longest run of
``n // 2`` consecutive ring hops, :func:`ring_hops`; twice for an all-reduce).

**The intra-chip path.** Where a chip holds several devices (tpu7x: two chiplets), bytes between
devices of one chip cross no ICI link but the chip's own path, one per chip, carrying both
directions at ``ChipSpec.intra_chip_bandwidth`` (no ICI efficiency, no hop latency). A phase
lasts as long as its slowest path: ``max(busiest ICI link bytes / (link_bandwidth *
efficiency), busiest chip's intra-chip bytes / intra_chip_bandwidth)``. Generations whose
``intra_chip_bandwidth`` is ``inf`` (all but tpu7x) price such bytes as free, as before.

**Algorithms (modelling choices, each switchable through** :class:`ModelOptions` **).** A group
is *regular* when its chips are every combination of a set of positions per physical axis
(a line, a 2x2 block, a strided row...), with the same number of members on each chip.

- ``all-gather`` of a regular group runs *per-axis phases*: along one axis at a time, every
  line of the group runs a bidirectional ring over its positions in physical order, each member
  sending half of its (growing) data each way. On a wrapped axis whose positions cover the ring
  the closing hop uses the wraparound link; on a line without wraparound the closing hop
  crosses the whole line, so the traffic that must cross the whole line is counted (twice the
  wrapped time for large messages: the scaling book's measured v5e case). With
  ``multi_axis="concurrent"`` (default) the data is split over every order of the group's axes
  so all axes' links work at once (the book's ``V / (W * axes)``); ``"sequential"`` runs one
  order, axis 0 first.
  A regular group with several members per chip gathers chip by chip and ends with an
  *intra-chip phase*: every device needs the whole result, and what reached a chip reached one
  of its devices, so each chip moves ``(members on it - 1) x result`` bytes between its devices.
- ``all-gather`` of an irregular or scattered group: one bidirectional ring over the members in
  the group's own order (the order the HLO lists them), each ring hop routed link by link (a
  hop between two devices of one chip takes the intra-chip path).
- ``reduce-scatter`` moves the same bytes as an all-gather whose result is the reduce-scatter's
  input; ``all-reduce`` is a reduce-scatter followed by an all-gather.
- ``all-to-all``: every member sends a ``1/size`` slice of its result to every other member
  directly, each transfer routed link by link.
- ``collective-permute``: each (source, target) pair sends its whole result (a device's send to
  itself is priced as a same-chip transfer: a local copy).

**Device order** (``ModelOptions.order``). A replica group lists its devices in an order (the
mesh's device order along the group's axes), and the TPU's collectives may run along it:
JAX's ``mesh_utils`` builds "rotated pincer device assignment[s]" (ring orders such as
``_V5E_TRAY_RING_ORDER``) for the ``RotatedPincerEmitter`` that runs TPU all-reduces, and
order-only changes have published step-time gains (``reports/benchmarks.md``, "Device
order"). What the compiler itself says, read from the ``collective_algorithm_config`` of
deviceless compiles (libtpu 0.0.42.1): an all-reduce over up to
:data:`RING_IN_ORDER_MAX_MEMBERS` devices is a bidirectional 1D ring with no reordering map in
any order, so it runs along the group's order; larger groups get per-axis (ND) rings or a
ring with a reordering map, whatever the order; an all-gather's emitter
(``1DAllGatherNonMajorDim``) carries a reordering map, so it maps any order onto its own ring.
Three models (:func:`order_algorithm`):

- ``"compiler"`` (default): that reading. All-reduces and reduce-scatters (which compile to
  all-reduce fusions) of groups up to 8 devices run one bidirectional ring in the group's
  order, each hop routed on the torus (a hop between devices of one chip takes the intra-chip
  path); everything else as ``"physical"``. Why the default: the published order-only
  measurements (``reports/benchmarks.md``, "Device order") reject ``"physical"`` (it predicts
  no gain for two of them) and do not separate ``"compiler"`` from ``"logical"`` (both reach
  every published gain); the compiler's own labels do.
- ``"logical"``: every gather and reduction runs along its group's order: where the order is
  a grid of physical lines (:func:`order_grid`; a line in physical order, a block in row-major
  order) per-axis phases with each line's ring in group order, which for lines in physical
  order is exactly the ``"physical"`` algorithm; any other order one ring in group order.
- ``"physical"``: per-axis rings in physical order for every regular group (the model before
  device orders were seen): two orders of the same chips cost the same.

Worked example (``v6e:2x4``, an all-reduce of 64 MB over all 8 chips): in coordinate
row-major order the ring's hops (1,0)->(0,1) take two links and its closing hop (1,3)->(0,0)
four, so ``"compiler"`` prices it at 1.33 ms; in the ring order (0,0) (0,1) (0,2) (0,3) (1,3)
(1,2) (1,1) (1,0) every hop is one link: 0.66 ms (``"physical"``: 0.85 ms in both orders).

Routing is dimension-ordered; with ``routing="balanced"`` (default) each transfer's bytes are
split evenly over every axis order and both ways of a tied wrapped axis, which keeps the model
invariant under mirror and rotation symmetries of the slice; ``"dimension-order"`` uses only
x-then-y-then-z with ties the + way (:meth:`Topology.route`).

Worked example (the scaling book's v5e measurement): on a v5e slice with axes {8, 4}, an
all-gather over the length-4 axis (no wraparound) of 8.4 MB shards: each line's ring sends
``3/2`` shards each way per hop, and the closing hop crosses the line the other way, so the
busiest link carries ``3 * 8.4e6`` bytes: ``25.2e6 / (4.5e10 * 0.95) + 3 * 1e-6 = 592 us``
(the book's formula gives 560 us; the profile measured 680 us).
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

import numpy as np

from aoizora_lab.errors import AoizoraError
from aoizora_lab.hardware import ChipSpec, chip_spec
from aoizora_lab.topology import Link, Topology

if TYPE_CHECKING:
    import pandas as pd

CollectiveKind = Literal[
    "all-gather", "reduce-scatter", "all-reduce", "all-to-all", "collective-permute"
]
COLLECTIVE_KINDS: tuple[str, ...] = (
    "all-gather", "reduce-scatter", "all-reduce", "all-to-all", "collective-permute"
)


@dataclass(frozen=True)
class Collective:
    """One collective of a compiled program, with logical device ids as the HLO gives them."""

    kind: CollectiveKind
    """One of :data:`COLLECTIVE_KINDS`."""
    groups: tuple[tuple[int, ...], ...]
    """Replica groups of logical device ids; for ``collective-permute`` the (source, target)
    pairs."""
    bytes: float
    """Byte size of the collective's result on one device (the HLO result shape's size)."""
    count: int = 1
    """How many times it runs per step (loop trip counts included)."""
    name: str = ""
    """The HLO instruction name, for people."""

    def __post_init__(self) -> None:
        if self.kind not in COLLECTIVE_KINDS:
            raise AoizoraError(
                f"Unknown collective kind {self.kind!r}; kinds are {list(COLLECTIVE_KINDS)}."
            )
        try:
            groups = tuple(tuple(int(i) for i in g) for g in self.groups)
        except (TypeError, ValueError) as err:
            raise AoizoraError(
                f"Collective {self.name or self.kind!r}: groups {self.groups!r} must be "
                "sequences of integer logical device ids, e.g. ((0, 1), (2, 3))."
            ) from err
        object.__setattr__(self, "groups", groups)
        ids = [i for g in groups for i in g]
        if not groups or any(len(g) == 0 for g in groups) or min(ids) < 0:
            raise AoizoraError(
                f"Collective {self.name or self.kind!r}: groups {self.groups!r} must be "
                "non-empty groups of non-negative logical device ids."
            )
        if self.kind == "collective-permute":
            if any(len(g) != 2 for g in groups):
                raise AoizoraError(
                    f"collective-permute {self.name!r}: groups {self.groups!r} must be "
                    "(source, target) pairs."
                )
        elif len(ids) != len(set(ids)):
            raise AoizoraError(
                f"Collective {self.name or self.kind!r}: a device id appears twice in groups "
                f"{self.groups!r}; replica groups must be disjoint."
            )
        if not (self.bytes >= 0 and math.isfinite(self.bytes)):
            raise AoizoraError(
                f"Collective {self.name or self.kind!r}: bytes={self.bytes!r} must be a finite "
                "non-negative byte count."
            )
        if int(self.count) != self.count or self.count < 0:
            raise AoizoraError(
                f"Collective {self.name or self.kind!r}: count={self.count!r} must be a "
                "non-negative integer (runs per step)."
            )

    @property
    def max_device_id(self) -> int:
        """The largest logical device id the collective names."""
        return max(i for g in self.groups for i in g)


ORDER_MODELS: tuple[str, ...] = ("compiler", "logical", "physical")
"""How the order of a group's devices shapes its gathers and reductions (module docstring,
*Device order*)."""

RING_IN_ORDER_MAX_MEMBERS = 8
"""The largest group whose all-reduce (and reduce-scatter) libtpu runs as one ring in the
group's own device order. Its ``RotatedPincerEmitter`` labels groups of 2, 4 and 8 devices
``UniDirection1DRingStrategy`` (two colours: both ways) with ``has_reordering_map:0`` in every
order tried, the whole ``v5e:2x4`` / ``v6e:2x4`` slice included; larger groups get a strategy
that does not follow the order: a whole slice ``UniDirectionNDRingStrategy`` / ``StrategyND``
(per-axis rings; ``v5e:4x4``, ``v5e:8x8`` and ``v5p:2x2x4`` in any order, random ones
included), 16 or 32 devices of a larger slice ``StrategyRing`` with ``has_reordering_map:1``
(libtpu 0.0.42.1, deviceless; ``benchmarks/device_order.py`` compiles them again and prints
the labels in ``reports/benchmarks.md``, "Device order"). TPU7x compiles carry no such labels
(its collectives run on the SparseCores): the same rule is applied there, without evidence of
its own."""


@dataclass(frozen=True)
class ModelOptions:
    """Switches between modelling choices where evidence is thin (see the module docstring)."""

    routing: Literal["balanced", "dimension-order"] = "balanced"
    """``"balanced"``: split each transfer over all axis orders and both ways of a tie."""
    multi_axis: Literal["concurrent", "sequential"] = "concurrent"
    """How an all-gather over several physical axes orders its per-axis phases."""
    order: Literal["compiler", "logical", "physical"] = "compiler"
    """What a group's device order does to its gathers and reductions (module docstring,
    *Device order*): ``"compiler"`` as libtpu's emitters label them, ``"logical"`` every
    group along its own order, ``"physical"`` per-axis rings whatever the order."""
    overlap: float = 1.0
    """The largest share of its asynchronous collectives' time that compute can hide
    (``aoizora_lab.cost`` applies it): 1 hides them wholly behind a long enough window;
    less leaves the rest exposed however long the window (a transfer that starts late, or
    slows the compute beside it)."""

    def __post_init__(self) -> None:
        if self.routing not in ("balanced", "dimension-order"):
            raise AoizoraError(
                f"ModelOptions.routing={self.routing!r}; use 'balanced' or 'dimension-order'."
            )
        if self.multi_axis not in ("concurrent", "sequential"):
            raise AoizoraError(
                f"ModelOptions.multi_axis={self.multi_axis!r}; use 'concurrent' or 'sequential'."
            )
        if not 0 <= self.overlap <= 1:
            raise AoizoraError(
                f"ModelOptions.overlap={self.overlap!r} must be in [0, 1]: the share of an "
                "asynchronous collective's time that compute can hide."
            )
        if self.order not in ORDER_MODELS:
            raise AoizoraError(
                f"ModelOptions.order={self.order!r}; use one of {list(ORDER_MODELS)} (module "
                "docstring of aoizora_lab.comm_model, 'Device order')."
            )


@dataclass(frozen=True, eq=False)
class CommEstimate:
    """Predicted cost of one collective (or a whole program) on a placement."""

    seconds: float
    """Predicted time, all runs per step included."""
    bandwidth_seconds: float
    """The part of ``seconds`` spent moving bytes over the busiest links."""
    latency_seconds: float
    """The part of ``seconds`` spent in per-hop latency."""
    link_bytes: np.ndarray
    """``float`` array ``[num_chips, ndim, 2]``: bytes per directed ICI link, all runs included
    (indexed like :attr:`Topology.link_target`)."""
    chip_bytes: np.ndarray
    """``float`` array ``[num_chips]``: bytes moved between the devices of each chip over its
    intra-chip path, all runs included (where a chip holds one device, only a permute's sends
    of a device to itself, which its ``inf`` bandwidth prices as free)."""
    busiest_link: Link | None
    """The link (or intra-chip path, :attr:`Link.intra_chip`) whose bytes take longest at its
    bandwidth, or ``None`` when no byte takes time on any."""
    busiest_link_bytes: float
    """Bytes on ``busiest_link``."""
    parts: tuple[CommEstimate, ...] = field(default=())
    """For a program: one estimate per collective, in order."""
    phase_peaks: np.ndarray = field(default_factory=lambda: np.zeros((0, 2)))
    """For one collective: ``float [phases, 2]``, one run's bytes on the busiest ICI link and
    on the busiest chip's intra-chip path in each phase (what :func:`transfer_seconds` prices
    again under other link constants; empty for a program)."""
    hops: int = 0
    """For one collective: the farthest a byte of one run travels, in links (an all-reduce's
    twice; 0 for a program)."""


Flows = tuple[np.ndarray, np.ndarray, np.ndarray]
"""(source chips, target chips, bytes) of the transfers of one phase."""


def estimate(
    collectives: Collective | Iterable[Collective],
    topology: Topology,
    placement: Sequence[int] | np.ndarray | None = None,
    *,
    chip: ChipSpec | None = None,
    options: ModelOptions | None = None,
) -> CommEstimate:
    """Predict the time and per-link bytes of ``collectives`` on ``topology``.

    ``collectives`` is one :class:`Collective`, a sequence of them, or a program object with a
    ``.collectives`` attribute; a program's estimate sums its collectives (run one after the
    other) and keeps each one's estimate in ``parts``. ``placement`` maps logical device id ->
    physical device index (row of ``topology.coords``): a ``Placement`` or any sequence of
    ints that ``numpy.asarray`` accepts; ``None`` is the identity. ``chip`` defaults to
    ``chip_spec(topology.generation)``.
    """
    chip = chip or chip_spec(topology.generation)
    options = options or ModelOptions()
    device_of = _placement_array(placement, topology)
    if isinstance(collectives, Collective):
        return _estimate_one(collectives, topology, device_of, chip, options)
    items = list(getattr(collectives, "collectives", collectives))
    parts = tuple(_estimate_one(c, topology, device_of, chip, options) for c in items)
    link_bytes = sum((p.link_bytes for p in parts), np.zeros(_load_shape(topology)))
    chip_bytes = sum((p.chip_bytes for p in parts), np.zeros(topology.num_chips))
    busiest, busiest_bytes = _busiest(link_bytes, chip_bytes, topology, chip)
    return CommEstimate(
        seconds=sum(p.seconds for p in parts),
        bandwidth_seconds=sum(p.bandwidth_seconds for p in parts),
        latency_seconds=sum(p.latency_seconds for p in parts),
        link_bytes=link_bytes, chip_bytes=chip_bytes, busiest_link=busiest,
        busiest_link_bytes=busiest_bytes, parts=parts,
    )


def mesh_axis_groups(mesh_shape: Sequence[int], axes: Sequence[int]) -> list[list[int]]:
    """Replica groups of logical ids for a collective over ``axes`` of a row-major mesh.

    Example: a ``(2, 4)`` mesh has ids ``[[0..3], [4..7]]``; over axis 1 the groups are
    ``[[0, 1, 2, 3], [4, 5, 6, 7]]``, over axis 0 ``[[0, 4], [1, 5], [2, 6], [3, 7]]``, over
    both one group of all eight.
    """
    mesh_shape = tuple(int(n) for n in mesh_shape)
    axes = [int(a) for a in axes]
    if not all(0 <= a < len(mesh_shape) for a in axes) or len(set(axes)) != len(axes):
        raise AoizoraError(
            f"Mesh axes {axes} must be distinct indices into mesh shape {mesh_shape}."
        )
    ids = np.arange(math.prod(mesh_shape)).reshape(mesh_shape)
    rest = [a for a in range(len(mesh_shape)) if a not in axes]
    grouped = ids.transpose(rest + axes).reshape(-1, math.prod(mesh_shape[a] for a in axes))
    return grouped.tolist()


_ROUTE_MATRICES: dict[tuple, Any] = {}


def route_matrix(topology: Topology, options: ModelOptions | None = None) -> Any:
    """Bytes on each directed link per byte sent, for every ordered pair of chips.

    A ``scipy.sparse`` matrix ``[num_chips ** 2, num_links + intra]``: row ``src * num_chips +
    dst``, column the link slot of ``route_loads(...).ravel()``, then (where a chip holds
    several devices, :func:`intra_chip_slots`) one column per chip for its intra-chip path,
    which row ``c * num_chips + c`` loads. The model's routing is linear in bytes, so the link
    loads of any set of transfers are ``traffic @ route_matrix`` with ``traffic`` the bytes per
    chip pair. Example: on a 4-chip line, row ``0 * 4 + 2`` has 1.0 on the + links of chips 0
    and 1. Cached per slice shape, wraparound, intra-chip columns and routing.
    """
    from scipy import sparse

    options = options or ModelOptions()
    intra = intra_chip_slots(topology)
    key = (tuple(topology.shape), tuple(topology.wrap), intra, options.routing)
    matrix = _ROUTE_MATRICES.get(key)
    if matrix is None:
        chips = topology.num_chips
        ici = int(np.prod(_load_shape(topology)))
        src, dst = np.divmod(np.arange(chips * chips), chips)
        pair, slot, amount = topology.route_entries(src, dst, 1.0,
                                                    **_routing(topology, options))
        if intra:
            same = np.arange(chips)
            pair = np.concatenate([pair, same * chips + same])
            slot = np.concatenate([slot, ici + same])
            amount = np.concatenate([amount, np.ones(chips)])
        matrix = sparse.csr_matrix((amount, (pair, slot)), shape=(chips * chips, ici + intra))
        _ROUTE_MATRICES[key] = matrix
    return matrix


def intra_chip_slots(topology: Topology) -> int:
    """Intra-chip columns of :func:`route_matrix`: one per chip where a chip holds several
    devices, else none (so one-device-per-chip slices keep exactly the ICI columns)."""
    return topology.num_chips if topology.devices_per_chip > 1 else 0



# ----------------------------------------------------------------------------- internals


def _routing(topology: Topology, options: ModelOptions) -> dict[str, Any]:
    """``route_loads`` keywords for ``options.routing``."""
    balanced = options.routing == "balanced"
    return {"axis_orders": list(itertools.permutations(range(topology.ndim))) if balanced
            else None, "split_ties": balanced}


def _load_shape(topology: Topology) -> tuple[int, int, int]:
    return (topology.num_chips, topology.ndim, 2)


def _placement_array(placement: Sequence[int] | np.ndarray | None,
                     topology: Topology) -> np.ndarray:
    """The placement as an int array over all devices, checked to be a permutation."""
    if placement is None:
        return np.arange(topology.num_devices)
    order = np.asarray(placement)
    if (order.ndim != 1 or order.size != topology.num_devices
            or not np.issubdtype(order.dtype, np.integer)
            or not np.array_equal(np.sort(order), np.arange(topology.num_devices))):
        raise AoizoraError(
            f"Placement {order.tolist() if order.size <= 64 else order!r} must be a permutation "
            f"of the {topology.num_devices} device indices 0..{topology.num_devices - 1} of "
            f"{topology.name}: entry i is the physical device of logical device i."
        )
    return order


def _busiest(link_bytes: np.ndarray, chip_bytes: np.ndarray, topology: Topology,
             chip: ChipSpec) -> tuple[Link | None, float]:
    """The ICI link or intra-chip path whose bytes take longest (ties: the ICI link)."""
    peak = float(link_bytes.max(initial=0.0))
    on_chip = float(chip_bytes.max(initial=0.0))
    if on_chip / chip.intra_chip_bandwidth > peak / (chip.ici_link_bandwidth
                                                     * chip.ici_efficiency):
        return topology.intra_chip_link(int(np.argmax(chip_bytes))), on_chip
    if peak <= 0:
        return None, 0.0
    index, axis, direction = np.unravel_index(int(np.argmax(link_bytes)), link_bytes.shape)
    return topology.link(int(index), int(axis), int(direction)), peak


def _estimate_one(collective: Collective, topology: Topology, device_of: np.ndarray,
                  chip: ChipSpec, options: ModelOptions) -> CommEstimate:
    if collective.max_device_id >= len(device_of):
        raise AoizoraError(
            f"Collective {collective.name or collective.kind!r} names logical device "
            f"{collective.max_device_id}, but {topology.name} has only {len(device_of)} devices."
        )
    chips_of = topology.device_chip[device_of]
    group_chips = [chips_of[list(g)] for g in collective.groups]
    phases = _phases(collective, group_chips, topology, options)
    link_bytes = np.zeros(_load_shape(topology))
    chip_bytes = np.zeros(topology.num_chips)
    peaks = np.zeros((len(phases), 2))
    for index, (src, dst, size) in enumerate(phases):
        loads = topology.route_loads(src, dst, size, **_routing(topology, options))
        same = src == dst
        on_chip = np.bincount(src[same], size[same], minlength=topology.num_chips)
        peaks[index] = loads.max(initial=0.0), on_chip.max(initial=0.0)
        link_bytes += loads
        chip_bytes += on_chip
    hops = _farthest_hops(collective, group_chips, topology, options)
    bandwidth_seconds = float(transfer_seconds(
        peaks, 0, chip.ici_link_bandwidth * chip.ici_efficiency, chip.intra_chip_bandwidth, 0.0))
    latency_seconds = hops * chip.ici_hop_latency
    count = collective.count
    link_bytes *= count
    chip_bytes *= count
    busiest, busiest_bytes = _busiest(link_bytes, chip_bytes, topology, chip)
    return CommEstimate(
        seconds=count * (bandwidth_seconds + latency_seconds),
        bandwidth_seconds=count * bandwidth_seconds,
        latency_seconds=count * latency_seconds,
        link_bytes=link_bytes, chip_bytes=chip_bytes, busiest_link=busiest,
        busiest_link_bytes=busiest_bytes, phase_peaks=peaks, hops=hops,
    )


def transfer_seconds(phase_peaks: np.ndarray, hops: int, link_rate: Any,
                     intra_chip_bandwidth: Any, hop_latency: Any) -> Any:
    """One run of a collective from its :attr:`CommEstimate.phase_peaks` and
    :attr:`~CommEstimate.hops`: each phase as long as its slower path, plus the hops'
    latency (module docstring). ``link_rate`` is bytes/s on one link (bandwidth x
    efficiency); the rates may be arrays over draws of the model (the result then is one)."""
    shape = np.broadcast_shapes(*(np.shape(v) for v in (link_rate, intra_chip_bandwidth,
                                                        hop_latency)))
    rate, intra, latency = (np.broadcast_to(np.asarray(v, dtype=np.float64), shape).ravel()
                            for v in (link_rate, intra_chip_bandwidth, hop_latency))
    links, chips = np.asarray(phase_peaks, dtype=np.float64).reshape(-1, 2).T
    seconds = np.maximum(links[:, None] / rate, chips[:, None] / intra).sum(axis=0)
    return (seconds + hops * latency).reshape(shape)


def _farthest_hops(collective: Collective, group_chips: list[np.ndarray],
                   topology: Topology, options: ModelOptions) -> int:
    """How far a byte of the collective travels: the largest hop distance between two chips
    of one group, or for a group run as a ring in its order (:func:`order_algorithm`) the
    longest way around it (:func:`ring_hops`); twice for an all-reduce."""
    farthest = 0
    if order_algorithm(collective.kind, len(group_chips[0]), topology, options) == "ring":
        coords = topology.chip_coords[np.stack(group_chips)]  # [groups, members, ndim]
        hop_lengths = topology.offset_hops(np.roll(coords, -1, axis=1) - coords)
        farthest = int(ring_hops(hop_lengths).max())
    else:
        for chips in group_chips:
            unique = np.unique(chips)
            farthest = max(farthest, int(topology.chip_distances(unique, unique).max()))
    return 2 * farthest if collective.kind == "all-reduce" else farthest


def ring_hops(hop_lengths: np.ndarray) -> np.ndarray:
    """The farthest a byte travels on bidirectional rings whose hops take ``hop_lengths``
    ``[..., S]`` links each (hop *i* from member *i* to *i + 1*, the closing hop last): every
    byte goes ``S // 2`` hops one way, so the longest run of that many consecutive hops.

    Example: a ring of 4 over a line without wraparound in physical order has hops (1, 1, 1,
    3): a byte goes at most 2 hops, the longest pair 1 + 3 = 4 links.
    """
    hop_lengths = np.asarray(hop_lengths)
    size = hop_lengths.shape[-1]
    run = size // 2
    if run == 0:
        return np.zeros(hop_lengths.shape[:-1], dtype=hop_lengths.dtype)
    around = np.cumsum(np.concatenate([hop_lengths, hop_lengths[..., :run]], axis=-1),
                       axis=-1)
    before = np.concatenate([np.zeros_like(around[..., :1]), around[..., :size - 1]], axis=-1)
    return (around[..., run - 1:run - 1 + size] - before).max(axis=-1)


def _phases(collective: Collective, group_chips: list[np.ndarray], topology: Topology,
            options: ModelOptions) -> list[Flows]:
    """Transfers of every group, merged phase by phase (groups run their phases together)."""
    size = float(collective.bytes)
    per_group: list[list[Flows]] = []
    for chips in group_chips:
        if collective.kind in ("collective-permute", "all-to-all"):
            per_group.append([direct_flows(collective.kind, chips, size)])
        else:
            shard = gathered_shard(collective.kind, size, len(chips))
            phases = all_gather_phases(chips, shard, topology, options, collective.kind)
            per_group.append(phases * 2 if collective.kind == "all-reduce" else phases)
    merged: list[Flows] = []
    for step in range(max(len(p) for p in per_group)):
        flows = [p[step] for p in per_group if step < len(p)]
        merged.append(tuple(np.concatenate([f[i] for f in flows]) for i in range(3)))
    return merged


def direct_flows(kind: str, chips: np.ndarray, size: float) -> Flows:
    """The one phase of a ``collective-permute`` or ``all-to-all`` with result ``size`` bytes.

    ``chips`` holds member chips ``[..., members]`` (one group, or a batch of groups); flows come
    out group by group. A permute pair sends ``size``; an all-to-all member sends ``size /
    members`` to every other member. Example: all-to-all over chips ``[0, 1, 2]`` with 3 bytes:
    six flows of one byte.
    """
    chips = np.asarray(chips)
    if kind == "collective-permute":
        src, dst = chips[..., 0].ravel(), chips[..., 1].ravel()
        return src, dst, np.full(src.size, size)
    members = chips.shape[-1]
    shape = (*chips.shape, members)
    off_diagonal = np.broadcast_to(~np.eye(members, dtype=bool), shape)
    src = np.broadcast_to(chips[..., :, None], shape)[off_diagonal]
    dst = np.broadcast_to(chips[..., None, :], shape)[off_diagonal]
    return src, dst, np.full(src.size, size / members)


def gathered_shard(kind: str, size: float, members: int) -> float:
    """Bytes per member that the all-gather behind ``kind`` (result ``size`` bytes) gathers."""
    gathered = {"all-gather": size, "reduce-scatter": size * members, "all-reduce": size}[kind]
    return gathered / members


def group_layout(chips: np.ndarray, topology: Topology
                 ) -> tuple[np.ndarray, np.ndarray, list[np.ndarray], bool]:
    """A group's distinct chips, members per chip, positions per axis, and whether it is
    *regular*: every combination of its per-axis positions, the same members on each chip."""
    unique, per_chip = np.unique(chips, return_counts=True)
    coords = topology.chip_coords[unique]
    positions = [np.unique(coords[:, a]) for a in range(topology.ndim)]
    regular = bool(per_chip.min() == per_chip.max()
                   and len(unique) == math.prod(len(p) for p in positions))
    return unique, per_chip, positions, regular


def order_algorithm(kind: str, members: int, topology: Topology,
                    options: ModelOptions) -> Literal["physical", "ring", "lines"]:
    """How a gather or reduction over a group of ``members`` devices runs (module docstring,
    *Device order*), for :func:`all_gather_phases`:

    - ``"physical"``: per-axis rings in physical order where the group's chips are regular
      (its order does not matter), else one ring in the group's order;
    - ``"ring"``: one bidirectional ring in the group's order, each hop routed;
    - ``"lines"``: rings along the group's order factor by factor where that order is a grid
      of physical lines (:func:`order_grid`), else one ring in the group's order.

    It depends on the kind and the group's size only, so all groups of a collective run
    alike. Example (``order="compiler"``): an all-reduce over 8 devices of ``v5e:4x4`` is a
    ``"ring"``, over all 16 ``"physical"`` (libtpu's ND strategy), an all-gather always
    ``"physical"``.
    """
    if options.order == "physical" or kind in ("all-to-all", "collective-permute"):
        return "physical"
    if options.order == "logical":
        return "lines"
    if kind == "all-gather":  # the emitter maps the order onto its own ring
        return "physical"
    return "ring" if members <= RING_IN_ORDER_MAX_MEMBERS else "physical"


def order_grid(chips: np.ndarray, topology: Topology) -> np.ndarray | None:
    """The member chips of one group, in group order, as a row-major grid ``[n_1, ..., n_k]``
    whose every grid axis steps along one physical axis (or stays on one chip: its devices),
    each physical axis used by one grid axis; the finest such grid, or ``None`` where the
    order is none (a snake, a ring of a block, a scattered order).

    Example on ``v5e:4x4``: chips at (0,0) (1,0) (0,1) (1,1) in that order are the grid
    ``[[(0,0), (1,0)], [(0,1), (1,1)]]`` (y outer, x inner); in the order (0,0) (1,0) (1,1)
    (0,1), a ring of the block, they are none.
    """
    chips = np.asarray(chips)
    coords = topology.chip_coords[chips]
    best = None
    for shape in _ordered_factorizations(len(chips), topology.ndim + 1):
        grid = coords.reshape(*shape, topology.ndim)
        used: set[int] = set()
        for dim in range(len(shape)):
            step = np.diff(grid, axis=dim) != 0  # [..., ndim]: which coordinates change
            moving = np.nonzero(step.reshape(-1, topology.ndim).any(axis=0))[0]
            axis = int(moving[0]) if len(moving) == 1 else -1 if not len(moving) else None
            if axis is None or axis in used or (axis >= 0 and not step[..., axis].all()):
                break
            used.add(axis)
        else:
            if best is None or len(shape) > len(best):
                best = shape
    return None if best is None else chips.reshape(best)


def _ordered_factorizations(n: int, most: int) -> list[tuple[int, ...]]:
    """Every way to write ``n`` as an ordered product of at most ``most`` factors > 1
    (``(1,)`` for 1)."""
    if n == 1:
        return [(1,)]
    out = [(n,)]
    if most > 1:
        out += [(a, *rest) for a in range(2, n) if n % a == 0
                for rest in _ordered_factorizations(n // a, most - 1)]
    return out


def all_gather_phases(chips: np.ndarray, shard: float, topology: Topology,
                      options: ModelOptions, kind: str = "all-gather") -> list[Flows]:
    """Phases of an all-gather of ``shard`` bytes per member over member chips ``chips`` (in
    group order); ``kind`` names the collective it is part of (:func:`order_algorithm`)."""
    grid = group_grid(chips, topology, order_algorithm(kind, len(chips), topology, options))
    return [ring_flows(chips, shard)] if grid is None else grid_phases(grid, shard, options)


def group_grid(chips: np.ndarray, topology: Topology, how: str) -> np.ndarray | None:
    """The grid a group's phases run over (:func:`grid_phases`) when it runs ``how``
    (:func:`order_algorithm`): its order where that is a grid of lines (``"lines"``,
    :func:`order_grid`), its chips in physical order where they are regular (``"physical"``,
    :func:`physical_grid`); ``None`` where it runs as one ring in its order."""
    if how == "lines":
        return order_grid(chips, topology)
    if how == "physical":
        return physical_grid(chips, topology)
    return None


def physical_grid(chips: np.ndarray, topology: Topology) -> np.ndarray | None:
    """A *regular* group's chips as a grid ``[positions per spanned axis..., members per
    chip]`` in physical order (axis 0 first), whatever their order: rings along its lines are
    the per-axis rings of the module docstring; ``None`` for an irregular group. Example:
    chips (0,0) (1,0) (0,1) (1,1) of ``v5e:4x4``, one device each, are ``[[[c00], [c01]],
    [[c10], [c11]]]`` (x, then y, then the device)."""
    unique, per_chip, positions, regular = group_layout(chips, topology)
    if not regular:
        return None
    spanned = [a for a in range(topology.ndim) if len(positions[a]) > 1]
    coords = topology.chip_coords[unique]
    shape = [len(positions[a]) for a in spanned]
    cells = np.ravel_multi_index([np.searchsorted(positions[a], coords[:, a]) for a in spanned],
                                 shape) if spanned else np.zeros(1, dtype=np.int64)
    grid = np.empty(math.prod(shape), dtype=np.int64)
    grid[cells] = unique
    return np.repeat(grid.reshape(shape)[..., None], per_chip[0], axis=-1)


def grid_phases(grid: np.ndarray, shard: float, options: ModelOptions) -> list[Flows]:
    """Per-axis phases over a :func:`group_grid`: along one grid axis at a time, every line
    runs a bidirectional ring in grid order (``multi_axis="concurrent"`` splits the data over
    every order of the axes, ``"sequential"`` runs them in grid order); a grid axis that
    stays on one chip (its devices) moves its bytes in the intra-chip phase at the end."""
    on_chip = [d for d in range(grid.ndim) if grid.shape[d] > 1
               and not np.diff(grid, axis=d).any()]
    per_chip = grid.shape[on_chip[0]] if on_chip else 1
    chips = np.take(grid, 0, axis=on_chip[0]) if on_chip else grid
    dims = [d for d in range(chips.ndim) if chips.shape[d] > 1]
    orders = (list(itertools.permutations(dims)) if options.multi_axis == "concurrent"
              else [tuple(dims)])
    data = shard * per_chip / len(orders)
    phases: list[Flows] = []
    for step in range(len(dims)):
        flows = [ring_flows(np.moveaxis(chips, order[step], -1).reshape(
                     -1, chips.shape[order[step]]),
                 data * math.prod(chips.shape[d] for d in order[:step])) for order in orders]
        phases.append(tuple(np.concatenate([f[i] for f in flows]) for i in range(3)))
    if per_chip > 1:
        unique = np.unique(chips)
        phases.append((unique, unique, np.full(len(unique), (per_chip - 1) * shard * grid.size)))
    return phases


def ring_flows(rings: np.ndarray, held: float) -> Flows:
    """A bidirectional ring all-gather: each member sends ``(n-1)/2`` of ``held`` each way.

    ``rings`` is one ring of member chips in ring order, or ``[rings, n]`` for several at once
    (flows come out ring by ring, ``2 n`` per ring).
    """
    rings = np.atleast_2d(rings)
    n = rings.shape[-1]
    successor = np.roll(rings, -1, axis=-1)
    src = np.concatenate([rings, successor], axis=-1).ravel()
    dst = np.concatenate([successor, rings], axis=-1).ravel()
    return src, dst, np.full(src.size, ring_flow_bytes(n, held))


def ring_flow_bytes(members: int, held: float) -> float:
    """Bytes of each flow of :func:`ring_flows`: a member sends ``(n-1)/2`` of ``held`` each
    way."""
    return (members - 1) / 2 * held


def standard_collectives(mesh_shape: Sequence[int], result_bytes: float) -> list[Collective]:
    """A small set of collectives over a logical mesh, for quick looks at a slice.

    One all-gather per mesh axis and over all axes, an all-reduce and an all-to-all over
    everything, and a shift by one along axis 0 (collective-permute), each with
    ``result_bytes`` per device.
    """
    mesh_shape = tuple(int(n) for n in mesh_shape)
    every = list(range(len(mesh_shape)))
    named = "xyzc"
    out = [Collective("all-gather", mesh_axis_groups(mesh_shape, [a]), result_bytes,
                      name=f"all-gather over {named[a]}")
           for a in every if mesh_shape[a] > 1]
    out.append(Collective("all-gather", mesh_axis_groups(mesh_shape, every), result_bytes,
                          name="all-gather over all"))
    out.append(Collective("all-reduce", mesh_axis_groups(mesh_shape, every), result_bytes,
                          name="all-reduce over all"))
    out.append(Collective("all-to-all", mesh_axis_groups(mesh_shape, every), result_bytes,
                          name="all-to-all over all"))
    lines = mesh_axis_groups(mesh_shape, [0])
    shift = [(line[i], line[(i + 1) % len(line)]) for line in lines for i in range(len(line))]
    if mesh_shape[0] > 1:
        out.append(Collective("collective-permute", shift, result_bytes,
                              name="shift +1 along x"))
    return out


def compare_placements(
    collectives: Iterable[Collective],
    topology: Topology,
    placements: dict[str, Sequence[int] | np.ndarray],
    *,
    chip: ChipSpec | None = None,
    options: ModelOptions | None = None,
) -> pd.DataFrame:
    """One row per collective: predicted microseconds and busiest link under each placement.

    Columns ``<name> us`` and ``<name> busiest link`` per placement, then ``slowest / fastest``.
    """
    import pandas as pd

    rows = []
    for collective in collectives:
        row: dict[str, object] = {"collective": collective.name or collective.kind,
                                  "groups": f"{len(collective.groups)} x "
                                            f"{len(collective.groups[0])}"}
        times = []
        for label, order in placements.items():
            result = estimate(collective, topology, order, chip=chip, options=options)
            row[f"{label} us"] = round(result.seconds * 1e6, 1)
            row[f"{label} busiest link"] = str(result.busiest_link or "-")
            times.append(result.seconds)
        fastest, slowest = min(times), max(times)
        row["slowest / fastest"] = (round(slowest / fastest, 2) if fastest > 0
                                    else (math.inf if slowest > 0 else 1.0))
        rows.append(row)
    return pd.DataFrame(rows)
