"""Charts of the planner's tables: where communication time goes, and how plans rank.

:func:`collective_breakdown` reads ``planner.breakdown()``'s frame and shows time per
collective as horizontal bars, heaviest on top, stacked by kind; collectives below
``min_share`` of the total, or past the ``top`` heaviest, are merged into one "other" bar
so a program with 200 collectives still reads at a glance. Example: 3 all-gathers of 400,
300 and 1 µs with ``min_share=0.01`` give bars for the two large ones and "other
(1 collective)". :func:`ranking_scatter` reads ``PlanResult.placements`` and plots each
(candidate, placement) at its compute and communication time, best starred.
"""

from __future__ import annotations

from collections.abc import Sequence

import pandas as pd
import plotly.graph_objects as go

from aoizora_lab.errors import AoizoraError
from aoizora_lab.viz.units import format_bytes, format_seconds, time_scale

# Tableau 10 hues: distinct for common colour-vision deficiencies, stable across figures.
KIND_COLORS = {
    "all-gather": "#4C78A8",
    "reduce-scatter": "#F58518",
    "all-reduce": "#E45756",
    "all-to-all": "#72B7B2",
    "collective-permute": "#54A24B",
}
OTHER_COLOR = "#9D9D9D"
MAX_LISTED = 5  # collectives named in the hover of a merged bar


def collective_breakdown(
    frame: pd.DataFrame,
    *,
    by: str = "collective",
    top: int = 12,
    min_share: float = 0.01,
    title: str | None = None,
) -> go.Figure:
    """Horizontal bars of communication time per ``by`` value (collective, or e.g. ``loop``).

    ``frame`` has ``planner.breakdown()``'s columns (``collective``, ``kind``, ``count``,
    ``group_size``, ``seconds``, ``busiest_link``, ``busiest_bytes``); only ``by`` and
    ``seconds`` are required. Bars are stacked by ``kind`` when the column exists; the
    ``top`` heaviest bars holding at least ``min_share`` of the total stay, the rest merge into
    "other".
    """
    _require(frame, [by, "seconds"], "collective_breakdown")
    rows = frame.copy()
    totals = (rows.groupby(by, sort=False)["seconds"].sum()
              .sort_values(ascending=False, kind="stable"))
    grand = float(totals.sum())
    kept = [name for name in totals.index[:top]
            if grand <= 0 or totals[name] >= min_share * grand]
    merged = len(totals) - len(kept)
    noun = "collective" if by == "collective" else f"{by} value"
    other = f"other ({merged} {noun}{'s' if merged != 1 else ''})"
    rows["bar"] = rows[by].where(rows[by].isin(kept), other)
    order = [*kept, other] if merged else kept
    factor, unit = time_scale(float(totals.max()) if len(totals) else 0.0)
    kinds = list(dict.fromkeys(rows["kind"])) if "kind" in rows else [None]
    traces = []
    for kind in kinds:
        part = rows if kind is None else rows[rows["kind"] == kind]
        bars = [(bar, part[part["bar"] == bar]) for bar in order if (part["bar"] == bar).any()]
        traces.append(go.Bar(
            orientation="h", name=kind or "time",
            x=[float(g["seconds"].sum()) * factor for _, g in bars],
            y=[bar for bar, _ in bars],
            hovertext=[_bar_hover(bar, g, by, grand) for bar, g in bars],
            hovertemplate="%{hovertext}<extra></extra>",
            marker={"color": KIND_COLORS.get(kind, OTHER_COLOR)}))
    fig = go.Figure(traces)
    fig.update_layout(
        title={"text": title or f"Communication time per step, by {by}",
               "subtitle": {"text": f"total {format_seconds(grand)} over {len(rows)} "
                                    f"collective{'s' if len(rows) != 1 else ''}"}},
        barmode="stack", template="plotly_white", legend_title_text="kind",
        xaxis_title=f"time per step ({unit})",
        # Plotly lists categories bottom-up: reverse so the heaviest bar is on top.
        yaxis={"categoryorder": "array", "categoryarray": order[::-1], "title": None},
        height=150 + 28 * len(order), margin={"t": 90},
    )
    return fig


