"""The AoiZora search end to end: enumerate -> IR estimate -> prune -> compile -> place -> rank.

``plan(workload, topology)`` returns a :class:`PlanResult` with a DataFrame per stage and the
best :class:`~aoizora_lab.realize.Plan`.

**Predicted step latency** of a (candidate, placement) pair = compute + communication, where
compute is the compiled program's per-device roofline estimate
(:meth:`~aoizora_lab.hlo.CommProgram.compute_seconds`) and communication is the ICI model on the
placement. Overlap rule: collectives the compiler scheduled asynchronously (``*-start`` ops and
async collective fusions) may hide behind compute, up to the compute time; synchronous ones add:

    total = compute + sync_comm + max(0, async_comm - compute)

Baselines (:mod:`aoizora_lab.baselines`) are compiled and scored by the same pipeline and
model, so ``PlanResult.baselines`` compares like with like.
"""

from __future__ import annotations

import concurrent.futures as cf
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from aoizora_lab import baselines as known
from aoizora_lab.candidates import (
    Candidate,
    candidates_from_table,
    default_attention,
    explain_candidates,
)
from aoizora_lab.comm_model import estimate
from aoizora_lab.compile import (
    CompiledCandidate,
    check_compilable,
    check_num_layers,
    compile_candidates,
)
from aoizora_lab.errors import AoizoraError, is_whole
from aoizora_lab.hardware import chip_spec
from aoizora_lab.hlo import CommProgram
from aoizora_lab.ir import IRCacheDir
from aoizora_lab.placement import Placement, search_placements
from aoizora_lab.prune import prune, survivors
from aoizora_lab.realize import Plan, Predicted
from aoizora_lab.topology import Topology
from aoizora_lab.workload import Workload


@dataclass(frozen=True, eq=False)
class PlanResult:
    """Every stage's table and the winner."""

    candidates: pd.DataFrame
    pruning: pd.DataFrame
    compiled: pd.DataFrame
    placements: pd.DataFrame
    """Top placements of every compiled candidate, best first: the ranking."""
    baselines: pd.DataFrame
    best: Plan
    programs: dict[str, CommProgram]
    """The compiled program of every candidate that compiled (baselines' included), by name."""
    baseline_plans: dict[str, Plan]
    """Every scored baseline (the ``ok`` rows of ``baselines``) as a plan, by baseline name."""


def predict(program: CommProgram, topology: Topology, placement: Placement | Any) -> Predicted:
    """Step latency of ``program`` on ``placement`` with the overlap rule (module docstring)."""
    chip = chip_spec(topology.generation)
    compute = program.compute_seconds(chip)
    sync = [c for c, s in zip(program.collectives, program.sites, strict=True)
            if not s.asynchronous]
    asyn = [c for c, s in zip(program.collectives, program.sites, strict=True)
            if s.asynchronous]
    sync_s = estimate(sync, topology, placement, chip=chip).seconds if sync else 0.0
    async_s = estimate(asyn, topology, placement, chip=chip).seconds if asyn else 0.0
    return Predicted.overlapped(compute, sync_s, async_s)


def breakdown(program: CommProgram, topology: Topology, placement: Placement) -> pd.DataFrame:
    """Per collective: kind, runs, seconds, busiest link and its bytes, heaviest first."""
    result = estimate(program, topology, placement)
    rows = [{"collective": c.name, "kind": c.kind, "count": c.count,
             "group_size": len(c.groups[0]), "seconds": p.seconds,
             "busiest_link": str(p.busiest_link or "-"), "busiest_bytes": p.busiest_link_bytes}
            for c, p in zip(program.collectives, result.parts, strict=True)]
    return pd.DataFrame(rows).sort_values("seconds", ascending=False).reset_index(drop=True)


TOP_PLACEMENTS = 3
"""Placements per candidate (best by communication) that are priced in full and ranked."""


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

    table = explain_candidates(workload, topology)
    candidates = candidates_from_table(table, default_attention(topology))
    stage("candidates")
    pruning = prune(candidates, workload, topology, keep=keep, ir_cache_dir=ir_cache_dir)
    kept = survivors(candidates, pruning)
    if not kept:
        raise AoizoraError(
            f"No candidate of {workload.name} on {topology.name} survived pruning: "
            + "; ".join(f"{c}: {r[:160]}" for c, r in list(zip(
                pruning["candidate"], pruning["reason"], strict=True))[:8])
            + ". A model that cannot fit needs more chips (a larger slice) or a generation "
            "with more HBM; a failed trace is a bug worth reporting with its message."
        )
    stage("pruned")
    compiled = _compile(kept, workload, topology, num_layers, cache_dir, executor,
                        timeout_s)
    stage("compiled")
    rows = []
    for result in compiled:
        if result.status != "ok":
            continue
        found = search_placements(result.program, result.candidate.mesh_shape, topology,
                                  budget=budget, axis_names=result.candidate.axis_names,
                                  extra=search_starts(result.candidate, topology))
        for _, row in found.head(top_placements).iterrows():
            predicted = predict(result.program, topology, row["placement"])
            rows.append({"candidate": result.candidate.name, "placement": row["placement"],
                         "description": row["description"], "source": row["source"],
                         **predicted.__dict__})
    if not rows:
        raise AoizoraError(
            "No candidate compiled: "
            + "; ".join(f"{r.candidate.name}: {r.status} ({r.message[:120]})" for r in compiled)
            + ". Fix what the messages say (an oom needs more chips or FSDP; crash or timeout: "
            "retry, or raise timeout_s)."
        )
    ranking = pd.DataFrame(rows).sort_values("total_s", kind="stable").reset_index(drop=True)
    stage("placed")
    by_name = {r.candidate.name: r for r in compiled}
    top = ranking.iloc[0]
    winner = by_name[top["candidate"]]
    best = Plan(workload, topology, winner.candidate, top["placement"],
                Predicted(float(top["compute_s"]), float(top["comm_s"]), float(top["total_s"])),
                winner.program,
                breakdown(winner.program, topology, top["placement"]))
    baseline_table, baseline_plans, best = _baselines(
        workload, topology, by_name, num_layers, cache_dir, executor, timeout_s, best,
        ir_cache_dir)
    stage("baselines")
    progress.close()
    programs = {name: r.program for name, r in by_name.items() if r.status == "ok"}
    return PlanResult(table, pruning, compiled_table(compiled), ranking, baseline_table, best,
                      programs, baseline_plans)


