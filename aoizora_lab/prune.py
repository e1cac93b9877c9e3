"""Keep the candidates worth compiling: IR estimates, lower bounds, and a reason for each drop.

Rules, applied to every candidate in order (the first that applies decides):

1. **Cannot fit**: parameters (of every resident expert: Wan 2.2 A14B keeps two unless it
   swaps one, ``Workload.swap_experts``) plus the
   largest activation per device exceed the chip's usable HBM (15.75 GiB on v5e): compiling it
   would only report ``RESOURCE_EXHAUSTED``, or leave no room for the other expert.
2. **Cannot win**: its latency *lower bound* exceeds the best *estimate* of any candidate by
   more than ``bound_margin`` (default 25 %, headroom for the estimate's error): even the
   best placement on this slice could not make it competitive.
3. **Unlikely to win**: its estimate exceeds the best estimate by more than
   ``estimate_margin`` (default 10 %: candidates that fit share most of their compute, so the
   estimates of the contenders sit within a few per cent of each other).
4. **Over the compile budget**: beyond the best ``max_fraction`` (default a quarter) of all
   candidates by estimate. The budget never cuts inside a tie: every candidate whose estimate
   equals the last one's within the budget (to 3 significant digits, as the ranking compares
   them) is kept too, since which of them the ranking put first says nothing about which is
   faster.
5. The ``keep`` best candidates by estimate that fit are always kept, whatever rules 2-4 say,
   so a poor estimate can never empty the compile queue.

A quick answer's tighter budget (``PlanOptions.max_compiled``) is not pruning's: the plan
keeps every survivor and its admission policy compiles only the best few
(:func:`aoizora_lab.jobs.budget_rule`), so the records still say what pruning kept.

Estimates apply the overlap rule, so when every collective hides behind compute many
candidates tie; estimates equal to 3 significant digits are ranked by their communication
estimate (the overlap rule is optimistic: less traffic is the safer bet). A tie is no
evidence, so the budget keeps all of it: on Wan 2.2 A14B at 720p on ``v6e:2x4`` the budget's
last estimate (the 13th of 52) is 3.64 s, and two candidates past it estimate the same; the
tie keeps 15. It once mattered: before the estimates knew which flags make all-to-alls
asynchronous (``flag_async``), nine Ulysses candidates tied at 3.94 s across that budget, and
MaxDiffusion's ``cfg2-uly4-fsdpseq``, ranked just past it, compiles 1.1 % faster than every
candidate within it. (Numbers as the planner prunes: each candidate under its best searched
flag set, ``flag_async``; ``prune``'s own default is libtpu's flags only.)

Known miss: the IR sees the collectives the step asks for (``shard_map`` ones, resharding
constraints), not those the partitioner adds on its own, such as the guidance combine across
a ``cfg`` split (the tiny test model on 4 host devices compiles ``cfg2-ctx2`` with a permute,
an all-reduce, an all-gather and two all-to-alls the IR does not count). At Wan sizes they
are a few MB next to the sequence traffic; on a latency-bound toy (microseconds a step) they
halve a ``cfg2`` candidate's estimated communication, and rule 3 can drop the compiled winner
(there, ``ctx4`` at 1.99x the estimate of ``cfg2-ctx2``).

A candidate whose trace fails is dropped with the error as its reason; the sweep goes on.
Example (Wan 2.1 14B at 720p on ``v5e:4x4``): ``cfg2-tp8`` has a lower bound of 5.96 s while
``cfg2-uly8-fsdp`` is estimated at 8.35 s, so rule 2 spares it (5.96 < 1.25 x 8.35), but its
estimate of 15.9 s is 1.91x the best and rule 3 drops it.
"""

from __future__ import annotations

import contextlib
import enum
import math
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

