"""The search's compiles as typed jobs: built up front, admitted by a policy, typed outcomes.

A plan compiles the survivors of pruning with each searched flag set, the existing systems'
setups and the user's own. :func:`build_jobs` makes every one a :class:`CompileJob` before
anything compiles, deduplicated by ``(candidate, flags)``: a setup that is also a survivor
compiles once and serves both (:attr:`CompileJob.origins`). An admission policy
(:class:`FullSearch`, :class:`TimeLimited`) orders the jobs into rounds of lanes and, as each
job comes up, admits it or says why not; :func:`run_jobs` runs them through one
:class:`~aoizora_lab.compile.CompileQueue` and returns one outcome per job: a
:class:`~aoizora_lab.compile.CompiledCandidate` (``ok``, or failed with its status) or a
:class:`~aoizora_lab.compile.NotRun` with its reason. Pricing, placement and the systems'
scores are functions of those outcomes.

**The flag rule** (both policies). Flags change how communication overlaps compute, not the
ops' compute, so a survivor's step under any flags is at least its compute under the first
flag set. A survivor's further flag set whose first-flags compute alone is no faster than the
best step priced so far (plain device order: placement only improves on it) is not run
(``CANNOT_WIN``), unless a system or the user runs that very compile. Measured on 14B@720p on
v6e:4x4: MaxDiffusion's flags change compute by -0.3 % to +2.1 %, mostly up.

Worked example, a full search of survivors A, B, C with flag sets ``d`` and ``m``, where
MaxDiffusion's setup is B with ``m``: the jobs are A/d, B/d, C/d, A/m, B/m (a survivor and
a system's), C/m and the systems' other setups. Round one runs A/d, B/d, C/d (as many at a
time as the pool runs); round two A/m, B/m, C/m, where A/m and C/m may be ``CANNOT_WIN`` but
B/m runs; round three the setups not yet run. A time-limited plan instead runs one round
of lanes in a planned order (:class:`TimeLimited`).
"""

from __future__ import annotations

import concurrent.futures as cf
import enum
import math
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

from aoizora_lab.baselines import USER, SystemSetups
from aoizora_lab.candidates import Candidate
from aoizora_lab.comm_model import ModelOptions
from aoizora_lab.compile import (
    CompiledCandidate,
    CompileQueue,
    CompilerFlags,
    CompileStatus,
    NotRun,
    NotRunReason,
    Outcome,
)
from aoizora_lab.cost import Predicted, predict
from aoizora_lab.placement import plain_order, rank_placements
from aoizora_lab.topology import Topology
from aoizora_lab.workers import usable_cpus

Key = tuple[str, str]
"""``(candidate name, flags label)``: a compile's identity in a plan."""


class OriginKind(enum.Enum):
    """Why a job is in the plan."""

    SURVIVOR = "survivor"
    """A candidate pruning kept, with one of the searched flag sets."""
    SYSTEM = "system"
    """An existing system's setup."""
    USER = "user"
    """The user's own setup (compiled whatever the limit)."""


@dataclass(frozen=True)
class Origin:
    """One reason a job is in the plan."""

    kind: OriginKind
    """Survivor, system or user."""
    rank: int = -1
    """Its place among pruning's kept candidates (a survivor) or among its system's setups
    (a setup; 0: the best IR estimate)."""
    flag_index: int = -1
    """For a survivor: which searched flag set (0: the first)."""
    first_flags: str = ""
    """For a survivor: the label of the first searched flag set (the flag rule reads that
    compile)."""
    system: str = ""
    """For a setup: the system (:data:`~aoizora_lab.baselines.SYSTEMS` or ``user``)."""
    group: int = -1
    """For a setup: its system's place in the plan's list of systems."""
    recipe: str = ""
    """For a setup: the recipe in the system's words."""