def ranking_scatter(
    frame: pd.DataFrame,
    *,
    y: str = "comm_s",
    title: str | None = None,
) -> go.Figure:
    """Compute vs communication (or total) time of every ranked (candidate, placement).

    ``frame`` has ``PlanResult.placements``' columns (``candidate``, ``placement``,
    ``description``, ``source``, ``compute_s``, ``comm_s``, ``total_s``); ``description`` and
    ``source`` are optional. One colour per candidate, in order of its best total; the row with
    the lowest ``total_s`` gets a star. ``y="total_s"`` plots predicted step time instead.
    """
    if y not in ("comm_s", "total_s"):
        raise AoizoraError(f"ranking_scatter y={y!r}; use 'comm_s' or 'total_s'.")
    _require(frame, ["candidate", "compute_s", "comm_s", "total_s"], "ranking_scatter")
    if frame.empty:
        raise AoizoraError("ranking_scatter got an empty ranking; plan at least one candidate.")
    ranked = frame.sort_values("total_s", kind="stable").reset_index(drop=True)
    factor, unit = time_scale(float(max(ranked["compute_s"].max(), ranked[y].max())))
    hover = [_rank_hover(row, rank, len(ranked)) for rank, row in ranked.iterrows()]
    traces = []
    for candidate in dict.fromkeys(ranked["candidate"]):  # best total first
        mine = ranked.index[ranked["candidate"] == candidate]
        traces.append(go.Scatter(
            x=(ranked.loc[mine, "compute_s"] * factor).tolist(),
            y=(ranked.loc[mine, y] * factor).tolist(),
            mode="markers", name=str(candidate), hovertext=[hover[i] for i in mine],
            hovertemplate="%{hovertext}<extra></extra>",
            marker={"size": 11, "opacity": 0.85, "line": {"width": 0.5, "color": "#333"}}))
    best = ranked.iloc[0]
    traces.append(go.Scatter(
        x=[float(best["compute_s"]) * factor], y=[float(best[y]) * factor],
        mode="markers+text", name="best", text=["best"], textposition="top center",
        hovertext=[hover[0]], hovertemplate="%{hovertext}<extra></extra>",
        marker={"symbol": "star", "size": 20, "color": "gold",
                "line": {"width": 1, "color": "#333"}}))
    described = f" · {best['description']}" if best.get("description") else ""
    fig = go.Figure(traces)
    fig.update_layout(
        title={"text": title or "Ranking: compute vs communication per step",
               "subtitle": {"text": f"best: {best['candidate']}{described} · total "
                                    f"{format_seconds(float(best['total_s']))}"}},
        template="plotly_white", legend_title_text="candidate", height=480,
        xaxis={"title": f"compute per step ({unit})"},
        yaxis={"title": ("communication per step" if y == "comm_s"
                         else "predicted step time") + f" ({unit})", "rangemode": "tozero"},
        margin={"t": 90},
    )
    return fig


def _require(frame: pd.DataFrame, columns: Sequence[str], who: str) -> None:
    missing = [c for c in columns if c not in frame.columns]
    if missing:
        raise AoizoraError(
            f"{who} needs columns {missing} that the frame lacks (it has "
            f"{list(frame.columns)}); pass planner.breakdown() or PlanResult.placements."
        )


def _bar_hover(bar: str, rows: pd.DataFrame, by: str, grand: float) -> str:
    seconds = float(rows["seconds"].sum())
    share = f" ({seconds / grand:.0%} of all)" if grand > 0 else ""
    lines = [f"<b>{bar}</b>"]
    if len(rows) == 1:
        row = rows.iloc[0]
        if str(row[by]) != bar:  # a lone collective merged into "other": name it
            lines[0] = f"<b>{row[by]}</b> (in {bar})"
        if "kind" in row:
            lines.append(f"kind: {row['kind']}")
        lines.append(f"time per step: {format_seconds(seconds)}{share}")
        if "count" in row:
            lines.append(f"runs per step: {row['count']}")
        if "group_size" in row:
            lines.append(f"group size: {row['group_size']}")
        if "busiest_link" in row:
            carried = (f" ({format_bytes(row['busiest_bytes'])})" if "busiest_bytes" in row
                       else "")
            lines.append(f"busiest link: {row['busiest_link']}{carried}")
        return "<br>".join(lines)
    if "kind" in rows:
        lines.append(f"kind: {rows['kind'].iloc[0]}")
    lines.append(f"time per step: {format_seconds(seconds)}{share}")
    names = rows["collective"].astype(str).tolist() if "collective" in rows else []
    if names:
        listed = ", ".join(names[:MAX_LISTED]) + (", …" if len(names) > MAX_LISTED else "")
        lines.append(f"{len(names)} collectives: {listed}")
    return "<br>".join(lines)


def _rank_hover(row: pd.Series, rank: int, total: int) -> str:
    lines = [f"<b>{row['candidate']}</b> · rank {rank + 1} of {total}"]
    if row.get("description"):
        lines.append(str(row["description"]))
    if row.get("source"):
        lines.append(f"source: {row['source']}")
    lines += [f"compute: {format_seconds(float(row['compute_s']))}",
              f"communication: {format_seconds(float(row['comm_s']))}",
              f"predicted step: {format_seconds(float(row['total_s']))}"]
    return "<br>".join(lines)
