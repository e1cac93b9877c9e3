"""The AoiZora search end to end: enumerate -> IR estimate -> prune -> compile -> place -> rank.

``plan(workload, topology)`` returns a :class:`PlanResult`: each stage's typed result (every
one has ``.to_frame()`` for notebooks), the baselines scored by the same compiler and cost
model (:mod:`aoizora_lab.baselines`), and the best :class:`~aoizora_lab.realize.Plan`.

Latencies are priced by :mod:`aoizora_lab.cost` (compiler compute, the ICI model, overlap from
the compiled schedule). Compiler flags are one more dimension of the search: the kept
candidates are compiled with the first flag set of ``flags`` and, on TPU slices, with each
other one where their compute alone could still beat the best step already priced. The
existing systems' setups (and yours, ``compare``) are compiled too and their programs placed
by the same search, so the plan searches the space they run in; a setup predicted faster on
its own device order than everything the search placed becomes the plan, so the plan is never
predicted slower than a setup it priced. :attr:`PlanResult.searched` keeps the search's own
best so the two can be told apart. :attr:`PlanResult.headline` splits the gain: against the
existing systems, from placement, from the sharding strategy.
"""

from __future__ import annotations

import concurrent.futures as cf
import dataclasses
import math
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import partial
from typing import TYPE_CHECKING

from aoizora_lab.baselines import (
    USER,
    Baselines,
    Headline,
    Setup,
    SystemSetups,
    baseline_setups,
    estimate_of,
    headline,
    score_baselines,
    user_setup,
)
from aoizora_lab.candidates import Candidate, CandidateSpace, explain_candidates
from aoizora_lab.compile import (
    CompiledCandidate,
    CompileQueue,
    CompilerFlags,
    Compiles,
    CompileStatus,
    check_compilable,
    check_num_layers,
    compile_candidates,
    compile_executor,
)
from aoizora_lab.cost import Predicted, breakdown, predict
from aoizora_lab.errors import AoizoraError
from aoizora_lab.hlo import CommProgram
from aoizora_lab.options import FULL_SEARCH, PlanOptions
from aoizora_lab.placement import (
    Ranking,
    is_ranked,
    plain_order,
    rank_placements,
)
from aoizora_lab.progress import Ticker
from aoizora_lab.progress import note as progress_note
from aoizora_lab.prune import Pruning, prune
from aoizora_lab.realize import Plan
from aoizora_lab.topology import DeviceSource, Topology
from aoizora_lab.versions import is_memoized, memoized
from aoizora_lab.workers import usable_cpus, warm_in_workers
from aoizora_lab.workload import Workload

if TYPE_CHECKING:
    import pandas as pd


@dataclass(frozen=True)
class SkippedCompile:
    """A kept candidate not compiled with a further flag set: its compute alone (under the
    first flag set) is no faster than a step already priced."""

    candidate: Candidate
    """The candidate."""
    flags: CompilerFlags
    """The flag set it was not compiled with."""
    compute_s: float
    """Its compute per step under the first flag set: a floor for its step with any flags."""
    best_s: float
    """The fastest step priced before (plain device order)."""

    @property
    def reason(self) -> str:
        """Why, for people."""
        return (f"{self.candidate.name} with {self.flags.label} flags: its compute alone "
                f"({self.compute_s:.4g} s) is no faster than a step already priced "
                f"({self.best_s:.4g} s)")