@dataclass(frozen=True)
class CompileJob:
    """One compile the plan may run, with every reason it is there."""

    candidate: Candidate
    """The sharding to compile."""
    flags: CompilerFlags
    """The compiler flags to compile it with."""
    origins: tuple[Origin, ...]
    """Why it is in the plan (several when a setup is also a survivor)."""
    estimate_s: float = math.nan
    """Pruning's IR estimate of the candidate (NaN: none)."""
    could_win: bool = True
    """Pruning's lower bound leaves it a chance to be the plan
    (:meth:`~aoizora_lab.prune.Pruning.could_win`): a time-limited plan runs the systems'
    setups that could win before further survivors."""

    @property
    def key(self) -> Key:
        """``(candidate name, flags label)``."""
        return self.candidate.name, self.flags.label

    @property
    def for_user(self) -> bool:
        """The user's setup needs it: compiled whatever the limit."""
        return any(o.kind is OriginKind.USER for o in self.origins)

    @property
    def for_setup(self) -> bool:
        """A system or the user runs this very compile: the flag rule does not spare it."""
        return any(o.kind is not OriginKind.SURVIVOR for o in self.origins)

    @property
    def further_flags(self) -> bool:
        """A survivor's flag set after its first."""
        return any(o.kind is OriginKind.SURVIVOR and o.flag_index > 0 for o in self.origins)


def build_jobs(kept: Sequence[Candidate], flag_sets: Sequence[CompilerFlags],
               setups: Sequence[SystemSetups],
               estimate: Callable[[Candidate, CompilerFlags | None], float],
               could_win: Callable[[Candidate], bool] = lambda candidate: True
               ) -> list[CompileJob]:
    """Every compile of a plan, each once: the survivors with each flag set (first flag set
    first, in pruning's order), then each system's and the user's setups; ``estimate``: a
    candidate's IR estimate under flags, or its best for ``None``
    (:func:`~aoizora_lab.baselines.estimate_of`: a survivor's job carries its best, the rank
    pruning gave it, a setup's job its own flags'); ``could_win``:
    whether pruning's lower bound leaves it a chance
    (:meth:`~aoizora_lab.prune.Pruning.could_win`)."""
    origins: dict[Key, list[Origin]] = {}
    made: dict[Key, tuple[Candidate, CompilerFlags]] = {}

    def add(candidate: Candidate, flags: CompilerFlags, origin: Origin) -> None:
        key = (candidate.name, flags.label)
        made.setdefault(key, (candidate, flags))
        origins.setdefault(key, []).append(origin)

    for j, flags in enumerate(flag_sets):
        for i, candidate in enumerate(kept):
            add(candidate, flags, Origin(OriginKind.SURVIVOR, rank=i, flag_index=j,
                                         first_flags=flag_sets[0].label))
    for g, group in enumerate(setups):
        kind = OriginKind.USER if group.name == USER else OriginKind.SYSTEM
        for n, s in enumerate(group.setups):
            add(s.candidate, s.flags, Origin(kind, rank=n, system=group.name, group=g,
                                             recipe=s.recipe))
    def survivor(key: Key) -> bool:
        return any(o.kind is OriginKind.SURVIVOR for o in origins[key])

    return [CompileJob(c, f, tuple(origins[key]), estimate(c, None if survivor(key) else f),
                       could_win(c))
            for key, (c, f) in made.items()]


class Prices:
    """Each compile's step in plain device order and the fastest so far: the flag rule's
    yardstick and the progress lines' "best so far" (a cold plan compiles for minutes, best
    IR estimate first, and says what it would answer now)."""

    def __init__(self, topology: Topology, model: ModelOptions | None = None) -> None:
        self.topology, self.model = topology, model
        self.plain = plain_order(topology)
        self.best: tuple[float, str] | None = None
        self.prices: dict[Key, Predicted] = {}
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
            known = predict(result.program, self.topology, self.plain, options=self.model)
            with self.lock:
                self.prices[result.key] = known
        return known

    def __call__(self, result: CompiledCandidate) -> str:
        """Price ``result``; the progress line's ending: the best so far."""
        priced = self.price(result)
        total = priced.total_s if priced is not None else math.inf
        with self.lock:
            if total < (self.best or (math.inf, ""))[0]:
                self.best = (total, f"{result.candidate.name} ({result.flags.label} flags)")
            best = self.best
        return f"best so far {best[1]}, {best[0]:.4g} s in plain order" if best else ""


