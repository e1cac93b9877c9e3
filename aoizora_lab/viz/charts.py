"""Charts of the pipeline's results: why candidates drop out, where communication goes, and
how plans rank.

- :func:`exclusion_chart` reads a :class:`~aoizora_lab.candidates.CandidateSpace` and draws
  its :meth:`~aoizora_lab.candidates.CandidateSpace.exclusions`: one bar per exclusion reason,
  the combinations it rules out.
- :func:`pruning_scatter` reads a :class:`~aoizora_lab.prune.Pruning` and plots every traced
  candidate at its IR lower bound and estimate, coloured by its
  :class:`~aoizora_lab.prune.Verdict`.
- :func:`traffic_chart` reads a :class:`~aoizora_lab.compile.Compiles` and stacks each compiled
  candidate's collective bytes by kind and schedule (:meth:`~aoizora_lab.compile.Compiles.
  traffic`).
- :func:`collective_breakdown` reads the frame of :func:`aoizora_lab.cost.breakdown` (also
  ``Plan.breakdown``) and shows time per collective as horizontal bars, heaviest on top,
  stacked by kind; collectives below ``min_share`` of the total, or past the ``top``
  heaviest, are merged into one "other" bar so a program with 200 collectives still reads at
  a glance. Example: 3 all-gathers of 400, 300 and 1 µs with ``min_share=0.01`` give bars for
  the two large ones and "other (1 collective)".
- :func:`ranking_scatter` reads ``PlanResult.ranking.to_frame()`` and plots each (candidate,
  placement) at its compute and communication time, best starred.
- :func:`generation_chart` reads ``Generation.to_frame()`` and shows a whole video's seconds
  part by part (text encoder, each expert's steps, VAE decode), each with its share.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

import pandas as pd
import plotly.graph_objects as go

from aoizora_lab.errors import AoizoraError
from aoizora_lab.prune import Verdict
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
VERDICT_COLORS = {
    Verdict.KEPT_BEST: "#54A24B",
    Verdict.KEPT: "#88D27A",
    Verdict.OVER_HBM: "#E45756",
    Verdict.CANNOT_WIN: "#F58518",
    Verdict.UNLIKELY: "#ECA82C",
    Verdict.OVER_BUDGET: "#9D755D",
    Verdict.TRACE_FAILED: OTHER_COLOR,
}
"""One colour per pruning verdict: greens kept, warm hues dropped."""

if TYPE_CHECKING:
    from aoizora_lab.candidates import CandidateSpace
    from aoizora_lab.compile import Compiles
    from aoizora_lab.prune import Pruning
    from aoizora_lab.uncertainty import Assessment


def collective_breakdown(
    frame: pd.DataFrame,
    *,
    by: str = "collective",
    top: int = 12,
    min_share: float = 0.01,
    title: str | None = None,
) -> go.Figure:
    """Horizontal bars of communication time per ``by`` value (collective, or e.g. ``loop``).

    ``frame`` has :func:`aoizora_lab.cost.breakdown`'s columns (``collective``, ``kind``, ``count``,
    ``group_size``, ``seconds``, ``hidden_s``, ``exposed_s``, ``busiest_link``...); only ``by``
    and ``seconds`` are required. Bars are stacked by ``kind`` when the column exists, and each
    kind's part splits into what the schedule leaves exposed (solid) and what it hides behind
    compute (hatched) when ``exposed_s`` is there; the ``top`` heaviest bars holding at least
    ``min_share`` of the total stay, the rest merge into "other".
    """
    _require(frame, [by, "seconds"], "collective_breakdown", "aoizora_lab.cost.breakdown(...)")
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
    # Exposed (solid) and hidden (hatched) parts when the schedule was read, else one part.
    parts = ([("exposed_s", "exposed", ""), ("hidden_s", "hidden", "/")]
             if {"exposed_s", "hidden_s"} <= set(rows) else [("seconds", "", "")])
    traces = []
    for kind in kinds:
        part = rows if kind is None else rows[rows["kind"] == kind]
        bars = [(bar, part[part["bar"] == bar]) for bar in order if (part["bar"] == bar).any()]
        for column, label, hatch in parts:
            traces.append(go.Bar(
                orientation="h", name=" ".join(filter(None, [kind or "time", label])),
                x=[float(g[column].sum()) * factor for _, g in bars],
                y=[bar for bar, _ in bars],
                hovertext=[_bar_hover(bar, g, by, grand) for bar, g in bars],
                hovertemplate="%{hovertext}<extra></extra>",
                marker={"color": KIND_COLORS.get(kind, OTHER_COLOR),
                        "pattern": {"shape": hatch}, "opacity": 0.55 if hatch else 1.0}))
    exposed = (f", {format_seconds(float(rows['exposed_s'].sum()))} of it exposed"
               if "exposed_s" in rows else "")
    fig = go.Figure(traces)
    fig.update_layout(
        title={"text": title or f"Communication time per step, by {by}",
               "subtitle": {"text": f"total {format_seconds(grand)} over {len(rows)} "
                                    f"collective{'s' if len(rows) != 1 else ''}{exposed}"}},
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

    ``frame`` has ``PlanResult.ranking.to_frame()``'s columns (``candidate``, ``placement``,
    ``description``, ``source``, ``compute_s``, ``comm_s``, ``total_s``); ``description`` and
    ``source`` are optional. One colour per candidate, in order of its best total; the row with
    the lowest ``total_s`` gets a star. ``y="total_s"`` plots predicted step time instead.
    """
    if y not in ("comm_s", "total_s"):
        raise AoizoraError(f"ranking_scatter y={y!r}; use 'comm_s' or 'total_s'.")
    _require(frame, ["candidate", "compute_s", "comm_s", "total_s"], "ranking_scatter",
             "PlanResult.ranking.to_frame()")
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
        title={"text": title or ("Ranking: compute vs communication per step" if y == "comm_s"
                                 else "Ranking: compute vs predicted step time"),
               "subtitle": {"text": f"best: {best['candidate']}{described} · total "
                                    f"{format_seconds(float(best['total_s']))}"}},
        template="plotly_white", legend_title_text="candidate", height=480,
        xaxis={"title": f"compute per step ({unit})"},
        yaxis={"title": ("communication per step" if y == "comm_s"
                         else "predicted step time") + f" ({unit})", "rangemode": "tozero"},
        margin={"t": 90},
    )
    return fig


