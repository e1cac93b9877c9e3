"""Showing a figure in a notebook so that it survives both JupyterLab and HTML export.

JupyterLab renders the plotly mimetype (``application/vnd.plotly.v1+json``) with the
plotly extension; nbconvert's HTML exporter does not know that mimetype and picks
``text/html`` instead. So :func:`show` publishes both, plus ``text/plain`` for consoles.
The HTML is a ``<div>`` and a ``Plotly.newPlot`` call with *no* plotly.js inside and no CDN
reference: the report pages load plotly.js once, from a file beside them, which keeps every
page small and the reports readable offline.
"""

from __future__ import annotations

import json
from typing import Any

import plotly.graph_objects as go

PLOTLY_MIMETYPE = "application/vnd.plotly.v1+json"
DEFAULT_HEIGHT_PX = 525  # plotly's own notebook default, for figures without a height


def display_bundle(fig: go.Figure) -> dict[str, Any]:
    """The mime bundle :func:`show` publishes: plotly JSON, plotly.js-free HTML, plain text."""
    # Through JSON so numpy arrays become what plotly.js reads, and the bundle serialises.
    spec = json.loads(fig.to_json())
    html = fig.to_html(full_html=False, include_plotlyjs=False, include_mathjax=False,
                       default_width="100%",
                       default_height=f"{fig.layout.height or DEFAULT_HEIGHT_PX}px")
    title = fig.layout.title.text or "untitled"
    return {PLOTLY_MIMETYPE: spec, "text/html": html,
            "text/plain": f"<plotly figure: {title}>"}


def show(fig: go.Figure) -> None:
    """Display ``fig`` in a notebook (use this rather than ``fig.show()`` in notebooks)."""
    from IPython.display import display

    display(display_bundle(fig), raw=True)
