"""Heatmaps of ICI link load: every directed link of a slice, coloured by the bytes it carries.

**How a slice is drawn.** Chips sit at their ``(x, y)`` coordinates, x across and y down (as
:meth:`Topology.describe` prints them), labelled with their device index (or the logical
device ids a placement puts there). Each neighbour pair has two lanes, one per direction,
and traffic keeps to its right-hand lane, so on a 4x4 slice the link ``(0,1) -> (1,1) +x``
is the lane just below the row and ``(1,1) -> (0,1) -x`` the lane just above it. An arrow
at the middle of each lane shows the direction, carries the exact colour and answers hover
with the link, its bytes, its share of the busiest link and the collectives that use it. A
wraparound link leaves the grid as a stub and re-enters as a stub on the opposite side, in
the same lane and colour. On a 3D slice every z-plane gets its own panel and a z-link is a
marker beside its source chip: ⊙ for +z, ⊗ for -z (out of and into the page).

Above 64 chips a slice is drawn in blocks of chips, or a region of it link by link
(:mod:`aoizora_lab.viz.views`); the colour scale stays the whole slice's.

Lanes are drawn in :data:`LEVELS` colour steps (one line trace per step keeps a figure's
trace count independent of the slice size); arrows use the continuous scale and its colour
bar. Idle links are grey, so the links a plan leaves unused stand out.

Every figure is built from the same traces in the same order for a given slice (tagged with
``meta``: ``"link-lanes"``, ``"chips"``, ``"links"``), which is what lets the explorers swap
one view's data into another view's figure.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np
import plotly.colors as pcolors
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from aoizora_lab.errors import AoizoraError
from aoizora_lab.topology import PLUS, Topology
from aoizora_lab.viz.loads import LinkKey
from aoizora_lab.viz.units import format_bytes
from aoizora_lab.viz.views import SliceView, auto_block, coarsen, region_view

LinkValue = Literal["bytes", "share"]
"""What colours a link: its bytes, or its share of the busiest link's bytes."""

BYTES_COLORSCALE = "YlOrRd"  # pale = light load, dark red = busiest: reads as heat on white
DIFF_COLORSCALE = "RdBu_r"  # red = more bytes on the right-hand plan, blue = fewer
IDLE_COLOR = "#cfcfcf"
LEVELS = 12
"""Colour steps of the drawn lanes (the arrows carry the exact colour)."""
LANE_OFFSET = 0.12  # half the distance between a pair's two lanes, in chip spacings
NODE_GAP = 0.2  # lanes stop this far from chip centres, so chip labels stay readable
STUB_END = 0.72  # wraparound stubs reach this far past the edge chip (half-way to a neighbour)
Z_OFFSET = 0.3  # z-link markers sit diagonally this far from their chip
MAX_PLANE_COLUMNS = 4  # z-planes per row of panels in a single 3D heatmap
MAX_HOVER_COLLECTIVES = 6  # collectives listed per link; the rest are counted
MIN_WIDTH_PX = 560

_ALONG = {0: (1.0, 0.0), 1: (0.0, 1.0)}  # screen direction of + along x and y (y points down)
_RIGHT_HAND = {0: (0.0, 1.0), 1: (-1.0, 0.0)}  # right-hand side of a + move, on screen
_ARROW_ANGLE = {(0, 1): 90.0, (0, -1): 270.0, (1, 1): 180.0, (1, -1): 0.0}  # clockwise from up


@dataclass(frozen=True)
class _LinkDrawing:
    """Where one directed link is drawn in its panel."""

    key: LinkKey
    """(source chip, axis, direction): its index into a link-bytes array."""
    plane: int
    """z-plane of the source chip (0 on a 2D slice): the panel the link is drawn in."""
    text: str
    """The link for people, e.g. ``"(0,1) -> (1,1) +x"``."""
    lanes: tuple[tuple[tuple[float, float], ...], ...]
    """Polylines of its lane: one segment, two stubs for a wraparound link, none for z."""
    anchor: tuple[float, float]
    """Where its arrow (or z marker) sits."""
    symbol: str
    """Marker symbol: ``"arrow"``, or ``"circle-open-dot"`` (⊙) / ``"circle-x-open"`` (⊗) for
    +z / -z: open symbols, so the colour is the glyph's stroke."""
    angle: float
    """Marker rotation in degrees clockwise from up."""


