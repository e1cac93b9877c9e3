"""One collective in two device orders: where its bytes go, and each logical neighbour's hop.

A gather or reduction may run along its group's device order (:mod:`aoizora_lab.comm_model`,
*Device order*): the ring steps from logical device *i* to *i + 1*, each step routed over the
links between their chips. :func:`order_comparison` draws the same collective in two orders
(say the same chips as a chain and as a ring) as :func:`~aoizora_lab.viz.heatmap_comparison`
does, with one group's hops drawn over each panel: a dashed line per hop, from member *i* to
member *i + 1* (the closing hop included), green where it takes one link, red where it takes
more (hover: how many). Each panel's title names the predicted time and the busiest link.
Hops are drawn on slices shown link by link in one plane (up to 64 chips of 1 or 2 axes).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import plotly.graph_objects as go

from aoizora_lab.comm_model import (
    Collective,
    CommEstimate,
    ModelOptions,
    estimate,
    order_algorithm,
)
from aoizora_lab.errors import AoizoraError
from aoizora_lab.placement import Placement, block_ring
from aoizora_lab.topology import Topology
from aoizora_lab.viz.torus import heatmap_comparison
from aoizora_lab.viz.units import format_bytes
from aoizora_lab.viz.views import auto_block

NEAR_HOP = "#1a9850"
"""A hop of one link."""
FAR_HOP = "#d73027"
"""A hop of several links: where an order pays."""
POSITION_COLOR = "#2c5fa8"
"""The member's position in the group (``#i``), up and left of its chip's own label."""
POSITION_OFFSET = 0.32


def order_comparison(topology: Topology, collective: Collective, left: Any, right: Any, *,
                     left_title: str | None = None, right_title: str | None = None,
                     group: int = 0, options: ModelOptions | None = None) -> go.Figure:
    """``collective`` on ``left`` and ``right`` (placements or device orders): link loads on
    one colour scale and their difference, group ``group``'s hops drawn over the two load
    panels (module docstring). Titles default to the placements' descriptions."""
    if not 0 <= group < len(collective.groups):
        raise AoizoraError(f"group={group!r}; {collective.name or collective.kind!r} has "
                           f"groups 0..{len(collective.groups) - 1}.")
    estimates = [estimate(collective, topology, p, options=options) for p in (left, right)]
    names = [title or getattr(p, "description", "") or side for title, p, side in
             ((left_title, left, "left"), (right_title, right, "right"))]
    fig = heatmap_comparison(topology, estimates[0].link_bytes, estimates[1].link_bytes,
                             left_title=names[0], right_title=names[1],
                             title=f"{collective.name or collective.kind} in two device orders "
                                   f"on {topology.name}")
    # The load panels' titles (the first two on a 2-D slice) get a line: time, busiest link.
    for title, name, found in zip(fig.layout.annotations, names, estimates, strict=False):
        if title.text == name:
            title.text = name + "".join(f"<br><sub>{line}</sub>" for line in _summary(found))
    if topology.ndim <= 2 and auto_block(topology) == 1:
        for column, placement in ((1, left), (2, right)):
            for trace in hop_traces(topology, collective.groups[group], placement):
                fig.add_trace(trace, row=1, col=column)
    return fig.update_layout(margin={"t": fig.layout.margin.t + 30},
                             height=fig.layout.height + 30)


def ordered_collective(program: Any, topology: Topology,
                       options: ModelOptions | None = None) -> Collective | None:
    """The collective of ``program`` (a compiled program or collectives) that takes longest
    per step in plain device order among those that run along their group's order
    (:func:`~aoizora_lab.comm_model.order_algorithm` ``"ring"``, more than two devices: a
    pair is the same in either order), or ``None``."""
    options = options or ModelOptions()
    ordered = [c for c in getattr(program, "collectives", program)
               if order_algorithm(c.kind, len(c.groups[0]), topology, options) == "ring"
               and len(c.groups[0]) > 2]
    return max(ordered, key=lambda c: estimate(c, topology, options=options).seconds,
               default=None)


def chain_and_ring(topology: Topology, result_bytes: float = 64e6
                   ) -> tuple[Collective, Placement, Placement] | None:
    """A teaching pair: an all-reduce over the chips of a block at the slice's origin (up to
    2 x 4, on its two longest axes), in row-major order (a chain whose hops cross the block)
    and as a :func:`~aoizora_lab.placement.block_ring`; the other devices follow in plain
    order. ``None`` where the slice has no 2 x 2 block."""
    longest = sorted(range(topology.ndim), key=lambda a: -topology.shape[a])[:2]
    if len(longest) < 2 or topology.shape[longest[1]] < 2:
        return None
    a, b = longest
    size = (min(topology.shape[a], 4), 2)
    grid = topology.device_grid()[..., 0]

    def device(pa: int, pb: int) -> int:
        index = [0] * topology.ndim
        index[a], index[b] = pa, pb
        return int(grid[tuple(index)])

    chain = [device(pa, pb) for pa in range(size[0]) for pb in range(size[1])]
    ring = [device(pa, pb) for pa, pb in block_ring(*size)]
    rest = [d for d in range(topology.num_devices) if d not in chain]
    members = list(range(len(chain)))
    collective = Collective("all-reduce", [members], result_bytes,
                            name=f"all-reduce over a {size[0]}x{size[1]} block")
    return (collective, Placement(tuple(chain + rest), "row-major chain"),
            Placement(tuple(ring + rest), "ring"))


def hop_traces(topology: Topology, members: tuple[int, ...], placement: Any
               ) -> list[go.Scatter]:
    """One dashed line per logical-neighbour hop of a group (``members``: logical ids in
    group order) on ``placement``, with the member's position in the group at each chip."""
    order = np.arange(topology.num_devices) if placement is None else np.asarray(placement)
    chips = topology.device_chip[order[list(members)]]
    coords = topology.chip_coords[chips]
    traces = []
    for i in range(len(members)):
        a, b = coords[i], coords[(i + 1) % len(members)]
        links = int(topology.offset_hops(b - a))
        (ax, ay), (bx, by) = _screen(a), _screen(b)
        traces.append(go.Scatter(
            x=[ax, bx], y=[ay, by], mode="lines",
            line={"color": NEAR_HOP if links <= 1 else FAR_HOP, "width": 3, "dash": "dash"},
            hoverinfo="text", meta="order-hops",
            text=f"hop {i} -> {(i + 1) % len(members)}: {links} link{'s' * (links != 1)}"))
    x, y = zip(*(_screen(c) for c in coords), strict=True)
    traces.append(go.Scatter(x=[v - POSITION_OFFSET for v in x],
                             y=[v - POSITION_OFFSET for v in y], mode="text",
                             text=[f"#{i}" for i in range(len(members))],
                             textfont={"size": 12, "color": POSITION_COLOR},
                             hoverinfo="skip", meta="order-positions"))
    return traces


def _summary(found: CommEstimate) -> tuple[str, str]:
    """The predicted time and the busiest link, a line each."""
    busiest = (f"busiest {found.busiest_link}: {format_bytes(found.busiest_link_bytes)}"
               if found.busiest_link is not None else "no link used")
    return f"{found.seconds * 1e3:.3g} ms", busiest


def _screen(coords: np.ndarray) -> tuple[float, float]:
    return float(coords[0]), float(coords[1]) if len(coords) > 1 else 0.0