def step_bands(assessment: Assessment, *, top: int = 12, title: str | None = None
               ) -> go.Figure:
    """Each option's predicted step under every draw of the ensemble, as a horizontal violin
    with its median, 80 % interval and the default model's step (a diamond); the plan and the
    systems marked. ``assessment`` is :func:`aoizora_lab.uncertainty.assess`'s; the ``top``
    fastest medians are shown, and every system's own setup."""
    if not len(assessment):
        raise AoizoraError("step_bands got an empty assessment; assess a plan first.")
    shown = [o for i, o in enumerate(assessment) if i < top or not o.ours]
    factor, unit = time_scale(max(float(o.steps.max()) for o in shown))
    traces = []
    for option in reversed(shown):  # fastest at the top
        colour = ("#d62728" if option.label == assessment.plan else
                  "#7f7f7f" if not option.ours else "#1f77b4")
        traces.append(go.Violin(
            x=(option.steps * factor).tolist(), y=[option.label] * len(option.steps),
            orientation="h", name=option.label, line_color=colour, showlegend=False,
            points=False, box_visible=False, meanline_visible=False, width=0.9,
            hoverinfo="skip"))
        traces.append(go.Scatter(
            x=[option.low_s * factor, option.high_s * factor], y=[option.label] * 2,
            mode="lines", line={"color": colour, "width": 4}, showlegend=False,
            hovertemplate=(f"{option.label}<br>80 %: {format_seconds(option.low_s)} - "
                           f"{format_seconds(option.high_s)}<extra></extra>")))
        traces.append(go.Scatter(
            x=[option.median_s * factor, option.point_s * factor], y=[option.label] * 2,
            mode="markers", marker={"symbol": ["line-ns-open", "diamond"], "size": [16, 9],
                                    "color": colour, "line": {"width": 2, "color": colour}},
            showlegend=False,
            hovertemplate=(f"{option.label}<br>median {format_seconds(option.median_s)}, "
                           f"default model {format_seconds(option.point_s)}<extra></extra>")))
    fig = go.Figure(traces)
    fig.update_layout(
        title={"text": title or "How sure: each option's step under the model's uncertainty",
               "subtitle": {"text": f"{assessment.ensemble.count} draws; bar: 80 % interval, "
                                    "tick: median, diamond: default model; red: the plan, "
                                    "grey: the systems in their own order"}},
        template="plotly_white", height=max(320, 34 * len(shown) + 140),
        xaxis={"title": f"predicted step ({unit})"}, margin={"t": 90, "l": 10},
        yaxis={"automargin": True})
    return fig


