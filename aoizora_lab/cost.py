"""The one place a step's latency is priced: compute per op, the ICI model, overlap read from
the compiled schedule.

Every latency the workbench prints comes from here: IR estimates and bounds (pruning), compiled
programs on placements (planner, baselines, benchmarks), predictions that measurements are
compared with.

**Compute** of one op (:func:`op_seconds`), two models (``compute_model``):

- ``"compiler"`` (default): the TPU compiler's own estimate, ``estimated_cycles`` in the op's
  backend config, over the chip's clock (:attr:`ChipSpec.clock_hz`); ops without one (Pallas
  attention kernels, programs compiled for CPU, generations of unknown clock) fall back to:
- ``"roofline"``: ``max(FLOPs / (peak x efficiency), bytes / (HBM bandwidth x efficiency))``
  with one efficiency per op class (matmul, attention kernel, memory-bound), the constants of
  :class:`~aoizora_lab.hardware.ChipSpec` (sources there) that IR estimates use too.

A program's ops run one after the other (:func:`compute_seconds`).

**Communication** of one collective is the ICI model (:func:`aoizora_lab.comm_model.estimate`)
on a placement, and never less than its own HBM traffic (reading its operand and writing its
result, :func:`hbm_seconds`).

**Overlap from the schedule** (:func:`overlap_groups`). The compiled module is scheduled: an
asynchronous collective runs from its start to its done, and only the compute the compiler
placed between them, in that computation (per loop iteration), can hide it. Collectives in
flight together form a group (asynchronous windows that overlap, and synchronous collectives
issued inside such a window); a group's members share the links, so they are priced together::

    group time  = max(window compute + synchronous members, joint link time)
    exposed     = max(group time - window compute,   (per run, times the runs per step)
                      synchronous members + (1 - overlap) x asynchronous members)
    joint time  = max(slowest member alone, busiest link of the members' summed loads)
    total       = compute + sum of exposed over groups

``overlap`` (``ModelOptions.overlap``, default 1) is the share of its asynchronous members'
time that compute can hide at most; at 1 the second term never binds.

Worked example: a weight all-gather of 3 ms starts before a 2 ms matmul and is waited for
after it: 1 ms is exposed. Started before a 5 ms matmul it hides entirely (with ``overlap =
0.77``, 0.69 ms of it stays exposed however long the matmul). A 1 ms synchronous
all-to-all issued inside that 2 ms window adds 1 ms of compute-stream time and shares links
with the gather: the group takes ``max(2 + 1, joint)`` with ``joint >= 3``, so 1 ms of the
pair is exposed at best.

:meth:`Predicted.overlapped` keeps the pooled rule (``compute + sync + max(0, async -
compute)``) for IR estimates, which have no schedule: there it is an optimistic estimate.

**Ensembles** (:func:`predict_draws`): the same rules under many draws of the uncertain
constants at once (:class:`Constants` holds one array per constant), from what :func:`predict`
keeps on disk: each collective's per-phase busiest-link bytes and hops, each group's window
ops. :func:`predict` is its one-draw case (:func:`_exposure` serves both).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from aoizora_lab.comm_model import ModelOptions, estimate, transfer_seconds
from aoizora_lab.errors import AoizoraError
from aoizora_lab.hardware import ChipSpec, device_spec
from aoizora_lab.topology import Topology
from aoizora_lab.versions import fingerprint, memoized

if TYPE_CHECKING:
    import pandas as pd

    from aoizora_lab.comm_model import Collective, CommEstimate
    from aoizora_lab.hlo import CommProgram, ComputeOp

COMPUTE_MODELS = ("compiler", "roofline")
"""How one op's compute time is priced (module docstring)."""
DEFAULT_COMPUTE_MODEL = "compiler"


@dataclass(frozen=True)
class Predicted:
    """Predicted one-step latency and its parts, in seconds."""

    compute_s: float
    """Per-device compute (ops one after the other)."""
    comm_s: float
    """All communication, hidden or not: every collective priced alone."""
    total_s: float
    """The step: compute plus the communication the schedule leaves exposed."""

    @property
    def exposed_s(self) -> float:
        """Communication not hidden behind compute (``total_s - compute_s``)."""
        return self.total_s - self.compute_s

    @classmethod
    def overlapped(cls, compute_s: float, sync_comm_s: float,
                   async_comm_s: float) -> Predicted:
        """The pooled rule for programs without a schedule (IR estimates): asynchronous
        collectives hide behind any compute up to its length, synchronous ones add."""
        return cls(float(compute_s), float(sync_comm_s + async_comm_s),
                   float(compute_s + sync_comm_s + max(0.0, async_comm_s - compute_s)))


