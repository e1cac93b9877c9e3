"""Physical placements of a logical mesh: enumerate, score with the ICI model, search.

A :class:`Placement` is a permutation: entry *i* is the physical device (row of
``Topology.coords``) of logical device *i*; it *is* the device order of a ``Mesh``.

**Scoring** (:class:`PlacementScorer`) minimises the predicted step: it is exactly the
communication :func:`~aoizora_lab.cost.predict` leaves exposed (each collective by
:func:`~aoizora_lab.estimate`, overlap groups read from the compiled schedule), vectorised over
a batch of placements with numpy:

1. collectives with the same kind and groups differ only in bytes and runs, and the model is
   linear in bytes for a fixed layout of groups, so their link loads per byte are computed
   once: a Wan step's hundreds of HLO collectives become a dozen *structures*;
2. routing is linear too, so a transfer adds its bytes to the links of its route in the
   model's :func:`~aoizora_lab.comm_model.route_matrix` (kept as one run of (link,
   fraction) entries per chip pair): a compiled loop (:mod:`aoizora_lab.flow_kernels`) adds
   each flow's bytes to the links of its route;
3. a *regular* group (a line, a block) that the model lays out by its chips runs per-axis
   physical rings whatever its members' order, so its per-phase loads are worked out once per
   chip set (keyed by a hash of the set) and gathered from a table after that; under
   ``ModelOptions(order="logical")`` a group whose order is a grid of lines is keyed by its
   order instead, and a group that runs as a ring in its order (an all-reduce of up to 8
   devices by default, :func:`~aoizora_lab.comm_model.order_algorithm`) is routed flow by
   flow like an irregular one;
4. a local search moves by swapping two positions, and only the groups holding them change:
   :meth:`PlacementScorer.swap_scores` re-prices those groups against the kept loads of the
   order they came from, routing only the flows whose ends the swap moves.

Throughput (placements per second on one core, whole placements and swaps apart):
``benchmarks/placement_throughput.py``, the table in ``reports/benchmarks.md``; the swap
scoring is the faster the larger the slice (what is left is mostly per-structure numpy work
per call and dense link vectors).

**Symmetry** (:func:`symmetries`): mirrors of each axis, swaps of equal axes with equal wrap,
and translations along wrapped axes map the slice onto itself and leave every score unchanged;
:func:`canonical` picks one representative per class so each class is scored once.

**Search** (:func:`search_placements`): every *structured* placement (each logical axis on
physical axes or factors of them, in every nesting order: contiguous blocks, strided lines),
deduplicated by symmetry, then a seeded, deterministic local search (pairwise swaps with
simulated-annealing acceptance) from the best few. Example on ``v5e:4x4`` for a ``(2, 8)``
mesh: ``cfg`` on x-major factor 2 and the 8-way axis on x-minor 2 × y 4 is one structured
placement ("cfg on x:2 | uly on x:2·y:4").
"""

from __future__ import annotations

import contextlib
import dataclasses
import enum
import itertools
import math
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from aoizora_lab.candidates import Candidate
from aoizora_lab.comm_model import (
    Collective,
    ModelOptions,
    direct_flows,
    estimate,
    gathered_shard,
    grid_phases,
    group_grid,
    intra_chip_slots,
    order_algorithm,
    ring_flow_bytes,
    ring_flows,
    ring_hops,
    route_matrix,
)
from aoizora_lab.compile import DEFAULT_FLAGS, CompilerFlags
from aoizora_lab.cost import Predicted, group_exposed, hbm_seconds, overlap_groups, predict
from aoizora_lab.errors import AoizoraError
from aoizora_lab.flow_kernels import (
    ALL_TO_ALL,
    PERMUTE,
    RING,
    maybe_regular,
    moved_longest,
    route_flows,
    route_group_changes,
)
from aoizora_lab.hardware import ChipSpec, device_spec
from aoizora_lab.hlo import CommProgram
from aoizora_lab.records import Records
from aoizora_lab.topology import Topology
from aoizora_lab.versions import fingerprint, is_memoized, memoized


@dataclass(frozen=True)
class Placement:
    """Logical device id -> physical device index (a permutation)."""

    order: tuple[int, ...]
    """Entry *i*: the physical device (row of ``Topology.coords``) of logical device *i*."""
    description: str = field(default="", compare=False)
    """How it was built, for people (e.g. ``"cfg on x:2 | uly on y:4"``)."""

    def __post_init__(self) -> None:
        order = tuple(int(i) for i in self.order)
        if sorted(order) != list(range(len(order))):
            raise AoizoraError(
                f"Placement {list(order)[:32]} is not a permutation of 0..{len(order) - 1}: "
                "each physical device must host exactly one logical device."
            )
        object.__setattr__(self, "order", order)

    def __array__(self, dtype: Any = None, copy: Any = None) -> np.ndarray:
        return np.asarray(self.order, dtype=dtype)

    def __len__(self) -> int:
        return len(self.order)

    def device_order(self, topology: Topology, mesh_shape: Sequence[int] | None = None
                     ) -> np.ndarray:
        """The topology's devices in this order, reshaped to ``mesh_shape`` (for a ``Mesh``)."""
        pool = _devices_of(topology)
        devices = np.empty(len(self.order), dtype=object)
        devices[:] = [pool[i] for i in self.order]
        return devices.reshape(tuple(mesh_shape) if mesh_shape else (len(self.order),))


# ----------------------------------------------------------------------------- device orders


def plain_order(topology: Topology) -> Placement:
    """Logical device *i* on physical device *i*: what ``Mesh(np.array(jax.devices())
    .reshape(shape))`` gives, and how the official Wan / xDiT code ranks processes."""
    return Placement(tuple(range(topology.num_devices)), "plain device order")


def order_of(devices: Any, topology: Topology, how: str) -> Placement:
    """The placement of an array of ``topology``'s devices (a mesh's ``devices``, what a
    library built), described as ``how``."""
    position = {id(d): i for i, d in enumerate(_devices_of(topology))}
    return Placement(tuple(position[id(d)] for d in np.asarray(devices).ravel()), how)


def _devices_of(topology: Topology) -> list[Any]:
    if topology.devices is None:
        raise AoizoraError(
            f"{topology.name} is simulated and has no devices; use Topology.from_name with "
            "libtpu, live TPU devices, or CPU host devices."
        )
    return list(topology.devices)


class LibraryRefuses(AoizoraError):
    """JAX's mesh construction (``jax.make_mesh``, ``mesh_utils.create_device_mesh``) refuses
    a mesh shape on a slice: a fact about the library, which callers record as such."""


@contextlib.contextmanager
def _library_call(what: str) -> Iterator[None]:
    """Turn what JAX's mesh code raises when it refuses a shape (its asserts, ``ValueError``,
    ``NotImplementedError``) into :class:`LibraryRefuses`; anything else propagates."""
    try:
        yield
    except (ValueError, NotImplementedError, AssertionError) as err:
        raise LibraryRefuses(f"{what} refuses: {type(err).__name__}: {err}") from err


def make_mesh_order(mesh_shape: Sequence[int], axis_names: Sequence[str],
                    topology: Topology) -> Placement:
    """Where ``jax.make_mesh`` puts a mesh of ``mesh_shape`` (:class:`LibraryRefuses` where it
    refuses)."""
    import jax

    devices = _devices_of(topology)
    with _library_call(f"jax.make_mesh{tuple(mesh_shape)}"):
        mesh = jax.make_mesh(tuple(mesh_shape), tuple(axis_names), devices=devices)
    return order_of(mesh.devices, topology, "jax.make_mesh")