def search_starts(candidate: Candidate, topology: Topology) -> list[Placement]:
    """The device orders every placement search of ``candidate`` starts from besides the
    structured ones: the plain device order, and what ``jax.make_mesh`` and
    ``mesh_utils.create_device_mesh`` pick where they accept its mesh (they refuse some shapes
    on some slices), so the search always sees what those libraries would do."""
    orders = [Placement(tuple(range(topology.num_devices)), "plain device order")]
    if topology.devices is None:
        return orders
    for build in (known.jax_default,
                  lambda c, t: known.device_mesh_order(c.mesh_shape, t)):
        try:
            orders.append(build(candidate, topology))
        except (NotImplementedError, ValueError, AssertionError):
            continue
    return orders


def _compile(candidates: list[Candidate], workload: Workload, topology: Topology,
             num_layers: int | None, cache_dir: str | Path | None,
             executor: cf.Executor | None, timeout_s: float) -> list[CompiledCandidate]:
    return compile_candidates(candidates, workload, topology, executor=executor,
                              cache_dir=cache_dir, timeout_s=timeout_s, num_layers=num_layers)


def compiled_table(compiled: list[CompiledCandidate]) -> pd.DataFrame:
    """One row per compile: status, whether cached, seconds, peak HBM, collective bytes."""
    return pd.DataFrame([{
        "candidate": r.candidate.name, "status": r.status, "cached": r.cached,
        "compile_s": r.compile_seconds, "peak_gib": r.memory.get("peak", np.nan) / 2**30,
        "comm_gb": r.program.total_bytes / 1e9 if r.program else np.nan,
        "message": r.message[:200]} for r in compiled])


def _baselines(workload: Workload, topology: Topology,
               by_name: dict[str, CompiledCandidate], num_layers: int | None,
               cache_dir: str | Path | None, executor: cf.Executor | None, timeout_s: float,
               best: Plan, ir_cache_dir: IRCacheDir,
               ) -> tuple[pd.DataFrame, dict[str, Plan], Plan]:
    """Score every baseline; a baseline that beats the search becomes the plan (so the plan is
    never predicted slower than a baseline)."""
    identity = Placement(tuple(range(topology.num_devices)), "plain device order")
    # logical-only: the best prediction of each compiled candidate on the plain order.
    logical = min((r for r in by_name.values() if r.status == "ok"),
                  key=lambda r: predict(r.program, topology, identity).total_s)
    builders = {
        "maxdiffusion": lambda: known.maxdiffusion(workload, topology),
        "xdit-usp": lambda: known.xdit_usp(workload, topology, ir_cache_dir=ir_cache_dir),
        "jax-default": lambda: (best.candidate, known.jax_default(best.candidate, topology)),
        "logical-only": lambda: (logical.candidate, identity),
    }
    entries: list[tuple[str, Candidate | None, Placement]] = []
    for name in known.BASELINES:
        try:
            entries.append((name, *builders[name]()))
        except Exception as err:  # a baseline that cannot be built is a row, not a crash
            entries.append((name, None, Placement(identity.order, f"not built: {err}")))
    missing = [c for _, c, _ in entries if c is not None and c.name not in by_name]
    for result in _compile(missing, workload, topology, num_layers, cache_dir, executor,
                           timeout_s):
        by_name[result.candidate.name] = result
    rows, plans = [], {}
    for name, candidate, placement in entries:
        result = by_name.get(candidate.name) if candidate is not None else None
        if result is None or result.status != "ok":
            rows.append({"baseline": name, "candidate": candidate.name if candidate else "-",
                         "placement": placement.description,
                         "status": result.status if result else "not built"})
            continue
        predicted = predict(result.program, topology, placement)
        rows.append({"baseline": name, "candidate": candidate.name,
                     "placement": placement.description, "status": "ok",
                     **predicted.__dict__})
        plans[name] = Plan(workload, topology, candidate, placement, predicted, result.program,
                           breakdown(result.program, topology, placement))
        if predicted.total_s < best.predicted.total_s:
            best = plans[name]
    rows.insert(0, {"baseline": "aoizora-lab", "candidate": best.candidate.name,
                    "placement": best.placement.description, "status": "ok",
                    **best.predicted.__dict__})
    frame = pd.DataFrame(rows)
    frame["speedup_of_plan"] = frame["total_s"] / best.predicted.total_s
    return frame, plans, best

