"""Compiled inner loops of :class:`~aoizora_lab.placement.PlacementScorer` (numba).

Routing a flow adds its bytes to the few links of its route. The routes come from
:func:`~aoizora_lab.comm_model.route_matrix` as runs of ``(link, fraction)`` entries, one run
per chip pair (``start[pair]``, ``length[pair]``, ``link``, ``fraction``; pair = ``src *
num_chips + dst``). In numpy every flow's route entries are first gathered into arrays of
their own and then summed with a bincount; here one loop adds each entry where it goes.

A swap of the local search changes the flows of the few groups holding a swapped position:
:func:`route_group_changes` walks each such group's flows before and after and routes only
those that differ, without building either flow list. Example: on ``v5e:8x8`` a swap in an
8-way all-to-all changes the 14 of the group's 56 flows that start or end at the moved
member (each taken off its old route and put on its new one); a call of the search (160
swaps) routes ~22,000 flows over ~160,000 route entries. Measured on 14B@720p
``cfg2-uly8-ring4-fsdp`` (64 chips), the search's placements per second went from 12.0k to
21.4k with these loops and the bookkeeping around them (``reports/benchmarks.md``).

numba compiles each kernel on first use (~6 s for all of them) and keeps the machine code in
its own on-disk format, which is pickle: so that cache lives in this user's own cache folder
(:func:`kernel_cache_dir`), never under a shared ``$AOIZORA_LAB_CACHE_DIR`` nor inside the
installed package.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import numba
import numpy as np

PERMUTE, ALL_TO_ALL, RING = 0, 1, 2
"""Flow layouts of a group's members ``c[0..S-1]`` in :func:`route_group_changes`: a permute
pair sends ``c[0] -> c[1]``; an all-to-all member ``c[i]`` sends to every other member; a
bidirectional ring sends ``c[i] -> c[i+1]`` and back, the closing pair included (the layout of
:func:`~aoizora_lab.comm_model.ring_flows`)."""


def kernel_cache_dir() -> Path:
    """Where numba keeps the compiled kernels: ``numba/`` in the user's cache folder."""
    from aoizora_lab.versions import user_cache_dir

    return user_cache_dir() / "numba"


def _kernel(function: Callable[..., Any]) -> Callable[..., Any]:
    """``numba.njit(cache=True)`` with the cache in :func:`kernel_cache_dir`. numba picks a
    function's cache folder as it decorates it, from ``numba.config.CACHE_DIR``: set for this
    function only, then put back."""
    before = numba.config.CACHE_DIR
    numba.config.CACHE_DIR = str(kernel_cache_dir())
    try:
        return numba.njit(cache=True)(function)
    finally:
        numba.config.CACHE_DIR = before


@_kernel
def _add_route(out: np.ndarray, row: int, src: int, dst: int, weight: float, num_chips: int,
               start: np.ndarray, length: np.ndarray, link: np.ndarray,
               fraction: np.ndarray) -> None:
    pair = src * num_chips + dst
    first = start[pair]
    for entry in range(first, first + length[pair]):
        out[row, link[entry]] += weight * fraction[entry]


@_kernel
def route_flows(out: np.ndarray, src: np.ndarray, dst: np.ndarray, weight: np.ndarray,
                rows: np.ndarray, num_chips: int, start: np.ndarray, length: np.ndarray,
                link: np.ndarray, fraction: np.ndarray) -> None:
    """Add flow *i* (``weight[i]`` bytes from chip ``src[i]`` to ``dst[i]``) to the links of
    its route in row ``rows[i]`` of ``out`` ``[rows, links]``."""
    for i in range(src.shape[0]):
        _add_route(out, rows[i], src[i], dst[i], weight[i], num_chips, start, length, link,
                   fraction)


@_kernel
def _change(out: np.ndarray, row: int, old_src: int, old_dst: int, new_src: int,
            new_dst: int, old_weight: float, new_weight: float, num_chips: int,
            start: np.ndarray, length: np.ndarray, link: np.ndarray,
            fraction: np.ndarray) -> None:
    if old_src == new_src and old_dst == new_dst and old_weight == new_weight:
        return  # the same flow before and after: cancels
    if old_weight != 0.0:
        _add_route(out, row, old_src, old_dst, -old_weight, num_chips, start, length, link,
                   fraction)
    if new_weight != 0.0:
        _add_route(out, row, new_src, new_dst, new_weight, num_chips, start, length, link,
                   fraction)


