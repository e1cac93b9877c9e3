"""The AoiZora search end to end: enumerate -> IR estimate -> prune -> compile -> place -> rank.

``plan(workload, topology, options)`` returns a :class:`PlanResult`: each stage's typed result
(every one has ``.to_frame()`` for notebooks), the baselines scored by the same compiler and
cost model (:mod:`aoizora_lab.baselines`), and the best :class:`~aoizora_lab.realize.Plan`.
The steps, each a small function: check the options; enumerate and prune; build every compile
as a job and run them under the options' admission policy (:mod:`aoizora_lab.jobs`); score
the systems from the outcomes; place every program; rank.

Latencies are priced by :mod:`aoizora_lab.cost` (compiler compute, the ICI model, overlap from
the compiled schedule). Compiler flags are one more dimension of the search: the kept
candidates are compiled with the first flag set of ``options.flags`` and, on TPU slices, with
each other one where their compute alone could still beat the best step already priced. The
existing systems' setups (and yours, ``compare``) are compiled too and their programs placed
by the same search. :attr:`PlanResult.searched` is the search's own best (the best placement
of a survivor's program); :attr:`PlanResult.best`, the recommended plan, is that or, where
one is faster, a setup's program placed by the search or in its own order, so the plan
recommended is never predicted slower than a setup it priced. :attr:`PlanResult.headline`
compares the search's own best with the systems (below 1 where a system wins) and splits the
gain: against the existing systems, from placement, from the sharding strategy.
"""

from __future__ import annotations

import concurrent.futures as cf
from collections.abc import Sequence
from dataclasses import dataclass, field
from functools import partial
from typing import TYPE_CHECKING

from aoizora_lab.baselines import (
    USER,
    Baselines,
    Headline,
    SystemSetups,
    baseline_setups,
    estimate_of,
    headline,
    score_baselines,
    user_setup,
    with_fallbacks,
)
from aoizora_lab.candidates import Candidate, CandidateSpace, explain_candidates
from aoizora_lab.comm_model import ModelOptions
from aoizora_lab.compile import (
    CompiledCandidate,
    CompileQueue,
    CompilerFlags,
    Compiles,
    NotRun,
    NotRunReason,
    Outcome,
    check_compilable,
    check_num_layers,
    compile_executor,
)
from aoizora_lab.cost import breakdown
from aoizora_lab.errors import AoizoraError
from aoizora_lab.hlo import CommProgram
from aoizora_lab.jobs import (
    Admission,
    CompileJob,
    FullSearch,
    OriginKind,
    Outcomes,
    Prices,
    TimeLimited,
    build_jobs,
    run_jobs,
)
from aoizora_lab.options import FULL_SEARCH, PlanOptions
from aoizora_lab.placement import RankedPlacement, Ranking, is_ranked, rank_placements
from aoizora_lab.progress import Ticker
from aoizora_lab.progress import note as progress_note
from aoizora_lab.prune import Pruning, prune
from aoizora_lab.realize import Plan
from aoizora_lab.topology import Topology
from aoizora_lab.versions import is_memoized, memoized
from aoizora_lab.workers import warm_in_workers
from aoizora_lab.workload import Workload

if TYPE_CHECKING:
    import pandas as pd