def exclusion_chart(space: CandidateSpace, *, title: str | None = None) -> go.Figure:
    """Horizontal bars: how many combinations each exclusion reason rules out, most on top.

    ``space`` is :func:`~aoizora_lab.candidates.explain_candidates`' result; the bars are its
    :meth:`~aoizora_lab.candidates.CandidateSpace.exclusions` (an option breaking several rules
    counts under each), the hover lists example names. A space with every option valid gives
    an empty chart that says so.
    """
    reasons = space.exclusions()
    invalid = sum(1 for option in space if not option.valid)
    bars = reasons.iloc[::-1]  # plotly draws categories bottom-up: heaviest on top
    fig = go.Figure(go.Bar(
        orientation="h", x=bars["combinations"].tolist(), y=bars["reason"].tolist(),
        hovertext=[f"<b>{r}</b><br>{n} combination{'s' if n != 1 else ''}<br>e.g. {e}"
                   for r, n, e in zip(bars["reason"], bars["combinations"], bars["examples"],
                                      strict=True)],
        hovertemplate="%{hovertext}<extra></extra>", marker={"color": KIND_COLORS["all-reduce"]},
        name="excluded"))
    fig.update_layout(
        title={"text": title or "Why combinations were excluded",
               "subtitle": {"text": f"{invalid} of {len(space)} combinations excluded, by "
                                    f"{len(reasons)} reason{'s' if len(reasons) != 1 else ''}"
                                    if invalid else "every combination is valid"}},
        template="plotly_white", xaxis_title="combinations", yaxis={"title": None},
        height=160 + 32 * max(1, len(reasons)), margin={"t": 90, "l": 20})
    return fig


def pruning_scatter(pruning: Pruning, *, title: str | None = None) -> go.Figure:
    """IR estimate vs lower bound of every traced candidate, one colour per verdict.

    ``pruning`` is :func:`~aoizora_lab.prune.prune`'s result. Each point is a candidate at its
    lower bound (x) and estimate (y), coloured and named by its
    :class:`~aoizora_lab.prune.Verdict`; kept candidates are circles, dropped ones crosses; the
    hover gives the reason. A dotted line marks estimate = lower bound (no point lies below
    it). Candidates whose trace failed have no figures and are only counted in the subtitle.
    """
    traced = [d for d in pruning if d.estimate is not None]
    largest = max((max(d.estimate.estimate_seconds, d.estimate.lower_bound_seconds)
                   for d in traced), default=0.0)
    factor, unit = time_scale(largest)
    traces = []
    for verdict in Verdict:
        mine = [d for d in traced if d.verdict is verdict]
        if not mine:
            continue
        traces.append(go.Scatter(
            x=[d.estimate.lower_bound_seconds * factor for d in mine],
            y=[d.estimate.estimate_seconds * factor for d in mine],
            mode="markers", name=verdict.value, meta="verdict",
            hovertext=[_decision_hover(d) for d in mine],
            hovertemplate="%{hovertext}<extra></extra>",
            marker={"size": 11, "color": VERDICT_COLORS[verdict], "opacity": 0.9,
                    "symbol": "circle" if verdict.keep else "x",
                    "line": {"width": 0.5, "color": "#333"}}))
    if traced:
        traces.append(go.Scatter(
            x=[0, largest * factor], y=[0, largest * factor], mode="lines",
            name="estimate = lower bound", meta="diagonal", hoverinfo="skip",
            line={"dash": "dot", "color": OTHER_COLOR, "width": 1}))
    failed = len(pruning) - len(traced)
    kept = sum(1 for d in pruning if d.verdict.keep)
    fig = go.Figure(traces)
    fig.update_layout(
        title={"text": title or "IR estimate vs lower bound per candidate",
               "subtitle": {"text": f"{kept} kept of {len(traced)} traced"
                                    + (f"; {failed} trace{'s' if failed != 1 else ''} failed "
                                       "(not shown)" if failed else "")}},
        template="plotly_white", legend_title_text="verdict", height=480,
        xaxis={"title": f"lower bound ({unit})", "rangemode": "tozero"},
        yaxis={"title": f"estimate ({unit})", "rangemode": "tozero"}, margin={"t": 90})
    return fig


def traffic_chart(compiled: Compiles, *, title: str | None = None) -> go.Figure:
    """Collective GB per device per step of each compiled program, stacked by kind and
    schedule.

    ``compiled`` is :func:`~aoizora_lab.compile.compile_candidates`' result or a plan's
    compiles; the bars are its :meth:`~aoizora_lab.compile.Compiles.traffic`: one bar per
    ``ok`` compile (labelled by its ``program``; compile order, top to bottom), one segment
    per collective kind, hatched where the compiler scheduled it asynchronously (it may hide
    behind compute), solid where it is synchronous.
    """
    traffic = compiled.traffic()
    candidates = list(dict.fromkeys(traffic["program"]))
    traces = []
    for (kind, schedule), part in traffic.groupby(["kind", "schedule"], sort=True):
        traces.append(go.Bar(
            orientation="h", name=f"{kind} ({schedule})", meta=schedule,
            x=part["gb"].tolist(), y=part["program"].tolist(),
            hovertext=[f"<b>{c}</b><br>{kind} ({schedule}): {format_bytes(gb * 1e9)} per "
                       "device per step" for c, gb in zip(part["program"], part["gb"],
                                                          strict=True)],
            hovertemplate="%{hovertext}<extra></extra>",
            marker={"color": KIND_COLORS.get(kind, OTHER_COLOR),
                    "pattern": {"shape": "/" if schedule == "async" else ""}}))
    fig = go.Figure(traces)
    fig.update_layout(
        title={"text": title or "Collective bytes per device per step (compiled HLO)",
               "subtitle": {"text": f"{len(candidates)} compiled program"
                                    f"{'s' if len(candidates) != 1 else ''}; hatched: "
                                    "asynchronous (may hide behind compute)"}},
        barmode="stack", template="plotly_white", legend_title_text="collective",
        xaxis_title="GB per device per step",
        yaxis={"categoryorder": "array", "categoryarray": candidates[::-1], "title": None},
        height=180 + 30 * max(1, len(candidates)), margin={"t": 90})
    return fig