@dataclass(frozen=True, eq=False)
class Constants:
    """The constants of a chip and of the model's options that pricing reads and an
    ensemble varies (:mod:`aoizora_lab.uncertainty`): each a float for one model, or an array
    ``[draws]`` with one value per draw of the model. Fields as in
    :class:`~aoizora_lab.hardware.ChipSpec` and
    :class:`~aoizora_lab.comm_model.ModelOptions`."""

    matmul_efficiency: Any
    attention_efficiency: Any
    hbm_efficiency: Any
    ici_link_bandwidth: Any
    ici_efficiency: Any
    ici_hop_latency: Any
    intra_chip_bandwidth: Any
    overlap: Any

    @classmethod
    def of(cls, chip: ChipSpec, options: ModelOptions | None = None) -> Constants:
        """One model's constants: ``chip``'s and ``options``' own."""
        return cls(chip.matmul_efficiency, chip.attention_efficiency, chip.hbm_efficiency,
                   chip.ici_link_bandwidth, chip.ici_efficiency, chip.ici_hop_latency,
                   chip.intra_chip_bandwidth, (options or ModelOptions()).overlap)

    def take(self, index: Any) -> Constants:
        """The draws ``index`` selects (fields that are one value for all draws stay so)."""
        values = (getattr(self, f.name) for f in dataclasses.fields(self))
        return Constants(*(value[index] if np.ndim(value) else value for value in values))

    @property
    def link_rate(self) -> Any:
        """Bytes/s a large transfer achieves on one ICI link."""
        return np.multiply(self.ici_link_bandwidth, self.ici_efficiency)


def roofline_seconds(flops: float, hbm_bytes: float, chip: ChipSpec, *,
                     compute_efficiency: Any = 1.0, hbm_efficiency: Any = 1.0) -> Any:
    """``max(FLOPs / (peak x efficiency), bytes / (HBM bandwidth x efficiency))``: the time of
    one op (or a lower bound for a whole program, at efficiency 1); an array where an
    efficiency is one (draws of the model)."""
    seconds = np.maximum(np.divide(flops, np.multiply(chip.peak_bf16_flops, compute_efficiency)),
                         np.divide(hbm_bytes, np.multiply(chip.hbm_bandwidth, hbm_efficiency)))
    return float(seconds) if np.ndim(seconds) == 0 else seconds


def _check_model(compute_model: str | None) -> str:
    model = compute_model or DEFAULT_COMPUTE_MODEL
    if model not in COMPUTE_MODELS:
        raise AoizoraError(f"compute_model={compute_model!r}; use one of {COMPUTE_MODELS}.")
    return model


def op_times(ops: Sequence[ComputeOp], chip: ChipSpec, compute_model: str | None = None,
             constants: Constants | None = None) -> np.ndarray:
    """``[ops, draws]``: one run of each op (module docstring), under ``constants`` (default:
    ``chip``'s own, one draw)."""
    model = _check_model(compute_model)
    constants = constants or Constants.of(chip)
    draws = np.broadcast_shapes(np.shape(constants.matmul_efficiency),
                                np.shape(constants.attention_efficiency),
                                np.shape(constants.hbm_efficiency))
    times = np.empty((len(ops), math.prod(draws)))
    efficiency = {"matmul": constants.matmul_efficiency,
                  "attention": constants.attention_efficiency}
    for index, op in enumerate(ops):
        if model == "compiler" and op.estimated_cycles and chip.clock_hz:
            times[index] = op.estimated_cycles / chip.clock_hz
        else:
            times[index] = np.ravel(roofline_seconds(
                op.flops, op.hbm_bytes, chip,
                compute_efficiency=efficiency.get(op.op_class, 1.0),
                hbm_efficiency=constants.hbm_efficiency))
    return times


def op_seconds(op: ComputeOp, chip: ChipSpec, compute_model: str | None = None) -> float:
    """Time of one run of a compiled compute op (module docstring)."""
    return float(op_times((op,), chip, compute_model)[0, 0])


def compute_seconds(program: CommProgram, chip: ChipSpec,
                    compute_model: str | None = None) -> float:
    """Per-device compute time of a compiled program: its ops one after the other, each times
    its runs per step."""
    return float(_runs(program) @ op_times(program.ops, chip, compute_model)[:, 0])


