"""Physical TPU slices: chip coordinates, wraparound, directed ICI links and routes.

A :class:`Topology` says where every device of a slice sits. Row *i* of ``coords`` is the
physical position of device *i*; a *placement* later maps logical device ids onto these rows.
Positions are chip coordinates ``(x, y)`` on v5e/v6e and ``(x, y, z)`` on v4/v5p/tpu7x; a name
such as ``"v5e:2x4"`` means 2 chips along x and 4 along y, exactly as libtpu reads it. A chip
may hold several devices: TPU7x (Ironwood) has two chiplets, each its own device
(``tpu7x:2x2x1`` is 4 chips, 8 devices), and deviceless v4 gives one device per TensorCore.

Wraparound follows the hardware rules (the scaling book; the ``wrap`` field of MaxText's
``accelerator_to_spec_map``):

- v5e / v6e: an axis has a wraparound link only when its length is 16, so ``v5e:4x4`` is a
  plain mesh, ``v5e:8x16`` wraps on the 16 axis and ``v5e:16x16`` on both;
- v4 / v5p / tpu7x: a slice whose three axes are all multiples of 4 (``4x4x4`` and larger) is
  a full 3D torus; the smaller ``2x2x1``, ``2x2x2``, ``2x2x4`` and ``2x4x4`` (and tpu7x's
  single-chip ``1x1x1``) have no wraparound.

Links are directed: every neighbour pair along an axis has one link per direction, and a
wrapped axis of length *n* adds the pair ``(n-1, 0)``. Link loads are arrays of shape
``[num_chips, ndim, 2]`` indexed by (source chip, axis, direction), direction 0 = towards
larger coordinates (+), 1 = towards smaller (-); chips are numbered row-major over ``shape``.
Traffic between two devices of one chip crosses no ICI link: :meth:`Topology.intra_chip_link`
names that path (the comm model prices it with ``ChipSpec.intra_chip_bandwidth``).

Routes are dimension-ordered: a transfer first moves along axis 0 until its x matches, then
along axis 1, then axis 2. On a wrapped axis it takes the shorter way round; **on a tie**
(exactly half the ring) :meth:`Topology.route` goes the + way, while
:meth:`Topology.route_loads` can split a tied transfer evenly over both ways, which is what a
traffic model that must stay mirror-symmetric wants. Example on ``v5e:16x16`` (both axes
wrap): from chip (0, 0) to chip (9, 3) the route goes 7 hops the - way along x (through the
wraparound link (0, 0) -> (15, 0)) and then 3 hops the + way along y: 10 hops.
"""

from __future__ import annotations

import enum
import functools
import hashlib
import itertools
import math
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

import numpy as np

from aoizora_lab.deviceless import deviceless_devices
from aoizora_lab.errors import AoizoraError, is_whole
from aoizora_lab.hardware import GENERATIONS, check_generation

Shape = tuple[int, ...]

PLUS, MINUS = 0, 1
"""Direction index of a link: towards larger (+) or smaller (-) coordinates."""

# Slice shapes each generation is offered in (Google Cloud TPU docs; libtpu's deviceless
# topologies; for tpu7x the shapes of xpk's system_characteristics and MaxText's
# accelerator_to_spec_map, which also give its wraparound: none below 4x4x4, full torus from it).
SLICE_SHAPES_2D: tuple[Shape, ...] = (
    (1, 1), (2, 2), (2, 4), (4, 4), (4, 8), (8, 8), (8, 16), (16, 16),
)
SMALL_SLICE_SHAPES_3D: tuple[Shape, ...] = ((2, 2, 1), (2, 2, 2), (2, 2, 4), (2, 4, 4))
SINGLE_CHIP_3D = {"tpu7x": (1, 1, 1)}  # tpu7x-standard-1t (xpk); libtpu has no deviceless one
MAX_CHIPS_3D = {"v4": 4096, "v5p": 8960, "tpu7x": 9216}  # full pod sizes (cloud docs)
TORUS_NDIM = {"v4": 3, "v5e": 2, "v5p": 3, "v6e": 2, "tpu7x": 3}
# libtpu's deviceless v4 gives one device per TensorCore; TPU7x has one device per chiplet
# (cloud docs: "two TPU devices" per chip; deviceless tpu7x:2x2x1 has 8 devices).
DEVICES_PER_CHIP = {"v4": 2, "tpu7x": 2}
_DEVICE_KINDS = {"TPU v4": "v4", "TPU v5 lite": "v5e", "TPU v5e": "v5e", "TPU v5": "v5p",
                 "TPU v5p": "v5p", "TPU v6 lite": "v6e", "TPU v6e": "v6e", "TPU7x": "tpu7x"}


