"""Figures for notebooks and HTML reports: pure builders returning plotly figures.

Every builder takes library values (a :class:`~aoizora_lab.Topology`, ``CommEstimate``
link bytes, a stage's typed result such as a ``CandidateSpace``, ``Pruning`` or ``Compiles``,
or a stage's ``.to_frame()``) and returns a ``plotly.graph_objects.Figure``; nothing here
computes a plan, prints or writes files. In a notebook, display figures with
:func:`show` (not ``fig.show()``), which keeps them visible both in JupyterLab and in the
exported HTML reports::

    from aoizora_lab import viz
    link_bytes, users = viz.link_bytes_by_collective(program, topo, placement)
    viz.show(viz.torus_heatmap(topo, link_bytes, collectives_by_link=users))
"""

from aoizora_lab.viz.charts import (
    collective_breakdown,
    exclusion_chart,
    generation_chart,
    pruning_scatter,
    ranking_scatter,
    step_bands,
    traffic_chart,
)
from aoizora_lab.viz.display import display_bundle, show
from aoizora_lab.viz.explorer import (
    HeatmapExplorer,
    heatmap_explorer_figure,
    heatmap_explorer_widget,
)
from aoizora_lab.viz.loads import (
    CollectivesByLink,
    LinkKey,
    collective_names,
    collective_views,
    heaviest_collective_views,
    link_bytes_by_collective,
    ranking_collective_views,
    ranking_views,
)
from aoizora_lab.viz.order import chain_and_ring, order_comparison, ordered_collective
from aoizora_lab.viz.torus import heatmap_comparison, torus_heatmap

__all__ = [
    "CollectivesByLink",
    "HeatmapExplorer",
    "LinkKey",
    "chain_and_ring",
    "collective_breakdown",
    "collective_names",
    "collective_views",
    "display_bundle",
    "exclusion_chart",
    "generation_chart",
    "heatmap_comparison",
    "heatmap_explorer_figure",
    "heatmap_explorer_widget",
    "heaviest_collective_views",
    "link_bytes_by_collective",
    "order_comparison",
    "ordered_collective",
    "pruning_scatter",
    "ranking_collective_views",
    "ranking_scatter",
    "ranking_views",
    "show",
    "step_bands",
    "torus_heatmap",
    "traffic_chart",
]
