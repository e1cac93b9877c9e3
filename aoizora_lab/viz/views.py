"""Views of a large slice for the link heatmaps: blocks of chips, and a sub-block.

At 256 chips a heatmap of every directed link draws 1,024 lanes and 256 labels in a few
hundred pixels. Two views keep it readable, each itself drawn as a small slice:

- :func:`coarsen` makes each block of ``block`` chips per axis one cell. The link from a cell
  to its neighbour carries the *busiest* of the parallel links between the two blocks (a
  collective's time is set by its busiest link, not by the average), and each cell's hover
  says the busiest link inside it. Example: ``v5e:16x16`` in blocks of 4 is a 4x4 view with
  its wraparound kept; the +x link of cell (0, 0) is the busiest of the four links from chips
  (3, 0..3) to chips (4, 0..3).
- :func:`region_view` keeps the chips from ``start`` to ``stop`` on each axis with every link
  between them, labelled as on the whole slice; wraparound only where the region spans its
  whole axis (links leaving the region are not drawn).

:func:`auto_block` is the default of :func:`~aoizora_lab.viz.torus_heatmap`: whole slices
above :data:`MAX_DETAILED_CHIPS` chips are drawn in blocks.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from aoizora_lab.errors import AoizoraError
from aoizora_lab.topology import MINUS, PLUS, Topology
from aoizora_lab.viz.units import format_bytes

MAX_DETAILED_CHIPS = 64
"""Slices up to this many chips are drawn link by link; larger ones in blocks."""


@dataclass(frozen=True)
class SliceView:
    """What a heatmap draws: a slice (chips or cells), its link bytes and its labels."""

    topology: Topology
    """The view as a slice: a cell per block, or the chips of a region."""
    link_bytes: np.ndarray
    """``[cells, ndim, 2]`` bytes per directed link of the view."""
    labels: tuple[str, ...]
    """Text on each cell (row-major)."""
    hover: tuple[str, ...]
    """Hover text of each cell."""
    note: str
    """What the view shows, for the figure's subtitle ("" for the whole slice)."""
    chips: tuple[int, ...] = ()
    """The original row-major chip of each cell of a region view (empty for blocks)."""
    label_kind: str = "labels: device index"
    """What the labels are, for the figure's legend."""


def auto_block(topology: Topology) -> int:
    """The smallest block that tiles the slice (:func:`coarsen`) and leaves at most
    :data:`MAX_DETAILED_CHIPS` cells (1: the slice is drawn link by link). Examples:
    ``v5e:16x16`` -> 2 (an 8x8 view); ``v5p:12x24x24`` -> 4 (3x6x6: 8 would not tile 12)."""
    return next((b for b in _tiling_blocks(topology.shape)
                 if _cells(topology.shape, b) <= MAX_DETAILED_CHIPS), max(topology.shape))