class DeviceSource(enum.StrEnum):
    """Where a :class:`Topology`'s devices come from. A ``str``, so a compile job's JSON holds
    the plain word."""

    DEVICELESS = "libtpu deviceless"
    """libtpu's compile-only devices (``get_topology_desc``): real coordinates, no chips."""
    LIVE = "live"
    """The TPU devices of this process (a TPU VM)."""
    HOST = "host devices"
    """CPU host devices standing in for a slice (``--xla_force_host_platform_device_count``)."""
    SIMULATED = "simulated"
    """Coordinates only, no devices: nothing compiles for it."""


class Link(NamedTuple):
    """One directed ICI link between two neighbouring chips."""

    src: tuple[int, ...]
    """Chip coordinates the link leaves."""
    dst: tuple[int, ...]
    """Chip coordinates the link enters."""
    axis: int
    """Physical axis the link runs along."""
    direction: int
    """+1 towards larger coordinates, -1 towards smaller (across the wrap on a wraparound link);
    0 on the intra-chip path."""
    wraparound: bool
    """Whether this is the link that closes a wrapped axis."""

    @property
    def intra_chip(self) -> bool:
        """Whether this is the path between the devices of one chip (``src == dst``), whose
        ``axis`` is the slice's ``ndim`` (the cores axis of :meth:`Topology.device_grid`)."""
        return self.src == self.dst

    def __str__(self) -> str:
        if self.intra_chip:
            return f"{self.src} within chip"
        arrow = "->" if not self.wraparound else "~>"
        return f"{self.src}{arrow}{self.dst}"


def _deviceless_slice(name: str) -> Topology:
    """A pickled deviceless slice, rebuilt in the process that unpickles it."""
    return Topology.from_name(name, deviceless=True)


def default_wrap(generation: str, shape: Shape) -> tuple[bool, ...]:
    """Which axes of a ``generation`` slice of ``shape`` have wraparound links (module rules)."""
    generation = check_generation(generation)
    if TORUS_NDIM[generation] == 2:
        return tuple(n == 16 for n in shape)
    full_torus = len(shape) == 3 and all(n % 4 == 0 for n in shape)
    return (full_torus,) * len(shape)


def _small_shapes_3d(generation: str) -> tuple[Shape, ...]:
    single = SINGLE_CHIP_3D.get(generation)
    return SMALL_SLICE_SHAPES_3D if single is None else (single, *SMALL_SLICE_SHAPES_3D)


def offered_shapes_text(generation: str) -> str:
    """The slice shapes ``generation`` comes in, as text for error messages."""
    if TORUS_NDIM[generation] == 2:
        return ", ".join("x".join(map(str, s)) for s in SLICE_SHAPES_2D)
    small = ", ".join("x".join(map(str, s)) for s in _small_shapes_3d(generation))
    return (f"{small}, or AxBxC with every axis a multiple of 4 (4x4x4, 4x4x8, ...) up to "
            f"{MAX_CHIPS_3D[generation]} chips")