@dataclass(frozen=True)
class _ColourScale:
    """One colour axis of a figure, shared by the panels that use it."""

    coloraxis: str
    """Plotly colour axis id, ``"coloraxis"`` or ``"coloraxis2"``."""
    colorscale: str
    """Plotly colour scale name."""
    cmin: float
    """Value at the bottom of the scale."""
    cmax: float
    """Value at the top of the scale."""
    title: str
    """Colour bar title."""
    tickformat: str = "~s"
    """d3 format of the colour bar ticks (``"~s"``: 25M)."""
    ticksuffix: str = "B"
    """Unit after each tick."""


@dataclass(frozen=True)
class _Panel:
    """One picture of per-link values on the slice (all of its z-planes)."""

    title: str
    """Panel title ("" for a lone panel: the figure title says it)."""
    values: np.ndarray
    """Colour value per :class:`LinkDrawing`, in drawing order."""
    hover: tuple[str, ...]
    """Hover text per drawing."""
    customdata: tuple[tuple[float, ...], ...]
    """Numbers per drawing, starting with (chip, axis, direction)."""
    scale: _ColourScale
    """The colour axis the panel uses."""


def torus_heatmap(
    topology: Topology,
    link_bytes: np.ndarray,
    *,
    title: str | None = None,
    collectives_by_link: Mapping[LinkKey, Sequence[tuple[str, float]]] | None = None,
    value: LinkValue = "bytes",
    placement: Sequence[int] | np.ndarray | None = None,
    cmax: float | None = None,
    block: int | None = None,
    region: tuple[Sequence[int], Sequence[int]] | None = None,
) -> go.Figure:
    """The slice with every directed link coloured by its load (drawing: module docstring).

    ``link_bytes`` is ``CommEstimate.link_bytes``: ``[num_chips, ndim, 2]`` indexed like
    :attr:`Topology.link_target`. ``value="share"`` colours by share of the busiest link
    instead of bytes. ``collectives_by_link`` (from :func:`link_bytes_by_collective`) adds the
    collectives that use each link to its hover text. With ``placement`` chips are labelled
    with the logical device ids placed on them. ``cmax`` fixes the top of the bytes scale, so
    that figures of different plans compare by colour.

    Large slices (:mod:`aoizora_lab.viz.views`): ``block`` draws blocks of that many chips
    per axis as one cell each, every link the busiest of those it stands for (default: 1, every
    link, up to :data:`~aoizora_lab.viz.views.MAX_DETAILED_CHIPS` chips, else the smallest
    power of 2 that leaves that many cells); ``region=(start, stop)`` draws only the chips
    between those chip coordinates, link by link. The colour scale is the whole slice's.

    Each arrow's ``customdata`` row is ``(chip, axis, direction, bytes, share)`` (the view's
    cell and link).
    """
    if value not in ("bytes", "share"):
        raise AoizoraError(f"torus_heatmap value={value!r}; use 'bytes' or 'share'.")
    if cmax is not None and not cmax > 0:
        raise AoizoraError(f"torus_heatmap cmax={cmax!r}; pass a positive byte count or None.")
    loads = check_link_bytes(topology, link_bytes)
    view = slice_view(topology, [loads], placement=placement, block=block, region=region)[0]
    drawings = _link_drawings(view.topology)
    busiest = float(loads.max(initial=0.0))
    if value == "bytes":
        top = cmax if cmax is not None else busiest
        scale = _ColourScale("coloraxis", BYTES_COLORSCALE, 0.0, top if top > 0 else 1.0,
                             "bytes per step")
    else:
        scale = _ColourScale("coloraxis", BYTES_COLORSCALE, 0.0, 1.0, "share of busiest link",
                             tickformat=".0%", ticksuffix="")
    users = collectives_by_link
    if users is not None and view.topology is not topology:
        # A region keeps its chips' links (renumbered); a block's link stands for several.
        cell_of = {chip: cell for cell, chip in enumerate(view.chips)}
        users = {(cell_of[c], a, d): u for (c, a, d), u in users.items() if c in cell_of}
    panel = _load_panel(drawings, view.link_bytes, title="", value=value, scale=scale,
                        collectives_by_link=users, busiest=busiest)
    return _build_figure(view, drawings, [panel], title=title or default_title(topology))