def coarsen(topology: Topology, link_bytes: np.ndarray, block: int) -> SliceView:
    """``topology`` in blocks of ``block`` chips per axis (fewer on an axis shorter than
    ``block``), each link the busiest of the links it stands for (see module)."""
    loads = np.asarray(link_bytes, dtype=np.float64)
    if block not in _tiling_blocks(topology.shape):
        raise AoizoraError(
            f"block={block!r} does not tile {topology.name} (shape {topology.shape}); pass a "
            "positive block that divides every axis longer than it: one of "
            f"{list(_tiling_blocks(topology.shape))}.")
    sizes = [min(block, n) for n in topology.shape]
    view_shape = tuple(n // b for n, b in zip(topology.shape, sizes, strict=True))
    wrap = tuple(bool(w) and v > 1 for w, v in zip(topology.wrap, view_shape, strict=True))
    view = Topology.simulated(view_shape, generation=topology.generation, wrap=wrap,
                              devices_per_chip=1)
    coords = topology.chip_coords
    # Row-major cells, last axis fastest (as Topology.chip_coords).
    strides = np.array([math.prod(view_shape[a + 1:]) for a in range(topology.ndim)])
    cell = ((coords // np.array(sizes)) * strides).sum(axis=1)
    view_loads = np.zeros((view.num_chips, topology.ndim, 2))
    inside = np.zeros(view.num_chips)
    for axis, (b, cells) in enumerate(zip(sizes, view_shape, strict=True)):
        position = coords[:, axis] % b
        for direction, edge in ((PLUS, b - 1), (MINUS, 0)):
            crossing = (position == edge) & (cells > 1)
            np.maximum.at(view_loads[:, axis, direction], cell[crossing],
                          loads[crossing, axis, direction])
            np.maximum.at(inside, cell[~crossing], loads[~crossing, axis, direction])
    labels, hover = [], []
    for index, origin in enumerate(view.chip_coords):
        lo = origin * np.array(sizes)
        span = ", ".join(f"{'xyz'[a]} {lo[a]}–{lo[a] + sizes[a] - 1}"
                         for a in range(topology.ndim))
        labels.append(",".join(map(str, lo.tolist())))
        hover.append(f"chips {span} ({math.prod(sizes)} chips)<br>"
                     f"busiest link inside: {format_bytes(inside[index])}")
    note = (f"blocks of {'x'.join(map(str, sizes))} chips: each link the busiest of those "
            "between two blocks (hover a block for the busiest inside)")
    return SliceView(view, view_loads, tuple(labels), tuple(hover), note,
                     label_kind="labels: a block's first chip")


def region_view(topology: Topology, link_bytes: np.ndarray, start: Sequence[int],
           stop: Sequence[int], labels: Sequence[str], hover: Sequence[str],
           label_kind: str = "labels: device index") -> SliceView:
    """The chips from ``start`` to ``stop`` (per axis, stop excluded) with the links between
    them; ``labels`` and ``hover`` are the whole slice's, per row-major chip."""
    start, stop = tuple(int(s) for s in start), tuple(int(s) for s in stop)
    shape = topology.shape
    if (len(start) != topology.ndim or len(stop) != topology.ndim
            or any(not 0 <= a < b <= n for a, b, n in zip(start, stop, shape, strict=True))):
        raise AoizoraError(
            f"region {start} to {stop} is not inside {topology.name} (shape {shape}); pass "
            f"one start and stop chip coordinate per axis with 0 <= start < stop <= size, "
            f"e.g. (0,) * {topology.ndim} to {tuple(min(n, 8) for n in shape)}.")
    whole = [a == 0 and b == n for a, b, n in zip(start, stop, shape, strict=True)]
    wrap = tuple(bool(w) and full for w, full in zip(topology.wrap, whole, strict=True))
    view_shape = tuple(b - a for a, b in zip(start, stop, strict=True))
    view = Topology.simulated(view_shape, generation=topology.generation, wrap=wrap,
                              devices_per_chip=topology.devices_per_chip)
    coords = topology.chip_coords
    keep = np.all((coords >= start) & (coords < stop), axis=1)
    chips = np.nonzero(keep)[0]  # row-major, so in the view's row-major order too
    view_loads = np.asarray(link_bytes, dtype=np.float64)[chips].copy()
    view_loads[~view.link_exists] = 0.0  # links that leave the region
    note = ("region " + ", ".join(f"{'xyz'[a]} {start[a]}–{stop[a] - 1}"
                                  for a in range(topology.ndim))
            + f" of {topology.name}: links leaving it not drawn")
    return SliceView(view, view_loads, tuple(labels[c] for c in chips),
                     tuple(hover[c] for c in chips), note, tuple(int(c) for c in chips),
                     label_kind)


def _tiling_blocks(shape: Sequence[int]) -> tuple[int, ...]:
    """Every block size that divides each axis longer than it, smallest first."""
    return tuple(b for b in range(1, max(shape) + 1) if all(n <= b or n % b == 0 for n in shape))


def _cells(shape: Sequence[int], block: int) -> int:
    return math.prod(-(-n // min(block, n)) for n in shape)