from aoizora_lab.candidates import Candidate
from aoizora_lab.errors import AoizoraError
from aoizora_lab.hardware import device_spec
from aoizora_lab.ir_estimate import (
    ASYNC_KINDS,
    LIBTPU_DEFAULTS,
    FlagAsync,
    IRCacheDir,
    IREstimate,
    check_flag_async,
    estimate_ir,
    is_traced,
    trace_counts,
)
from aoizora_lab.progress import Ticker
from aoizora_lab.records import Records
from aoizora_lab.topology import Topology
from aoizora_lab.workers import warm_in_workers
from aoizora_lab.workload import Workload

GiB = 2**30


def estimate_candidates(candidates: Sequence[Candidate], workload: Workload,
                        topology: Topology, *, dtype: Any = None,
                        ir_cache_dir: IRCacheDir = None,
                        flag_async: FlagAsync = LIBTPU_DEFAULTS,
                        ) -> dict[str, IREstimate | str]:
    """IR estimate per candidate name, or the error text where tracing failed (traces cached
    under ``ir_cache_dir``; ``flag_async``: what each flag set searched makes asynchronous;
    see :func:`estimate_ir`). With the cache on, the traces not cached yet run side by side in
    worker processes first (:func:`warm_in_workers`), then every estimate is read here."""
    check_flag_async(flag_async)
    todo = [c for c in candidates if ir_cache_dir is not False and not is_traced(
        c, workload, dtype=dtype, cache_dir=ir_cache_dir)]
    warm_in_workers(_trace_in_worker, [(c, workload, dtype, ir_cache_dir) for c in todo],
                    what=f"IR traces ({workload.name} on {topology.name})")
    results: dict[str, IREstimate | str] = {}
    ticker = Ticker()
    for done, candidate in enumerate(candidates):
        ticker.note(f"IR traces ({workload.name} on {topology.name}): {done} of "
                    f"{len(candidates)} candidates")
        try:
            results[candidate.name] = estimate_ir(candidate, workload, topology, dtype=dtype,
                                                  cache_dir=ir_cache_dir,
                                                  flag_async=flag_async)
        except Exception as err:  # one candidate's failure must not end the sweep
            results[candidate.name] = f"{type(err).__name__}: {err}"
    return results


def _trace_in_worker(candidate: Candidate, workload: Workload, dtype: Any,
                     ir_cache_dir: IRCacheDir) -> None:
    """In a worker process: trace and cache (no slice needed); a failure is left for the
    serial pass of :func:`estimate_candidates` to record."""
    with contextlib.suppress(Exception):
        trace_counts(candidate, workload, dtype=dtype, cache_dir=ir_cache_dir)


class Verdict(enum.Enum):
    """What pruning decided for one candidate (the rule of the module docstring that applied)."""

    KEPT_BEST = "kept: among the best estimates"
    """Rule 5: among the ``keep`` best estimates, kept whatever the other rules say."""
    KEPT = "kept"
    """Passed rules 1-4."""
    OVER_HBM = "cannot fit"
    """Rule 1: parameters plus the largest activation exceed the usable HBM."""
    CANNOT_WIN = "cannot win"
    """Rule 2: lower bound above the best estimate plus the bound margin."""
    UNLIKELY = "unlikely to win"
    """Rule 3: estimate above the best estimate plus the estimate margin."""
    OVER_BUDGET = "over the compile budget"
    """Rule 4: not among the best ``max_fraction`` of the candidates."""
    TRACE_FAILED = "trace failed"
    """The IR trace raised; the reason holds the error."""

    @property
    def keep(self) -> bool:
        """Whether the candidate goes on to be compiled."""
        return self in (Verdict.KEPT_BEST, Verdict.KEPT)


@dataclass(frozen=True)
class PruneDecision:
    """Pruning's decision for one candidate, with the IR figures it was made from."""

    candidate: Candidate
    """The candidate decided on."""
    verdict: Verdict
    """Which rule decided."""
    reason: str
    """The decision for people, with the numbers that made it."""
    estimate: IREstimate | None
    """The candidate's IR estimate and bounds (``None`` when its trace failed)."""
    position: int
    """Its place in the candidates pruning received (ties the ranking keeps in that order)."""


