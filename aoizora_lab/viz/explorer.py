"""Switching between many link-load heatmaps: a static dropdown figure and a live widget.

A notebook compares many views of one slice: the load of each candidate, each of its
placements, each collective. Two ways to flip through them:

- :func:`heatmap_explorer_figure` is ONE plotly figure with a dropdown (``updatemenus``):
  each button restyles the link traces with its view's data, so it works in a static HTML
  report, with no kernel. Every view is stored in the page, so keep the views to a few dozen.
- :func:`heatmap_explorer_widget` is an ipywidgets explorer for JupyterLab: one dropdown per
  key level (candidate, placement, collective), each narrowed to what exists under the
  levels before it, and the figure re-rendered on every change.

By default every view shares one bytes scale topped by the busiest link of all views, so the
same colour means the same bytes whichever view is shown. Example: ``views = {"compact":
a, "scattered": b}`` gives a dropdown of two buttons; picking "scattered" swaps ``b``'s
bytes into the lanes, arrows and hover text.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import plotly.graph_objects as go

from aoizora_lab.errors import AoizoraError
from aoizora_lab.topology import Topology
from aoizora_lab.viz.display import display_bundle
from aoizora_lab.viz.loads import CollectivesByLink
from aoizora_lab.viz.torus import LinkValue, check_link_bytes, default_title, torus_heatmap

_CHANGING = ("link-lanes", "links")  # trace roles whose data differ between views
MENU_ROOM_PX = 45  # the dropdown menu and its padding, added above the panels


def heatmap_explorer_figure(
    topology: Topology,
    views: Mapping[str, np.ndarray],
    *,
    title: str | None = None,
    collectives_by_view: Mapping[str, CollectivesByLink] | None = None,
    value: LinkValue = "bytes",
    shared_scale: bool = True,
) -> go.Figure:
    """One figure with a dropdown button per named view (``name -> link_bytes``).

    The figure opens on the first view. Each button is an ``"update"`` whose args are
    ``[trace data, layout, trace indices]``: ``x``/``y`` of the lanes, ``customdata``,
    ``hovertext`` and ``marker.color`` of the arrows, and the title (and colour range when
    ``shared_scale=False``). ``collectives_by_view`` adds per-link collective lists to the hover.
    """
    if not views:
        raise AoizoraError("heatmap_explorer_figure needs at least one view (name -> link_bytes).")
    loads = {str(name): check_link_bytes(topology, data) for name, data in views.items()}
    top = _shared_top(loads.values()) if shared_scale else None
    base = title or default_title(topology)
    users = collectives_by_view or {}
    figures = {name: torus_heatmap(topology, data, title=f"{base} — {name}", value=value,
                                   collectives_by_link=users.get(name), cmax=top)
               for name, data in loads.items()}
    first = next(iter(figures.values()))
    changing = [i for i, trace in enumerate(first.data) if trace.meta in _CHANGING]
    buttons = []
    for name, fig in figures.items():
        restyle = {
            "x": [_plain(fig.data[i].x) for i in changing],
            "y": [_plain(fig.data[i].y) for i in changing],
            "customdata": [_plain(fig.data[i].customdata) for i in changing],
            "hovertext": [_plain(fig.data[i].hovertext) for i in changing],
            "marker.color": [_plain(fig.data[i].marker.color) for i in changing],
        }
        relayout = {"title.text": fig.layout.title.text,
                    "coloraxis.cmin": fig.layout.coloraxis.cmin,
                    "coloraxis.cmax": fig.layout.coloraxis.cmax}
        buttons.append({"label": name, "method": "update", "args": [restyle, relayout, changing]})
    explorer = go.Figure(first)
    # The menu sits above the panels, under the title: grow the top margin to make room.
    explorer.update_layout(
        height=explorer.layout.height + MENU_ROOM_PX,
        margin={"t": explorer.layout.margin.t + MENU_ROOM_PX},
        updatemenus=[{
            "type": "dropdown", "buttons": buttons, "active": 0, "showactive": True,
            "direction": "down", "x": 0.0, "xanchor": "left", "y": 1.0, "yanchor": "bottom",
            "pad": {"b": 30},
        }])
    return explorer


class HeatmapExplorer:
    """A JupyterLab explorer of link-load views, keyed by (candidate, placement, collective).

    Not a frozen value like the rest of the library: it is a live UI whose selection changes.
    ``dropdowns`` holds one ``ipywidgets.Dropdown`` per level, ``output`` the rendered figure,
    ``widget`` the whole box (the explorer also displays itself as the last line of a cell),
    and ``figure`` the plotly figure of the current selection.
    """

    def __init__(
        self,
        topology: Topology,
        views: Mapping[Any, np.ndarray],
        *,
        levels: Sequence[str],
        title: str | None,
        collectives_by_view: Mapping[Any, CollectivesByLink] | None,
        value: LinkValue,
        shared_scale: bool,
    ) -> None:
        import ipywidgets as widgets

        self.topology = topology
        self.levels = tuple(levels)
        self.views = {_key(k, self.levels): check_link_bytes(topology, v)
                      for k, v in views.items()}
        if not self.views:
            raise AoizoraError("heatmap_explorer_widget needs at least one view.")
        self.collectives_by_view = {_key(k, self.levels): v
                                    for k, v in (collectives_by_view or {}).items()}
        self.value = value
        self.top = _shared_top(self.views.values()) if shared_scale else None
        self.title = title or default_title(topology)
        self.dropdowns = {level: widgets.Dropdown(description=level) for level in self.levels}
        self.output = widgets.Output()
        self.widget = widgets.VBox([widgets.HBox(list(self.dropdowns.values())), self.output])
        self.figure = go.Figure()
        self._syncing = False
        self._narrow(0)
        self._render()
        for depth, dropdown in enumerate(self.dropdowns.values()):
            dropdown.observe(functools.partial(self._changed, depth), names="value")

    @property
    def selection(self) -> tuple[str, ...]:
        """The key of the view on show."""
        return tuple(d.value for d in self.dropdowns.values())

    def _changed(self, depth: int, _change: Any) -> None:
        if self._syncing:  # our own narrowing of the later dropdowns: render once, at the end
            return
        self._narrow(depth + 1)
        self._render()

    def _narrow(self, start: int) -> None:
        """Offer in each dropdown from ``start`` on only what exists under the earlier choices,
        keeping a choice where it still exists."""
        self._syncing = True
        try:
            dropdowns = list(self.dropdowns.values())
            for depth in range(start, len(dropdowns)):
                chosen = tuple(d.value for d in dropdowns[:depth])
                options = list(dict.fromkeys(k[depth] for k in self.views
                                             if k[:depth] == chosen))
                keep = dropdowns[depth].value
                dropdowns[depth].options = options
                dropdowns[depth].value = keep if keep in options else options[0]
        finally:
            self._syncing = False

    def _render(self) -> None:
        key = self.selection
        self.figure = torus_heatmap(
            self.topology, self.views[key], title=f"{self.title} — {' / '.join(key)}",
            collectives_by_link=self.collectives_by_view.get(key), value=self.value,
            cmax=self.top)
        # Set the outputs directly: works without a kernel, and replaces rather than appends.
        self.output.outputs = ({"output_type": "display_data",
                                "data": display_bundle(self.figure), "metadata": {}},)

    def _repr_mimebundle_(self, **kwargs: Any) -> Any:
        return self.widget._repr_mimebundle_(**kwargs)


def heatmap_explorer_widget(
    topology: Topology,
    views: Mapping[Any, np.ndarray],
    *,
    levels: Sequence[str] = ("candidate", "placement", "collective"),
    title: str | None = None,
    collectives_by_view: Mapping[Any, CollectivesByLink] | None = None,
    value: LinkValue = "bytes",
    shared_scale: bool = True,
) -> HeatmapExplorer:
    """An ipywidgets explorer of ``views``: ``(candidate, placement, collective) -> link_bytes``.

    Keys are tuples with one entry per name in ``levels`` (a plain string is a one-level key).
    Build them with :func:`collective_views`, e.g. ``{(cand, place, coll): bytes for coll,
    bytes in collective_views(program, topo, placement).items()}``. Put the explorer last in
    a cell (or ``display(explorer.widget)``); ``explorer.figure`` is the figure on show.
    """
    return HeatmapExplorer(topology, views, levels=levels, title=title,
                           collectives_by_view=collectives_by_view, value=value,
                           shared_scale=shared_scale)


def _shared_top(loads: Any) -> float:
    """Top of a colour scale shared by ``loads``: the busiest link of any (1 if all idle)."""
    top = max(float(np.max(data, initial=0.0)) for data in loads)
    return top if top > 0 else 1.0


def _plain(data: Any) -> Any:
    """Trace data as nested JSON-ready lists (plotly keeps tuples and arrays), ``None`` kept."""
    if data is None:
        return None
    if isinstance(data, np.ndarray):
        return data.tolist()
    return [_plain(item) if isinstance(item, (tuple, list, np.ndarray)) else item
            for item in data]


def _key(key: Any, levels: tuple[str, ...]) -> tuple[str, ...]:
    parts = tuple(map(str, key)) if isinstance(key, tuple) else (str(key),)
    if len(parts) != len(levels):
        raise AoizoraError(
            f"View key {key!r} has {len(parts)} parts but levels are {list(levels)}; key every "
            f"view by one value per level, e.g. {tuple(levels)!r}."
        )
    return parts