class Outcomes:
    """The outcome of every job run so far, by key, from several threads."""

    def __init__(self, known: Iterable[Outcome] = ()) -> None:
        self._by_key: dict[Key, Outcome] = {o.key: o for o in known}
        self._lock = threading.Lock()

    def add(self, outcome: Outcome) -> None:
        with self._lock:
            self._by_key[outcome.key] = outcome

    def get(self, key: Key) -> Outcome | None:
        with self._lock:
            return self._by_key.get(key)

    def snapshot(self) -> dict[Key, Outcome]:
        """Every outcome so far, by key."""
        with self._lock:
            return dict(self._by_key)


def flag_rule(job: CompileJob, outcomes: Outcomes, prices: Prices) -> NotRun | None:
    """The module docstring's flag rule for ``job``: ``None`` to run it."""
    if not job.further_flags or job.for_setup:
        return None
    survivor = next(o for o in job.origins if o.kind is OriginKind.SURVIVOR)
    first = outcomes.get((job.candidate.name, survivor.first_flags))
    if isinstance(first, NotRun):
        return NotRun(job.candidate, job.flags, first.reason,
                      f"not compiled: its first flag set was not ({first.message})")
    price = prices.price(first) if first is not None else None
    best_s = prices.best_s
    if price is not None and price.compute_s >= best_s:
        return NotRun(job.candidate, job.flags, NotRunReason.CANNOT_WIN,
                      f"{job.candidate.name} with {job.flags.label} flags: its compute alone "
                      f"({price.compute_s:.4g} s) is no faster than a step already priced "
                      f"({best_s:.4g} s)", compute_s=price.compute_s, best_s=best_s)
    return None


def budget_rule(job: CompileJob, max_survivors: int | None) -> NotRun | None:
    """The compile budget: only the ``max_survivors`` best survivors by IR estimate compile
    (``None``: every one); a system's or the user's setup is never held back by it.
    ``None`` to run ``job``."""
    if max_survivors is None or job.for_setup or _rank(job) < max_survivors:
        return None
    return NotRun(job.candidate, job.flags, NotRunReason.BUDGET,
                  f"not compiled: beyond the compile budget (the {max_survivors} best "
                  f"survivors by IR estimate, max_compiled={max_survivors}); raise it, or "
                  "None to compile every survivor")


Lane = list[CompileJob]
"""Jobs run one after the other (a survivor's flag sets)."""
Round = list[Lane]
"""Lanes run side by side, as many at a time as the pool runs, started in order; a round
starts when the one before has ended."""


@dataclass(frozen=True)
class FullSearch:
    """Every job runs but those the flag rule (and the compile budget) spare: every
    survivor's first flag set, then their further flag sets (judged against the best of every
    first compile), then the setups not run yet."""

    max_survivors: int | None = None
    """The compile budget (:func:`budget_rule`; ``None``: every survivor)."""

    def rounds(self, jobs: Sequence[CompileJob]) -> list[Round]:
        """The module docstring's three rounds."""
        first = [j for j in jobs if _survivor(j, first=True)]
        further: dict[int, Lane] = {}
        for job in jobs:
            if job not in first and _survivor(job, first=False):
                further.setdefault(_rank(job), []).append(job)
        rest = [j for j in jobs if j not in first and all(j not in lane
                                                          for lane in further.values())]
        return [[[j] for j in first], [further[r] for r in sorted(further)],
                [[j] for j in rest]]

    def admit(self, job: CompileJob, outcomes: Outcomes, prices: Prices,
              queue: CompileQueue) -> NotRun | None:
        """Run it unless the compile budget or the flag rule spares it."""
        return budget_rule(job, self.max_survivors) or flag_rule(job, outcomes, prices)

    def finish(self, result: CompiledCandidate, seconds: float, queue: CompileQueue) -> None:
        """Nothing to keep."""

    def time_left(self) -> float:
        """No limit."""
        return math.inf