@dataclass(frozen=True, eq=False)
class PlanResult:
    """Every stage's result and the winner."""

    candidates: CandidateSpace
    """Every role-degree combination considered, valid or not, with reasons."""
    pruning: Pruning
    """Each valid candidate's pruning decision, best IR estimate first."""
    compiled: Compiles
    """The survivors' compiles (status, time, memory, program) with each flag set worth it,
    first flag set first; a time-limited plan's also those it did not run
    (:class:`~aoizora_lab.compile.NotRun`)."""
    ranking: Ranking
    """Top placements of every compiled candidate, fastest predicted step first."""
    baselines: Baselines
    """Existing systems (and the user's setup), each built, compiled and priced (or why
    not)."""
    baseline_compiles: Compiles
    """The compiles of the systems' (and your) setups that are not a survivor's."""
    searched: Plan
    """The search's own best: the best placement of a survivor's program (the systems'
    setups' programs rank in :attr:`ranking` but are not the search's)."""
    best: Plan
    """The recommended plan: :attr:`searched`, or a setup's program (placed by the search or
    in its own order) where one is predicted faster."""
    headline: Headline
    """The search's own best against the existing systems, the plan's placement gain and the
    strategy gain."""
    skipped: tuple[NotRun, ...] = ()
    """Survivors' further flag sets that could not have won (``CANNOT_WIN``, the flag rule of
    :mod:`aoizora_lab.jobs`)."""
    model: ModelOptions = field(default_factory=ModelOptions)
    """The ICI model everything was priced under (:attr:`PlanOptions.model`)."""

    @property
    def programs(self) -> dict[tuple[str, str], CommProgram]:
        """The compiled program of every compile that produced one (baselines' included), by
        ``(candidate name, flags label)``."""
        return {r.key: r.program for r in [*self.compiled.ok, *self.baseline_compiles.ok]}

    @property
    def baseline_plans(self) -> dict[str, Plan]:
        """Every priced baseline as a plan, by baseline name."""
        return self.baselines.plans

    def advice(self, *, budget: int = 5_000) -> pd.DataFrame:
        """What to change in your setup (``PlanOptions(compare=...)``), one step at a time.

        Rows (``step``, ``change``, ``candidate``, ``flags``, ``placement``, ``total_s``,
        ``speedup``: your step / this row's): your setup as you run it; your sharding and
        flags on the placement the search finds for them (the placement gain alone); the plan
        (sharding, flags and placement changed). Raises where no setup of yours was given or
        it did not compile.
        """
        import pandas as pd

        if USER not in self.baselines:
            raise AoizoraError("No setup of yours to advise on: PlanOptions(compare=...) with "
                               "MaxDiffusion keys, Wan flags or a mesh (baselines.user_setup).")
        yours = self.baselines[USER]
        if yours.plan is None:
            raise AoizoraError(f"Your setup {yours.setup.recipe if yours.setup else ''!r} is "
                               f"{yours.status.value}: {yours.reason}")
        mine, best = yours.plan, self.best
        placed = rank_placements(mine.program, mine.candidate, mine.topology, budget=budget,
                                 top=1, flags=mine.flags, options=self.model)[0]
        changes = [f"sharding {mine.candidate.name} -> {best.candidate.name}"
                   if mine.candidate != best.candidate else "",
                   f"flags {mine.flags.label} -> {best.flags.label}"
                   if mine.flags.label != best.flags.label else "",
                   "placement" if best.placement != mine.placement else ""]
        rows = [("your setup", yours.setup.recipe, mine.candidate.name, mine.flags.label,
                 mine.placement.description, mine.predicted.total_s),
                ("place it", "your sharding and flags, placed by the search",
                 mine.candidate.name, mine.flags.label, placed.placement.description,
                 placed.predicted.total_s),
                ("the plan", ", ".join(c for c in changes if c) or "nothing: it is the plan",
                 best.candidate.name, best.flags.label, best.placement.description,
                 best.predicted.total_s)]
        frame = pd.DataFrame(rows, columns=["step", "change", "candidate", "flags",
                                            "placement", "total_s"])
        frame["speedup"] = mine.predicted.total_s / frame["total_s"]
        return frame