PART_COLORS = {"text encoder": "#B279A2", "VAE encode (image condition)": "#EECA3B",
               "expert swaps (host -> HBM)": "#9D755D", "VAE decode": "#F58518"}
"""The non-DiT parts' colours; every DiT row (one per expert) is blue."""


def generation_chart(frame: pd.DataFrame, *, title: str | None = None) -> go.Figure:
    """A whole video's TPU seconds, one bar per part (``Generation.to_frame()``: its
    ``part``, ``plan``, ``per_call_s``, ``calls``, ``seconds`` and ``share`` columns), in the
    order they run, each labelled with its share of the video."""
    _require(frame, ["part", "plan", "per_call_s", "calls", "seconds", "share"],
             "generation_chart", "Generation.to_frame()")
    factor, unit = time_scale(float(frame["seconds"].max()))
    total = float(frame["seconds"].sum())
    fig = go.Figure(go.Bar(
        orientation="h", x=(frame["seconds"] * factor).tolist(),
        y=frame["part"].tolist(),
        text=[f"{share:.0%}" for share in frame["share"]], textposition="auto",
        marker={"color": [PART_COLORS.get(part, KIND_COLORS["all-gather"])
                          for part in frame["part"]]},
        hovertext=[f"<b>{row.part}</b><br>{row.plan}<br>{format_seconds(row.per_call_s)} x "
                   f"{row.calls} = {format_seconds(row.seconds)}"
                   for row in frame.itertuples()],
        hovertemplate="%{hovertext}<extra></extra>"))
    fig.update_layout(
        title={"text": title or "Where a video's time goes (predicted TPU seconds)",
               "subtitle": {"text": f"{format_seconds(total)} in all; host work (tokenising, "
                                    "copying the video out) not modelled"}},
        template="plotly_white", xaxis_title=f"per video ({unit})",
        yaxis={"categoryorder": "array", "categoryarray": frame["part"].tolist()[::-1],
               "title": None},
        height=160 + 40 * len(frame), margin={"t": 90})
    return fig


def _require(frame: pd.DataFrame, columns: Sequence[str], who: str, source: str) -> None:
    """Refuse a frame without ``columns``, naming the call that makes one (``source``)."""
    missing = [c for c in columns if c not in frame.columns]
    if missing:
        raise AoizoraError(
            f"{who} needs columns {missing} that the frame lacks (it has "
            f"{list(frame.columns)}); pass {source}."
        )


def _bar_hover(bar: str, rows: pd.DataFrame, by: str, grand: float) -> str:
    seconds = float(rows["seconds"].sum())
    share = f" ({seconds / grand:.0%} of all)" if grand > 0 else ""
    lines = [f"<b>{bar}</b>"]
    hidden = (f"hidden behind compute: {format_seconds(float(rows['hidden_s'].sum()))}, "
              f"exposed: {format_seconds(float(rows['exposed_s'].sum()))}"
              if {"hidden_s", "exposed_s"} <= set(rows) else None)
    if len(rows) == 1:
        row = rows.iloc[0]
        if str(row[by]) != bar:  # a lone collective merged into "other": name it
            lines[0] = f"<b>{row[by]}</b> (in {bar})"
        if "kind" in row:
            lines.append(f"kind: {row['kind']}")
        lines.append(f"time per step: {format_seconds(seconds)}{share}")
        if hidden:
            lines.append(hidden)
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
    if hidden:
        lines.append(hidden)
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


def _decision_hover(decision) -> str:  # a PruneDecision with an estimate
    e = decision.estimate
    return "<br>".join([
        f"<b>{decision.candidate.name}</b> · {decision.verdict.value}",
        f"estimate: {format_seconds(e.estimate_seconds)}",
        f"lower bound: {format_seconds(e.lower_bound_seconds)}",
        f"communication: {format_bytes(e.comm_bytes)} per device",
        decision.reason])