@dataclass(frozen=True, eq=False)
class PlanResult:
    """Every stage's result and the winner."""

    candidates: CandidateSpace
    """Every role-degree combination considered, valid or not, with reasons."""
    pruning: Pruning
    """Each valid candidate's pruning decision, best IR estimate first."""
    compiled: Compiles
    """The survivors' compiles (status, time, memory, program), with each flag set worth it
    (a time-limited plan lists those it did not start as ``unstarted``)."""
    ranking: Ranking
    """Top placements of every compiled candidate, fastest predicted step first."""
    baselines: Baselines
    """Existing systems (and the user's setup), each built, compiled and priced (or why
    not)."""
    baseline_compiles: Compiles
    """The baselines' setups the search had not compiled, compiled for them."""
    searched: Plan
    """The search's own best: the top of :attr:`ranking`."""
    best: Plan
    """The plan: :attr:`searched`, or a baseline where one is predicted faster."""
    headline: Headline
    """The plan against the existing systems, its placement gain and its strategy gain."""
    skipped: tuple[SkippedCompile, ...] = ()
    """Compiles with more flag sets that could not have won (see :class:`SkippedCompile`)."""

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
                                 top=1, flags=mine.flags)[0]
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
    most that many survivors, the IR's best (:func:`~aoizora_lab.prune.prune`'s ``max_kept``;
    where estimates tie, the compiled winner may be among those left out), and
    ``systems=False`` skips the existing systems' setups (the headline then has no system to
    compare with). ``time_limit_s`` answers within that many seconds (see
    :class:`_TimeLimit`): survivors compile best estimate first, each with its further flag
    sets before the next survivors and placed as it comes back, each system's best-estimate
    setup right after the first survivor and its others among the survivors by estimate, and
    none starts that would end after the limit (those are ``unstarted`` in
    :attr:`PlanResult.compiled` and the systems' trials; a system priced on only some setups
    is named in :attr:`Headline.partial`). A setup of yours is compiled whatever the limit.
    ``executor``: the pool compiles run from (default one thread per compile the machine
    holds; ``dask.distributed.Client(...).get_executor()`` for a cluster).
    """
    from tqdm.auto import tqdm

    if not isinstance(options, PlanOptions):
        raise AoizoraError(f"plan(options={options!r}): give a PlanOptions, e.g. "
                           "PlanOptions(num_layers=2) or INTERACTIVE.replace(num_layers=2).")
    # Checked before anything is traced or compiled: a typo should not cost a sweep.
    check_compilable(topology)
    check_num_layers(options.num_layers, workload.config().num_layers)
    keep, budget, top_placements = options.keep, options.budget, options.top_placements
    num_layers, cache_dir, timeout_s = options.num_layers, options.cache_dir, options.timeout_s
    systems, time_limit_s = options.systems, options.time_limit_s
    limit = None if time_limit_s is None else _TimeLimit(time_limit_s)
    flag_sets = list(options.flags)
    compare = options.compare
    if compare is not None:  # a typo in your setup is refused before anything compiles
        compare = user_setup(compare, workload, topology)
    if topology.source is DeviceSource.HOST:
        flag_sets = flag_sets[:1]
    progress = tqdm(total=5, desc="plan", disable=options.quiet)

    def stage(name: str, detail: str) -> None:
        progress.set_postfix_str(name)
        progress.update(1)
        progress_note(f"plan {workload.name} on {topology.name}: {detail}")

    space = explain_candidates(workload, topology)
    stage("candidates", f"{len(space.valid)} valid candidates; tracing their IR")
    pruning = prune(space.valid, workload, topology, keep=keep,
                    ir_cache_dir=options.ir_cache_dir, max_kept=options.max_compiled)
    if limit is not None:
        limit.traced(sum(d.estimate.trace_seconds for d in pruning if d.estimate is not None))
        # Everything that shapes what a time-limited plan starts: the same again reads back
        # what its first run started, and starts nothing else.
        first_run = (workload, topology.name, topology.source, options.key,
                     tuple(c.name for c in pruning.kept))
        if is_memoized("time-limited-plan", first_run, code=__name__):
            limit.started = memoized("time-limited-plan", first_run, lambda: None,
                                     code=__name__)
    if not pruning.kept:
        raise AoizoraError(
            f"No candidate of {workload.name} on {topology.name} survived pruning: "
            + "; ".join(f"{d.candidate.name}: {d.reason[:160]}" for d in pruning[:8])
            + ". A model that cannot fit needs more chips (a larger slice) or a generation "
            "with more HBM; a failed trace is a bug worth reporting with its message."
        )
    stage("pruned", f"{len(pruning.kept)} kept by the IR estimates; compiling them with "
          f"{len(flag_sets)} flag set(s)")

    # With a limit the systems' setups share it, so they are known before anything compiles.
    setups = baseline_setups(workload, topology, pruning, compare=compare, systems=systems)
    scheduled = setups if limit else []
    best_so_far = _BestSoFar(topology)
    # One pool for every sweep below: the systems' setups compile with several flag sets
    # side by side, so no worker idles at the end of one while another waits.
    pool = executor or compile_executor(workload, topology, cache_dir=cache_dir,
                                        num_layers=num_layers)

    def place(result: CompiledCandidate) -> None:  # stored; the ranking below reads it back
        rank_placements(result.program, result.candidate, topology, budget=budget,
                        top=top_placements, flags=result.flags)

    def compile(candidates: list[Candidate], with_flags: CompilerFlags
                ) -> list[CompiledCandidate]:
        # Past a limit a system's fallback compile (its recipe's flags refused) waits too.
        late = [r for r in (limit.unstarted(c, with_flags) for c in candidates)
                if r is not None] if limit else []
        rest = [c for c in candidates if c.name not in {r.candidate.name for r in late}]
        return [*late, *(compile_candidates(rest, workload, topology, executor=pool,
                                            cache_dir=cache_dir, timeout_s=timeout_s,
                                            num_layers=num_layers, flags=with_flags,
                                            describe=best_so_far) if rest else [])]

    try:
        with CompileQueue(workload, topology, executor=pool, cache_dir=cache_dir,
                          timeout_s=timeout_s, num_layers=num_layers, describe=best_so_far,
                          expected=len(pruning.kept) * len(flag_sets)
                          + sum(len(g.setups) for g in scheduled), at_most=True) as queue:
            compiled, skipped, from_setups = _compile_flag_sets(
                pruning.kept, flag_sets, queue, best_so_far, limit=limit,
                place=place if limit else None, setups=scheduled,
                estimate=lambda c: estimate_of(pruning, c))
        stage("compiled", "compiling the existing systems' setups" if systems and not limit
              else "pricing the existing systems' setups compiled within the "
              f"{time_limit_s:g} s limit" if systems else
              "not compiling the existing systems' setups (systems=False)")
        if not compiled.ok:
            raise AoizoraError(
                "No candidate compiled: "
                + "; ".join(f"{r.candidate.name}: {r.status} ({r.message[:120]})"
                            for r in compiled)
                + ". Fix what the messages say (an oom needs more chips or FSDP; crash or "
                "timeout: retry, or raise timeout_s)."
            )
        known = {r.key: r for r in compiled}
        known.update((key, r) for key, r in from_setups.items()
                     if key not in known or known[key].status is CompileStatus.UNSTARTED)
        # The existing systems' setups (and yours) are compiled before placement, so the
        # search places their programs too: the plan searches the space the systems run in.
        baselines, added = score_baselines(workload, topology, pruning, known, compile,
                                           setups=setups)
        survivors = {r.key for r in compiled if r.status is not CompileStatus.UNSTARTED}
        added = [*(r for key, r in from_setups.items() if key not in survivors), *added]
        if limit is not None and limit.started is None:
            memoized("time-limited-plan", first_run, lambda: frozenset(
                r.key for r in [*compiled, *added] if r.status is not CompileStatus.UNSTARTED),
                code=__name__)
    finally:
        if executor is None:
            pool.shutdown()
    programs = [*compiled.ok, *(r for r in added if r.status is CompileStatus.OK)]
    stage("baselines", f"searching placements of {len(programs)} compiled programs")
    ranking = Ranking(entry for ranked in _rank_programs(programs, topology, budget,
                                                         top_placements, workload.name)
                      for entry in ranked).ranked()
    by_key = {r.key: r for r in programs}
    top = ranking[0]
    program = by_key[(top.candidate.name, top.flags.label)].program
    searched = Plan(workload, topology, top.candidate, top.placement, top.predicted, program,
                    breakdown(program, topology, top.placement), flags=top.flags)
    priced = [o.plan for o in baselines if o.plan is not None]
    best = min([searched, *priced], key=lambda p: p.predicted.total_s)
    stage("placed", f"done: {best.candidate.name}, {best.predicted.total_s:.3f} s per step")
    progress.close()
    return PlanResult(space, pruning, compiled, ranking,
                      Baselines(baselines, plan_s=best.predicted.total_s), Compiles(added),
                      searched, best, headline(best, baselines, programs), skipped)


class _TimeLimit:
    """When a time-limited plan stops starting compiles.

    The clock starts with the plan (its IR traces count). Once a compile and its placement
    search have come back, a compile starts only if one more such step, at the mean of those
    this plan ran, would end by the limit; the first round always starts (a plan needs a
    program). Example: a 300 s limit, 20 s of IR traces, steps of ~46 s two at a time:
    rounds end at 66, 112, ... 296 s; a seventh would end at ~342 s and does not start.

    The same plan again (same case, options and limit: ``started``, what its first run
    started) starts exactly those compiles, reading them back, so it answers at once with
    the same plan instead of spending the limit again on what the first run left out.
    Other work read back from the caches is charged what it cost when it ran
    (:meth:`charge`, :meth:`traced`), so a plan with a longer limit spends only the
    difference. Whatever the caches hold is read, past the limit too: a full search's
    compiles make a limited plan the full one.
    """

    def __init__(self, seconds: float, started: frozenset[tuple[str, str]] | None = None
                 ) -> None:
        self.seconds = seconds
        self.started = started
        self.start = time.monotonic()
        self.deadline = self.start + seconds
        self.steps: list[float] = []
        self.lock = threading.Lock()

    def record(self, seconds: float) -> None:
        """One compile and its placement search took ``seconds``."""
        with self.lock:
            self.steps.append(seconds)

    def charge(self, seconds: float) -> None:
        """Count ``seconds`` of work read back from a cache as if it ran now."""
        with self.lock:
            self.deadline -= seconds

    def traced(self, seconds: float) -> None:
        """The IR traces took ``seconds`` when they ran (side by side, :func:`usable_cpus`
        at a time): count that much from the start where reading them back took less."""
        with self.lock:
            self.deadline -= max(0.0, seconds / usable_cpus() - (time.monotonic() - self.start))

    def unstarted(self, candidate: Candidate, flags: CompilerFlags) -> CompiledCandidate | None:
        """The ``unstarted`` result of a compile that would end after the limit, or ``None``
        to start it."""
        if self.started is not None:
            if (candidate.name, flags.label) in self.started:
                return None
            return CompiledCandidate(
                candidate, CompileStatus.UNSTARTED, "not compiled: the first run of this plan did "
                f"not reach it within its {self.seconds:g} s time limit; raise the limit to "
                "compile it", 0.0, flags=flags)
        with self.lock:
            typical = sum(self.steps) / len(self.steps) if self.steps else 0.0
        late = time.monotonic() + typical - self.deadline
        if not typical or late <= 0:
            return None
        return CompiledCandidate(
            candidate, CompileStatus.UNSTARTED,
            f"not compiled: it would end about {late:.0f} s after the {self.seconds:g} s time "
            f"limit (a compile and its placement take {typical:.0f} s here); raise the limit "
            "to compile it", 0.0, flags=flags)


class _BestSoFar:
    """Each compile's step in plain device order and the fastest so far: for the progress
    lines (a cold plan compiles for minutes, best IR estimate first, and says what it would
    answer now) and for the flag rule of :func:`_compile_flag_sets`."""

    def __init__(self, topology: Topology) -> None:
        self.topology = topology
        self.plain = plain_order(topology)
        self.best: tuple[float, str] | None = None
        self.prices: dict[tuple[str, str], Predicted] = {}
        self.lock = threading.Lock()  # compiles report from several threads

    @property
    def best_s(self) -> float:
        """The fastest step priced so far (inf before any)."""
        with self.lock:
            return self.best[0] if self.best else math.inf

    def price(self, result: CompiledCandidate) -> Predicted | None:
        """``result``'s step in plain order (``None`` without a program), priced once."""
        if result.status is not CompileStatus.OK or result.program is None:
            return None
        with self.lock:
            known = self.prices.get(result.key)
        if known is None:
            known = predict(result.program, self.topology, self.plain)
            with self.lock:
                self.prices[result.key] = known
        return known

    def __call__(self, result: CompiledCandidate) -> str:
        priced = self.price(result)
        total = priced.total_s if priced is not None else math.inf
        with self.lock:
            if total < (self.best or (math.inf, ""))[0]:
                self.best = (total, f"{result.candidate.name} ({result.flags.label} flags)")
            best = self.best
        return f"best so far {best[1]}, {best[0]:.4g} s in plain order" if best else ""