def create_device_mesh_order(mesh_shape: Sequence[int], topology: Topology, *,
                             allow_split: bool | None = None) -> Placement:
    """Where ``mesh_utils.create_device_mesh`` puts a mesh of ``mesh_shape``.

    ``allow_split`` is its ``allow_split_physical_axes``; ``None`` (default) tries ``False``
    (the library's default) and retries with ``True`` where that refuses the shape. A refusal
    with ``False`` or ``True`` raises :class:`LibraryRefuses`."""
    from jax.experimental import mesh_utils

    devices = _devices_of(topology)
    if allow_split is None:
        try:
            return create_device_mesh_order(mesh_shape, topology, allow_split=False)
        except LibraryRefuses:
            return create_device_mesh_order(mesh_shape, topology, allow_split=True)
    with _library_call(f"mesh_utils.create_device_mesh{tuple(mesh_shape)} with "
                       f"allow_split_physical_axes={allow_split}"):
        ordered = mesh_utils.create_device_mesh(tuple(mesh_shape), devices,
                                                allow_split_physical_axes=allow_split)
    how = ("mesh_utils.create_device_mesh(allow_split_physical_axes=True)" if allow_split
           else "mesh_utils.create_device_mesh")
    return order_of(ordered, topology, how)


def library_orders(mesh_shape: Sequence[int], axis_names: Sequence[str],
                   topology: Topology) -> list[Placement]:
    """The plain device order, and what ``jax.make_mesh`` and
    ``mesh_utils.create_device_mesh`` pick where they accept the mesh (they refuse some
    shapes on some slices; a simulated slice has only the plain order): every placement
    search starts from these, so it always sees what those libraries would do."""
    orders = [plain_order(topology)]
    if topology.devices is None:
        return orders
    for build in (lambda: make_mesh_order(mesh_shape, axis_names, topology),
                  lambda: create_device_mesh_order(mesh_shape, topology)):
        try:
            orders.append(build())
        except LibraryRefuses:
            continue
    return orders


# ----------------------------------------------------------------------------- symmetry


def symmetries(topology: Topology, *, limit: int = 4096) -> list[np.ndarray]:
    """Device permutations that map the slice onto itself (identity first).

    Generated by per-axis mirrors, swaps of axes with equal length and wrap, and unit
    translations along wrapped axes; at most ``limit`` elements are kept.
    """
    coords = topology.chip_coords
    shape = np.array(topology.shape)
    generators = []
    for axis in range(topology.ndim):
        mirrored = coords.copy()
        mirrored[:, axis] = shape[axis] - 1 - mirrored[:, axis]
        generators.append(mirrored)
        if topology.wrap[axis]:
            shifted = coords.copy()
            shifted[:, axis] = (shifted[:, axis] + 1) % shape[axis]
            generators.append(shifted)
    for a, b in itertools.combinations(range(topology.ndim), 2):
        if shape[a] == shape[b] and topology.wrap[a] == topology.wrap[b]:
            swapped = coords.copy()
            swapped[:, [a, b]] = swapped[:, [b, a]]
            generators.append(swapped)
    chip_maps = [np.ravel_multi_index(g.T, topology.shape) for g in generators]
    # Chip maps -> device maps: device (chip c, core k) -> device (chip map[c], core k).
    grid = topology.device_grid().reshape(topology.num_chips, topology.devices_per_chip)
    device_maps = []
    for chip_map in chip_maps:
        perm = np.empty(topology.num_devices, dtype=np.int64)
        perm[grid.ravel()] = grid[chip_map].ravel()
        device_maps.append(perm)
    identity = np.arange(topology.num_devices)
    group = {identity.tobytes(): identity}
    frontier = [identity]
    while frontier and len(group) < limit:
        nxt = []
        for element in frontier:
            for g in device_maps:
                composed = g[element]
                key = composed.tobytes()
                if key not in group and len(group) < limit:
                    group[key] = composed
                    nxt.append(composed)
        frontier = nxt
    return list(group.values())


def canonical(order: Sequence[int] | np.ndarray, maps: Sequence[np.ndarray]) -> tuple[int, ...]:
    """The smallest image of ``order`` under ``maps``: equal for symmetric placements."""
    order = np.asarray(order)
    images = np.stack([m[order] for m in maps])
    best = images[np.lexsort(images.T[::-1])[0]]
    return tuple(int(i) for i in best)


# ----------------------------------------------------------------------------- structured