def slice_view(topology: Topology, loads: Sequence[np.ndarray], *,
               placement: Sequence[int] | np.ndarray | None = None, block: int | None = None,
               region: tuple[Sequence[int], Sequence[int]] | None = None
               ) -> list[SliceView]:
    """The view a heatmap draws of each of ``loads`` (all the same view; see
    :func:`torus_heatmap`)."""
    labels, hover = _chip_labels(topology, placement)
    kind = "labels: logical device ids" if placement is not None else "labels: device index"
    if region is not None:
        if block not in (None, 1):
            raise AoizoraError(
                f"torus_heatmap got block={block!r} and region={region!r}; a region is drawn "
                "link by link: pass one of them.")
        if len(region) != 2:
            raise AoizoraError(f"region={region!r}; pass (start, stop), one chip coordinate "
                               "per axis each, e.g. ((0, 0), (8, 8)).")
        return [region_view(topology, each, *region, labels, hover, kind) for each in loads]
    block = auto_block(topology) if block is None else block
    if block == 1:
        return [SliceView(topology, each, tuple(labels), tuple(hover), "", label_kind=kind)
                for each in loads]
    return [coarsen(topology, each, block) for each in loads]


def heatmap_comparison(
    topology: Topology,
    left_bytes: np.ndarray,
    right_bytes: np.ndarray,
    *,
    left_title: str = "left",
    right_title: str = "right",
    title: str | None = None,
    block: int | None = None,
    region: tuple[Sequence[int], Sequence[int]] | None = None,
) -> go.Figure:
    """Two link loads side by side on one colour scale, then their difference.

    The first two panels share a bytes scale topped by the busier of the two; the third shows
    ``right - left`` per link on a diverging scale centred on zero (red: the right-hand plan
    puts more bytes there). On a 3D slice the three views are rows, one panel per z-plane.
    Difference arrows carry ``customdata`` ``(chip, axis, direction, left, right, change)``.
    ``block`` and ``region`` draw a large slice as :func:`torus_heatmap` does.
    """
    whole = [check_link_bytes(topology, left_bytes), check_link_bytes(topology, right_bytes)]
    top = max(float(w.max(initial=0.0)) for w in whole)
    left_view, right_view = slice_view(topology, whole, block=block, region=region)
    left, right = left_view.link_bytes, right_view.link_bytes
    drawings = _link_drawings(left_view.topology)
    shared = _ColourScale("coloraxis", BYTES_COLORSCALE, 0.0, top if top > 0 else 1.0,
                          "bytes per step")
    change = right - left
    reach = float(np.abs(change).max(initial=0.0))
    reach = reach if reach > 0 else 1.0
    diverging = _ColourScale("coloraxis2", DIFF_COLORSCALE, -reach, reach,
                             f"{right_title} − {left_title}")
    panels = [
        _load_panel(drawings, left, title=left_title, value="bytes", scale=shared),
        _load_panel(drawings, right, title=right_title, value="bytes", scale=shared),
        _difference_panel(drawings, (left_title, left), (right_title, right),
                          scale=diverging),
    ]
    return _build_figure(
        left_view, drawings, panels,
        title=title or f"{left_title} vs {right_title} on {topology.name}")


# ----------------------------------------------------------------------------- shared pieces


def default_title(topology: Topology) -> str:
    """``"ICI link load on v5e:4x4 (wraparound x, y)"``."""
    wraps = [name for name, w in zip("xyz", topology.wrap, strict=False) if w]
    suffix = f" (wraparound {', '.join(wraps)})" if wraps else ""
    return f"ICI link load on {topology.name}{suffix}"


def check_link_bytes(topology: Topology, link_bytes: np.ndarray) -> np.ndarray:
    """``link_bytes`` as a float array, checked to belong to ``topology``."""
    loads = np.asarray(link_bytes, dtype=np.float64)
    expected = (topology.num_chips, topology.ndim, 2)
    if loads.shape != expected:
        raise AoizoraError(
            f"link_bytes has shape {loads.shape}, but {topology.name} needs {expected} "
            "(chips, axes, directions); pass CommEstimate.link_bytes from an estimate on this "
            "topology."
        )
    if not np.isfinite(loads).all():
        raise AoizoraError("link_bytes holds NaN or infinite values; pass finite byte counts.")
    stray = np.abs(loads[~topology.link_exists]).max(initial=0.0)
    if stray > 0:
        raise AoizoraError(
            f"link_bytes puts {format_bytes(stray)} on links that {topology.name} "
            f"(wrap={topology.wrap}) does not have; was it estimated on another topology?"
        )
    return loads


