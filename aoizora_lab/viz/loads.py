"""Per-link bytes split by collective: the data behind the heatmaps' hover lists and views.

:func:`~aoizora_lab.estimate` prices a program as the sum of its collectives and keeps each
one's per-link bytes in ``CommEstimate.parts``; these helpers regroup those parts by link
(which collectives use this link, and how much?) or by collective (what does this one
collective put on every link?). Example: an all-gather ``"ag"`` over rows and an all-reduce
``"ar"`` over columns of a 4x4 slice share no link, so every link lists exactly one of them.

The explorers' views come from here too: :func:`ranking_views` (one view per ranked placement,
for :func:`~aoizora_lab.viz.heatmap_explorer_figure`), :func:`heaviest_collective_views` (a
program's heaviest collectives) and :func:`ranking_collective_views` ((candidate, placement,
collective) keys for :func:`~aoizora_lab.viz.heatmap_explorer_widget`), each built from the
entries of a :class:`~aoizora_lab.placement.Ranking`.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from aoizora_lab.comm_model import Collective, ModelOptions, estimate
from aoizora_lab.cost import breakdown
from aoizora_lab.errors import AoizoraError
from aoizora_lab.hardware import ChipSpec
from aoizora_lab.topology import Topology

if TYPE_CHECKING:
    from aoizora_lab.hlo import CommProgram
    from aoizora_lab.placement import RankedPlacement

LinkKey = tuple[int, int, int]
"""(source chip, axis, direction) of a directed link: an index into a link-bytes array."""
CollectivesByLink = dict[LinkKey, tuple[tuple[str, float], ...]]
"""Per link, the (collective name, bytes) pairs that use it, heaviest first."""


def collective_names(collectives: Iterable[Collective]) -> list[str]:
    """A distinct label per collective: its HLO ``name``, else its kind, numbered on repeats.

    Example: two unnamed all-gathers and one named ``"ar.3"`` -> ``["all-gather",
    "all-gather #2", "ar.3"]``.
    """
    labels: list[str] = []
    seen: dict[str, int] = {}
    for collective in collectives:
        base = collective.name or collective.kind
        seen[base] = seen.get(base, 0) + 1
        labels.append(base if seen[base] == 1 else f"{base} #{seen[base]}")
    return labels


def link_bytes_by_collective(
    program_or_collectives: Any,
    topology: Topology,
    placement: Sequence[int] | np.ndarray | None = None,
    *,
    chip: ChipSpec | None = None,
    options: ModelOptions | None = None,
) -> tuple[np.ndarray, CollectivesByLink]:
    """Total bytes per directed link, and which collectives put them there.

    ``program_or_collectives`` is a ``CommProgram`` (anything with ``.collectives``), a
    sequence of :class:`Collective` or a single one; ``placement`` maps logical device ids to
    physical devices as in :func:`~aoizora_lab.estimate`. Returns ``(link_bytes,
    collectives_by_link)``: the program's ``[num_chips, ndim, 2]`` array and, for every link
    that carries bytes, ``(name, bytes)`` pairs heaviest first — what
    :func:`~aoizora_lab.viz.torus_heatmap` lists when hovering a link.
    """
    collectives = _collective_list(program_or_collectives)
    result = estimate(collectives, topology, placement, chip=chip, options=options)
    users: dict[LinkKey, list[tuple[str, float]]] = {}
    for name, part in zip(collective_names(collectives), result.parts, strict=True):
        for key in map(tuple, np.argwhere(part.link_bytes > 0).tolist()):
            users.setdefault(key, []).append((name, float(part.link_bytes[key])))
    by_link = {key: tuple(sorted(pairs, key=lambda p: -p[1])) for key, pairs in users.items()}
    return result.link_bytes, by_link


def collective_views(
    program_or_collectives: Any,
    topology: Topology,
    placement: Sequence[int] | np.ndarray | None = None,
    *,
    total: str = "all collectives",
    chip: ChipSpec | None = None,
    options: ModelOptions | None = None,
) -> dict[str, np.ndarray]:
    """Link bytes of the whole program (key ``total``) and of each collective (by its label).

    The dict feeds the explorers: ``heatmap_explorer_figure(topo, collective_views(prog,
    topo, placement))`` switches between the program's load and each collective's.
    """
    collectives = _collective_list(program_or_collectives)
    result = estimate(collectives, topology, placement, chip=chip, options=options)
    views = {total: result.link_bytes}
    views.update(zip(collective_names(collectives), (p.link_bytes for p in result.parts),
                     strict=True))
    return views


def heaviest_collective_views(
    program_or_collectives: Any,
    topology: Topology,
    placement: Sequence[int] | np.ndarray | None = None,
    *,
    top: int = 4,
    prefix: str = "",
    chip: ChipSpec | None = None,
    options: ModelOptions | None = None,
) -> dict[str, np.ndarray]:
    """Link bytes of the ``top`` collectives that take longest on ``placement``, slowest first.

    Keys are the collectives' labels (:func:`collective_names`), after ``prefix`` and `` · ``
    when ``prefix`` is given; an asynchronous collective of a compiled program also says how
    much the schedule hides behind compute: ``heaviest_collective_views(best.program, topo,
    best.placement, prefix="winner")`` -> ``{"winner · all-gather.131 (80% hidden)": ...}``.
    """
    collectives = _collective_list(program_or_collectives)
    result = estimate(collectives, topology, placement, chip=chip, options=options)
    names = collective_names(collectives)
    sites = getattr(program_or_collectives, "sites", ())
    if any(site.asynchronous for site in sites):  # say how much the schedule hides
        frame = breakdown(program_or_collectives, topology, placement, chip=chip,
                          options=options)
        share = (frame["hidden_s"] / frame["seconds"]).where(frame["seconds"] > 0, 0.0)
        hidden = dict(zip(frame["collective"], share, strict=True))
        names = [f"{name} ({hidden.get(c.name, 0.0):.0%} hidden)" if site.asynchronous
                 else name for name, c, site in zip(names, collectives, sites, strict=True)]
    parts = sorted(zip(names, result.parts, strict=True),
                   key=lambda named: -named[1].seconds)[:top]
    lead = f"{prefix} · " if prefix else ""
    return {f"{lead}{name}": part.link_bytes for name, part in parts}


def ranking_views(
    entries: Iterable[RankedPlacement],
    programs: Mapping[tuple[str, str], CommProgram],
    topology: Topology,
    *,
    width: int = 60,
) -> tuple[dict[str, np.ndarray], dict[str, CollectivesByLink]]:
    """One view per ranked placement: its program's link bytes and the collectives per link.

    ``entries`` are :class:`~aoizora_lab.placement.RankedPlacement` values (e.g.
    ``result.ranking[:4]``), ``programs`` the compiled program of each candidate by
    ``(name, flags label)`` (``PlanResult.programs``). Views are labelled ``"#rank candidate ·
    placement"`` (candidate with ``+flags`` where not the compiler's defaults; the
    placement's description cut to ``width`` characters), so two placements never share a
    label. Returns ``(views, collectives_by_view)`` for
    :func:`~aoizora_lab.viz.heatmap_explorer_figure`.
    """
    views: dict[str, np.ndarray] = {}
    users: dict[str, CollectivesByLink] = {}
    for rank, entry in enumerate(entries, start=1):
        name = f"#{rank} {_compiled_name(entry)} · {entry.placement.description[:width]}"
        views[name], users[name] = link_bytes_by_collective(
            _program(programs, entry), topology, entry.placement)
    return views, users


def ranking_collective_views(
    entries: Iterable[RankedPlacement],
    programs: Mapping[tuple[str, str], CommProgram],
    topology: Topology,
    *,
    collectives: int = 6,
    width: int = 60,
) -> dict[tuple[str, str, str], np.ndarray]:
    """``(candidate, placement, collective) -> link bytes`` of every ranked placement.

    For each entry: the whole program (``"all collectives"``) and then its collectives in
    program order, ``collectives`` views in all (see :func:`collective_views`). The placement
    level is ``"#rank description"`` (cut to ``width`` characters). Feeds
    :func:`~aoizora_lab.viz.heatmap_explorer_widget`.
    """
    views: dict[tuple[str, str, str], np.ndarray] = {}
    for rank, entry in enumerate(entries, start=1):
        loads = collective_views(_program(programs, entry), topology, entry.placement)
        label = f"#{rank} {entry.placement.description[:width]}"
        for collective, data in list(loads.items())[:collectives]:
            views[(_compiled_name(entry), label, collective)] = data
    return views


def _compiled_name(entry: Any) -> str:
    """``cfg2-uly8``, or ``cfg2-uly8+maxdiffusion-ulysses`` when compiled with flags."""
    label = entry.flags.label
    return entry.candidate.name + ("" if label == "default" else f"+{label}")


def _program(programs: Mapping[tuple[str, str], Any], entry: Any) -> Any:
    key = (entry.candidate.name, entry.flags.label)
    try:
        return programs[key]
    except KeyError:
        raise AoizoraError(
            f"No compiled program for {key!r}; programs: {sorted(programs)} "
            "(pass PlanResult.programs with entries of PlanResult.ranking).") from None


def _collective_list(program_or_collectives: Any) -> list[Collective]:
    # A single collective has no parts in its estimate; a list of one always does.
    if isinstance(program_or_collectives, Collective):
        return [program_or_collectives]
    return list(getattr(program_or_collectives, "collectives", program_or_collectives))