def _factorizations(n: int) -> list[tuple[int, ...]]:
    """Ordered ways (major first) to write ``n`` as one or two factors > 1."""
    out = [(n,)] if n > 1 else [()]
    out += [(a, n // a) for a in range(2, n) if n % a == 0]
    return out


def structured_placements(mesh_shape: Sequence[int], topology: Topology,
                          axis_names: Sequence[str] | None = None) -> list[Placement]:
    """Every placement that lays each logical axis on whole physical axes or factors of them.

    The physical grid (device_grid, cores last) is split into factors (each physical axis whole
    or as major x minor), the factors are put in every order, and consecutive runs of them form
    the logical axes (row-major). Duplicates are removed.
    """
    mesh_shape = tuple(int(n) for n in mesh_shape)
    if math.prod(mesh_shape) != topology.num_devices:
        raise AoizoraError(
            f"Mesh {mesh_shape} has {math.prod(mesh_shape)} devices but {topology.name} has "
            f"{topology.num_devices}."
        )
    names = list(axis_names or [f"axis{i}" for i in range(len(mesh_shape))])
    grid = topology.device_grid()
    physical = list(grid.shape)  # chips per axis, then cores per chip
    labels = [*"xyz"[:topology.ndim], "core"]
    seen: set[tuple[int, ...]] = set()
    result = []
    for splits in itertools.product(*(_factorizations(n) for n in physical)):
        factors = [(labels[a], f, a, k) for a, split in enumerate(splits)
                   for k, f in enumerate(split)]
        tensor = grid.reshape([f for _, f, _, _ in factors])
        for perm in itertools.permutations(range(len(factors))):
            sizes = [factors[p][1] for p in perm]
            runs = _group_runs(sizes, mesh_shape)
            if runs is None:
                continue
            for arranged, styles in _line_orders(tensor.transpose(perm), runs):
                order = tuple(int(i) for i in arranged.ravel())
                if order in seen:
                    continue
                seen.add(order)
                parts = []
                for name, (start, stop), style in zip(names, runs, styles, strict=True):
                    used = [factors[p] for p in perm[start:stop]]
                    parts.append(f"{name} on "
                                 + ("·".join(f"{lab}:{f}" for lab, f, _, _ in used) or "-")
                                 + (f" {style}" if style else ""))
                result.append(Placement(order, " | ".join(parts)))
    return result


def _line_orders(arranged: np.ndarray, runs: list[tuple[int, int]]
                 ) -> list[tuple[np.ndarray, list[str]]]:
    """``arranged`` (one array axis per physical factor) in every combination of per-axis
    orders: plain; ``snake`` for a logical axis over two or more factors (the minor factor
    reversed on every other major index, so logical neighbours stay physical neighbours);
    ``ring`` for a logical axis over two factors whose major one is longer than 2 (a
    Hamiltonian ring of the block, :func:`block_ring`: its closing hop is one link too, where
    a snake's crosses the block; with a major factor of 2 the snake is that ring);
    ``folded`` for a logical axis on one factor of 4 or more (0, 2, 4, ..., 5, 3, 1: every
    ring hop, the closing one included, is at most two links on a line without wraparound).
    Rings matter where a collective runs along its group's order (an all-reduce of up to 8
    devices, :mod:`aoizora_lab.comm_model`).

    Example: ``ring`` on ``x:2·y:4`` snake visits (0,0) (0,1) (0,2) (0,3) (1,3) (1,2) ...
    """
    variants = [(arranged, [])]
    for start, stop in runs:
        grown = []
        for array, styles in variants:
            grown.append((array, [*styles, ""]))
            if stop - start >= 2:
                snake = array.copy()
                odd = [slice(None)] * array.ndim
                odd[stop - 2] = slice(1, None, 2)
                snake[tuple(odd)] = np.flip(array[tuple(odd)], axis=stop - 1)
                grown.append((snake, [*styles, "snake"]))
                major, minor = array.shape[start], array.shape[start + 1]
                if stop - start == 2 and major > 2 and (major * minor) % 2 == 0:
                    flat = [a * minor + b for a, b in block_ring(major, minor)]
                    merged = array.reshape(*array.shape[:start], major * minor,
                                           *array.shape[stop:])
                    grown.append((np.take(merged, flat, axis=start).reshape(array.shape),
                                  [*styles, "ring"]))
            elif stop - start == 1 and array.shape[start] >= 4:
                n = array.shape[start]
                fold = np.concatenate([np.arange(0, n, 2), np.arange(n - 1 - n % 2, 0, -2)])
                grown.append((np.take(array, fold, axis=start), [*styles, "folded"]))
        variants = grown
    return variants


def block_ring(major: int, minor: int) -> list[tuple[int, int]]:
    """A Hamiltonian ring of a ``major`` x ``minor`` block (one of them even, both >= 2):
    every step, the closing one included, moves one position along one axis.

    Example: ``block_ring(4, 2)`` is (0,0) (0,1) (1,1) (2,1) (3,1) (3,0) (2,0) (1,0): down
    the first row, a snake through the rest that leaves the first column free, back up it.
    """
    if major * minor % 2 or min(major, minor) < 2:
        raise AoizoraError(f"A {major} x {minor} block has no ring through every position: "
                           "one side must be even and both at least 2.")
    if major % 2:
        return [(a, b) for b, a in block_ring(minor, major)]
    ring = [(0, b) for b in range(minor)]
    for a in range(1, major):
        ring += [(a, b) for b in (range(minor - 1, 0, -1) if a % 2 else range(1, minor))]
    return ring + [(a, 0) for a in range(major - 1, 0, -1)]


def _group_runs(sizes: list[int], mesh_shape: tuple[int, ...]
                ) -> list[tuple[int, int]] | None:
    """Split ``sizes`` into consecutive runs whose products are ``mesh_shape`` (or None)."""
    runs, start = [], 0
    for target in mesh_shape:
        stop, product = start, 1
        while stop < len(sizes) and product < target:
            product *= sizes[stop]
            stop += 1
        if product != target:
            return None
        runs.append((start, stop))
        start = stop
    return runs if start == len(sizes) else None


# ----------------------------------------------------------------------------- scoring

Terms = tuple[np.ndarray, np.ndarray, "np.ndarray | None"]
"""One structure's part of a batch's score: unit-byte link loads ``[B, phases, links]``,
each group's longest hop count ``[B, groups]``, and for gathers and reductions each group's
row in the phase tables ``[B, groups]`` (-1: irregular; ``None`` for other kinds)."""


Kept = tuple[dict[bytes, int], list[Terms]]
"""Terms a scorer keeps between calls of ``swap_scores``: each order's row, and the terms."""


Changes = tuple[int, np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]
"""Groups whose flows a swap changes, as :func:`~aoizora_lab.flow_kernels.route_group_changes`
takes them: flow layout, member chips before and after ``[N, S]``, bytes per flow before and
after ``[N]`` (0: no flows on that side) and each group's row of the batch ``[N]``."""


class PlacementScorer:
    """Predicted exposed communication seconds of one program under many placements (see
    module)."""

    def __init__(self, collectives: Iterable[Collective] | Any, topology: Topology, *,
                 chip: ChipSpec | None = None, options: ModelOptions | None = None):
        items = list(getattr(collectives, "collectives", collectives))
        self.program = items
        self.topology = topology
        self.chip = device_spec(topology, chip)
        self.options = options or ModelOptions()
        # What is in flight together, read once from the schedule (a bare list: all
        # synchronous); the objective is the communication the schedule leaves exposed.
        if not hasattr(collectives, "collectives"):
            collectives = CommProgram(tuple(items), topology.num_devices)
        self.groups = [g for g in overlap_groups(collectives, self.chip) if g.runs > 0]
        structures: dict[tuple[str, tuple[tuple[int, ...], ...]], int] = {}
        self._structure_of = [structures.setdefault((c.kind, c.groups), len(structures))
                              for c in items]
        self.structures = [(kind, np.array(groups, dtype=np.int64))
                           for kind, groups in structures]
        # How each structure's groups run (comm_model.order_algorithm): "physical" groups are
        # priced by chip set, "lines" by their order, "ring" ones as rings in member order.
        self._how = [order_algorithm(kind, len(groups[0]), topology, self.options)
                     for kind, groups in structures]
        self._hbm_s = np.array([hbm_seconds(c, self.chip) for c in items])
        self._bytes = np.array([float(c.bytes) for c in items])
        self._structure_index = np.array(self._structure_of, dtype=np.int64)
        # Hop latency per hop of each structure (an all-reduce crosses its group twice).
        self._hop_factor = np.array([(2.0 if kind == "all-reduce" else 1.0)
                                     * self.chip.ici_hop_latency for kind, _ in structures])
        singles = [g for g in self.groups if len(g.members) == 1]
        self._single_member = np.array([g.members[0] for g in singles], dtype=np.int64)
        self._single_async = np.array([g.asynchronous[0] for g in singles], dtype=bool)
        self._single_window = np.array([g.window_s for g in singles], dtype=np.float64)
        self._single_runs = np.array([float(g.runs) for g in singles])
        self._multi_groups = [g for g in self.groups if len(g.members) > 1]
        self._joint_structures = sorted({self._structure_of[i] for g in self._multi_groups
                                         for i in g.members})
        # Each such group's bytes per structure: its members' summed loads are one weighted
        # sum of its structures' loads, however many members share a structure.
        self._joint_bytes: list[dict[int, float]] = []
        for group in self._multi_groups:
            weights: dict[int, float] = {}
            for i in group.members:
                k = self._structure_of[i]
                weights[k] = weights.get(k, 0.0) + self._bytes[i]
            self._joint_bytes.append(weights)
        routes = route_matrix(topology, self.options)
        intra = intra_chip_slots(topology)
        if intra:
            # Intra-chip columns in ICI-link-equivalent bytes, so that every load below takes
            # load / (link bandwidth * efficiency) seconds, whichever path carries it.
            from scipy import sparse

            scale = np.ones(routes.shape[1])
            scale[-intra:] = (self.chip.ici_link_bandwidth * self.chip.ici_efficiency
                              / self.chip.intra_chip_bandwidth)
            routes = (routes @ sparse.diags(scale)).tocsr()
        # Each chip pair's route as a run of (link, fraction) entries: a flow adds its bytes
        # to the few links of its route only (a traffic matrix times the route matrix costs
        # chips^2 x links per placement: 1M multiply-adds at 64 chips, for ~500 flows).
        routes = routes.tocsr()
        routes.sort_indices()
        self._routes = (topology.num_chips, routes.indptr[:-1].astype(np.int64),
                        np.diff(routes.indptr).astype(np.int64),
                        routes.indices.astype(np.int64), routes.data.astype(np.float64))
        self._num_links = routes.shape[1]
        # A group's chip set keyed by the wrapping sum of random 64-bit numbers of its chips
        # (a multiset hash: order-free, any slice size, collisions ~2^-64 per pair).
        keys = np.random.default_rng(0).integers(
            0, np.iinfo(np.int64).max, size=topology.num_chips + topology.num_devices,
            dtype=np.int64).astype(np.uint64)
        self._chip_key = keys[:topology.num_chips]
        # An ordered group ("lines") is keyed by the wrapping sum of chip key x position key.
        self._position_key = keys[topology.num_chips:] | np.uint64(1)
        chips = np.arange(topology.num_chips)
        self._distances = topology.chip_distances(chips, chips)
        # Hops of each per-axis offset, laid out as a circular correlation of grids padded to
        # twice each axis lays them out (index k: offset k, or k - 2n past n).
        offsets = np.indices([2 * n for n in topology.shape]).reshape(topology.ndim, -1).T
        offsets = np.where(offsets < topology.shape, offsets, offsets - 2 * np.array(
            topology.shape))
        self._offset_hops = np.where(
            (np.abs(offsets) < topology.shape).all(axis=1),
            topology.offset_hops(offsets), 0).reshape([2 * n for n in topology.shape])
        self._chip_of = topology.device_chip
        # Regular chip sets seen so far: key -> row of the phase tables (-1: irregular), and
        # their unit phase loads, one pass and two (an all-reduce), each aligned at phase 0.
        self._set_rows: dict[int, int] = {}
        self._tables = (np.zeros((1, 1, self._num_links)), np.zeros((1, 2, self._num_links)))
        self._table_rows = 0
        self._set_hops: dict[int, int] = {}
        # Per structure, the groups each logical position is in (a permute's position is in
        # two pairs), for swap_scores; and the terms of the last call's bases and swaps.
        self._groups_holding = [_groups_holding(groups, topology.num_devices)
                                for _, groups in self.structures]
        self._bases: Kept = ({}, [])
        self._last: Kept = ({}, [])
        self.evaluations = 0
        self.chunk = 256

    @property
    def group_layouts_modelled(self) -> int:
        """Distinct group chip sets (or orders) whose layout and phases the model has worked
        out."""
        return len(self._set_rows)

    def scores(self, orders: Iterable[Sequence[int]] | np.ndarray) -> np.ndarray:
        """Predicted exposed communication seconds of the program on each order (rows of a
        batch): every overlap group priced as :func:`aoizora_lab.cost.predict` prices it, so
        adding the (placement-independent) compute gives the predicted step."""
        batch = np.atleast_2d(np.asarray(orders, dtype=np.int64))
        if len(batch) > self.chunk:  # chunks keep the traffic matrices in cache
            return np.concatenate([self.scores(batch[i:i + self.chunk])
                                   for i in range(0, len(batch), self.chunk)])
        self.evaluations += len(batch)
        return self._price(self._terms(batch))

    def swap_scores(self, orders: np.ndarray, first: np.ndarray, second: np.ndarray
                    ) -> np.ndarray:
        """:meth:`scores` of each row of ``orders`` with its positions ``first[k]`` and
        ``second[k]`` swapped, re-pricing only the groups that hold a swapped position.

        The link loads are sums over groups, so a swap's loads are its base order's minus the
        touched groups on the base plus them on the swap; the busiest link, the phases and
        the overlap groups are then priced in full, exactly as :meth:`scores` prices them (to
        rounding). The terms of each base order are kept, and so are those of the swaps of
        the last call: a local search that moves to one of them does not rescore it.
        A group that holds both swapped positions keeps its chip set, so where it is laid
        out regularly (its phases depend on the set alone) it is not re-priced at all; of the
        others only the flows whose ends change are routed. Example: on ``v5e:8x8`` a
        ``(2, 8, 4)`` program's all-to-alls over the 8-way axis re-price 2 of 8 groups per
        swap, and its 64-way weight gathers none.
        """
        orders = np.atleast_2d(np.asarray(orders, dtype=np.int64))
        first, second = np.asarray(first, dtype=np.int64), np.asarray(second, dtype=np.int64)
        if len(orders) > self.chunk:
            return np.concatenate([
                self.swap_scores(orders[i:i + self.chunk], first[i:i + self.chunk],
                                 second[i:i + self.chunk])
                for i in range(0, len(orders), self.chunk)])
        self.evaluations += len(orders)
        rows = np.arange(len(orders))
        trials = orders.copy()
        trials[rows, first], trials[rows, second] = orders[rows, second], orders[rows, first]
        # Few distinct bases (a search's current orders): found by their bytes, which is
        # much faster than sorting rows.
        index_of: dict[bytes, int] = {}
        which = np.array([index_of.setdefault(row.tobytes(), len(index_of)) for row in orders],
                         dtype=np.int64)
        bases = orders[np.unique(which, return_index=True)[1]]  # base m: first row m
        base_terms = self._base_terms(bases)
        parts, changes = [], []  # changes: (structure, groups whose flows change)
        for index, (_, groups) in enumerate(self.structures):
            base_loads, base_hops, base_picks = base_terms[index]
            picks = None if base_picks is None else base_picks[which]
            touched, both = self._touched_groups(index, first, second)  # [K, T], -1: none
            unused = touched < 0
            slots = np.where(unused, 0, touched)
            # A group holding both swapped positions keeps its chip set, so its longest hop
            # and, laid out regularly and priced by set, its phases.
            if picks is not None and self._how[index] == "physical":
                unused |= both & (picks[rows[:, None], slots] >= 0)
            if unused.all():
                parts.append((base_loads[which], base_hops[which], picks))
                continue
            row, slot = np.nonzero(~unused)  # each touched group once per row
            group = touched[row, slot]
            old = self._chip_of[orders[row[:, None], groups[group]]]  # [N, S]
            new = self._chip_of[trials[row[:, None], groups[group]]]
            table, change, new_picks = self._unit_phase_delta(
                index, old, new, row, None if picks is None else picks[row, group])
            if picks is not None:
                picks[row, group] = new_picks
            if change is not None:
                changes.append((index, change))
            phases = base_loads.shape[1] if table is None else max(base_loads.shape[1],
                                                                     table[1].shape[1])
            loads = _pad_phases(base_loads, phases)[which]
            if table is not None:  # rows may repeat (two groups of one swap)
                np.add.at(loads, (table[0], slice(0, table[1].shape[1])), table[1])
            hops = base_hops[which]
            if self._how[index] == "ring":  # the way around changes with the order
                hops[row, group] = self._ring_hops(new)
            else:
                moved_set = ~both[row, slot]
                hops[row[moved_set], group[moved_set]] = self._moved_hops(
                    old[moved_set], new[moved_set], hops[row[moved_set], group[moved_set]])
            parts.append((loads, hops, picks))
        for index, (layout, before, after, weight_before, weight_after, row) in changes:
            moved = np.zeros((len(orders), self._num_links))  # contiguous: the loop's fastest
            route_group_changes(moved, layout, before, after, weight_before, weight_after, row,
                                *self._routes)
            kind = self.structures[index][0]
            parts[index][0][:, :2 if kind == "all-reduce" else 1] += moved[:, None, :]
        terms = parts
        # The swaps' terms stay in one piece; a swap that becomes a base is cut out then.
        self._last = ({trials[k].tobytes(): k for k in range(len(trials))}, terms)
        return self._price(terms)

    def score(self, order: Sequence[int] | np.ndarray) -> float:
        """Predicted exposed communication seconds of the program on ``order``."""
        return float(self.scores([order])[0])

    def lower_bound(self) -> float:
        """Exposed communication seconds no placement can go below (the search's gap is its
        best score over this).

        Each collective at its per-chip injection bound: a chip has at most as many ICI links
        as the best-connected chip of the slice (two per axis longer than 2 or wrapped, one
        per axis of 2), and whatever it cannot hold on its own devices must cross them. A
        member of an all-gather of ``n`` (result ``R``) holding ``m`` members on its chip
        receives ``(n - m) R / n``; a reduce-scatter ``(n - m)`` shards of ``R``, an
        all-reduce both; an all-to-all member sends
        ``(n - m) R / n``, with ``m`` members on a chip sending ``m`` times that; a permute
        pair on two chips sends ``R``. No hop latency, never below the collective's HBM
        time, and the overlap groups priced as :meth:`scores` prices them (their time is
        monotone in each member's). An all-to-all is also held to its average link load:
        each member's flows go to ``n - 1`` others at least as far away as the ``n - 1``
        nearest devices of the best-placed chip, and every hop loads a link, so its bytes
        times hops over all the slice's links bound the busiest one. Still loose where
        gathers' routes are long. Example: a 64-way all-to-all of 1 GB on ``v5e:8x8`` (4
        links of 45 GB/s a chip) cannot take less than 63/64 GB / 180 GB/s, 5.5 ms, by
        injection; its hops (at least 4.06 on average to 63 others) put 1.14 GB on the
        average of the 224 links, 25 ms at 45 GB/s.
        """
        topology = self.topology
        degree = int(topology.link_exists.reshape(topology.num_chips, -1).sum(axis=1).max())
        per_chip = topology.devices_per_chip
        link_rate = self.chip.ici_link_bandwidth * self.chip.ici_efficiency
        bandwidth = degree * link_rate
        links = int(topology.link_exists.sum())
        # Distances from each chip to every device, nearest first (0 for a chip's own others).
        nearest = np.sort(np.repeat(self._distances, per_chip, axis=1), axis=1)[:, 1:]
        alone = np.empty(len(self.program))
        for index, collective in enumerate(self.program):
            n = len(collective.groups[0])
            together = min(per_chip, n)  # members one chip can hold
            if collective.kind == "collective-permute":
                moves = any(src != dst for src, dst in collective.groups)
                crossing = collective.bytes if per_chip == 1 and moves else 0.0
            elif collective.kind == "all-to-all":
                crossing = min(m * (n - m) for m in {1, together}) * collective.bytes / n
                hops = float(nearest[:, :n - 1].sum(axis=1).min())  # per member, at least
                spread = len(collective.groups) * collective.bytes * hops / max(links, 1)
                crossing = max(crossing, spread * bandwidth / link_rate)
            else:
                shard = gathered_shard(collective.kind, collective.bytes, n)
                passes = 2 if collective.kind == "all-reduce" else 1
                crossing = passes * (n - together) * shard
            alone[index] = max(crossing / bandwidth, self._hbm_s[index])
        total = 0.0
        for group in self.groups:
            member_s = alone[list(group.members)][:, None]
            total += float(group_exposed(group, member_s, member_s.max(axis=0),
                                         overlap=self.options.overlap)[0]) * group.runs
        return total

    def _terms(self, batch: np.ndarray) -> list[Terms]:
        """Per structure: unit-byte link loads ``[B, phases, links]``, each group's longest
        hop count ``[B, groups]`` and (gathers, reductions) each group's row in the phase
        tables ``[B, groups]`` on every order of ``batch``."""
        terms = []
        for index, (_, groups) in enumerate(self.structures):
            chips = self._chip_of[batch[:, groups]]  # [B, G, S]
            loads, picks = self._unit_phase_loads(index, chips)
            hops = (self._ring_hops(chips) if self._how[index] == "ring"
                    else self._group_hops(chips))
            terms.append((loads, hops, picks))
        return terms

    def _base_terms(self, bases: np.ndarray) -> list[Terms]:
        """:meth:`_terms` of ``bases``, from what earlier calls kept where they can: the
        bases of the last call (a chain that stayed) and its swaps (a chain that moved); the
        rest are priced afresh. Kept as this call's bases."""
        keys = [base.tobytes() for base in bases]
        sources = [self._bases, self._last]
        source = np.full(len(bases), len(sources), dtype=np.int64)
        row = np.zeros(len(bases), dtype=np.int64)
        for m, key in enumerate(keys):
            for s, (rows, _) in enumerate(sources):
                if key in rows:
                    source[m], row[m] = s, rows[key]
                    break
        missing = np.nonzero(source == len(sources))[0]
        if len(missing):
            sources.append(({}, self._terms(bases[missing])))
            row[missing] = np.arange(len(missing))
        used = [(np.nonzero(source == s)[0], terms) for s, (_, terms) in enumerate(sources)
                if (source == s).any()]
        terms = []
        for index in range(len(self.structures)):
            phases = max(kept[index][0].shape[1] for _, kept in used)
            _, some_hops, some_picks = used[0][1][index]
            loads = np.empty((len(bases), phases, self._num_links))
            hops = np.empty((len(bases), some_hops.shape[1]), dtype=some_hops.dtype)
            picks = None if some_picks is None else np.empty(
                (len(bases), some_picks.shape[1]), dtype=some_picks.dtype)
            for where, kept in used:
                kept_loads, kept_hops, kept_picks = kept[index]
                loads[where] = _pad_phases(kept_loads[row[where]], phases)
                hops[where] = kept_hops[row[where]]
                if picks is not None:
                    picks[where] = kept_picks[row[where]]
            terms.append((loads, hops, picks))
        self._bases = ({key: m for m, key in enumerate(keys)}, terms)
        return terms

    def _touched_groups(self, index: int, first: np.ndarray, second: np.ndarray
                        ) -> tuple[np.ndarray, np.ndarray]:
        """Groups of structure ``index`` holding position ``first[k]`` or ``second[k]``,
        each once per row ``[K, T]`` (-1 pads), and which of them hold both."""
        holding = self._groups_holding[index]
        a, b = holding[first], holding[second]
        shared = (b[:, :, None] == a[:, None, :]) & (a[:, None, :] >= 0)  # [K, Tb, Ta]
        b = np.where(shared.any(axis=2), -1, b)
        both = np.concatenate([shared.any(axis=1), np.zeros(b.shape, dtype=bool)], axis=1)
        return np.concatenate([a, b], axis=1), both

    def _ring_hops(self, chips: np.ndarray) -> np.ndarray:
        """How far a byte travels around each group of ``chips`` ``[..., S]`` run as a ring
        in member order (:func:`~aoizora_lab.comm_model.ring_hops`)."""
        return ring_hops(self._distances[chips, np.roll(chips, -1, axis=-1)])

    def _group_hops(self, chips: np.ndarray) -> np.ndarray:
        """Longest chip-to-chip distance within each group ``[B, G]`` of ``chips``
        ``[B, G, S]``."""
        members = chips.shape[-1]
        if members <= 8:  # at most 64 lookups a group: cheaper than finding the set
            return _longest(self._distances, chips)
        # Large groups: the longest distance depends only on the chip set (one per key).
        keys = self._chip_key[chips].sum(axis=2)
        distinct, first, inverse = np.unique(keys, return_index=True, return_inverse=True)
        hops = np.array([self._set_hops.get(key, -1) for key in distinct.tolist()])
        new = np.nonzero(hops < 0)[0]
        if len(new):
            sets = chips.reshape(-1, members)[first[new]]
            hops[new] = (_longest(self._distances, sets) if members ** 2 <= self._offset_hops.size
                         else self._longest_by_offsets(sets))
            self._set_hops.update(zip(distinct[new].tolist(), hops[new].tolist(), strict=True))
        return hops[inverse.ravel()].reshape(chips.shape[:2])

    def _longest_by_offsets(self, sets: np.ndarray) -> np.ndarray:
        """:func:`_longest` of large chip sets ``[M, S]`` from each set's autocorrelation.

        Distance depends only on the per-axis coordinate offset, so a set's longest distance
        is the longest of the offsets at which it meets a shifted copy of itself: one FFT of
        its occupancy grid (zero-padded to twice each axis, so offsets do not alias) instead
        of ``S^2`` lookups. Example: a 128-chip group on ``v5e:16x16``, 1,024 cells against
        16,384 pairs.
        """
        shape = self._offset_hops.shape
        grid = np.zeros((len(sets), *shape))
        coords = self.topology.chip_coords[sets]  # [M, S, ndim]
        grid[(np.arange(len(sets))[:, None], *np.moveaxis(coords, 2, 0))] = 1.0
        axes = tuple(range(1, grid.ndim))
        spectrum = np.fft.rfftn(grid, axes=axes)
        meets = np.fft.irfftn(spectrum * spectrum.conj(), s=shape, axes=axes) > 0.5
        return np.where(meets, self._offset_hops, 0).reshape(len(sets), -1).max(axis=1)

    def _moved_hops(self, old: np.ndarray, new: np.ndarray, old_hops: np.ndarray
                    ) -> np.ndarray:
        """Longest distance within each group ``new`` ``[M, S]``: ``old`` with at most one
        member's chip changed (``old_hops``: its longest distance); from the moved chips
        where that suffices (:func:`~aoizora_lab.flow_kernels.moved_longest`), else the set
        worked out afresh."""
        hops, again = moved_longest(self._distances, old, new, old_hops)
        again = np.nonzero(again)[0]
        if len(again):
            hops[again] = self._group_hops(new[again][:, None, :])[:, 0]
        return hops

    def _price(self, terms: list[Terms]) -> np.ndarray:
        """Exposed seconds of each order from its per-structure :meth:`_terms`."""
        per_byte = 1.0 / (self.chip.ici_link_bandwidth * self.chip.ici_efficiency)
        # One byte of each distinct (kind, groups): busiest-link time summed over phases,
        # the loads summed over phases (for groups in flight together) and the latency.
        if not terms:
            return np.zeros(0)
        unit_time = np.stack([loads.max(axis=2, initial=0.0).sum(axis=1) * per_byte
                              for loads, _, _ in terms])  # [structures, B]
        latency = np.stack([hops.max(axis=1, initial=0) for _, hops, _ in terms]
                           ) * self._hop_factor[:, None]
        of = self._structure_index
        alone = np.maximum(unit_time[of] * self._bytes[:, None] + latency[of],
                           self._hbm_s[:, None])  # [collectives, B]
        # A collective in flight alone: all of it exposed when synchronous, what outlasts
        # the compute scheduled beside it when asynchronous (cost.group_exposed).
        single = alone[self._single_member]
        window = self._single_window[:, None]
        exposed = np.where(self._single_async[:, None],
                           np.maximum(np.maximum(window, single) - window,
                                      (1 - self.options.overlap) * single), single)
        totals = self._single_runs @ exposed
        # Loads summed over phases, once per structure in flight with others. (Not one
        # matrix product: BLAS threads left spinning slow the loops after it.)
        over_phases = {k: terms[k][0].sum(axis=1) for k in self._joint_structures}
        for group, weights in zip(self._multi_groups, self._joint_bytes, strict=True):
            member_s = alone[list(group.members)]
            summed = sum(over_phases[k] * b for k, b in weights.items())
            joint = summed.max(axis=1, initial=0.0) * per_byte + latency[
                of[list(group.members)]].max(axis=0)
            totals += group_exposed(group, member_s, joint,
                                    overlap=self.options.overlap) * group.runs
        return totals

    def _link_loads(self, flows: tuple[np.ndarray, np.ndarray, np.ndarray],
                    rows: np.ndarray, num_rows: int) -> np.ndarray:
        """Link loads ``[num_rows, links]`` of ``flows``, flow *i* counted in row ``rows[i]``."""
        src, dst, size = flows
        out = np.zeros((num_rows, self._num_links))
        route_flows(out, src, dst, np.broadcast_to(np.asarray(size, dtype=np.float64),
                                                   src.shape), rows, *self._routes)
        return out

    def _unit_phase_loads(self, index: int, chips: np.ndarray
                          ) -> tuple[np.ndarray, np.ndarray | None]:
        """Per-phase link loads ``[B, phases, links]`` of one byte of structure ``index`` on
        ``chips``, and for gathers and reductions each group's table row (:data:`Terms`).

        The groups of a collective run their phases together: phase *k* adds every group's
        *k*-th phase, exactly as :func:`~aoizora_lab.estimate` merges them.
        """
        kind = self.structures[index][0]
        batch, num_groups, members = chips.shape
        if kind in ("collective-permute", "all-to-all"):
            flows = direct_flows(kind, chips, 1.0)
            rows = np.repeat(np.arange(batch), len(flows[0]) // batch)
            return self._link_loads(flows, rows, batch)[:, None, :], None
        repeats = 2 if kind == "all-reduce" else 1
        shard = gathered_shard(kind, 1.0, members)
        # Groups in the tables (regular sets, or orders that are grids of lines): each row
        # adds the table rows of its groups (the table's last row, zeros, for the others).
        picks = self._set_table_rows(chips.reshape(-1, members), self._how[index]
                                     ).reshape(batch, num_groups)
        table = self._tables[repeats - 1]
        irregular = picks < 0
        rows_of = np.where(irregular, self._table_rows, picks)
        loads = table[rows_of[:, 0]] * shard
        for group in range(1, num_groups):
            loads += table[rows_of[:, group]] * shard
        if irregular.any():
            # The others: one ring in member order, whose cost depends on that order.
            src, dst, size = ring_flows(chips.reshape(-1, members), shard)
            keep = np.repeat(irregular.ravel(), 2 * members)
            rows = np.repeat(np.arange(batch), num_groups * 2 * members)[keep]
            ring = self._link_loads((src[keep], dst[keep], size[keep]), rows, batch)
            loads[:, :repeats] += ring[:, None, :]
        return loads, picks

    def _unit_phase_delta(self, index: int, old: np.ndarray, new: np.ndarray, row: np.ndarray,
                          old_picks: np.ndarray | None
                          ) -> tuple[tuple[np.ndarray, np.ndarray] | None, Changes | None,
                                     np.ndarray | None]:
        """:meth:`_unit_phase_loads` of groups ``new`` minus that of ``old`` (``[N, S]``
        chips: a group before and after a swap, in row ``row[i]`` of the batch;
        ``old_picks``: their table rows), in two parts: the change of the tables' regular
        phases (rows of the batch and their loads ``[n, phases, links]``; ``None`` where no
        table row changes) and the groups whose flows change (:data:`Changes`, for the
        caller to route into its first phase, or two for an all-reduce; ``None``: none); and
        the table rows of ``new``.

        :func:`~aoizora_lab.flow_kernels.route_group_changes` routes only the flows whose
        ends differ: a swap re-routes the flows of its two moved members, not their whole
        groups.
        """
        kind = self.structures[index][0]
        members = old.shape[1]
        if kind in ("collective-permute", "all-to-all"):
            layout = PERMUTE if kind == "collective-permute" else ALL_TO_ALL
            weight = np.full(len(row), 1.0 if layout == PERMUTE else 1.0 / members)
            return None, (layout, old, new, weight, weight, row), None
        shard = gathered_shard(kind, 1.0, members)
        new_picks = old_picks.copy()
        moved = np.nonzero((old != new).any(axis=1))[0]  # else: the same chips in order
        new_picks[moved] = self._set_table_rows(new[moved], self._how[index])
        table = self._tables[1 if kind == "all-reduce" else 0]
        differ = np.nonzero(new_picks != old_picks)[0]
        phases = None
        if len(differ):  # irregular sets take the table's last row, zeros
            rows_of = [np.where(p[differ] < 0, self._table_rows, p[differ])
                       for p in (old_picks, new_picks)]
            phases = (row[differ], (table[rows_of[1]] - table[rows_of[0]]) * shard)
        # Irregular groups are one ring in member order.
        ring = ring_flow_bytes(members, shard)
        weights = [np.where(p < 0, ring, 0.0) for p in (old_picks, new_picks)]
        some = np.nonzero((weights[0] > 0) | (weights[1] > 0))[0]
        if not len(some):
            return phases, None, new_picks
        return phases, (RING, old[some], new[some], weights[0][some], weights[1][some],
                        row[some]), new_picks

    def _set_table_rows(self, groups: np.ndarray, how: str) -> np.ndarray:
        """Each group's row in the phase tables (``groups`` ``[N, members]`` of chips, in
        group order), -1 for a group priced as a ring in member order; a chip set (``how``
        ``"physical"``) or order (``"lines"``) seen for the first time is worked out once."""
        if groups.shape[1] == 2 or how == "ring":
            # A pair's ring in member order is the same four flows as its regular layout (and
            # its intra-chip phase): no table needed, and pairs are the most numerous sets.
            return np.full(len(groups), -1, dtype=np.int64)
        if how == "lines":  # a hash of the sequence
            keys = (self._chip_key[groups] * self._position_key[:groups.shape[1]]).sum(axis=1)
        else:
            keys = self._chip_key[groups].sum(axis=1)  # wraps: a hash of the multiset
        distinct, first, inverse = np.unique(keys, return_index=True, return_inverse=True)
        rows = np.full(len(distinct), -1, dtype=np.int64)
        maybe = np.arange(len(distinct))
        if self.topology.devices_per_chip == 1:
            maybe = np.nonzero(maybe_regular(self.topology.chip_coords,
                                             np.array(self.topology.shape), groups[first]))[0]
        for index in maybe.tolist():
            key = int(distinct[index])
            row = self._set_rows.get(key)
            if row is None:
                row = self._set_rows[key] = self._add_set(groups[first[index]], how)
            rows[index] = row
        return rows[inverse.ravel()]

    def _add_set(self, chips: np.ndarray, how: str) -> int:
        """Work out a new chip set (``how`` ``"physical"``: per-axis rings whatever the
        members' order) or order (``"lines"``: rings along it, :func:`~aoizora_lab.
        comm_model.order_grid`): its table row, or -1 where it is a ring in member order."""
        grid = group_grid(chips, self.topology, how)
        if grid is None:
            return -1
        phases = grid_phases(grid, 1.0, self.options)
        entry = np.stack([self._link_loads(flows, np.zeros(len(flows[0]), dtype=np.int64), 1)[0]
                          for flows in phases]) if phases else np.zeros((0, self._num_links))
        single, double = self._tables
        row = self._table_rows
        if row + 1 >= len(single) or len(entry) > single.shape[1]:
            # Grow (doubling rows; phases to the longest entry); the last row stays zeros.
            rows, width = max(2 * len(single), row + 2), max(single.shape[1], len(entry))
            single = _grown(single, rows, width, row)
            double = _grown(double, rows, 2 * width, row)
        single[row, :len(entry)] = entry
        double[row, :2 * len(entry)] = np.concatenate([entry, entry])
        self._tables = (single, double)
        self._table_rows = row + 1
        return row


def _longest(distances: np.ndarray, chips: np.ndarray) -> np.ndarray:
    """The largest of ``distances`` between any two of each group's ``chips`` (``[..., S]``)."""
    pairs = distances[chips[..., :, None], chips[..., None, :]]
    return pairs.reshape(*chips.shape[:-1], -1).max(axis=-1)


def _grown(table: np.ndarray, rows: int, phases: int, used: int) -> np.ndarray:
    """A zero table ``[rows, phases, links]`` holding ``table``'s first ``used`` rows."""
    grown = np.zeros((rows, phases, table.shape[2]))
    grown[:used, :table.shape[1]] = table[:used]
    return grown


def _pad_phases(loads: np.ndarray, phases: int) -> np.ndarray:
    """``loads`` ``[B, p, links]`` with zero phases appended up to ``phases``."""
    if loads.shape[1] == phases:
        return loads
    return np.pad(loads, ((0, 0), (0, phases - loads.shape[1]), (0, 0)))


def _groups_holding(groups: np.ndarray, num_devices: int) -> np.ndarray:
    """``[num_devices, m]``: the groups (rows of ``groups``) each position is in, once each,
    padded with -1."""
    holding: list[list[int]] = [[] for _ in range(num_devices)]
    for index, members in enumerate(groups):
        for position in dict.fromkeys(members.tolist()):
            holding[position].append(index)
    width = max(1, max(len(h) for h in holding))
    return np.array([h + [-1] * (width - len(h)) for h in holding], dtype=np.int64)


# ----------------------------------------------------------------------------- search


class Source(enum.Enum):
    """Where a scored placement came from."""

    LIBRARY = "library order"
    """A device order a library would use: plain order, ``jax.make_mesh``,
    ``mesh_utils.create_device_mesh`` (:func:`library_orders`)."""
    STRUCTURED = "structured"
    """Each logical axis on whole physical axes or factors of them
    (:func:`structured_placements`)."""
    LOCAL_SEARCH = "local search"
    """Simulated-annealing swaps from one of the best placements found before."""


@dataclass(frozen=True)
class ScoredPlacement:
    """A placement and the communication its program leaves exposed there."""

    placement: Placement
    """The device order."""
    exposed_s: float
    """Communication not hidden behind compute on this placement (the search's objective:
    the predicted step minus the compute, which no placement changes)."""
    source: Source
    """How the search found it."""


class ScoredPlacements(Records[ScoredPlacement]):
    """What :func:`search_placements` scored, least exposed communication first (one per symmetry
    class). :meth:`to_frame` adds each placement's busiest link."""

    COLUMNS = ("placement", "exposed_s", "source", "description", "busiest_link")

    def __init__(self, items: Iterable[ScoredPlacement] = (), *,
                 busiest: Callable[[Placement], str] | None = None) -> None:
        super().__init__(items)
        self._busiest = busiest

    def row(self, item: ScoredPlacement) -> dict[str, Any]:
        return {"placement": item.placement, "exposed_s": item.exposed_s,
                "source": item.source.value, "description": item.placement.description,
                "busiest_link": self._busiest(item.placement) if self._busiest else "-"}


LOCAL_SEARCH_STARTS = 5
"""Placements the local search of :func:`search_placements` starts from (its ``top``)."""

LOCAL_SEARCH_CHAINS = 4
"""Independent annealing chains from each start. More chains of fewer steps, stepped together,
make bigger batches for the scorer (whose cost is mostly per call): on 14B@720p
``cfg2-uly8-fsdp`` (v5e:4x4, 20,000 evaluations) 5 starts x 4 chains reach the same 0.317 s
of exposed communication as 5 x 1 (within 0.2 %, three seeds) at 1.7x the placements per
second, where 32 swaps per step instead of 8 stall at 0.407 s."""


def search_placements(program: Any, mesh_shape: Sequence[int], topology: Topology, *,
                      budget: int = 20_000, top: int = LOCAL_SEARCH_STARTS, seed: int = 0,
                      axis_names: Sequence[str] | None = None,
                      extra: Sequence[Placement] = (), chip: ChipSpec | None = None,
                      options: ModelOptions | None = None) -> ScoredPlacements:
    """Score placements of ``program`` (a CommProgram or collectives) on ``topology``.

    Scores every structured placement (and ``extra`` ones, e.g. :func:`library_orders`) once
    per symmetry class, then spends what is left of ``budget`` evaluations on a local search
    from the ``top`` best. Returns them least exposed communication first.
    """
    scorer = PlacementScorer(program, topology, chip=chip, options=options)
    maps = symmetries(topology)
    found: dict[tuple[int, ...], ScoredPlacement] = {}

    def consider(placements: Iterable[Placement], source: Source) -> None:
        fresh: dict[tuple[int, ...], Placement] = {}
        for placement in placements:
            key = canonical(placement.order, maps)
            if key not in found:
                fresh.setdefault(key, placement)
        if not fresh:
            return
        scores = scorer.scores([p.order for p in fresh.values()])
        for (key, placement), score in zip(fresh.items(), scores, strict=True):
            found[key] = ScoredPlacement(placement, float(score), source)

    consider(extra, Source.LIBRARY)
    consider(structured_placements(mesh_shape, topology, axis_names), Source.STRUCTURED)
    starts = sorted(found.values(), key=lambda r: r.exposed_s)[:top]
    rng = np.random.default_rng(seed)
    chains = [start for start in starts for _ in range(LOCAL_SEARCH_CHAINS)]
    per_chain = max(0, (budget - scorer.evaluations) // max(1, len(chains)))
    if chains:
        ends = anneal(scorer, np.array([start.placement.order for start in chains]),
                      per_chain, rng)
        consider([Placement(tuple(end), f"local search from: {start.placement.description}")
                  for start, end in zip(chains, ends, strict=True)], Source.LOCAL_SEARCH)

    def busiest(placement: Placement) -> str:
        return str(estimate(scorer.program, topology, placement, chip=scorer.chip,
                            options=scorer.options).busiest_link or "-")

    return ScoredPlacements(sorted(found.values(), key=lambda r: r.exposed_s), busiest=busiest)


SWAPS_PER_STEP = 8
"""Swaps each annealing chain scores per step (see :func:`anneal`)."""


def anneal(scorer: PlacementScorer, starts: np.ndarray, evaluations: int,
           rng: np.random.Generator, proposals: int = SWAPS_PER_STEP) -> np.ndarray:
    """Batched simulated annealing over pairwise swaps, one chain per row of ``starts``, all
    chains stepped together; returns each chain's best order (``evaluations`` per chain).

    Each step scores ``proposals`` random swaps of every chain's current order in one batch
    (:meth:`PlacementScorer.swap_scores`: only the groups a swap touches are re-priced) and
    moves each chain to the best of its swaps when it is no worse, or with the Metropolis
    probability at a temperature that falls linearly from 5 % of the chain's start score to
    zero. Swaps of 8 per chain and step leave enough steps (see :data:`LOCAL_SEARCH_CHAINS`
    for the batch size the scorer wants).
    """
    current = np.array(starts, dtype=np.int64)
    chains, n = current.shape
    current_s = scorer.scores(current)
    best, best_s = current.copy(), current_s.copy()
    steps = evaluations // proposals
    if n < 2 or steps <= 0:
        return best
    start_temperature = 0.05 * current_s
    rows = np.arange(chains)
    for step in range(steps):
        i = rng.integers(0, n, size=(chains, proposals))
        j = (i + rng.integers(1, n, size=(chains, proposals))) % n  # never i
        scores = scorer.swap_scores(np.repeat(current, proposals, axis=0), i.ravel(),
                                    j.ravel()).reshape(chains, proposals)
        pick = scores.argmin(axis=1)
        delta = scores[rows, pick] - current_s
        temperature = start_temperature * (1 - step / steps) + 1e-30
        uphill = np.exp(-np.maximum(delta, 0.0) / temperature)
        move = np.nonzero((delta <= 0) | (rng.random(chains) < uphill))[0]
        a, b = i[move, pick[move]], j[move, pick[move]]
        current[move, a], current[move, b] = current[move, b], current[move, a]
        current_s[move] = scores[move, pick[move]]
        better = current_s < best_s
        best[better], best_s[better] = current[better], current_s[better]
    return best


# ----------------------------------------------------------------------------- ranking


@dataclass(frozen=True)
class RankedPlacement:
    """One entry of a ranking: a candidate on a placement, priced in full."""

    candidate: Candidate
    """The logical sharding."""
    placement: Placement
    """Its device order on the slice."""
    predicted: Predicted
    """Compute, communication and the step, overlap read from the compiled schedule
    (:func:`aoizora_lab.cost.predict`)."""
    source: Source
    """Where the placement search found it."""
    flags: CompilerFlags = DEFAULT_FLAGS
    """The compiler flags the program was compiled with."""


class Ranking(Records[RankedPlacement]):
    """Candidates on placements, fastest predicted step first."""

    COLUMNS = ("candidate", "flags", "placement", "description", "source", "compute_s",
               "comm_s", "total_s")

    def ranked(self) -> Ranking:
        """The same entries, fastest first (ties keep their order)."""
        return Ranking(sorted(self, key=lambda r: r.predicted.total_s))

    def row(self, item: RankedPlacement) -> dict[str, Any]:
        return {"candidate": item.candidate.name, "flags": item.flags.label,
                "placement": item.placement,
                "description": item.placement.description, "source": item.source.value,
                **dataclasses.asdict(item.predicted)}


TOP_PLACEMENTS = 3
"""Placements per candidate (least exposed communication) that are priced in full and ranked."""


def rank_placements(program: CommProgram, candidate: Candidate, topology: Topology, *,
                    budget: int = 20_000, top: int = TOP_PLACEMENTS,
                    flags: CompilerFlags = DEFAULT_FLAGS,
                    options: ModelOptions | None = None) -> Ranking:
    """Search ``candidate``'s placements for its compiled ``program`` and price the ``top``
    ones that leave the least communication exposed, fastest first: the one way the planner
    and the benchmarks rank a compiled program's placements (``options``: the ICI model's)."""
    options = options or ModelOptions()

    def search() -> Ranking:
        found = search_placements(program, candidate.mesh_shape, topology, budget=budget,
                                  axis_names=candidate.axis_names,
                                  extra=library_orders(candidate.mesh_shape,
                                                       candidate.axis_names, topology),
                                  options=options)
        return Ranking(RankedPlacement(candidate, s.placement,
                                       predict(program, topology, s.placement,
                                               options=options), s.source, flags)
                       for s in found[:top]).ranked()

    # Deterministic (seeded search), so a warm plan reads it back: ~2 s per 14B program.
    return memoized("placement", _ranking_key(program, candidate, topology, budget, top, flags,
                                              options),
                    search, code=__name__)


def is_ranked(program: CommProgram, candidate: Candidate, topology: Topology, *,
              budget: int = 20_000, top: int = TOP_PLACEMENTS,
              flags: CompilerFlags = DEFAULT_FLAGS, options: ModelOptions | None = None
              ) -> bool:
    """Whether :func:`rank_placements` with these arguments reads a stored ranking."""
    return is_memoized("placement", _ranking_key(program, candidate, topology, budget, top,
                                                 flags, options or ModelOptions()),
                       code=__name__)


def _ranking_key(program: CommProgram, candidate: Candidate, topology: Topology, budget: int,
                 top: int, flags: CompilerFlags, options: ModelOptions) -> tuple[Any, ...]:
    return (fingerprint(program), candidate, topology.cache_key, device_spec(topology), budget,
            top, flags, options)
