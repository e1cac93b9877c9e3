"""The one place a step's latency is priced: roofline compute, the ICI model, the overlap rule.

Every latency the workbench prints comes from here: IR estimates and bounds (pruning), compiled
programs on placements (planner, baselines, benchmarks), predictions that measurements are
compared with.

**Compute** of one op is its roofline, ``max(FLOPs / peak, HBM bytes / HBM bandwidth)``
(:func:`roofline_seconds`; peak and bandwidth from :mod:`aoizora_lab.hardware`, each with its
source); a program's ops run one after the other (:func:`compute_seconds`).

**Communication** is the ICI model (:func:`aoizora_lab.comm_model.estimate`) on a placement.

**Overlap rule** (:meth:`Predicted.overlapped`): collectives the compiler scheduled
asynchronously (``*-start`` ops, async collective fusions) may hide behind compute, up to the
compute time; synchronous ones add::

    total = compute + sync_comm + max(0, async_comm - compute)

Worked example: 4 s of compute, 0.5 s of synchronous all-to-alls and 1 s of asynchronous
weight all-gathers -> 4.5 s; with 5 s of all-gathers -> 5.5 s (1 s of them exposed).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from aoizora_lab.comm_model import estimate
from aoizora_lab.hardware import ChipSpec, chip_spec
from aoizora_lab.topology import Topology

if TYPE_CHECKING:
    import pandas as pd

    from aoizora_lab.hlo import CommProgram


@dataclass(frozen=True)
class Predicted:
    """Predicted one-step latency and its parts, in seconds."""

    compute_s: float
    """Per-device compute (ops at their roofline, one after the other)."""
    comm_s: float
    """All communication, hidden or not (synchronous + asynchronous)."""
    total_s: float
    """The step: compute + synchronous + the exposed part of the asynchronous collectives."""

    @classmethod
    def overlapped(cls, compute_s: float, sync_comm_s: float,
                   async_comm_s: float) -> Predicted:
        """The overlap rule (module docstring): asynchronous collectives hide behind compute up
        to its length, synchronous ones add."""
        return cls(float(compute_s), float(sync_comm_s + async_comm_s),
                   float(compute_s + sync_comm_s + max(0.0, async_comm_s - compute_s)))


def roofline_seconds(flops: float, hbm_bytes: float, chip: ChipSpec, *,
                     compute_efficiency: float = 1.0, hbm_efficiency: float = 1.0) -> float:
    """``max(FLOPs / (peak x efficiency), bytes / (HBM bandwidth x efficiency))``: the time of
    one op (or a lower bound for a whole program, at efficiency 1)."""
    return max(flops / (chip.peak_bf16_flops * compute_efficiency),
               hbm_bytes / (chip.hbm_bandwidth * hbm_efficiency))


def compute_seconds(program: CommProgram, chip: ChipSpec) -> float:
    """Per-device compute time of a compiled program: each top-level op at its roofline, one
    after the other, times its runs per step."""
    return sum(runs * roofline_seconds(f, b, chip) for f, b, runs, _ in program.ops)


def split_by_overlap(program: CommProgram) -> tuple[list[Any], list[Any]]:
    """The program's collectives as (synchronous, asynchronous), by their compiled sites."""
    sync, asyn = [], []
    for collective, site in zip(program.collectives, program.sites, strict=True):
        (asyn if site.asynchronous else sync).append(collective)
    return sync, asyn


def predict(program: CommProgram, topology: Topology, placement: Any, *,
            chip: ChipSpec | None = None) -> Predicted:
    """Step latency of a compiled ``program`` on ``placement`` (a
    :class:`~aoizora_lab.placement.Placement` or a device order) with the overlap rule."""
    chip = chip or chip_spec(topology.generation)
    sync, asyn = split_by_overlap(program)
    return Predicted.overlapped(compute_seconds(program, chip),
                                comm_seconds(sync, topology, placement, chip=chip),
                                comm_seconds(asyn, topology, placement, chip=chip))


def comm_seconds(collectives: Sequence[Any], topology: Topology, placement: Any = None, *,
                 chip: ChipSpec | None = None) -> float:
    """ICI time of ``collectives`` run one after the other on ``placement`` (0 for none)."""
    if not collectives:
        return 0.0
    return estimate(list(collectives), topology, placement, chip=chip).seconds


def breakdown(program: CommProgram, topology: Topology, placement: Any) -> pd.DataFrame:
    """Per collective of ``program`` on ``placement``: kind, runs, group size, seconds, whether
    the compiler made it asynchronous, busiest link and its bytes; heaviest first."""
    import pandas as pd

    result = estimate(program, topology, placement)
    asynchronous = [s.asynchronous for s in program.sites] or [False] * len(result.parts)
    rows = [{"collective": c.name, "kind": c.kind, "count": c.count,
             "group_size": len(c.groups[0]), "seconds": p.seconds, "asynchronous": a,
             "busiest_link": str(p.busiest_link or "-"), "busiest_bytes": p.busiest_link_bytes}
            for c, a, p in zip(program.collectives, asynchronous, result.parts, strict=True)]
    return pd.DataFrame(rows).sort_values("seconds", ascending=False).reset_index(drop=True)