PRUNING_COLUMNS = ("candidate", "estimate_s", "lower_bound_s", "compute_estimate_s",
                   "comm_estimate_s", "also_async", "tflops_per_device", "comm_gb_per_device",
                   "param_gib_per_device", "memory_lower_bound_gib", "keep", "verdict",
                   "reason")
"""Columns of :meth:`Pruning.to_frame` (``also_async``: the kinds the estimate's flag set
makes asynchronous besides libtpu's, ``IREstimate.async_kinds``)."""


class Pruning(Records[PruneDecision]):
    """Every candidate's decision, best estimate first (failed traces last)."""

    COLUMNS = PRUNING_COLUMNS

    @property
    def kept(self) -> list[Candidate]:
        """The candidates kept, best estimate first: what gets compiled, in that order, so the
        likeliest winners are priced (and shown as the best so far) first."""
        return [d.candidate for d in self if d.verdict.keep]

    def could_win(self, candidate: Candidate) -> bool:
        """Whether ``candidate`` may still be the fastest: rules 1 and 2 do not rule it out
        and its trace did not fail (the estimate's rules 3-4 do not count: the IR has no
        schedule, and flags that hide communication can lift a candidate it ranks low). A
        candidate pruning never saw may."""
        try:
            verdict = self.decision_of(candidate).verdict
        except AoizoraError:  # never seen
            return True
        return verdict not in (Verdict.OVER_HBM, Verdict.CANNOT_WIN, Verdict.TRACE_FAILED)

    def decision_of(self, candidate: Candidate) -> PruneDecision:
        """The decision ``candidate`` is judged by: that on :func:`pruned_as` it."""
        return self.decision(pruned_as(candidate).name)

    def decision(self, name: str) -> PruneDecision:
        """The decision on the candidate called ``name``."""
        for d in self:
            if d.candidate.name == name:
                return d
        raise AoizoraError(f"No candidate {name!r} was pruned; candidates: "
                           f"{[d.candidate.name for d in self]}.")

    def row(self, item: PruneDecision) -> dict[str, Any]:
        e = item.estimate
        figures = {} if e is None else {
            "estimate_s": e.estimate_seconds, "lower_bound_s": e.lower_bound_seconds,
            "compute_estimate_s": e.compute_estimate_seconds,
            "comm_estimate_s": e.comm_estimate_seconds,
            "also_async": ", ".join(k for k in e.async_kinds if k not in ASYNC_KINDS),
            "tflops_per_device": e.flops / 1e12,
            "comm_gb_per_device": e.comm_bytes / 1e9, "param_gib_per_device": e.param_bytes / GiB,
            "memory_lower_bound_gib": e.memory_lower_bound_bytes / GiB}
        return {"candidate": item.candidate.name, **figures, "keep": item.verdict.keep,
                "verdict": item.verdict.name.lower(), "reason": item.reason}


MAX_FRACTION = 0.25
"""Rule 4's default cap: the share of the candidates pruning keeps at most (``keep`` aside)."""


def pruned_as(candidate: Candidate) -> Candidate:
    """The candidate pruning traces for ``candidate``: itself, or for chunked Ulysses
    (``ulysses_chunks`` > 1: a system's recipe may ask for it, the space never enumerates it)
    its unchunked twin, the same program with each all-to-all cut in chunks: the same weights,
    activations and bytes, so one decision and one estimate serve both (the chunks' overlap
    shows only in the compiled schedule)."""
    return replace(candidate, ulysses_chunks=1)