def is_offered_shape(generation: str, shape: Shape) -> bool:
    """Whether ``shape`` is a slice shape ``generation`` comes in."""
    if TORUS_NDIM[generation] == 2:
        return shape in SLICE_SHAPES_2D
    if shape in _small_shapes_3d(generation):
        return True
    return (len(shape) == 3 and all(n % 4 == 0 and n > 0 for n in shape)
            and math.prod(shape) <= MAX_CHIPS_3D[generation])


def check_shape(shape: Any, what: str = "Slice shape") -> Shape:
    """``shape`` as a tuple of positive ints, or an error quoting it: ``(2, 4)`` -> ``(2, 4)``;
    ``"2x4"``, ``4``, ``(2.5, 2)``, ``(0, 4)`` and ``()`` are refused."""
    try:
        dims = tuple(shape)
    except TypeError:
        dims = ()
    if isinstance(shape, str) or not dims or not all(is_whole(n) for n in dims):
        raise AoizoraError(
            f"{what} {shape!r} must be one or more positive whole chip counts, one per physical "
            "axis, e.g. (4, 4) or (2, 2, 4); for a slice name such as 'v5e:4x4' use "
            "Topology.from_name."
        )
    return tuple(int(n) for n in dims)


def parse_slice_name(name: str) -> tuple[str, Shape]:
    """``"v5e:4x4"`` -> ``("v5e", (4, 4))``, with an error naming the bad part."""
    match = re.fullmatch(r"\s*([A-Za-z0-9]+)\s*:\s*(\d+(?:x\d+)*)\s*", str(name))
    if not match:
        raise AoizoraError(
            f"Slice name {name!r} is not of the form GENERATION:SHAPE, e.g. 'v5e:4x4' or "
            f"'tpu7x:2x2x1'; generations are {list(GENERATIONS)}."
        )
    try:
        generation = check_generation(match.group(1))
    except AoizoraError as err:
        raise AoizoraError(f"Slice name {name!r}: {err}") from None
    shape = tuple(int(n) for n in match.group(2).split("x"))
    if not is_offered_shape(generation, shape):
        raise AoizoraError(
            f"{generation} slices do not come in shape {match.group(2)!r} (from {name!r}); "
            f"{generation} shapes are {offered_shapes_text(generation)}. For another shape use "
            "Topology.simulated(shape, generation=...)."
        )
    return generation, shape


