"""The solutions people use today, built as candidates + device orders and scored by the same
compiler and cost model as the plan.

- ``maxdiffusion``: data 2 as CFG x ``context`` over the rest (K/V gathered), weights sharded
  over the context axis (FSDP), devices ordered by ``mesh_utils.create_device_mesh`` (with
  ``allow_split_physical_axes`` where its default refuses the shape);
- ``xdit-usp``: no CFG parallelism, the best Ulysses x ring split (by IR estimate; FSDP when the
  weights need it), devices in plain id order.

Two *ablations* of the plan sit beside them (they are not systems anyone runs):

- ``jax-default``: the plan's candidate placed by ``jax.make_mesh``;
- ``logical-only``: the candidate a topology-blind search would pick: the best prediction of
  every compiled candidate with devices in plain id order.

:func:`score_baselines` builds each one, compiles what the search has not compiled yet and
prices it with :func:`aoizora_lab.cost.predict`: one :class:`BaselineOutcome` per name. A
builder that refuses (no valid split, a library that refuses the mesh) is a ``not built``
outcome with its reason; any other exception is a bug and propagates.
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from aoizora_lab.candidates import Candidate, default_attention, explain_candidates
from aoizora_lab.compile import CompiledCandidate
from aoizora_lab.cost import breakdown, predict
from aoizora_lab.errors import AoizoraError
from aoizora_lab.placement import (
    Placement,
    create_device_mesh_order,
    make_mesh_order,
    plain_order,
)
from aoizora_lab.prune import Pruning
from aoizora_lab.realize import Plan
from aoizora_lab.records import Records
from aoizora_lab.topology import Topology
from aoizora_lab.workload import Workload

BASELINES = ("maxdiffusion", "xdit-usp", "jax-default", "logical-only")
"""Every baseline and ablation, in report order."""
ABLATIONS = ("jax-default", "logical-only")
"""The names in :data:`BASELINES` that are ablations of the plan, not existing systems."""
REFUSALS = (AoizoraError, ValueError, NotImplementedError, AssertionError)
"""What a builder raises when it cannot build (our checks; ``jax.make_mesh`` and
``create_device_mesh`` refusing a mesh): a ``not built`` outcome, not a crash."""


def maxdiffusion(workload: Workload, topology: Topology) -> tuple[Candidate, Placement]:
    """CFG 2 x context, FSDP over context, ``create_device_mesh`` order."""
    n = topology.num_devices
    cfg = 2 if workload.cfg and n % 2 == 0 else 1
    candidate = Candidate.from_degrees({"cfg": cfg, "context": n // cfg}, fsdp=True,
                                       attention=default_attention(topology))
    return candidate, create_device_mesh_order(candidate.mesh_shape, topology)


def xdit_usp(workload: Workload, topology: Topology, pruning: Pruning
             ) -> tuple[Candidate, Placement]:
    """Best Ulysses x ring (no CFG parallelism) by IR estimate, plain device order.

    The estimates are pruning's (every valid candidate was traced there); a split whose trace
    failed is skipped, ties go to the first in enumeration order."""
    usp = [d for c in explain_candidates(workload, topology).valid
           if all(c.degree(role) == 1 for role in ("cfg", "context", "tp"))
           and (d := pruning.decision(c.name)).estimate is not None]
    if not usp:
        raise AoizoraError(f"No valid Ulysses x ring split of {workload.name} on {topology.name} "
                           "whose IR trace succeeded.")
    best = min(usp, key=lambda d: d.estimate.estimate_seconds)
    return best.candidate, plain_order(topology)


class Status(enum.Enum):
    """How far a baseline got."""

    OK = "ok"
    """Built, compiled and priced: it has a plan."""
    NOT_BUILT = "not built"
    """Its builder refused (reason says why)."""
    NOT_COMPILED = "not compiled"
    """Built, but its compile did not produce a program (reason has the compile status)."""


@dataclass(frozen=True)
class BaselineOutcome:
    """One baseline: what it built and, where it compiled, its priced plan."""

    name: str
    """One of :data:`BASELINES`."""
    status: Status
    """How far it got."""
    candidate: Candidate | None = None
    """Its candidate (``None`` when not built)."""
    placement: Placement | None = None
    """Its device order (``None`` when not built)."""
    plan: Plan | None = None
    """The priced plan (``ok`` only)."""
    reason: str = ""
    """Why it is not ``ok``."""

    @property
    def ablation(self) -> bool:
        """An ablation of the plan rather than an existing system."""
        return self.name in ABLATIONS


class Baselines(Records[BaselineOutcome]):
    """Every baseline's outcome, in :data:`BASELINES` order. ``plan_s`` (the plan's
    predicted step) gives :meth:`to_frame` its ``speedup_of_plan`` column."""

    COLUMNS = ("baseline", "ablation", "candidate", "placement", "status", "compute_s",
               "comm_s", "total_s", "speedup_of_plan", "reason")

    def __init__(self, items: Sequence[BaselineOutcome] = (), *,
                 plan_s: float | None = None) -> None:
        super().__init__(items)
        self.plan_s = plan_s

    def __contains__(self, name: object) -> bool:
        return any(o.name == name for o in self)

    def __getitem__(self, index: Any) -> Any:
        if isinstance(index, str):
            for outcome in self:
                if outcome.name == index:
                    return outcome
            raise KeyError(f"No baseline {index!r}; baselines: {[o.name for o in self]}.")
        return super().__getitem__(index)

    @property
    def plans(self) -> dict[str, Plan]:
        """The priced baselines as plans, by name."""
        return {o.name: o.plan for o in self if o.plan is not None}

    def row(self, item: BaselineOutcome) -> dict[str, Any]:
        predicted = item.plan.predicted if item.plan else None
        return {"baseline": item.name, "ablation": item.ablation,
                "candidate": item.candidate.name if item.candidate else "-",
                "placement": item.placement.description if item.placement else "-",
                "status": item.status.value,
                "compute_s": predicted.compute_s if predicted else float("nan"),
                "comm_s": predicted.comm_s if predicted else float("nan"),
                "total_s": predicted.total_s if predicted else float("nan"),
                "speedup_of_plan": (predicted.total_s / self.plan_s
                                    if predicted and self.plan_s else float("nan")),
                "reason": item.reason}


Compile = Callable[[list[Candidate]], Sequence[CompiledCandidate]]
"""Compiles candidates the way the planner does (same slice, depth, cache, executor)."""


def score_baselines(workload: Workload, topology: Topology, planned: Candidate,
                    pruning: Pruning, compiled: Mapping[str, CompiledCandidate],
                    compile: Compile) -> tuple[Baselines, list[CompiledCandidate]]:
    """Build every baseline, compile what ``compiled`` (by candidate name) lacks, price each.

    ``planned`` is the candidate of the search's best plan (the ``jax-default`` ablation
    places it); ``pruning`` holds the IR estimates ``xdit-usp`` picks its split by. Returns
    the outcomes and the compiles this added. A new baseline needs a builder here and its
    name in :data:`BASELINES`.
    """
    compiled = dict(compiled)
    ok = [r for r in compiled.values() if r.status == "ok"]
    builders: dict[str, Callable[[], tuple[Candidate, Placement]]] = {
        "maxdiffusion": lambda: maxdiffusion(workload, topology),
        "xdit-usp": lambda: xdit_usp(workload, topology, pruning),
        "jax-default": lambda: (planned, make_mesh_order(planned.mesh_shape,
                                                         planned.axis_names, topology)),
        "logical-only": lambda: (min(ok, key=lambda r: predict(
            r.program, topology, plain_order(topology)).total_s).candidate,
                                 plain_order(topology)),
    }
    built: list[tuple[str, Candidate, Placement] | BaselineOutcome] = []
    for name in BASELINES:
        try:
            built.append((name, *builders[name]()))
        except REFUSALS as err:
            built.append(BaselineOutcome(name, Status.NOT_BUILT, reason=str(err)))
    missing = list({entry[1].name: entry[1] for entry in built
                    if isinstance(entry, tuple) and entry[1].name not in compiled}.values())
    added = list(compile(missing)) if missing else []
    compiled |= {r.candidate.name: r for r in added}
    outcomes = []
    for entry in built:
        if isinstance(entry, BaselineOutcome):
            outcomes.append(entry)
            continue
        name, candidate, placement = entry
        result = compiled[candidate.name]
        if result.status != "ok":
            outcomes.append(BaselineOutcome(
                name, Status.NOT_COMPILED, candidate, placement,
                reason=f"{result.status}: {result.message[:200]}"))
            continue
        plan = Plan(workload, topology, candidate, placement,
                    predict(result.program, topology, placement), result.program,
                    breakdown(result.program, topology, placement))
        outcomes.append(BaselineOutcome(name, Status.OK, candidate, placement, plan))
    return Baselines(outcomes), added