def _runs(program: CommProgram) -> np.ndarray:
    return np.array([float(op.runs) for op in program.ops])


def hbm_seconds(collective: Collective, chip: ChipSpec, hbm_efficiency: Any = None) -> Any:
    """One run's HBM traffic of a collective: it reads its operand and writes its result
    (at ``chip``'s HBM efficiency, or ``hbm_efficiency``, one per draw)."""
    size = len(collective.groups[0]) if collective.kind != "collective-permute" else 1
    operand = {"all-gather": collective.bytes / size,
               "reduce-scatter": collective.bytes * size}.get(collective.kind, collective.bytes)
    efficiency = chip.hbm_efficiency if hbm_efficiency is None else hbm_efficiency
    return (operand + collective.bytes) / np.multiply(chip.hbm_bandwidth, efficiency)


# ----------------------------------------------------------------------------- overlap


@dataclass(frozen=True)
class OverlapGroup:
    """Collectives of one computation in flight together, and the compute they can hide
    behind."""

    members: tuple[int, ...]
    """Indices into the program's ``collectives``."""
    asynchronous: tuple[bool, ...]
    """Per member: asynchronous (runs beside compute) or synchronous (the schedule waits)."""
    window_s: float
    """Compute scheduled while the asynchronous members are in flight, per run."""
    runs: int
    """Runs per step (those of the computation)."""
    window_ops: tuple[int, ...] = ()
    """The ops (indices into the program's ``ops``) scheduled in the window, once per
    anchor there: what :attr:`window_s` sums, kept to price it again under other
    constants."""


def _segments(start: int, done: int) -> list[tuple[float, float]]:
    """Open intervals of schedule positions a collective is in flight over; a done before its
    start waits in the next iteration of the loop body, so the window wraps."""
    if done == start:
        return []
    if done > start:
        return [(start, done)]
    return [(start, np.inf), (-1, done)]


def _in_flight_together(start_a: int, windows_a: list[tuple[float, float]], start_b: int,
                        windows_b: list[tuple[float, float]]) -> bool:
    """Whether two collectives of one computation are in flight at once: their windows
    overlap, or one is synchronous (no window) and issued inside the other's window."""
    if not windows_a:
        return any(lo < start_a < hi for lo, hi in windows_b)
    if not windows_b:
        return any(lo < start_b < hi for lo, hi in windows_a)
    return any(lo_a < hi_b and lo_b < hi_a for lo_a, hi_a in windows_a
               for lo_b, hi_b in windows_b)


def overlap_groups(program: CommProgram, chip: ChipSpec,
                   compute_model: str | None = None) -> tuple[OverlapGroup, ...]:
    """The program's collectives grouped by what is in flight together (module docstring);
    every collective is in exactly one group, a synchronous one alone when nothing overlaps
    it."""
    sites = program.sites
    if not sites:  # a bare list of collectives: all synchronous
        return tuple(OverlapGroup((i,), (False,), 0.0, c.count)
                     for i, c in enumerate(program.collectives))
    parent = list(range(len(sites)))

    def root(i: int) -> int:
        while parent[i] != i:
            parent[i] = parent[parent[i]]
            i = parent[i]
        return i

    segments = [_segments(s.start, s.done) for s in sites]
    by_computation: dict[str, list[int]] = {}
    for i, site in enumerate(sites):
        by_computation.setdefault(site.computation, []).append(i)
    for members in by_computation.values():
        for a_index, a in enumerate(members):
            for b in members[a_index + 1:]:
                if _in_flight_together(sites[a].start, segments[a], sites[b].start,
                                       segments[b]):
                    parent[root(b)] = root(a)
    grouped: dict[int, list[int]] = {}
    for i in range(len(sites)):
        grouped.setdefault(root(i), []).append(i)
    times = _runs(program) * op_times(program.ops, chip, compute_model)[:, 0]
    groups = []
    for members in grouped.values():
        computation = sites[members[0]].computation
        windows = [seg for i in members for seg in segments[i]]
        runs = program.collectives[members[0]].count
        inside = tuple(index for index, op in enumerate(program.ops)
                       for comp, position in op.anchors if comp == computation
                       and any(lo < position < hi for lo, hi in windows))
        window = float(times[list(inside)].sum()) / max(runs, 1)
        groups.append(OverlapGroup(tuple(members), tuple(bool(segments[i]) for i in members),
                                   window, runs, inside))
    return tuple(groups)