@_kernel
def route_group_changes(out: np.ndarray, layout: int, old: np.ndarray, new: np.ndarray,
                        old_weight: np.ndarray, new_weight: np.ndarray, rows: np.ndarray,
                        num_chips: int, start: np.ndarray, length: np.ndarray,
                        link: np.ndarray, fraction: np.ndarray) -> None:
    """Add to row ``rows[g]`` of ``out`` ``[rows, links]`` the flows of group ``new[g]`` (member
    chips, each flow ``new_weight[g]`` bytes) minus those of ``old[g]`` (``old_weight[g]``),
    in ``layout``; a weight of 0 means the group has no such flows on that side."""
    members = old.shape[1]
    for g in range(old.shape[0]):
        row, w_old, w_new = rows[g], old_weight[g], new_weight[g]
        a, b = old[g], new[g]
        if layout == PERMUTE:
            _change(out, row, a[0], a[1], b[0], b[1], w_old, w_new, num_chips, start,
                    length, link, fraction)
        elif layout == ALL_TO_ALL:
            for i in range(members):
                for j in range(members):
                    if i != j:
                        _change(out, row, a[i], a[j], b[i], b[j], w_old, w_new, num_chips,
                                start, length, link, fraction)
        else:
            for i in range(members):
                k = (i + 1) % members
                _change(out, row, a[i], a[k], b[i], b[k], w_old, w_new, num_chips, start,
                        length, link, fraction)
                _change(out, row, a[k], a[i], b[k], b[i], w_old, w_new, num_chips, start,
                        length, link, fraction)


SCAN_MEMBERS = 64
"""Up to this many members a group's longest distance is found by scanning its pairs (2,016
lookups at 64, a few microseconds); larger sets are worked out once each by their owner."""


@_kernel
def moved_longest(distances: np.ndarray, old: np.ndarray, new: np.ndarray,
                  old_hops: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Longest distance within each group ``new[g]`` (member chips), which is ``old[g]``
    (longest distance ``old_hops[g]``) with at most one member's chip changed; and where it
    is left to the caller (``again``: the chip that left was in a longest pair of ``old[g]``
    and the group has over :data:`SCAN_MEMBERS` members; the caller works out such sets once
    each).

    When the chip that leaves is nearer than ``old_hops[g]`` to every other member, the
    others keep their longest pair, and only the distances to the chip that comes in are
    new: ``2 S`` lookups instead of the set's ``S^2 / 2``.
    """
    count, members = old.shape
    hops = old_hops.copy()
    again = np.zeros(count, dtype=np.bool_)
    for g in range(count):
        moved = -1
        for i in range(members):
            if old[g, i] != new[g, i]:
                moved = i
                break
        if moved < 0:
            continue
        leaving, coming = old[g, moved], new[g, moved]
        kept = True
        for j in range(members):
            if distances[leaving, old[g, j]] >= old_hops[g]:
                kept = False
                break
        if kept:
            for j in range(members):
                hops[g] = max(hops[g], distances[coming, new[g, j]])
        elif members <= SCAN_MEMBERS:
            hops[g] = 0
            for i in range(members):
                for j in range(i + 1, members):
                    hops[g] = max(hops[g], distances[new[g, i], new[g, j]])
        else:
            again[g] = True
    return hops, again


@_kernel
def maybe_regular(coords: np.ndarray, shape: np.ndarray, groups: np.ndarray) -> np.ndarray:
    """Whether each group's chips (``groups`` ``[N, S]``, ``coords`` per chip) take as many
    distinct positions per axis as multiply to ``S``: a regular set (every combination of
    its per-axis positions) must, so most sets a swap makes are ruled out without working
    out their layout."""
    count, members = groups.shape
    out = np.zeros(count, dtype=np.bool_)
    seen = np.zeros(shape.max(), dtype=np.bool_)
    for g in range(count):
        product = 1
        for axis in range(shape.shape[0]):
            seen[:] = False
            distinct = 0
            for i in range(members):
                position = coords[groups[g, i], axis]
                if not seen[position]:
                    seen[position] = True
                    distinct += 1
            product *= distinct
        out[g] = product == members
    return out