def _link_drawings(topology: Topology) -> tuple[_LinkDrawing, ...]:
    """Every directed link's drawing, ordered by (source chip, axis, direction)."""
    if topology.ndim > 3:
        raise AoizoraError(
            f"Heatmaps draw slices of 1 to 3 axes; {topology.name} has {topology.ndim}.")
    drawings = []
    for chip, axis, direction in np.argwhere(topology.link_exists).tolist():
        link = topology.link(chip, axis, direction)
        src, dst = _screen(link.src), _screen(link.dst)
        plane = link.src[2] if topology.ndim == 3 else 0
        text = (f"({','.join(map(str, link.src))}) -> ({','.join(map(str, link.dst))}) "
                f"{'+-'[direction]}{'xyz'[axis]}" + (" (wraparound)" if link.wraparound else ""))
        key = (chip, axis, direction)
        step = link.direction
        if axis == 2:  # up-right of the chip for +z, down-left for -z
            anchor = (src[0] + step * Z_OFFSET, src[1] - step * Z_OFFSET)
            symbol = "circle-open-dot" if direction == PLUS else "circle-x-open"
            drawings.append(_LinkDrawing(key, plane, text, (), anchor, symbol, 0.0))
            continue
        if link.wraparound:
            lanes = ((_lane_point(src, NODE_GAP, axis, step),
                      _lane_point(src, STUB_END, axis, step)),
                     (_lane_point(dst, -STUB_END, axis, step),
                      _lane_point(dst, -NODE_GAP, axis, step)))
            anchor = _lane_point(src, (NODE_GAP + STUB_END) / 2, axis, step)
        else:
            lanes = ((_lane_point(src, NODE_GAP, axis, step),
                      _lane_point(src, 1 - NODE_GAP, axis, step)),)
            anchor = _lane_point(src, 0.5, axis, step)
        drawings.append(_LinkDrawing(key, plane, text, lanes, anchor, "arrow",
                                     _ARROW_ANGLE[(axis, step)]))
    return tuple(drawings)


def _load_panel(
    drawings: Sequence[_LinkDrawing],
    loads: np.ndarray,
    *,
    title: str,
    value: LinkValue,
    scale: _ColourScale,
    collectives_by_link: Mapping[LinkKey, Sequence[tuple[str, float]]] | None = None,
    busiest: float | None = None,
) -> _Panel:
    """A panel of one link load: colour by bytes or share (of ``busiest``, default the
    busiest drawn link), hover with the collectives."""
    per_link = np.array([loads[d.key] for d in drawings])
    busiest = float(per_link.max(initial=0.0)) if busiest is None else busiest
    share = per_link / busiest if busiest > 0 else np.zeros_like(per_link)
    users = collectives_by_link or {}
    hover = tuple(
        _load_hover(d.text, b, s, users.get(d.key, ()))
        for d, b, s in zip(drawings, per_link.tolist(), share.tolist(), strict=True))
    customdata = tuple((*d.key, b, s)
                       for d, b, s in zip(drawings, per_link.tolist(), share.tolist(),
                                          strict=True))
    return _Panel(title, per_link if value == "bytes" else share, hover, customdata, scale)