def plan(workload: Workload, topology: Topology, options: PlanOptions = FULL_SEARCH, *,
         executor: cf.Executor | None = None) -> PlanResult:
    """Search candidates, compiler flags and placements of ``workload`` on ``topology``;
    rank; compare with the existing systems (and ``options.compare``, a setup of yours).

    ``options`` (:class:`~aoizora_lab.options.PlanOptions`; default the full search) says how:
    depth, budgets, flag sets, limits, caches. A quick answer: ``max_compiled`` compiles at
    most that many survivors, the IR's best (:func:`~aoizora_lab.jobs.budget_rule`; where
    estimates tie, the compiled winner may be among those left out), and
    ``systems=False`` skips the existing systems' setups (the headline then has no system to
    compare with). ``time_limit_s`` answers within that many seconds
    (:class:`~aoizora_lab.jobs.TimeLimited`); a system priced on only some setups is named in
    :attr:`Headline.partial`. A setup of yours is compiled whatever the limit. ``executor``:
    the pool compiles run from (default one thread per compile the machine holds;
    ``dask.distributed.Client(...).get_executor()`` for a cluster).
    """
    compare, flag_sets = _checked(workload, topology, options)
    stages = _Stages(workload, topology, quiet=options.quiet)
    policy: Admission = FullSearch(options.max_compiled) if options.time_limit_s is None \
        else TimeLimited(options.time_limit_s, topology, budget=options.budget,
                         top=options.top_placements, max_survivors=options.max_compiled,
                         model=options.model)
    space = explain_candidates(workload, topology)
    stages.next("candidates", f"{len(space.valid)} valid candidates; tracing their IR")
    pruning = prune(space.valid, workload, topology, keep=options.keep,
                    ir_cache_dir=options.ir_cache_dir,
                    flag_async=options.flag_async(topology))
    _check_survivors(pruning, workload, topology)
    first_run = _first_run(policy, pruning, workload, topology, options)
    stages.next("pruned", f"{len(pruning.kept)} kept by the IR estimates; compiling them with "
                f"{len(flag_sets)} flag set(s)")
    setups = baseline_setups(workload, topology, pruning, compare=compare,
                             systems=options.systems)
    jobs, outcomes, setups = _run_compiles(workload, topology, options, pruning, flag_sets,
                                           setups, policy, executor)
    stages.next("compiled", "pricing the existing systems' setups" if options.systems
                else "not compiling the existing systems' setups (systems=False)")
    compiled, skipped, extra = _sorted_outcomes(jobs, outcomes)
    _check_compiled(compiled)
    baselines = score_baselines(workload, topology, pruning, setups, outcomes,
                                options=options.model)
    if first_run is not None:  # what this first run started, for the same plan again
        memoized("time-limited-plan", first_run, lambda: frozenset(
            key for key, o in outcomes.items() if isinstance(o, CompiledCandidate)),
            code=__name__)
    programs = [*compiled.ok, *extra.ok]
    stages.next("baselines", f"searching placements of {len(programs)} compiled programs")
    searched, top, ranking = _searched(programs, {r.key for r in compiled.ok}, workload,
                                       topology, options)
    priced = [o.plan for o in baselines if o.plan is not None]
    best = min([searched, top, *priced], key=lambda p: p.predicted.total_s)
    stages.next("placed", f"done: {best.candidate.name}, {best.predicted.total_s:.3f} s per "
                "step")
    stages.close()
    return PlanResult(space, pruning, compiled, ranking,
                      Baselines(baselines, plan_s=best.predicted.total_s), extra, searched,
                      best, headline(best, searched, baselines, compiled.ok,
                                     pruning.could_win, options=options.model), skipped,
                      model=options.model)


def _checked(workload: Workload, topology: Topology, options: PlanOptions
             ) -> tuple[object, list[CompilerFlags]]:
    """Everything checked before anything is traced or compiled (a typo should not cost a
    sweep): the options, the slice, the depth and your setup. Returns your setup (or
    ``None``) and the flag sets to search (one on CPU host devices: TPU flags mean nothing
    there)."""
    if not isinstance(options, PlanOptions):
        raise AoizoraError(f"plan(options={options!r}): give a PlanOptions, e.g. "
                           "PlanOptions(num_layers=2) or INTERACTIVE.replace(num_layers=2).")
    check_compilable(topology)
    check_num_layers(options.num_layers, workload.config().num_layers)
    compare = (user_setup(options.compare, workload, topology)
               if options.compare is not None else None)
    return compare, list(options.flags_on(topology))