class TimeLimited:
    """Answer within ``seconds``: the full search's jobs in an order that reaches the likely
    winners, and every system's chance to beat them, first; no job starts that would end
    after the limit.

    The clock starts with the plan (its IR traces count, :meth:`traced`). Once a compile and
    its placement search have come back, a compile starts only if one more such step, at the
    mean of those this plan ran, would end by the limit; the first round always starts (a
    plan needs a program). Example: a 300 s limit, 20 s of IR traces, steps of ~46 s two at
    a time: rounds end at 66, 112, ... 296 s; a seventh would end at ~342 s and does not
    start.

    One round of lanes, so that a quick answer never claims a win it has not checked:

    1. the best survivor with all its flag sets (a plan needs a program);
    2. the user's setups (never limited);
    3. each system's best-estimate setup, so every system is priced on at least one;
    4. every other setup of a system that could win (:attr:`CompileJob.could_win`: pruning's
       lower bound does not rule it out), best estimate first: the IR estimate has no
       schedule, so a setup it ranks below the best survivor may still win once its flags
       hide its communication;
    5. the other survivors by IR estimate, each with all its flag sets, and the setups that
       cannot win slotted in where their estimate falls among the survivors'.

    Worked example: survivors A (1.0 s), B (2.0 s); MaxDiffusion's setups M1 (0.9 s), M2
    (2.5 s, could win) and M3 (9 s, cannot win): A, M1, M2, B, M3. Each program is placed as
    it comes back, so the limit counts placement too.

    The same plan again (``started``: what its first run started) starts exactly those
    compiles, reading them back, so it answers at once with the same plan. Work read back
    from the caches is charged what it cost when it ran, so a longer limit spends only the
    difference; whatever the caches hold is read, past the limit too. ``max_survivors``: the
    compile budget (:func:`budget_rule`) on top of the limit.
    """

    def __init__(self, seconds: float, topology: Topology, *, budget: int, top: int,
                 started: frozenset[Key] | None = None,
                 max_survivors: int | None = None, model: ModelOptions | None = None) -> None:
        self.seconds, self.topology, self.budget, self.top = seconds, topology, budget, top
        self.model = model
        self.started, self.max_survivors = started, max_survivors
        self.start = time.monotonic()
        self.deadline = self.start + seconds
        self.steps: list[float] = []
        self.lock = threading.Lock()

    def time_left(self) -> float:
        """Seconds until the limit (negative past it)."""
        with self.lock:
            return self.deadline - time.monotonic()

    def traced(self, seconds: float) -> None:
        """The IR traces took ``seconds`` when they ran (side by side, :func:`usable_cpus`
        at a time): count that much from the start where reading them back took less."""
        with self.lock:
            self.deadline -= max(0.0, seconds / usable_cpus() - (time.monotonic() - self.start))

    def rounds(self, jobs: Sequence[CompileJob]) -> list[Round]:
        """One round in the order the class docstring gives."""
        survivors: dict[int, Lane] = {}
        for job in jobs:
            if _survivor(job, first=None):
                survivors.setdefault(_rank(job), []).append(job)
        lanes = [survivors[r] for r in sorted(survivors)]
        setups = _setups_by_system(jobs)
        users = [[j] for j in setups.pop(USER, [])]
        firsts = [[group[0]] for group in setups.values()]
        others = sorted(((j.estimate_s, n, j) for group in setups.values()
                         for n, j in enumerate(group[1:])), key=lambda t: t[:2])
        contenders = [[j] for *_, j in others if j.could_win]
        rest = [t for t in others if not t[2].could_win]
        ordered: Round = [*lanes[:1], *users, *firsts, *contenders]
        for lane in lanes[1:]:
            while rest and rest[0][0] <= lane[0].estimate_s:
                ordered.append([rest.pop(0)[2]])
            ordered.append(lane)
        ordered += [[j] for *_, j in rest]
        return [_first_lanes_only(ordered)]

    def admit(self, job: CompileJob, outcomes: Outcomes, prices: Prices,
              queue: CompileQueue) -> NotRun | None:
        """The compile budget and the flag rule, then the limit (never for the user's setup,
        nor for a compile the cache holds)."""
        spared = budget_rule(job, self.max_survivors) or flag_rule(job, outcomes, prices)
        if spared is not None or job.for_user or queue.cached(job.candidate, job.flags):
            return spared
        if self.started is not None:
            return None if job.key in self.started else NotRun(
                job.candidate, job.flags, NotRunReason.FIRST_RUN,
                f"not compiled: the first run of this plan did not reach it within its "
                f"{self.seconds:g} s time limit; raise the limit to compile it")
        with self.lock:
            typical = sum(self.steps) / len(self.steps) if self.steps else 0.0
        late = time.monotonic() + typical - self.deadline
        if not typical or late <= 0:
            return None
        return NotRun(job.candidate, job.flags, NotRunReason.TIME_LIMIT,
                      f"not compiled: it would end about {late:.0f} s after the "
                      f"{self.seconds:g} s time limit (a compile and its placement take "
                      f"{typical:.0f} s here); raise the limit to compile it")

    def finish(self, result: CompiledCandidate, seconds: float, queue: CompileQueue) -> None:
        """Place the program now, and count the step (a cached one at its cold cost)."""
        start = time.monotonic()
        if result.status is CompileStatus.OK:
            rank_placements(result.program, result.candidate, self.topology,
                            budget=self.budget, top=self.top, flags=result.flags,
                            options=self.model)
        seconds += time.monotonic() - start
        with self.lock:
            if not result.cached:
                self.steps.append(seconds)
            elif math.isfinite(result.child_seconds):  # its cost cold, shared as it ran
                self.steps.append(result.child_seconds)
                self.deadline -= result.child_seconds / queue.width