@dataclass(frozen=True, eq=False)
class Topology:
    """A physical TPU slice: where each device sits and which links join the chips.

    Build one with :meth:`from_name`, :meth:`simulated` or :meth:`from_devices`; the
    constructor checks that ``coords`` fill every chip of ``shape`` with the same number of
    devices (one per chip, or one per TensorCore on deviceless v4).
    """

    generation: str
    """Chip generation (``"v5e"``...): picks the :class:`~aoizora_lab.ChipSpec`."""
    shape: Shape
    """Chips along each physical axis, e.g. ``(4, 4)`` or ``(2, 2, 4)``."""
    wrap: tuple[bool, ...]
    """Whether each axis has a wraparound link."""
    coords: np.ndarray
    """``int`` array ``[num_devices, ndim]``: row *i* is the chip position of device *i*."""
    devices: tuple[Any, ...] | None = None
    """Live or deviceless jax devices in the order of ``coords``, or ``None`` if simulated."""
    source: DeviceSource = DeviceSource.SIMULATED
    """Where its devices come from (a plain word is read as its :class:`DeviceSource`)."""
    note: str = ""
    """Why the slice is simulated, or other facts a reader should know."""

    def __post_init__(self) -> None:
        shape = check_shape(self.shape, "Topology shape")
        coords = np.array(self.coords, dtype=np.int64, copy=True)
        wrap = tuple(bool(w) for w in self.wrap)
        if len(wrap) != len(shape):
            raise AoizoraError(
                f"Topology wrap {self.wrap!r} needs one flag per axis of shape {shape}."
            )
        if coords.ndim != 2 or coords.shape[1] != len(shape):
            raise AoizoraError(
                f"Topology coords must be [num_devices, {len(shape)}], got {coords.shape}."
            )
        if (coords < 0).any() or (coords >= np.array(shape)).any():
            raise AoizoraError(f"Topology coords fall outside the slice shape {shape}.")
        per_chip = np.bincount(np.ravel_multi_index(coords.T, shape), minlength=math.prod(shape))
        if per_chip.min() != per_chip.max() or per_chip.min() == 0:
            raise AoizoraError(
                f"Topology coords must put the same number of devices on every chip of {shape}; "
                f"got between {per_chip.min()} and {per_chip.max()} per chip."
            )
        if self.devices is not None and len(self.devices) != len(coords):
            raise AoizoraError(
                f"Topology has {len(coords)} coordinate rows but {len(self.devices)} devices; "
                "pass one device per row."
            )
        coords.setflags(write=False)
        object.__setattr__(self, "shape", shape)
        object.__setattr__(self, "wrap", wrap)
        object.__setattr__(self, "coords", coords)
        object.__setattr__(self, "generation", check_generation(self.generation))
        try:
            object.__setattr__(self, "source", DeviceSource(self.source))
        except ValueError:
            raise AoizoraError(f"Topology source {self.source!r}: one of "
                               f"{[s.value for s in DeviceSource]}.") from None
        if self.devices is not None:
            object.__setattr__(self, "devices", tuple(self.devices))

    # ----------------------------------------------------------------- constructors

    @classmethod
    def from_name(cls, name: str, *, deviceless: bool | None = None) -> Topology:
        """The slice ``name`` (``"v5e:4x4"``), with libtpu's deviceless devices when possible.

        ``deviceless=None`` tries libtpu and falls back to a simulated slice with the same
        coordinates and a note saying why; ``True`` requires libtpu; ``False`` never loads it.
        """
        generation, shape = parse_slice_name(name)
        canonical = f"{generation}:{'x'.join(map(str, shape))}"
        if deviceless is not False:
            try:
                devices = deviceless_devices(canonical)
            except RuntimeError as err:
                if deviceless:
                    raise AoizoraError(
                        f"Deviceless TPU devices for {canonical!r} are not available: {err}. "
                        "Install jax[tpu] on x86-64 Linux, or pass deviceless=None/False to use "
                        "a simulated slice."
                    ) from err
                return cls.simulated(shape, generation=generation, note=(
                    f"simulated: libtpu gave no deviceless devices for {canonical} ({err})"))
            topo = cls.from_devices(devices, source=DeviceSource.DEVICELESS)
            if topo.shape != shape or topo.generation != generation:
                raise AoizoraError(
                    f"libtpu described {canonical!r} as {topo.name!r}; this is a bug in the "
                    "slice-name mapping, please report it."
                )
            return topo
        return cls.simulated(shape, generation=generation,
                             note="simulated: deviceless=False, libtpu not asked")

    @classmethod
    def simulated(
        cls,
        shape: Sequence[int],
        *,
        generation: str = "v5e",
        wrap: Sequence[bool] | None = None,
        devices: Sequence[Any] | None = None,
        devices_per_chip: int | None = None,
        note: str = "",
    ) -> Topology:
        """A slice of any ``shape`` and wrap pattern, for tests and what-if studies.

        Devices are numbered with axis 0 fastest (device 1 is chip (1, 0)), then cores on a
        chip. ``devices`` (e.g. CPU host devices) stand in for the chips in that order;
        ``wrap=None`` applies the generation's wraparound rule to ``shape``.
        """
        generation = check_generation(generation)
        shape = check_shape(shape, "Slice shape")
        per_chip = devices_per_chip or DEVICES_PER_CHIP.get(generation, 1)
        chips = np.array(list(itertools.product(*(range(n) for n in reversed(shape)))))
        chips = chips[:, ::-1]  # axis 0 fastest
        coords = np.repeat(chips, per_chip, axis=0)
        if devices is not None and len(devices) != len(coords):
            raise AoizoraError(
                f"A simulated {'x'.join(map(str, shape))} slice has {len(coords)} devices, but "
                f"{len(devices)} devices were passed; pass exactly {len(coords)} (for CPU host "
                f"devices set XLA_FLAGS=--xla_force_host_platform_device_count={len(coords)})."
            )
        wrap = default_wrap(generation, shape) if wrap is None else tuple(wrap)
        return cls(generation=generation, shape=shape, wrap=wrap, coords=coords,
                   devices=None if devices is None else tuple(devices),
                   source=DeviceSource.HOST if devices is not None else DeviceSource.SIMULATED,
                   note=note or "simulated slice: coordinates only, nothing compiles for it")

    @classmethod
    def from_devices(cls, devices: Iterable[Any], *,
                     source: DeviceSource | str = DeviceSource.LIVE) -> Topology:
        """The slice formed by TPU ``devices`` (``jax.devices()`` on a TPU VM), from ``.coords``."""
        devices = tuple(devices)
        if not devices or not all(hasattr(d, "coords") for d in devices):
            raise AoizoraError(
                "Topology.from_devices needs TPU devices with .coords (e.g. jax.devices() on a "
                f"TPU VM); got {devices[:2]!r}. For CPU host devices use "
                "Topology.simulated(shape, devices=jax.devices())."
            )
        kind = devices[0].device_kind
        if kind not in _DEVICE_KINDS:
            raise AoizoraError(
                f"Unknown TPU device kind {kind!r}; known kinds are {sorted(_DEVICE_KINDS)}."
            )
        generation = _DEVICE_KINDS[kind]
        ndim = TORUS_NDIM[generation]
        coords = np.array([tuple(d.coords)[:ndim] for d in devices], dtype=np.int64)
        coords -= coords.min(axis=0)  # a sub-slice may not start at the origin
        shape = tuple(int(n) for n in coords.max(axis=0) + 1)
        return cls(generation=generation, shape=shape, wrap=default_wrap(generation, shape),
                   coords=coords, devices=devices, source=source,
                   note="" if source != DeviceSource.LIVE else "live TPU devices")

    # ----------------------------------------------------------------- other processes

    @property
    def portable(self) -> bool:
        """Whether the slice pickles, so a worker process can have it: a deviceless one is
        rebuilt there by name (libtpu describes it again), a simulated one travels as is;
        live and CPU host devices belong to this process."""
        return self.source is DeviceSource.DEVICELESS or self.devices is None

    def __reduce_ex__(self, protocol: Any) -> Any:
        if self.source is DeviceSource.DEVICELESS:
            return (_deviceless_slice, (self.name,))
        # Through the constructor, so the checks run and the positions stay read-only.
        return (Topology, (self.generation, self.shape, self.wrap, self.coords, self.devices,
                           self.source, self.note))

    # ----------------------------------------------------------------- sizes and names

    @property
    def name(self) -> str:
        """``"v5e:4x4"``-style name of the slice."""
        return f"{self.generation}:{'x'.join(map(str, self.shape))}"

    @property
    def cache_key(self) -> tuple[Any, ...]:
        """What a result computed on this slice depends on: generation, shape, wrap and every
        device's position (two simulated slices of one name may differ in wrap)."""
        return (self.generation, self.shape, self.wrap,
                hashlib.sha256(self.coords.tobytes()).hexdigest()[:32])

    @property
    def ndim(self) -> int:
        """Number of physical axes."""
        return len(self.shape)

    @property
    def num_devices(self) -> int:
        """Number of devices (rows of ``coords``)."""
        return len(self.coords)

    @property
    def num_chips(self) -> int:
        """Number of chips (positions in ``shape``)."""
        return math.prod(self.shape)

    @property
    def devices_per_chip(self) -> int:
        """Devices on each chip: 1, or 2 on tpu7x (one per chiplet) and deviceless v4 (one per
        TensorCore)."""
        return self.num_devices // self.num_chips

    @functools.cached_property
    def device_chip(self) -> np.ndarray:
        """``int`` array ``[num_devices]``: the row-major chip index of each device."""
        chips = np.ravel_multi_index(self.coords.T, self.shape)
        chips.setflags(write=False)
        return chips

    @functools.cached_property
    def chip_coords(self) -> np.ndarray:
        """``int`` array ``[num_chips, ndim]``: coordinates of each row-major chip index."""
        coords = np.stack(np.unravel_index(np.arange(self.num_chips), self.shape), axis=1)
        coords.setflags(write=False)
        return coords

    def device_grid(self) -> np.ndarray:
        """Device indices laid out physically: shape ``(*shape, devices_per_chip)``.

        ``device_grid().ravel()`` is the compact row-major placement of a logical mesh of the
        same shape: logical neighbours are physical neighbours.
        """
        order = np.lexsort((np.arange(self.num_devices), self.device_chip))
        return order.reshape(*self.shape, self.devices_per_chip)

    # ----------------------------------------------------------------- links

    @functools.cached_property
    def link_target(self) -> np.ndarray:
        """``int`` array ``[num_chips, ndim, 2]``: chip each link enters, ``-1`` where none."""
        target = np.full((self.num_chips, self.ndim, 2), -1, dtype=np.int64)
        for axis, (n, wraps) in enumerate(zip(self.shape, self.wrap, strict=True)):
            for direction, step in ((PLUS, 1), (MINUS, -1)):
                moved = self.chip_coords.copy()
                moved[:, axis] += step
                if wraps and n > 1:
                    moved[:, axis] %= n
                inside = (moved[:, axis] >= 0) & (moved[:, axis] < n) & (n > 1)
                target[inside, axis, direction] = np.ravel_multi_index(
                    moved[inside].T, self.shape)
        target.setflags(write=False)
        return target

    @property
    def link_exists(self) -> np.ndarray:
        """``bool`` array ``[num_chips, ndim, 2]``: which (chip, axis, direction) links exist."""
        return self.link_target >= 0

    @property
    def num_links(self) -> int:
        """Number of directed ICI links."""
        return int(self.link_exists.sum())

    def link(self, chip: int, axis: int, direction: int) -> Link:
        """The :class:`Link` leaving row-major chip ``chip`` along ``axis`` (PLUS or MINUS)."""
        target = int(self.link_target[chip, axis, direction])
        if target < 0:
            raise AoizoraError(
                f"There is no {'+-'[direction]} link along axis {axis} from chip "
                f"{tuple(self.chip_coords[chip])} of {self.name} (wrap={self.wrap})."
            )
        src = tuple(int(c) for c in self.chip_coords[chip])
        dst = tuple(int(c) for c in self.chip_coords[target])
        step = 1 if direction == PLUS else -1
        return Link(src, dst, axis, step, dst[axis] != src[axis] + step)

    def links(self) -> list[Link]:
        """Every directed link, ordered by (source chip, axis, direction)."""
        return [self.link(*map(int, idx)) for idx in np.argwhere(self.link_exists)]

    def intra_chip_link(self, chip: int) -> Link:
        """The path between the devices of row-major chip ``chip``: no ICI link, the chip's own
        (die-to-die on tpu7x). Only slices with several devices per chip have one."""
        if self.devices_per_chip == 1 or not 0 <= chip < self.num_chips:
            raise AoizoraError(
                f"{self.name} has no intra-chip path at chip {chip!r}: it needs a chip index "
                f"0..{self.num_chips - 1} on a slice with several devices per chip "
                f"(this one has {self.devices_per_chip})."
            )
        coords = tuple(int(c) for c in self.chip_coords[chip])
        return Link(coords, coords, self.ndim, 0, False)

    # ----------------------------------------------------------------- distances and routes

    def _axis_moves(self, delta: np.ndarray, axis: int) -> tuple[np.ndarray, np.ndarray]:
        """Hops the + way and the - way for coordinate differences ``delta`` along ``axis``.

        On a wrapped axis both counts are returned (the caller picks the shorter); on a plain
        axis the way that does not exist gets a count that is never shorter.
        """
        n = self.shape[axis]
        if self.wrap[axis]:
            plus = delta % n
            return plus, (n - plus) % n
        return np.where(delta > 0, delta, n + 1), np.where(delta < 0, -delta, n + 1)

    def chip_distances(self, chips_a: np.ndarray, chips_b: np.ndarray) -> np.ndarray:
        """Shortest hop counts ``[len(a), len(b)]`` between row-major chip indices."""
        a = self.chip_coords[np.asarray(chips_a, dtype=np.int64)]
        b = self.chip_coords[np.asarray(chips_b, dtype=np.int64)]
        return self.offset_hops(b[None, :, :] - a[:, None, :])

    def offset_hops(self, offsets: np.ndarray) -> np.ndarray:
        """Shortest hop counts of coordinate offsets ``[..., ndim]`` (target minus source):
        a distance depends on nothing else."""
        offsets = np.asarray(offsets, dtype=np.int64)
        total = np.zeros(offsets.shape[:-1], dtype=np.int64)
        for axis in range(self.ndim):
            delta = offsets[..., axis]
            plus, minus = self._axis_moves(delta, axis)
            total += np.where(delta == 0, 0, np.minimum(plus, minus))
        return total

    def hop_distances(self) -> np.ndarray:
        """``int`` array ``[num_devices, num_devices]`` of shortest hop counts between devices."""
        return self.chip_distances(self.device_chip, self.device_chip)

    def hop_distance(self, a: int, b: int) -> int:
        """Shortest hop count between devices ``a`` and ``b`` (0 on the same chip)."""
        return len(self.route(a, b))

    def route(self, a: int, b: int) -> list[Link]:
        """The dimension-ordered route from device ``a`` to device ``b`` (ties go + way)."""
        self._check_device(a)
        self._check_device(b)
        here = list(self.coords[a])
        hops: list[Link] = []
        for axis in range(self.ndim):
            delta = np.array(self.coords[b, axis] - here[axis])
            plus, minus = (int(v) for v in self._axis_moves(delta, axis))
            if delta == 0:
                continue
            direction, count = (PLUS, plus) if plus <= minus else (MINUS, minus)
            for _ in range(count):
                chip = int(np.ravel_multi_index(tuple(here), self.shape))
                hops.append(self.link(chip, axis, direction))
                here[axis] = hops[-1].dst[axis]
        return hops

    def route_loads(
        self,
        src_chips: np.ndarray,
        dst_chips: np.ndarray,
        weights: np.ndarray,
        *,
        axis_orders: Sequence[Sequence[int]] | None = None,
        split_ties: bool = True,
    ) -> np.ndarray:
        """Bytes each directed link carries when chip ``src[i]`` sends ``weights[i]`` to ``dst[i]``.

        Vectorised over transfers. Each transfer follows a dimension-ordered route; with several
        ``axis_orders`` its bytes are split evenly over those orders (default: axis 0, 1, 2 only),
        and with ``split_ties`` a tied wrapped axis sends half each way (else all the + way, as
        :meth:`route`). Returns ``float`` array ``[num_chips, ndim, 2]``. Conservation holds:
        ``loads.sum() == sum(weights[i] * hops(src[i], dst[i]))``.
        """
        _, slots, amounts = self.route_entries(src_chips, dst_chips, weights,
                                               axis_orders=axis_orders, split_ties=split_ties)
        return np.bincount(slots, amounts, minlength=self.num_chips * self.ndim * 2).reshape(
            self.num_chips, self.ndim, 2)

    def route_entries(
        self,
        src_chips: np.ndarray,
        dst_chips: np.ndarray,
        weights: np.ndarray,
        *,
        axis_orders: Sequence[Sequence[int]] | None = None,
        split_ties: bool = True,
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """The routes of :meth:`route_loads` unsummed: ``(transfer, link slot, bytes)`` triples.

        A link slot indexes ``route_loads(...).ravel()``: ``(chip * ndim + axis) * 2 +
        direction``. Example: on a 4-chip line, chip 0 -> chip 2 with weight 1 gives
        ``([0, 0], [0, 2], [1.0, 1.0])``: two + hops, from chip 0 and from chip 1.
        """
        src = np.asarray(src_chips, dtype=np.int64).ravel()
        dst = np.asarray(dst_chips, dtype=np.int64).ravel()
        weights = np.broadcast_to(np.asarray(weights, dtype=np.float64), src.shape)
        orders = [tuple(o) for o in (axis_orders or [tuple(range(self.ndim))])]
        transfers, slots, amounts = [], [], []
        target = self.chip_coords[dst]
        index = np.arange(len(src))
        for order in orders:
            here = self.chip_coords[src].copy()
            share = weights / len(orders)
            for axis in order:
                n = self.shape[axis]
                delta = target[:, axis] - here[:, axis]
                plus, minus = self._axis_moves(delta, axis)
                moving = delta != 0
                tie = moving & (plus == minus)
                plus_share = np.where(plus < minus, 1.0, 0.0)
                plus_share = np.where(tie, 0.5 if split_ties else 1.0, plus_share)
                for direction, count, frac in ((PLUS, plus, plus_share),
                                               (MINUS, minus, 1.0 - plus_share)):
                    step = 1 if direction == PLUS else -1
                    active = moving & (frac > 0)
                    count = np.where(active, count, 0)
                    for k in range(int(count.max(initial=0))):
                        sel = count > k
                        pos = here[sel].copy()
                        pos[:, axis] = (pos[:, axis] + step * k) % n
                        chip = np.ravel_multi_index(pos.T, self.shape)
                        transfers.append(index[sel])
                        slots.append((chip * self.ndim + axis) * 2 + direction)
                        amounts.append(share[sel] * frac[sel])
                here[:, axis] = target[:, axis]
        if not slots:
            empty = np.zeros(0, dtype=np.int64)
            return empty, empty, np.zeros(0)
        return np.concatenate(transfers), np.concatenate(slots), np.concatenate(amounts)

    def _check_device(self, index: int) -> None:
        if not 0 <= int(index) < self.num_devices:
            raise AoizoraError(
                f"Device index {index!r} is out of range for {self.name}, which has "
                f"{self.num_devices} devices (0..{self.num_devices - 1})."
            )

    # ----------------------------------------------------------------- display

    def describe(self) -> str:
        """A few lines for people: size, wraparound, where the devices came from, the grid."""
        wraps = ", ".join(
            f"axis {'xyz'[a]}: {n}{' wraps' if w else ''}"
            for a, (n, w) in enumerate(zip(self.shape, self.wrap, strict=True)))
        lines = [
            f"{self.name}: {self.num_chips} chips, {self.num_devices} devices, "
            f"{self.num_links} directed ICI links ({wraps})",
            f"devices: {self.source}" + (f" — {self.note}" if self.note else ""),
            "device index at each chip (x across, y down"
            + (", one block per z)" if self.ndim == 3 else ")") + ":",
        ]
        grid = self.device_grid()
        planes = [grid] if self.ndim == 2 else [grid[:, :, z] for z in range(self.shape[2])]
        for z, plane in enumerate(planes):
            if self.ndim == 3:
                lines.append(f"  z={z}")
            for y in range(self.shape[1]):
                cells = [",".join(map(str, plane[x, y])) for x in range(self.shape[0])]
                lines.append("  " + " ".join(f"{c:>5}" for c in cells))
        return "\n".join(lines)