class _Stages:
    """The plan's five stages: a bar (unless quiet) and a progress line each."""

    def __init__(self, workload: Workload, topology: Topology, *, quiet: bool) -> None:
        from tqdm.auto import tqdm

        self.what = f"plan {workload.name} on {topology.name}"
        self.bar = tqdm(total=5, desc="plan", disable=quiet)

    def next(self, name: str, detail: str) -> None:
        self.bar.set_postfix_str(name)
        self.bar.update(1)
        progress_note(f"{self.what}: {detail}")

    def close(self) -> None:
        self.bar.close()


def _check_survivors(pruning: Pruning, workload: Workload, topology: Topology) -> None:
    if not pruning.kept:
        raise AoizoraError(
            f"No candidate of {workload.name} on {topology.name} survived pruning: "
            + "; ".join(f"{d.candidate.name}: {d.reason[:160]}" for d in pruning[:8])
            + ". A model that cannot fit needs more chips (a larger slice) or a generation "
            "with more HBM; a failed trace is a bug worth reporting with its message."
        )


def _first_run(policy: Admission, pruning: Pruning, workload: Workload, topology: Topology,
               options: PlanOptions) -> tuple[object, ...] | None:
    """A time-limited plan's key for what its first run started (``None`` without a limit).
    Where that run happened, the policy starts exactly those compiles again: the same plan
    again answers at once with the same plan. The IR traces count against the limit."""
    if not isinstance(policy, TimeLimited):
        return None
    policy.traced(sum(d.estimate.trace_seconds for d in pruning if d.estimate is not None))
    key = (workload, topology.name, topology.source, options.key,
           tuple(c.name for c in pruning.kept))
    if not is_memoized("time-limited-plan", key, code=__name__):
        return key
    policy.started = memoized("time-limited-plan", key, lambda: None, code=__name__)
    return None


def _run_compiles(workload: Workload, topology: Topology, options: PlanOptions,
                  pruning: Pruning, flag_sets: Sequence[CompilerFlags],
                  setups: list[SystemSetups], policy: Admission,
                  executor: cf.Executor | None
                  ) -> tuple[list[CompileJob], dict[tuple[str, str], Outcome],
                             list[SystemSetups]]:
    """Every compile of the plan as a job, run under ``policy`` through one pool (so no
    worker idles at the end of one round while another waits); then the setups whose
    recipe's flags failed, with fewer flags until one compiles (:func:`with_fallbacks`, a
    round per try). Returns the jobs, every outcome by key, and the setups with their tries."""
    jobs = build_jobs(pruning.kept, flag_sets, setups, partial(estimate_of, pruning),
                      pruning.could_win)
    rounds = policy.rounds(jobs)
    prices, outcomes = Prices(topology, options.model), Outcomes()
    pool = executor or compile_executor(workload, topology, cache_dir=options.cache_dir,
                                        num_layers=options.num_layers)
    try:
        with CompileQueue(workload, topology, executor=pool, cache_dir=options.cache_dir,
                          timeout_s=options.timeout_s, num_layers=options.num_layers,
                          describe=prices, expected=len(jobs), at_most=True,
                          time_left=policy.time_left) as queue:
            run_jobs(rounds, policy, queue, prices, outcomes)
            tries: list[CompileJob] = []
            while again := [j for j in build_jobs(
                    (), (), with_fallbacks(setups, outcomes.snapshot()),
                    partial(estimate_of, pruning), pruning.could_win)
                    if outcomes.get(j.key) is None]:
                queue.expect(len(again))
                run_jobs([[[j] for j in again]], policy, queue, prices, outcomes)
                tries.extend(again)
    finally:
        if executor is None:
            pool.shutdown()
    return [*jobs, *tries], outcomes.snapshot(), with_fallbacks(setups, outcomes.snapshot())


