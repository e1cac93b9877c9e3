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
2. routing is linear too, so the link loads of any transfers are ``traffic @ R`` with
   ``traffic`` the bytes per (source chip, target chip) pair and ``R`` the model's
   :func:`~aoizora_lab.comm_model.route_matrix`: a batch of all-to-alls, permutes and
   irregular rings (whose flows follow the members' order) becomes one bincount and one
   matrix product;
3. a *regular* group (a line, a block) runs per-axis physical rings whatever its members'
   order, so its per-phase loads are cached per chip set; which groups are regular is itself
   decided for the whole batch at once (distinct positions per axis multiply to the size).

On ``v5e:4x4`` with a Wan 14B program (11 structures) this scores about 20-50 thousand
placements per second on one core (``benchmarks/placement_throughput.py``).

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

import dataclasses
import enum
import itertools
import math
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from aoizora_lab.candidates import Candidate
from aoizora_lab.comm_model import (
    Collective,
    ModelOptions,
    all_gather_phases,
    direct_flows,
    estimate,
    gathered_shard,
    group_layout,
    intra_chip_slots,
    ring_flows,
    route_matrix,
)
from aoizora_lab.compile import DEFAULT_FLAGS, CompilerFlags
from aoizora_lab.cost import Predicted, group_exposed, hbm_seconds, overlap_groups, predict
from aoizora_lab.errors import AoizoraError
from aoizora_lab.hardware import ChipSpec, device_spec
from aoizora_lab.hlo import CommProgram
from aoizora_lab.records import Records
from aoizora_lab.topology import Topology


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


def _order_of(devices: Any, topology: Topology, how: str) -> Placement:
    position = {id(d): i for i, d in enumerate(_devices_of(topology))}
    return Placement(tuple(position[id(d)] for d in np.asarray(devices).ravel()), how)


def _devices_of(topology: Topology) -> list[Any]:
    if topology.devices is None:
        raise AoizoraError(
            f"{topology.name} is simulated and has no devices; use Topology.from_name with "
            "libtpu, live TPU devices, or CPU host devices."
        )
    return list(topology.devices)


def make_mesh_order(mesh_shape: Sequence[int], axis_names: Sequence[str],
                    topology: Topology) -> Placement:
    """Where ``jax.make_mesh`` puts a mesh of ``mesh_shape`` (raises where it refuses)."""
    import jax

    mesh = jax.make_mesh(tuple(mesh_shape), tuple(axis_names), devices=_devices_of(topology))
    return _order_of(mesh.devices, topology, "jax.make_mesh")


def create_device_mesh_order(mesh_shape: Sequence[int], topology: Topology, *,
                             allow_split: bool | None = None) -> Placement:
    """Where ``mesh_utils.create_device_mesh`` puts a mesh of ``mesh_shape``.

    ``allow_split`` is its ``allow_split_physical_axes``; ``None`` (default) tries ``False``
    (the library's default) and retries with ``True`` where that refuses the shape. A refusal
    with ``False`` or ``True`` raises the library's error."""
    from jax.experimental import mesh_utils

    devices = _devices_of(topology)
    if allow_split is None:
        try:
            return create_device_mesh_order(mesh_shape, topology, allow_split=False)
        except (ValueError, NotImplementedError, AssertionError):
            return create_device_mesh_order(mesh_shape, topology, allow_split=True)
    ordered = mesh_utils.create_device_mesh(tuple(mesh_shape), devices,
                                            allow_split_physical_axes=allow_split)
    how = ("mesh_utils.create_device_mesh(allow_split_physical_axes=True)" if allow_split
           else "mesh_utils.create_device_mesh")
    return _order_of(ordered, topology, how)


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
        except (NotImplementedError, ValueError, AssertionError):
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
    ``folded`` for a logical axis on one factor of 4 or more (0, 2, 4, ..., 5, 3, 1: every
    ring hop, the closing one included, is at most two links on a line without wraparound).

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
            elif stop - start == 1 and array.shape[start] >= 4:
                n = array.shape[start]
                fold = np.concatenate([np.arange(0, n, 2), np.arange(n - 1 - n % 2, 0, -2)])
                grown.append((np.take(array, fold, axis=start), [*styles, "folded"]))
        variants = grown
    return variants


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
        self._hbm_s = np.array([hbm_seconds(c, self.chip) for c in items])
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
        # Dense routes and traffic are faster while they are small (16 chips: 256 x 64).
        self._dense = routes.shape[0] * routes.shape[1] <= 1 << 22
        self._routes = routes.toarray() if self._dense else routes
        # A chip set as one integer (bit per chip) when every chip hosts one device.
        self._bitmask = topology.num_chips <= 63 and topology.devices_per_chip == 1
        chips = np.arange(topology.num_chips)
        self._distances = topology.chip_distances(chips, chips)
        self._chip_of = topology.device_chip
        self._regular_phases: dict[bytes, np.ndarray | None] = {}
        self.evaluations = 0
        self.chunk = 256

    @property
    def group_layouts_modelled(self) -> int:
        """Distinct group chip sets whose regularity (and phases) the model has worked out."""
        return len(self._regular_phases)

    def scores(self, orders: Iterable[Sequence[int]] | np.ndarray) -> np.ndarray:
        """Predicted exposed communication seconds of the program on each order (rows of a
        batch): every overlap group priced as :func:`aoizora_lab.cost.predict` prices it, so
        adding the (placement-independent) compute gives the predicted step."""
        batch = np.atleast_2d(np.asarray(orders, dtype=np.int64))
        if len(batch) > self.chunk:  # chunks keep the traffic matrices in cache
            return np.concatenate([self.scores(batch[i:i + self.chunk])
                                   for i in range(0, len(batch), self.chunk)])
        self.evaluations += len(batch)
        per_byte = 1.0 / (self.chip.ici_link_bandwidth * self.chip.ici_efficiency)
        # One byte of each distinct (kind, groups): busiest-link time summed over phases,
        # the loads summed over phases (for groups in flight together) and the latency.
        unit_time, unit_loads, latency = [], [], []
        for kind, groups in self.structures:
            chips = self._chip_of[batch[:, groups]]  # [B, G, S]
            loads = self._unit_phase_loads(kind, chips)  # [B, phases, links] for one byte
            hops = self._distances[chips[..., :, None], chips[..., None, :]].reshape(
                len(batch), -1).max(axis=1)
            if kind == "all-reduce":
                hops = 2 * hops
            unit_time.append(loads.max(axis=2, initial=0.0).sum(axis=1) * per_byte)
            unit_loads.append(loads)
            latency.append(hops * self.chip.ici_hop_latency)
        alone = [np.maximum(unit_time[s] * c.bytes + latency[s], self._hbm_s[i])
                 for i, (c, s) in enumerate(zip(self.program, self._structure_of,
                                                strict=True))]
        totals = np.zeros(len(batch))
        for group in self.groups:
            member_s = np.stack([alone[i] for i in group.members])
            joint = member_s.max(axis=0)
            if len(group.members) > 1:
                summed = sum(unit_loads[self._structure_of[i]].sum(axis=1)
                             * self.program[i].bytes for i in group.members)
                joint = summed.max(axis=1, initial=0.0) * per_byte + np.max(
                    [latency[self._structure_of[i]] for i in group.members], axis=0)
            totals += group_exposed(group, member_s, joint) * group.runs
        return totals

    def score(self, order: Sequence[int] | np.ndarray) -> float:
        """Predicted exposed communication seconds of the program on ``order``."""
        return float(self.scores([order])[0])

    def _link_loads(self, flows: tuple[np.ndarray, np.ndarray, np.ndarray],
                    rows: np.ndarray, num_rows: int) -> np.ndarray:
        """Link loads ``[num_rows, links]`` of ``flows``, flow *i* counted in row ``rows[i]``."""
        from scipy import sparse

        src, dst, size = flows
        chips = self.topology.num_chips
        if self._dense:
            traffic = np.bincount(rows * chips * chips + src * chips + dst, size,
                                  minlength=num_rows * chips * chips)
            return traffic.reshape(num_rows, chips * chips) @ self._routes
        traffic = sparse.csr_matrix((size, (rows, src * chips + dst)),
                                    shape=(num_rows, chips * chips))
        return (traffic @ self._routes).toarray()

    def _unit_phase_loads(self, kind: str, chips: np.ndarray) -> np.ndarray:
        """Per-phase link loads ``[B, phases, links]`` of one byte of ``kind`` on ``chips``.

        The groups of a collective run their phases together: phase *k* adds every group's
        *k*-th phase, exactly as :func:`~aoizora_lab.estimate` merges them.
        """
        batch, num_groups, members = chips.shape
        links = self._routes.shape[1]
        if kind in ("collective-permute", "all-to-all"):
            flows = direct_flows(kind, chips, 1.0)
            rows = np.repeat(np.arange(batch), len(flows[0]) // batch)
            return self._link_loads(flows, rows, batch)[:, None, :]
        repeats = 2 if kind == "all-reduce" else 1
        shard = gathered_shard(kind, 1.0, members)
        # Regular groups: phases depend only on the chip set; looked up per distinct set.
        tables, compact = self._regular_sets(chips.reshape(-1, members))
        regular = (compact >= 0).reshape(batch, num_groups)
        phases = max([len(e) * repeats for e in tables] + [0])
        if not regular.all():
            phases = max(phases, repeats)
        loads = np.zeros((batch, phases, links))
        if regular.any() and phases:
            table = np.zeros((len(tables), phases, links))
            for index, entry in enumerate(tables):
                if len(entry):
                    table[index, :len(entry) * repeats] = np.concatenate([entry] * repeats)
            rows = np.repeat(np.arange(batch), num_groups)
            counts = np.bincount(rows[compact >= 0] * len(tables) + compact[compact >= 0],
                                 minlength=batch * len(tables)).reshape(batch, len(tables))
            loads += (counts @ table.reshape(len(tables), -1)).reshape(
                batch, phases, links) * shard
        if not regular.all():
            # Irregular groups: one ring in member order, whose cost depends on that order.
            src, dst, size = ring_flows(chips.reshape(-1, members), shard)
            keep = np.repeat(~regular.ravel(), 2 * members)
            rows = np.repeat(np.arange(batch), num_groups * 2 * members)[keep]
            ring = self._link_loads((src[keep], dst[keep], size[keep]), rows, batch)
            loads[:, :repeats] += ring[:, None, :]
        return loads

    def _regular_sets(self, groups: np.ndarray) -> tuple[list[np.ndarray], np.ndarray]:
        """Unit phase loads of the distinct regular chip sets among ``groups`` ``[N, members]``
        and each group's index into them (-1: irregular)."""
        if self._bitmask:
            # One device per chip: regular <=> the chips are every combination of their
            # per-axis positions, so distinct positions multiply to the group size.
            coords = np.sort(self.topology.chip_coords[groups], axis=1)
            distinct = 1 + (np.diff(coords, axis=1) != 0).sum(axis=1)
            regular = distinct.prod(axis=1) == groups.shape[1]
            masks = np.bitwise_or.reduce(
                np.left_shift(np.uint64(1), groups[regular].astype(np.uint64)), axis=1)
            _, first, inverse = np.unique(masks, return_index=True, return_inverse=True)
            rows = np.sort(groups[regular][first], axis=1)
            compact = np.full(len(groups), -1)
            compact[regular] = inverse.ravel()
            return [self._regular_group_phases(row) for row in rows], compact
        sets, inverse = np.unique(np.sort(groups, axis=1), axis=0, return_inverse=True)
        entries = [self._regular_group_phases(row) for row in sets]
        is_regular = np.array([e is not None for e in entries], dtype=bool)
        compact = np.where(is_regular, np.cumsum(is_regular) - 1, -1)[inverse.ravel()]
        return [e for e in entries if e is not None], compact

    def _regular_group_phases(self, sorted_chips: np.ndarray) -> np.ndarray | None:
        """Per-phase unit loads ``[phases, links]`` of a regular group's all-gather, or
        ``None`` for an irregular group; cached per chip set."""
        key = sorted_chips.tobytes()
        if key not in self._regular_phases:
            entry = None
            if group_layout(sorted_chips, self.topology)[3]:
                phases = all_gather_phases(sorted_chips, 1.0, self.topology, self.options)
                entry = np.stack([self._link_loads(flows, np.zeros(len(flows[0]), dtype=int), 1)[0]
                                  for flows in phases]) if phases else np.zeros((0, 0))
            self._regular_phases[key] = entry
        return self._regular_phases[key]


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


def search_placements(program: Any, mesh_shape: Sequence[int], topology: Topology, *,
                      budget: int = 20_000, top: int = 5, seed: int = 0,
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
    per_start = max(0, (budget - scorer.evaluations) // max(1, len(starts)))
    consider([Placement(tuple(_anneal(scorer, np.array(start.placement.order), per_start,
                                      rng)),
                        f"local search from: {start.placement.description}")
              for start in starts], Source.LOCAL_SEARCH)

    def busiest(placement: Placement) -> str:
        return str(estimate(scorer.program, topology, placement, chip=scorer.chip,
                            options=scorer.options).busiest_link or "-")

    return ScoredPlacements(sorted(found.values(), key=lambda r: r.exposed_s), busiest=busiest)


def _anneal(scorer: PlacementScorer, order: np.ndarray, evaluations: int,
            rng: np.random.Generator, proposals: int = 8) -> np.ndarray:
    """Batched simulated annealing over pairwise swaps; returns the best order seen.

    Each step scores ``proposals`` random swaps of the current order in one batch and moves to
    the best of them when it is no worse, or with the Metropolis probability at a temperature
    that falls linearly from 5 % of the start score to zero. Batches of 8 keep most of the
    batch speed-up and enough steps: on 14B@720p ``cfg2-uly8-fsdp`` (v5e:4x4, 4,000
    evaluations per start) 1 and 8 proposals reach 1.162 s of communication, 32 stall at 1.251.
    """
    current, current_s = order.copy(), scorer.score(order)
    best, best_s = current.copy(), current_s
    n = len(order)
    steps = evaluations // proposals
    if n < 2 or steps <= 0:
        return best
    start_temperature = 0.05 * current_s
    rows = np.arange(proposals)
    for step in range(steps):
        i = rng.integers(0, n, size=proposals)
        j = (i + rng.integers(1, n, size=proposals)) % n  # never i
        trials = np.repeat(current[None], proposals, axis=0)
        trials[rows, i], trials[rows, j] = current[j], current[i]
        scores = scorer.scores(trials)
        pick = int(np.argmin(scores))
        delta = scores[pick] - current_s
        temperature = start_temperature * (1 - step / steps) + 1e-30
        if delta <= 0 or rng.random() < math.exp(-delta / temperature):
            current, current_s = trials[pick], scores[pick]
            if current_s < best_s:
                best, best_s = current.copy(), current_s
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
                    flags: CompilerFlags = DEFAULT_FLAGS) -> Ranking:
    """Search ``candidate``'s placements for its compiled ``program`` and price the ``top``
    ones that leave the least communication exposed, fastest first: the one way the planner
    and the benchmarks rank a compiled program's placements."""
    found = search_placements(program, candidate.mesh_shape, topology, budget=budget,
                              axis_names=candidate.axis_names,
                              extra=library_orders(candidate.mesh_shape, candidate.axis_names,
                                                   topology))
    return Ranking(RankedPlacement(candidate, s.placement,
                                   predict(program, topology, s.placement), s.source, flags)
                   for s in found[:top]).ranked()