def group_exposed(group: OverlapGroup, member_s: np.ndarray, joint_s: np.ndarray | float,
                  window_s: np.ndarray | float | None = None, overlap: Any = 1.0
                  ) -> np.ndarray:
    """Exposed seconds per run of ``group``: ``member_s`` are its members' times alone
    (``[members, ...]``, one run), ``joint_s`` their time together on shared links,
    ``window_s`` the compute that hides them (default :attr:`OverlapGroup.window_s`), of
    which at most ``overlap`` of the asynchronous members' time (``ModelOptions.overlap``)."""
    window = group.window_s if window_s is None else window_s
    sync = sum(t for t, a in zip(member_s, group.asynchronous, strict=True) if not a)
    hidden = sum(t for t, a in zip(member_s, group.asynchronous, strict=True) if a)
    together = np.maximum(np.max(member_s, axis=0), joint_s)
    return np.maximum(np.maximum(window + sync, together) - window,
                      sync + np.multiply(np.subtract(1.0, overlap), hidden))


Priced = tuple[tuple["OverlapGroup", ...], list[float], list[float], tuple["CommEstimate", ...]]


def _priced(program: CommProgram, topology: Topology, placement: Any, chip: ChipSpec,
            compute_model: str | None, options: ModelOptions | None) -> Priced:
    """Overlap groups, per collective its time alone per run and its exposed time per step,
    and the ICI estimates; kept on disk (a warm plan prices its baselines and placement gains
    again, ~0.1 s each on 16 chips)."""
    order = None if placement is None else tuple(int(i) for i in np.asarray(placement).ravel())
    options = options or ModelOptions()
    return memoized("priced", (fingerprint(program), topology.cache_key, order, chip,
                               compute_model, options),
                    lambda: _price(program, topology, placement, chip, compute_model, options),
                    code=__name__)
"""The code a priced program depends on besides its inputs."""


def _price(program: CommProgram, topology: Topology, placement: Any, chip: ChipSpec,
           compute_model: str | None, options: ModelOptions) -> Priced:
    parts = estimate(program.collectives, topology, placement, chip=chip, options=options).parts \
        if program.collectives else ()
    groups = overlap_groups(program, chip, compute_model)
    alone, exposed = _exposure(program, groups, parts, chip, compute_model,
                               Constants.of(chip, options))
    return groups, alone[:, 0].tolist(), exposed[:, 0].tolist(), parts


def _exposure(program: CommProgram, groups: Sequence[OverlapGroup],
              parts: Sequence[CommEstimate], chip: ChipSpec, compute_model: str | None,
              constants: Constants) -> tuple[np.ndarray, np.ndarray]:
    """Per collective ``[collectives, draws]``: its time alone per run, and its exposed time
    per step (module docstring), under ``constants``."""
    times = _runs(program)[:, None] * op_times(program.ops, chip, compute_model, constants)
    link_rate, intra, hop = (constants.link_rate, constants.intra_chip_bandwidth,
                             constants.ici_hop_latency)
    draws = np.broadcast_shapes(times.shape[1:], *(np.shape(v) for v in (
        link_rate, intra, hop, constants.hbm_efficiency, constants.overlap)))
    alone = np.zeros((len(program.collectives), math.prod(draws)))
    for i, (c, p) in enumerate(zip(program.collectives, parts, strict=True)):
        if c.count:
            alone[i] = np.maximum(transfer_seconds(p.phase_peaks, p.hops, link_rate, intra, hop),
                                  hbm_seconds(c, chip, constants.hbm_efficiency))
    exposed = np.zeros_like(alone)
    for group in groups:
        members = list(group.members)
        member_s = alone[members]
        window = times[list(group.window_ops)].sum(axis=0) / max(group.runs, 1)
        joint = member_s.max(axis=0)
        if len(members) > 1:
            runs = [max(program.collectives[i].count, 1) for i in members]
            links = sum(parts[i].link_bytes / n for i, n in zip(members, runs, strict=True))
            chips = sum(parts[i].chip_bytes / n for i, n in zip(members, runs, strict=True))
            joint = (np.maximum(links.max(initial=0.0) / link_rate,
                                chips.max(initial=0.0) / intra)
                     + max(parts[i].hops for i in members) * hop)
        # Waits are exposed in full (a group exposes at least them); the asynchronous members
        # share the rest in proportion to their time alone.
        waiting = ~np.array(group.asynchronous)
        rest = np.maximum(0.0, group_exposed(group, member_s, joint, window,
                                             constants.overlap) - member_s[waiting].sum(axis=0))
        hiding = member_s[~waiting].sum(axis=0)
        share = np.divide(member_s, hiding, out=np.zeros_like(member_s), where=hiding > 0)
        exposed[members] = group.runs * np.where(waiting[:, None], member_s, rest * share)
    return alone, exposed