def _rank_programs(programs: Sequence[CompiledCandidate], topology: Topology, budget: int,
                   top: int, what: str) -> list[Ranking]:
    """:func:`rank_placements` of each compiled program, in order. The searches not stored
    yet run side by side in worker processes (:func:`warm_in_workers`) where the slice can be
    rebuilt there (libtpu's deviceless devices by name, or a simulated slice); then every
    ranking is read here, so a warm plan starts no process."""
    todo = [r for r in programs if not is_ranked(r.program, r.candidate, topology,
                                                 budget=budget, top=top, flags=r.flags)]
    if topology.portable:
        warm_in_workers(_rank_in_worker, [(r.program, r.candidate, topology, budget, top,
                                           r.flags) for r in todo],
                        what=f"plan {what} on {topology.name}: placement searches")
    ticker = Ticker()
    rankings = []
    for index, r in enumerate(programs):
        ticker.note(f"plan {what} on {topology.name}: placed {index} of {len(programs)} "
                    "programs")
        rankings.append(rank_placements(r.program, r.candidate, topology, budget=budget,
                                        top=top, flags=r.flags))
    return rankings


def _rank_in_worker(program: CommProgram, candidate: Candidate, topology: Topology,
                    budget: int, top: int, flags: CompilerFlags) -> None:
    """In a worker process: store the ranking (:func:`_rank_programs` reads it back)."""
    rank_placements(program, candidate, topology, budget=budget, top=top, flags=flags)