def _build_figure(
    view: SliceView,
    drawings: Sequence[_LinkDrawing],
    panels: Sequence[_Panel],
    *,
    title: str,
) -> go.Figure:
    """Lay ``panels`` out (one per z-plane each) and draw lanes, chips and arrows in each."""
    topology = view.topology
    planes = topology.shape[2] if topology.ndim == 3 else 1
    cells = _cells(len(panels), planes)
    rows = max(r for _, _, r, _ in cells)
    cols = max(c for _, _, _, c in cells)
    titles = [""] * (rows * cols)
    for p, z, r, c in cells:
        name = panels[p].title
        if planes > 1:
            name = f"{name} · z={z}" if name else f"z={z}"
        titles[(r - 1) * cols + c - 1] = name
    side_by_side_scales = planes == 1 and len({p.scale.coloraxis for p in panels}) > 1
    h_spacing = 0.12 if side_by_side_scales else 0.04
    v_spacing = 0.1 if rows > 1 else 0.0
    fig = make_subplots(rows=rows, cols=cols, subplot_titles=titles,
                        horizontal_spacing=h_spacing if cols > 1 else 0.0,
                        vertical_spacing=v_spacing)
    labels, chip_hover = list(view.labels), list(view.hover)
    nx, ny = _screen_extent(topology)
    pad_x = 0.95 if topology.wrap[0] else 0.55  # room for wraparound stubs, else for z markers
    pad_y = 0.95 if topology.ndim > 1 and topology.wrap[1] else 0.55
    span = max(nx - 1 + 2 * pad_x, ny - 1 + 2 * pad_y)
    # About 460 px for a lone panel; several panels share ~800 px so figures fit a notebook.
    cell_px = float(np.clip((460 if cols == 1 else 800 / cols) / span, 30, 96))
    for p, z, r, c in cells:
        for trace in _cell_traces(topology, drawings, panels[p], z, labels, chip_hover,
                                  cell_px):
            fig.add_trace(trace, row=r, col=c)
    fig.update_xaxes(visible=False, range=[-pad_x, nx - 1 + pad_x])
    fig.update_yaxes(visible=False, range=[ny - 1 + pad_y, -pad_y])
    for r in range(1, rows + 1):
        for c in range(1, cols + 1):
            subplot = fig.get_subplot(r, c)
            fig.update_yaxes(scaleanchor=subplot.xaxis.plotly_name.replace("axis", ""),
                             scaleratio=1, row=r, col=c)
    for scale in {p.scale.coloraxis: p.scale for p in panels}.values():
        used = [(r, c) for p, _, r, c in cells if panels[p].scale.coloraxis == scale.coloraxis]
        fig.update_layout({scale.coloraxis: _coloraxis(fig, scale, used)})
    panel_w = (nx - 1 + 2 * pad_x) * cell_px
    panel_h = (ny - 1 + 2 * pad_y) * cell_px
    fig.update_layout(
        # Pinned to the top, so room added below it (e.g. an explorer's menu) stays free.
        title={"text": title, "subtitle": {"text": _legend_text(view)},
               "yref": "container", "y": 1.0, "yanchor": "top", "pad": {"t": 34}},
        template="plotly_white", showlegend=False, hovermode="closest",
        # At least MIN_WIDTH_PX, so the two-line legend under the title fits small slices.
        width=max(MIN_WIDTH_PX, int(cols * panel_w / (1 - h_spacing * (cols - 1)) + 150)),
        height=int(rows * panel_h / (1 - v_spacing * (rows - 1)) + 180),
        margin={"l": 20, "r": 110, "t": 150, "b": 20},
    )
    return fig


# ----------------------------------------------------------------------------- internals


def _screen(coords: Sequence[int]) -> tuple[float, float]:
    return (float(coords[0]), float(coords[1]) if len(coords) > 1 else 0.0)


def _lane_point(origin: tuple[float, float], t: float, axis: int, step: int
                ) -> tuple[float, float]:
    """``t`` chip spacings from ``origin`` along a ``step`` (+1/-1) move on ``axis``, shifted
    into that move's right-hand lane."""
    along, side = _ALONG[axis], _RIGHT_HAND[axis]
    return (origin[0] + step * (t * along[0] + LANE_OFFSET * side[0]),
            origin[1] + step * (t * along[1] + LANE_OFFSET * side[1]))


def _screen_extent(topology: Topology) -> tuple[int, int]:
    return topology.shape[0], topology.shape[1] if topology.ndim > 1 else 1