def predict(program: CommProgram, topology: Topology, placement: Any, *,
            chip: ChipSpec | None = None, compute_model: str | None = None,
            options: ModelOptions | None = None) -> Predicted:
    """Step latency of a compiled ``program`` on ``placement`` (a
    :class:`~aoizora_lab.placement.Placement` or a device order), overlap read from its
    schedule (module docstring); ``options`` are the ICI model's
    (:class:`~aoizora_lab.comm_model.ModelOptions`, its defaults when ``None``)."""
    chip = device_spec(topology, chip)
    compute = compute_seconds(program, chip, compute_model)
    _, alone, exposed, _ = _priced(program, topology, placement, chip, compute_model, options)
    comm = sum(t * c.count for t, c in zip(alone, program.collectives, strict=True))
    return Predicted(compute, comm, compute + sum(exposed))


def predict_draws(program: CommProgram, topology: Topology, placement: Any,
                  constants: Constants, *, chip: ChipSpec | None = None,
                  compute_model: str | None = None, options: ModelOptions | None = None
                  ) -> tuple[np.ndarray, np.ndarray]:
    """``(compute_s, total_s)``, arrays ``[draws]``: the step :func:`predict` prices, under
    each draw of ``constants`` (an ensemble, :mod:`aoizora_lab.uncertainty`). The ICI
    estimate and the overlap groups are :func:`predict`'s (``options``' order and routing;
    kept on disk), priced again per draw in one pass: a draw costs array arithmetic, not a
    model run. ``constants`` replace ``chip``'s and ``options``' own."""
    chip = device_spec(topology, chip)
    # Which collectives are in flight together does not depend on the compute model: the
    # default's groups serve every draw (their windows are priced again below).
    groups, _, _, parts = _priced(program, topology, placement, chip, None, options)
    _, exposed = _exposure(program, groups, parts, chip, compute_model, constants)
    compute = _runs(program) @ op_times(program.ops, chip, compute_model, constants)
    compute = np.broadcast_to(compute, exposed.shape[1:])
    return compute, compute + exposed.sum(axis=0)


def comm_seconds(collectives: Sequence[Any], topology: Topology, placement: Any = None, *,
                 chip: ChipSpec | None = None, options: ModelOptions | None = None) -> float:
    """ICI time of ``collectives`` run one after the other on ``placement`` (0 for none)."""
    if not collectives:
        return 0.0
    return estimate(list(collectives), topology, placement, chip=chip, options=options).seconds


def breakdown(program: CommProgram, topology: Topology, placement: Any, *,
              chip: ChipSpec | None = None, compute_model: str | None = None,
              options: ModelOptions | None = None) -> pd.DataFrame:
    """Per collective of ``program`` on ``placement``: kind, runs, group size, seconds (alone,
    all runs), how much of it the schedule hides behind compute and how much is exposed,
    whether the compiler made it asynchronous, the collectives in flight with it, busiest link
    and its bytes; heaviest first."""
    import pandas as pd

    chip = device_spec(topology, chip)
    groups, alone, exposed, parts = _priced(program, topology, placement, chip, compute_model,
                                            options)
    group_of = {i: g for g in groups for i in g.members}
    rows = []
    for i, (c, p) in enumerate(zip(program.collectives, parts, strict=True)):
        seconds = alone[i] * c.count
        rows.append({
            "collective": c.name, "kind": c.kind, "count": c.count,
            "group_size": len(c.groups[0]), "seconds": seconds,
            "hidden_s": max(0.0, seconds - exposed[i]), "exposed_s": exposed[i],
            "asynchronous": bool(program.sites[i].asynchronous) if program.sites else False,
            "in_flight_with": len(group_of[i].members) - 1,
            "window_s": group_of[i].window_s * group_of[i].runs,
            "busiest_link": str(p.busiest_link or "-"), "busiest_bytes": p.busiest_link_bytes})
    columns = ["collective", "kind", "count", "group_size", "seconds", "hidden_s", "exposed_s",
               "asynchronous", "in_flight_with", "window_s", "busiest_link", "busiest_bytes"]
    return pd.DataFrame(rows, columns=columns).sort_values(
        "seconds", ascending=False).reset_index(drop=True)
