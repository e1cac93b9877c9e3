"""The AoiZora search end to end: enumerate -> IR estimate -> prune -> compile -> place -> rank.

``plan(workload, topology)`` returns a :class:`PlanResult`: each stage's typed result (every
one has ``.to_frame()`` for notebooks), the baselines scored by the same compiler and cost
model (:mod:`aoizora_lab.baselines`), and the best :class:`~aoizora_lab.realize.Plan`.

Latencies are priced by :mod:`aoizora_lab.cost` (roofline compute, the ICI model, the overlap
rule). A baseline predicted faster than the search's own best becomes the plan, so the plan is
never predicted slower than a baseline; :attr:`PlanResult.searched` keeps the search's own best
so the two can be told apart.
"""

from __future__ import annotations

import concurrent.futures as cf
from dataclasses import dataclass
from pathlib import Path

from aoizora_lab.baselines import Baselines, score_baselines
from aoizora_lab.candidates import Candidate, CandidateSpace, explain_candidates
from aoizora_lab.compile import (
    Compiles,
    check_compilable,
    check_num_layers,
    compile_candidates,
)
from aoizora_lab.cost import breakdown
from aoizora_lab.errors import AoizoraError, is_whole
from aoizora_lab.hlo import CommProgram
from aoizora_lab.ir_estimate import IRCacheDir
from aoizora_lab.placement import TOP_PLACEMENTS, Ranking, rank_placements
from aoizora_lab.prune import Pruning, prune
from aoizora_lab.realize import Plan
from aoizora_lab.topology import Topology
from aoizora_lab.workload import Workload


@dataclass(frozen=True, eq=False)
class PlanResult:
    """Every stage's result and the winner."""

    candidates: CandidateSpace
    """Every role-degree combination considered, valid or not, with reasons."""
    pruning: Pruning
    """Each valid candidate's pruning decision, best IR estimate first."""
    compiled: Compiles
    """The survivors' compiles (status, time, memory, program)."""
    ranking: Ranking
    """Top placements of every compiled candidate, fastest predicted step first."""
    baselines: Baselines
    """Existing systems and ablations, each built, compiled and priced (or why not)."""
    baseline_compiles: Compiles
    """The baselines' candidates that pruning had not kept, compiled for them."""
    searched: Plan
    """The search's own best: the top of :attr:`ranking`."""
    best: Plan
    """The plan: :attr:`searched`, or a baseline where one is predicted faster."""

    @property
    def programs(self) -> dict[str, CommProgram]:
        """The compiled program of every candidate that compiled (baselines' included), by
        name."""
        return {r.candidate.name: r.program
                for r in [*self.compiled.ok, *self.baseline_compiles.ok]}

    @property
    def baseline_plans(self) -> dict[str, Plan]:
        """Every priced baseline as a plan, by baseline name."""
        return self.baselines.plans


def plan(workload: Workload, topology: Topology, *, keep: int = 3, budget: int = 20_000,
         top_placements: int = TOP_PLACEMENTS, num_layers: int | None = None,
         cache_dir: str | Path | None = None, executor: cf.Executor | None = None,
         timeout_s: float = 900.0, quiet: bool = True,
         ir_cache_dir: IRCacheDir = None) -> PlanResult:
    """Search candidates and placements of ``workload`` on ``topology``; rank; compare.

    ``cache_dir`` holds the compiles (default ``data/cache/compile``), ``ir_cache_dir`` the IR
    traces (default ``data/cache/ir``; ``False``: trace afresh).
    """
    from tqdm.auto import tqdm

    # Checked before anything is traced or compiled: a typo should not cost a sweep.
    check_compilable(topology)
    check_num_layers(num_layers, workload.config().num_layers)
    for name, value, least in (("keep", keep, 1), ("budget", budget, 0),
                               ("top_placements", top_placements, 1)):
        if not is_whole(value, least):
            raise AoizoraError(f"plan({name}={value!r}): must be a whole number >= {least}.")
    progress = tqdm(total=5, desc="plan", disable=quiet)

    def stage(name: str) -> None:
        progress.set_postfix_str(name)
        progress.update(1)

    space = explain_candidates(workload, topology)
    stage("candidates")
    pruning = prune(space.valid, workload, topology, keep=keep, ir_cache_dir=ir_cache_dir)
    if not pruning.kept:
        raise AoizoraError(
            f"No candidate of {workload.name} on {topology.name} survived pruning: "
            + "; ".join(f"{d.candidate.name}: {d.reason[:160]}" for d in pruning[:8])
            + ". A model that cannot fit needs more chips (a larger slice) or a generation "
            "with more HBM; a failed trace is a bug worth reporting with its message."
        )
    stage("pruned")

    def compile(candidates: list[Candidate]) -> Compiles:
        return compile_candidates(candidates, workload, topology, executor=executor,
                                  cache_dir=cache_dir, timeout_s=timeout_s,
                                  num_layers=num_layers)

    compiled = compile(pruning.kept)
    stage("compiled")
    if not compiled.ok:
        raise AoizoraError(
            "No candidate compiled: "
            + "; ".join(f"{r.candidate.name}: {r.status} ({r.message[:120]})" for r in compiled)
            + ". Fix what the messages say (an oom needs more chips or FSDP; crash or timeout: "
            "retry, or raise timeout_s)."
        )
    ranking = Ranking(entry for r in compiled.ok for entry in rank_placements(
        r.program, r.candidate, topology, budget=budget, top=top_placements)).ranked()
    stage("placed")
    by_name = {r.candidate.name: r for r in compiled}
    top = ranking[0]
    program = by_name[top.candidate.name].program
    searched = Plan(workload, topology, top.candidate, top.placement, top.predicted, program,
                    breakdown(program, topology, top.placement))
    baselines, added = score_baselines(workload, topology, searched.candidate, pruning,
                                       by_name, compile)
    best = min([searched, *baselines.plans.values()], key=lambda p: p.predicted.total_s)
    stage("baselines")
    progress.close()
    return PlanResult(space, pruning, compiled, ranking,
                      Baselines(baselines, plan_s=best.predicted.total_s), Compiles(added),
                      searched, best)