def _cells(num_panels: int, planes: int) -> list[tuple[int, int, int, int]]:
    """(panel, z-plane, row, col) of every subplot.

    2D: panels side by side. 3D: one panel's planes wrap into rows of
    :data:`MAX_PLANE_COLUMNS`; several panels take one row each, a plane per column.
    """
    if planes == 1:
        return [(p, 0, 1, p + 1) for p in range(num_panels)]
    if num_panels == 1:
        return [(0, z, z // MAX_PLANE_COLUMNS + 1, z % MAX_PLANE_COLUMNS + 1)
                for z in range(planes)]
    return [(p, z, p + 1, z + 1) for p in range(num_panels) for z in range(planes)]


def _load_hover(text: str, size: float, share: float,
                users: Sequence[tuple[str, float]]) -> str:
    lines = [f"<b>{text}</b>", f"bytes: {format_bytes(size)}",
             f"share of busiest link: {share:.0%}"]
    if users:
        lines.append("collectives:")
        lines += [f"  {name}: {format_bytes(b)}" for name, b in users[:MAX_HOVER_COLLECTIVES]]
        if len(users) > MAX_HOVER_COLLECTIVES:
            lines.append(f"  … and {len(users) - MAX_HOVER_COLLECTIVES} more")
    return "<br>".join(lines)


def _difference_panel(drawings: Sequence[_LinkDrawing], left: tuple[str, np.ndarray],
                      right: tuple[str, np.ndarray], *, scale: _ColourScale) -> _Panel:
    """Per link ``right - left``; each side is (title, link bytes)."""
    (left_title, left_bytes), (right_title, right_bytes) = left, right
    before = np.array([left_bytes[d.key] for d in drawings])
    after = np.array([right_bytes[d.key] for d in drawings])
    change = after - before
    hover = []
    for d, b, a, delta in zip(drawings, before.tolist(), after.tolist(), change.tolist(),
                              strict=True):
        relative = f" ({delta / b:+.0%})" if b > 0 else ""
        sign = "+" if delta > 0 else ""
        hover.append("<br>".join([f"<b>{d.text}</b>", f"{left_title}: {format_bytes(b)}",
                                  f"{right_title}: {format_bytes(a)}",
                                  f"change: {sign}{format_bytes(delta)}{relative}"]))
    customdata = tuple((*d.key, b, a, delta) for d, b, a, delta in
                       zip(drawings, before.tolist(), after.tolist(), change.tolist(),
                           strict=True))
    return _Panel(f"difference: {right_title} − {left_title}", change, tuple(hover), customdata,
                  scale)


def _levels(values: np.ndarray, scale: _ColourScale) -> np.ndarray:
    """Colour step of each value, ``-1`` for an idle link (no bytes, or no change)."""
    span = scale.cmax - scale.cmin
    frac = np.clip((values - scale.cmin) / span, 0.0, 1.0)
    level = np.minimum((frac * LEVELS).astype(int), LEVELS - 1)
    # A difference of two float sums can miss zero by rounding: treat that as no change.
    idle = np.abs(values) <= 1e-9 * max(abs(scale.cmin), abs(scale.cmax))
    return np.where(idle, -1, level)


def _cell_traces(topology: Topology, drawings: Sequence[_LinkDrawing], panel: _Panel, z: int,
                 labels: list[str], chip_hover: list[str], cell_px: float) -> list[go.Scatter]:
    """Lanes (one trace per colour step, idle first), chips, then arrows on top."""
    members = [i for i, d in enumerate(drawings) if d.plane == z]
    levels = _levels(panel.values[members], panel.scale) if members else np.array([], int)
    colours = [IDLE_COLOR, *pcolors.sample_colorscale(
        pcolors.get_colorscale(panel.scale.colorscale),
        [(k + 0.5) / LEVELS for k in range(LEVELS)])]
    traces: list[go.Scatter] = []
    for level, colour in zip(range(-1, LEVELS), colours, strict=True):
        xs: list[float | None] = []
        ys: list[float | None] = []
        for i, lvl in zip(members, levels.tolist(), strict=True):
            for lane in drawings[i].lanes if lvl == level else ():
                xs += [p[0] for p in lane] + [None]
                ys += [p[1] for p in lane] + [None]
        traces.append(go.Scatter(
            x=xs, y=ys, mode="lines", hoverinfo="skip", meta="link-lanes",
            line={"color": colour, "width": max(2.0, cell_px * 0.055)}))
    on_plane = [c for c in range(topology.num_chips)
                if topology.ndim < 3 or topology.chip_coords[c, 2] == z]
    traces.append(go.Scatter(
        x=[_screen(topology.chip_coords[c])[0] for c in on_plane],
        y=[_screen(topology.chip_coords[c])[1] for c in on_plane],
        mode="markers+text", meta="chips", text=[labels[c] for c in on_plane],
        hovertext=[chip_hover[c] for c in on_plane], hovertemplate="%{hovertext}<extra></extra>",
        textfont={"size": 11 if cell_px > 50 else 9},
        marker={"symbol": "square", "size": float(np.clip(cell_px * 0.3, 14, 30)),
                "color": "white", "line": {"color": "#444", "width": 1}}))
    traces.append(go.Scatter(
        x=[drawings[i].anchor[0] for i in members], y=[drawings[i].anchor[1] for i in members],
        mode="markers", meta="links", name=panel.title,
        customdata=[list(panel.customdata[i]) for i in members],
        hovertext=[panel.hover[i] for i in members], hovertemplate="%{hovertext}<extra></extra>",
        marker={"symbol": [drawings[i].symbol for i in members],
                "angle": [drawings[i].angle for i in members],
                "color": panel.values[members].tolist(), "coloraxis": panel.scale.coloraxis,
                "size": float(np.clip(cell_px * 0.15, 8, 14)),
                # Arrows get a thin outline; the open z glyphs are all stroke, so a thick one.
                "line": {"color": "#555",
                         "width": [0.6 if drawings[i].symbol == "arrow" else 2.0
                                   for i in members]}}))
    return traces


def _chip_labels(topology: Topology, placement: Sequence[int] | np.ndarray | None
                 ) -> tuple[list[str], list[str]]:
    """Label (device or logical ids) and hover text per row-major chip index."""
    devices = topology.device_grid().reshape(topology.num_chips, -1)
    logical = None
    if placement is not None:
        order = np.asarray(placement)
        if sorted(order.tolist()) != list(range(topology.num_devices)):
            raise AoizoraError(
                f"placement must be a permutation of the {topology.num_devices} device indices "
                f"of {topology.name} (entry i: the device of logical device i); got "
                f"{order.tolist()[:32]}."
            )
        logical = np.empty(topology.num_devices, dtype=np.int64)
        logical[order] = np.arange(topology.num_devices)
    labels, hover = [], []
    for chip in range(topology.num_chips):
        ids = devices[chip].tolist()
        coords = ",".join(map(str, topology.chip_coords[chip].tolist()))
        lines = [f"chip {chip} at ({coords})",
                 f"device{'s' if len(ids) > 1 else ''} {', '.join(map(str, ids))}"]
        if logical is None:
            labels.append(",".join(map(str, ids)))
        else:
            placed = logical[ids].tolist()
            labels.append(",".join(map(str, placed)))
            lines.append(f"logical device{'s' if len(placed) > 1 else ''} "
                         f"{', '.join(map(str, placed))}")
        hover.append("<br>".join(lines))
    return labels, hover


def _coloraxis(fig: go.Figure, scale: _ColourScale, cells: list[tuple[int, int]]
               ) -> dict[str, Any]:
    """The colour axis, its bar to the right of the subplots that use it, as tall as they are."""
    subplots = [fig.get_subplot(r, c) for r, c in cells]
    right = max(s.xaxis.domain[1] for s in subplots)
    bottom = min(s.yaxis.domain[0] for s in subplots)
    top = max(s.yaxis.domain[1] for s in subplots)
    return {
        "colorscale": scale.colorscale, "cmin": scale.cmin, "cmax": scale.cmax,
        "colorbar": {"title": {"text": scale.title, "side": "right"},
                     "tickformat": scale.tickformat, "ticksuffix": scale.ticksuffix,
                     "x": right + 0.01, "xanchor": "left", "y": (bottom + top) / 2,
                     "yanchor": "middle", "len": max(top - bottom, 0.3), "thickness": 12},
    }


def _legend_text(view: SliceView) -> str:
    topology = view.topology
    first = ["x across, y down", "each direction keeps to its right-hand lane",
             view.label_kind]
    second = ["hover an arrow for its load"]
    if any(topology.wrap[:2]):
        second.append("edge stubs: wraparound links")
    if topology.ndim == 3:
        second.append("⊙ +z link, ⊗ −z link")
    lines = [" · ".join(first), " · ".join(second)]
    if view.note:
        lines.append(view.note)
    return "<br>".join(lines)