def _sorted_outcomes(jobs: Sequence[CompileJob], outcomes: dict[tuple[str, str], Outcome]
                     ) -> tuple[Compiles, tuple[NotRun, ...], Compiles]:
    """The survivors' outcomes (first flag set first, each in pruning's order) but the ones
    the flag rule spared, the spared ones, and the setups' outcomes that are no survivor's."""
    def order(job: CompileJob) -> tuple[int, int]:
        return min((o.flag_index, o.rank) for o in job.origins if o.kind is OriginKind.SURVIVOR)

    survivors = sorted((j for j in jobs if any(o.kind is OriginKind.SURVIVOR
                                               for o in j.origins)), key=order)
    mine = [outcomes[j.key] for j in survivors]
    spared = tuple(o for o in mine
                   if isinstance(o, NotRun) and o.reason is NotRunReason.CANNOT_WIN)
    others = {j.key: outcomes[j.key] for j in jobs if j not in survivors}
    return (Compiles(o for o in mine if o not in spared), spared,
            Compiles(others.values()))


def _check_compiled(compiled: Compiles) -> None:
    if not compiled.ok:
        raise AoizoraError(
            "No candidate compiled: "
            + "; ".join(f"{r.candidate.name}: {r.status} ({r.message[:120]})"
                        for r in compiled.ran)
            + ". Fix what the messages say (an oom needs more chips or FSDP; crash or "
            "timeout: retry, or raise timeout_s; a time limit too short for one compile: "
            "raise it)."
        )


def _searched(programs: Sequence[CompiledCandidate], survivors: set[tuple[str, str]],
              workload: Workload, topology: Topology, options: PlanOptions
              ) -> tuple[Plan, Plan, Ranking]:
    """Every program placed and ranked; the best of the ``survivors``' programs (the
    search's own) and the top of them all, each as a :class:`Plan`."""
    ranking = Ranking(entry for ranked in _rank_programs(
        programs, topology, options.budget, options.top_placements, workload.name,
        options.model) for entry in ranked).ranked()
    by_key = {r.key: r.program for r in programs}

    def as_plan(entry: RankedPlacement) -> Plan:
        program = by_key[entry.candidate.name, entry.flags.label]
        return Plan(workload, topology, entry.candidate, entry.placement, entry.predicted,
                    program, breakdown(program, topology, entry.placement,
                                       options=options.model), flags=entry.flags)

    own = next(e for e in ranking if (e.candidate.name, e.flags.label) in survivors)
    return as_plan(own), as_plan(ranking[0]), ranking


def _rank_programs(programs: Sequence[CompiledCandidate], topology: Topology, budget: int,
                   top: int, what: str, model: ModelOptions) -> list[Ranking]:
    """:func:`rank_placements` of each compiled program, in order. The searches not stored
    yet run side by side in worker processes (:func:`warm_in_workers`) where the slice can be
    rebuilt there (libtpu's deviceless devices by name, or a simulated slice); then every
    ranking is read here, so a warm plan starts no process."""
    todo = [r for r in programs if not is_ranked(r.program, r.candidate, topology,
                                                 budget=budget, top=top, flags=r.flags,
                                                 options=model)]
    if topology.portable:
        warm_in_workers(_rank_in_worker, [(r.program, r.candidate, topology, budget, top,
                                           r.flags, model) for r in todo],
                        what=f"plan {what} on {topology.name}: placement searches")
    ticker = Ticker()
    rankings = []
    for index, r in enumerate(programs):
        ticker.note(f"plan {what} on {topology.name}: placed {index} of {len(programs)} "
                    "programs")
        rankings.append(rank_placements(r.program, r.candidate, topology, budget=budget,
                                        top=top, flags=r.flags, options=model))
    return rankings


def _rank_in_worker(program: CommProgram, candidate: Candidate, topology: Topology,
                    budget: int, top: int, flags: CompilerFlags, model: ModelOptions) -> None:
    """In a worker process: store the ranking (:func:`_rank_programs` reads it back)."""
    rank_placements(program, candidate, topology, budget=budget, top=top, flags=flags,
                    options=model)