def prune(candidates: Sequence[Candidate], workload: Workload, topology: Topology, *,
          keep: int = 3, bound_margin: float = 0.25, estimate_margin: float = 0.1,
          max_fraction: float = MAX_FRACTION,
          estimates: dict[str, IREstimate | str] | None = None,
          dtype: Any = None, ir_cache_dir: IRCacheDir = None,
          flag_async: FlagAsync = LIBTPU_DEFAULTS,
          ) -> Pruning:
    """Decide for every candidate (rules in the module docstring); best estimate first.
    ``flag_async``: per flag set the survivors will be compiled with, the collective kinds it
    makes asynchronous (``CompilerFlags.async_kinds``; default libtpu's own only, the
    planner's ``PlanOptions.flag_async``), so a candidate is estimated under its best flag set
    (unused where ``estimates`` are given)."""
    check_flag_async(flag_async)
    if keep < 1 or bound_margin < 0 or estimate_margin < 0 or not 0 < max_fraction <= 1:
        raise AoizoraError(
            f"prune needs keep >= 1, non-negative margins and 0 < max_fraction <= 1; got "
            f"keep={keep}, bound_margin={bound_margin}, estimate_margin={estimate_margin}, "
            f"max_fraction={max_fraction}."
        )
    budget = max(keep, math.floor(max_fraction * len(candidates)))
    estimates = estimates or estimate_candidates(candidates, workload, topology, dtype=dtype,
                                                 ir_cache_dir=ir_cache_dir,
                                                 flag_async=flag_async)
    usable = device_spec(topology).hbm_usable_bytes
    failed, fits, over = [], [], []
    for position, candidate in enumerate(candidates):
        result = estimates[candidate.name]
        if isinstance(result, str):
            failed.append(PruneDecision(candidate, Verdict.TRACE_FAILED,
                                        f"trace failed: {result}", None, position))
        elif (needs := result.memory_lower_bound_bytes
              + (workload.resident_experts - 1) * result.param_bytes) > usable:
            held = ("parameters" if workload.resident_experts == 1
                    else f"parameters of {workload.resident_experts} resident experts")
            over.append(PruneDecision(
                candidate, Verdict.OVER_HBM,
                f"cannot fit: needs >= {needs / GiB:.2f} GiB per device ({held} + largest "
                f"activation) > {usable / GiB:.2f} GiB usable HBM", result, position))
        else:
            fits.append((position, candidate, result))
    fits = _ranked(fits)
    decided = []
    if fits:
        best_name, best_s = fits[0][1].name, fits[0][2].estimate_seconds
        last_kept = _rank_key(fits[min(budget, len(fits)) - 1][2])[0]
        for rank, (position, candidate, e) in enumerate(fits):
            if rank < keep:
                verdict, reason = Verdict.KEPT_BEST, f"kept: among the {keep} best estimates"
            elif e.lower_bound_seconds > (1 + bound_margin) * best_s:
                verdict, reason = Verdict.CANNOT_WIN, (
                    f"cannot win: lower bound {e.lower_bound_seconds:.3g} s > "
                    f"{1 + bound_margin:g} x best estimate {best_s:.3g} s ({best_name})")
            elif e.estimate_seconds > (1 + estimate_margin) * best_s:
                verdict, reason = Verdict.UNLIKELY, (
                    f"unlikely to win: estimate {e.estimate_seconds:.3g} s is "
                    f"{e.estimate_seconds / best_s:.2f} x the best ({best_name})")
            elif rank >= budget and _rank_key(e)[0] > last_kept:
                verdict, reason = Verdict.OVER_BUDGET, (
                    f"over the compile budget: not among the best {budget} of "
                    f"{len(candidates)} estimates")
            elif rank >= budget:
                verdict, reason = Verdict.KEPT, (
                    f"kept: past the best {budget} estimates but tied with the last of them "
                    f"({last_kept:.3g} s)")
            else:
                verdict, reason = Verdict.KEPT, (
                    f"kept: estimate within {1 + estimate_margin:g} x the best")
            decided.append(PruneDecision(candidate, verdict, reason, e, position))
    # Candidates over HBM rank among the traced ones by estimate, as the kept ones do.
    traced = sorted(decided + over, key=lambda d: (*_rank_key(d.estimate), d.position))
    return Pruning([*traced, *failed])


def _rank_key(e: IREstimate) -> tuple[float, float]:
    """Best estimate first; estimates equal to 3 significant digits go to less communication."""
    return float(f"{e.estimate_seconds:.3g}"), e.comm_estimate_seconds


def _ranked(fits: list[tuple[int, Candidate, IREstimate]]
            ) -> list[tuple[int, Candidate, IREstimate]]:
    return sorted(fits, key=lambda f: _rank_key(f[2]))