Admission = FullSearch | TimeLimited
"""What decides the order of a plan's jobs and which run."""


def run_jobs(rounds: Sequence[Round], policy: Admission, queue: CompileQueue, prices: Prices,
             outcomes: Outcomes) -> None:
    """Run ``rounds`` through ``queue``, each job admitted by ``policy`` as it comes up; its
    outcome goes to ``outcomes`` (a job already there is not run again). A failure of this
    code (not of a compile: that is an outcome) stops what has not started and propagates."""
    stop = threading.Event()

    def lane(jobs: Lane) -> None:
        for job in jobs:
            if stop.is_set():
                return
            if outcomes.get(job.key) is not None:
                queue.skip()
                continue
            refused = policy.admit(job, outcomes, prices, queue)
            if refused is not None:
                outcomes.add(refused)
                queue.skip()
                continue
            start = time.monotonic()
            result = queue.compile(job.candidate, job.flags)
            prices(result)
            policy.finish(result, time.monotonic() - start, queue)
            outcomes.add(result)

    for lanes in rounds:
        if not lanes:
            continue
        with cf.ThreadPoolExecutor(max_workers=max(1, min(queue.width, len(lanes)))) as pool:
            try:  # started in order; re-raises a lane's failure
                list(pool.map(lane, lanes))
            except BaseException:
                stop.set()
                raise


def _survivor(job: CompileJob, *, first: bool | None) -> bool:
    """A survivor's job (``first``: its first flag set; ``False``: a further one)."""
    return any(o.kind is OriginKind.SURVIVOR and (first is None or (o.flag_index == 0) == first)
               for o in job.origins)


def _rank(job: CompileJob) -> int:
    return min(o.rank for o in job.origins if o.kind is OriginKind.SURVIVOR)


def _setups_by_system(jobs: Sequence[CompileJob]) -> dict[str, Lane]:
    """Each system's (and the user's) setup jobs, in its order (best IR estimate first)."""
    found = sorted((o.group, o.rank, o.system, job) for job in jobs for o in job.origins
                   if o.kind is not OriginKind.SURVIVOR)
    out: dict[str, Lane] = {}
    for *_, system, job in found:
        out.setdefault(system, []).append(job)
    return out


def _first_lanes_only(lanes: Round) -> Round:
    """Each job in the first lane that holds it only (a setup that is also a survivor
    compiles once, where it first comes up)."""
    seen: set[Key] = set()
    out = []
    for lane in lanes:
        kept = [j for j in lane if j.key not in seen]
        seen.update(j.key for j in kept)
        if kept:
            out.append(kept)
    return out