def _compile_flag_sets(kept: list[Candidate], flag_sets: list[CompilerFlags],
                       queue: CompileQueue, priced: _BestSoFar, *,
                       limit: _TimeLimit | None = None,
                       place: Callable[[CompiledCandidate], None] | None = None,
                       setups: Sequence[SystemSetups] = (),
                       estimate: Callable[[Candidate], float] = lambda c: math.nan,
                       ) -> tuple[Compiles, tuple[SkippedCompile, ...],
                                  dict[tuple[str, str], CompiledCandidate]]:
    """Compile ``kept`` (best IR estimate first, as many at a time as the pool runs) with
    the first flag set, then with each other flag set where it could still win; with a
    ``limit``, the systems' ``setups`` too.

    Flags change how communication overlaps compute, not the ops' compute: a candidate's
    step under any flags and placement is at least its compute under the first flags. So a
    candidate whose compute alone is no faster than the best step priced (plain device
    order: the search only improves on it) is not compiled again. Measured on 14B@720p on
    v6e:4x4 (29 candidates, both flag sets): MaxDiffusion's flags change compute by -0.3 %
    to +2.1 %, mostly up. There 20 of 29 second compiles are spared (74 compiles in all, the
    baselines' included, become 55), on v5p:2x2x4 16 of 29 (71 become 55); both plans are
    the ones found with every compile.

    Without ``limit`` every survivor's first compile comes first, so the rule judges against
    the best of them all. With one, each survivor's further flag sets follow its own first
    compile (2 at a time: ``A`` and ``B`` with the default flags; as ``A`` comes back, ``A``
    with MaxDiffusion's flags, then ``B``'s, then ``C`` and ``D``), judged against the best
    so far (never below the final best: it spares less, never a winner), so the flags that
    win are reached before the limit; nothing starts past it, and ``place`` places each
    program as it comes back, so the limit counts placement too. The ``setups`` then share
    the limit: the user's (:data:`USER`, never left out) and each system's best IR estimate
    right after the first survivor, so every system is priced on at least one setup, and
    each system's other setups where their estimate falls among the survivors'. A setup
    that is also a survivor (same candidate and flags) compiles once.

    Returns the survivors' compiles, the spared ones, and the setups' compiles by key.
    """
    results: dict[tuple[int, int], CompiledCandidate] = {}
    skipped: dict[tuple[int, int], SkippedCompile] = {}
    done: dict[tuple[str, str], CompiledCandidate] = {}
    from_setups: dict[tuple[str, str], CompiledCandidate] = {}
    lock = threading.Lock()
    stop = threading.Event()  # a failure elsewhere: start nothing more

    def run(candidate: Candidate, flags: CompilerFlags, bounded: bool = True
            ) -> CompiledCandidate:
        key = (candidate.name, flags.label)
        with lock:
            known = done.get(key)
        late = (limit.unstarted(candidate, flags) if limit and bounded and not known
                and not queue.cached(candidate, flags) else None)
        if known is not None or late is not None:
            queue.skip()
            return known or late
        start = time.monotonic()
        result = queue.compile(candidate, flags)
        priced(result)  # the best so far, whatever the queue's progress hook is
        if place is not None and result.status is CompileStatus.OK:
            place(result)
        if limit is not None:
            if not result.cached:
                limit.record(time.monotonic() - start)
            elif math.isfinite(result.child_seconds):  # its cost cold, shared as it ran
                limit.record(result.child_seconds)
                limit.charge(result.child_seconds / queue.width)
        with lock:
            done[key] = result
        return result

    def survivor(i: int, sets: range) -> None:
        for j in sets:
            if stop.is_set():
                return
            first = results.get((i, 0))
            price = priced.price(first) if j and first is not None else None
            best_s = priced.best_s
            if price is not None and price.compute_s >= best_s:
                skipped[i, j] = SkippedCompile(kept[i], flag_sets[j], price.compute_s, best_s)
                queue.skip()
                continue
            with lock:
                known = done.get((kept[i].name, flag_sets[j].label))  # a setup's compile
            if (j and first is not None and first.status is CompileStatus.UNSTARTED
                    and known is None):
                # one whose first compile did not start gets no other
                results[i, j] = dataclasses.replace(first, flags=flag_sets[j])
                queue.skip()
                continue
            results[i, j] = run(kept[i], flag_sets[j])

    def setup(s: Setup, bounded: bool) -> None:
        if not stop.is_set():
            from_setups[s.candidate.name, s.flags.label] = run(s.candidate, s.flags, bounded)

    def go(tasks: list[Callable[[], None]]) -> None:
        with cf.ThreadPoolExecutor(max_workers=max(1, min(queue.width, len(tasks)))) as pool:
            try:  # started in order; re-raises a task's failure
                list(pool.map(lambda task: task(), tasks))
            except BaseException:
                stop.set()
                raise

    every = range(len(flag_sets))
    if limit is None:
        go([partial(survivor, i, range(1)) for i in range(len(kept))])
        go([partial(survivor, i, range(1, len(flag_sets))) for i in range(len(kept))])
    else:
        yours = [g for g in setups if g.name == USER]  # compiled whatever the limit
        tasks = [partial(survivor, 0, every),
                 *(partial(setup, s, False) for g in yours for s in g.setups),
                 *(partial(setup, g.setups[0], True) for g in setups
                   if g.name != USER and g.setups)]
        rest = sorted(((estimate(s.candidate), n, s) for g in setups if g.name != USER
                       for n, s in enumerate(g.setups[1:])), key=lambda t: t[:2])
        for i in range(1, len(kept)):
            while rest and rest[0][0] <= estimate(kept[i]):
                tasks.append(partial(setup, rest.pop(0)[2], True))
            tasks.append(partial(survivor, i, every))
        tasks += [partial(setup, s, True) for *_, s in rest]
        go(tasks)
    by_flags = sorted(results, key=lambda ij: (ij[1], ij[0]))
    return (Compiles(results[ij] for ij in by_flags),
            tuple(skipped[ij] for ij in sorted(skipped, key=lambda ij: (ij[1], ij[0]))),
            from_setups)
