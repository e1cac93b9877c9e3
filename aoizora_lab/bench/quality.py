"""Plan quality: the planner's plan against every baseline, placement alone, and the roofline.

Per workload x slice, :func:`plan_quality` plans the case and reports the plan's predicted
one-step latency against each baseline's, what placement alone gains (the plan's candidate and
compiled program in other device orders) and how close the plan comes to the compute roofline
(:func:`useful_flops`); :func:`quality_targets` checks :data:`SPEEDUP_TARGET` and
:data:`ROOFLINE_TARGET`. The matrices: :data:`DEFAULT_MATRIX` and, for ``--quick``,
:data:`QUICK_MATRIX` at :data:`QUICK_LAYERS` layers.
"""

from __future__ import annotations

import dataclasses
import datetime
import json
import math
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd

from aoizora_lab.bench.report import case_label, case_row, config_line, markdown_table, met
from aoizora_lab.cases import Case
from aoizora_lab.comm_model import ModelOptions
from aoizora_lab.topology import Topology
from aoizora_lab.versions import code_versions, write_atomically
from aoizora_lab.workload import Workload

DEFAULT_MATRIX: tuple[str, ...] = (
    "wan2.1-t2v-1.3b@832x480x81/v5e:2x4",
    "wan2.1-t2v-1.3b@832x480x81/v5e:4x4",
    "wan2.1-t2v-14b@1280x720x81/v5e:4x4",
    "wan2.1-t2v-14b@832x480x81/v5e:2x4",
    # The 16-chip workloads on the other 16-chip slices libtpu describes (more HBM per chip
    # than v5e, so whatever fits a v5e:4x4 fits them).
    "wan2.1-t2v-1.3b@832x480x81/v6e:4x4",
    "wan2.1-t2v-14b@1280x720x81/v6e:4x4",
    "wan2.1-t2v-1.3b@832x480x81/v5p:2x2x4",
    "wan2.1-t2v-14b@1280x720x81/v5p:2x2x4",
    # Where communication weighs: more chips per video, lower resolutions, wrapped axes and a
    # 3D torus (v5e wraps its 16-long axes; v5p:4x4x4 wraps all three).
    "wan2.1-t2v-1.3b@832x480x81/v5e:4x8",
    "wan2.1-t2v-14b@832x480x81/v5e:4x8",
    "wan2.1-t2v-1.3b@832x480x81/v5e:8x8",
    "wan2.1-t2v-14b@832x480x81/v5e:8x8",
    "wan2.1-t2v-14b@1280x720x81/v5e:8x8",  # a control: compute-heavy, placement matters less
    "wan2.1-t2v-1.3b@832x480x81/v5e:16x16",
    "wan2.1-t2v-14b@832x480x81/v5e:16x16",
    "wan2.1-t2v-1.3b@832x480x81/v5p:4x4x4",
    # TPU7x: two devices a chip, a 3D slice; 2x2x2 is MaxDiffusion's published v7x-16 setup.
    "wan2.1-t2v-1.3b@832x480x81/tpu7x:2x2x2",
    "wan2.1-t2v-14b@1280x720x81/tpu7x:2x2x2",
    # Wan 2.2 T2V-A14B on MaxDiffusion's published Wan 2.2 slice (v6e-8): a step is one
    # expert's (Wan 2.1 14B's shape), with the other expert's weights resident too.
    "wan2.2-t2v-a14b@1280x720x81/v6e:2x4",
)
"""Plan-quality matrix (case specs, :mod:`aoizora_lab.cases`): 8 cases of 8-16 chips, 8 of
32-256 chips, 2 on TPU7x (8 chips, 16 devices), then Wan 2.2 A14B on 8 v6e chips. A 16-chip
14B case compiles ~80 programs (the plan's survivors with each flag set, every baseline recipe
tried), about an hour on 2 cores, so the matrix is run over several sittings
(``aoizora-lab bench --resume``)."""

QUICK_MATRIX: tuple[str, ...] = ("wan2.1-t2v-1.3b@832x480x81/v5e:2x4",)
"""``--quick``: one small workload (compiled at :data:`QUICK_LAYERS` layers), for plan quality
and search cost."""

QUICK_LAYERS = 2
"""Compile depth of ``--quick`` (the layer loop is folded back to the model's depth)."""

# Predicted latencies, so "met" means "met by the model's prediction".
SPEEDUP_TARGET = 1.42
"""The plan's speedup over the best existing system, on at least one workload."""
ROOFLINE_TARGET = 1.3
"""The plan within this factor of the compute roofline, wherever it is compute-bound."""

FLOPS_SOURCE = "IR trace of the unsharded step"
"""Where the roofline's FLOPs come from: the jaxpr of the whole denoising step (both CFG
passes) traced without a mesh, counted by :func:`aoizora_lab.ir.count_function` (matmuls from
shapes, splash attention from its q/k shapes) — the useful work, without the work a sharding
repeats on several devices."""


@dataclass(frozen=True, eq=False)
class PlanQuality:
    """:func:`plan_quality`'s tables."""

    summary: pd.DataFrame
    """One row per workload x slice: the plan, the existing systems, the placement and
    strategy gains, the roofline."""
    baselines: pd.DataFrame
    """Every case's ``PlanResult.baselines`` rows (each system's chosen setup), with
    ``workload`` and ``slice``."""
    trials: pd.DataFrame
    """Every setup each system was tried with (``Baselines.trials``), with ``workload`` and
    ``slice``."""
    targets: pd.DataFrame
    """``target``, ``value``, ``met`` (see :func:`quality_targets`)."""
    config: dict[str, Any] = field(default_factory=dict)
    """How it was run (compile depth, placement budget, cases done of the matrix)."""

    def markdown(self) -> str:
        """The section of the benchmark report."""
        from aoizora_lab.baselines import SYSTEMS
        from aoizora_lab.uncertainty import option_label

        s = self.summary
        latency = s[["workload", "slice", "status", "record", "ici_model", "candidate",
                     "flags", "placement", "plan_s", "compute_s", "comm_s", "exposed_s",
                     "plan_wall_s"]]
        headline = s[["workload", "slice", "record", "searched_candidate", "searched_s",
                      "searched_p10_s", "searched_p90_s", *[f"{b}_s" for b in SYSTEMS],
                      "best_system", "vs_best_system", "vs_best_system_p10",
                      "vs_best_system_p90", "p_plan_faster", "speedup_target"]]
        robust = s[["workload", "slice", "median_winner", "robust_choice",
                    "robust_median_change", "robust_p90_change",
                    "least_regret_choice"]].assign(
            plan=[option_label(str(c), str(f)) for c, f in zip(s["candidate"], s["flags"],
                                                              strict=True)])
        gains = s[["workload", "slice", "placement_gain_vs_plain",
                   "placement_gain_vs_make_mesh", "placement_gain_vs_create_device_mesh",
                   "strategy_candidate", "strategy_s", "strategy_gain"]]
        roofline = s[["workload", "slice", "candidate", "useful_tflops", "plan_tflops",
                      "roofline_s", "roofline_ratio", "bound", "roofline_target"]]
        return "\n\n".join([
            "## Plan quality",
            "Predicted one-step latency (seconds; both CFG passes) of the AoiZora Lab plan and "
            "of the systems people run, all compiled deviceless by libtpu with the compiler "
            "flags of their recipe and priced by the same model (`aoizora_lab.cost.predict`); "
            "nothing ran on a TPU. The plan's parts: `compute_s` (ops as the compiler "
            "estimates them), `comm_s` (every collective priced alone) and `exposed_s` (what "
            "the compiled schedule does not hide behind compute; `plan_s` = `compute_s` + "
            "`exposed_s`); `flags`: the compiler flag set the search chose; `plan_wall_s`: "
            "the planner's wall time; `ici_model`: the device-order model of the ICI model "
            "that priced the row (`comm_model.ModelOptions.order`; `physical`: planned "
            "before the model saw device orders); `record`: `current` where today's code "
            "(library versions and the digest of every source the plan runs) made the row, "
            "else stale with the date it was planned (`--resume` plans a stale case again). "
            + config_line(self.config),
            markdown_table(latency),
            "**Against the existing systems** (the headline): MaxDiffusion as its Wan config "
            "ships (`maxdiffusion-default`: context over every chip, flash attention, "
            "`create_device_mesh`), MaxDiffusion's best kernel x recipe on the slice "
            "(`maxdiffusion-best`) and the official Wan 2.1 / xDiT USP's best Ulysses x ring "
            "split (`xdit-usp`); `vs_best_system` = the fastest of them / the search's own "
            "best (`searched_s`: the best placement of a survivor's program; below 1 where a "
            "system wins, and the plan recommended, `plan_s` above, is then that system's "
            "setup). Rows without `searched_s` were planned when the headline was the "
            "fastest system / the plan recommended (at least 1 by construction). "
            f"Target: at least {SPEEDUP_TARGET:g}x on one workload. How sure "
            "(`aoizora_lab.uncertainty`: every compiled program on its best placement, and "
            "each system on its own, priced again under 256 draws of the model's uncertain "
            "constants and choices, each range with its source; the same draws for all): "
            "`searched_p10_s` / `searched_p90_s`, the 80 % interval of the search's own best; "
            "`vs_best_system_p10` / `_p90`, of its speedup over the best system (draw by "
            "draw); `p_plan_faster`, the share of draws in which it is faster (a tie counts "
            "half). Rows planned before the ensemble existed have none.",
            markdown_table(headline),
            "**The robust choice.** Beside the lowest median step (`median_winner`), the "
            "option with the lowest 90th-percentile step (`robust_choice`) and the one whose "
            "worst regret over the draws is least (`least_regret_choice`), among every "
            "compiled program the search placed (`candidate (flags)`) and the search's own "
            "best program in the library orders (`candidate (flags) on <order>`: the same "
            "sharding, where the placement is the risk), and the `plan` "
            "recommended (the lowest step under the row's `ici_model`, a system's setup "
            "where one beats the search). `robust_median_change` / `robust_p90_change`: the "
            "robust choice's median and 90th-percentile step over the search's own best's, "
            "less 1 (what it costs at the median and saves at the slow end; the plan stays "
            "the fastest under the row's model, and `aoizora-lab plan` prints this trade "
            "where they differ). " + _robust_differs(robust),
            markdown_table(robust),
            "**Where the gain comes from.** *Placement gain*: the plan's own compiled program "
            "in plain device order, where `jax.make_mesh` and where "
            "`mesh_utils.create_device_mesh` put it, over its best placement (NaN: the "
            "library refuses the mesh). *Strategy gain*: the best existing system (in its "
            "own device order) over the best compiled candidate (and flags) of the search in "
            "plain device order: what the choice of sharding buys, plus whatever the "
            "system's own device order costs against plain order (where the best system "
            "runs the plan's own candidate, the whole column is its library's device "
            "order). These are ablations of the plan, not baselines.",
            markdown_table(gains),
            "What each existing system built (its chosen setup, in its own words and ours):",
            markdown_table(self.baselines.reindex(columns=[
                "workload", "slice", "baseline", "recipe", "candidate", "placement", "flags",
                "status", "total_s", "speedup_of_plan", "note", "reason"])),
            "Every setup each system was tried with: refused where the system refuses it "
            "(reason), every other one compiled with its recipe's flags and priced "
            "(`total_s`; `estimate_s`: the IR estimate, for comparison); `chosen` marks the "
            "system's best.",
            markdown_table(self.trials.reindex(columns=[
                "workload", "slice", "baseline", "recipe", "candidate", "flags", "estimate_s",
                "total_s", "chosen", "reason"])),
            "Roofline: useful FLOPs / (chips x peak bf16 FLOP/s), FLOPs from the "
            f"{FLOPS_SOURCE}; `plan_tflops` is what the plan's compiled program executes on "
            "all devices together. `bound`: compute when the plan's predicted compute time is "
            f"at least its communication time; target: within {ROOFLINE_TARGET:g}x of the "
            "roofline wherever compute-bound.",
            markdown_table(roofline),
            "Targets:",
            markdown_table(self.targets),
        ])


def _robust_differs(robust: pd.DataFrame) -> str:
    """Names the cases where a robust choice is not the median winner, and those where the
    plan recommended is not the robust choice."""
    known = robust.dropna(subset=["median_winner"])
    if known.empty:
        return "No row has an ensemble yet."
    differ = known[(known["robust_choice"] != known["median_winner"])
                   | (known["least_regret_choice"] != known["median_winner"])]
    unlike = known[known["robust_choice"] != known["plan"]]

    def named(rows: pd.DataFrame) -> str:
        return "; ".join(f"{r.workload} on {r.slice}" for r in rows.itertuples())

    return " ".join([
        f"They agree on all {len(known)} cases assessed." if differ.empty else
        f"They differ on {len(differ)} of {len(known)} cases assessed: {named(differ)}.",
        f"The plan recommended is the robust choice on all {len(known)}." if unlike.empty
        else f"The plan recommended is not the robust choice on {len(unlike)}: "
             f"{named(unlike)}."])


def useful_flops(workload: Workload, attention: str) -> float:
    """FLOPs of one denoising step of ``workload``, traced unsharded (see :data:`FLOPS_SOURCE`)."""
    import jax
    import jax.numpy as jnp

    from aoizora_lab.ir import count_function
    from aoizora_lab.models.parallel import ParallelPlan
    from aoizora_lab.models.wan import abstract_params
    from aoizora_lab.workload import denoise_step

    model = workload.config()
    params = abstract_params(model, jnp.bfloat16)
    inputs = workload.abstract_inputs(jnp.bfloat16)
    plan = ParallelPlan(attention=attention)
    replicated = [None] * len(jax.tree.leaves((params, inputs)))
    counts = count_function(lambda p, i: denoise_step(p, model, plan=plan, **i),
                            (params, inputs), replicated, {})
    return float(counts.flops)


def plan_quality(cases: Iterable[Case | str] = DEFAULT_MATRIX, *, num_layers: int | None = None,
                 budget: int = 20_000, cache_dir: str | Path | None = None,
                 timeout_s: float = 900.0,
                 progress: Callable[[str], None] | None = None,
                 on_case: Callable[[PlanQuality], None] | None = None,
                 records: str | Path | None = None, resume: bool = False,
                 plan_missing: bool = True) -> PlanQuality:
    """Plan every case and compare the plan with the existing systems, its placement and the
    roofline; ``on_case`` gets the tables so far after each case (a long run writes as it
    goes).

    ``records``: a folder that gets one JSON file per finished case (its row, its systems'
    setups and trials, the depth and budget it ran with, the date); with ``resume``, a case
    recorded there at the same ``num_layers`` and ``budget`` is read back instead of planned
    again, so a matrix that takes longer than one sitting (a 14B case compiles ~25 programs
    at minutes each on 2 cores) is finished over several runs. A failed case is not recorded.
    ``plan_missing=False`` (with ``resume``) plans nothing: a case without a record is a row
    saying so, which assembles the tables from the records alone.

    Per case (columns of ``summary``): the plan's ``candidate``, ``flags``, ``placement`` and
    predicted ``plan_s`` (``compute_s`` + ``exposed_s``, the part of ``comm_s`` the schedule
    does not hide); ``<system>_s`` for every existing system, ``best_system`` and
    ``vs_best_system`` (its step / the plan's); the placement gains
    ``placement_gain_vs_{plain,make_mesh,create_device_mesh}`` (the plan's program in those
    orders over its best placement); ``strategy_candidate``, ``strategy_s`` and
    ``strategy_gain`` (best system / the best candidate in plain order); ``useful_tflops`` (see
    :data:`FLOPS_SOURCE`), ``plan_tflops``, ``roofline_s``, ``roofline_ratio``, ``bound`` and
    the target columns; ``plan_wall_s``: the planner's wall time. A case that fails has its
    ``status``.
    """
    from aoizora_lab.baselines import SYSTEMS

    cases = list(cases)
    rows: list[dict[str, Any]] = []
    baseline_rows: list[dict[str, Any]] = []
    trial_rows: list[dict[str, Any]] = []
    columns = ["workload", "slice", "status", "record", "ici_model", "candidate", "flags",
               "placement",
               "plan_s", "compute_s", "comm_s", "exposed_s", "searched_candidate",
               "searched_s", *[f"{b}_s" for b in SYSTEMS],
               "best_system", "vs_best_system", "vs_best_system_p10", "vs_best_system_p90",
               "p_plan_faster", "searched_p10_s", "searched_p90_s", "median_winner",
               "robust_choice", "robust_median_change", "robust_p90_change",
               "least_regret_choice", "speedup_target", "plain_order_s",
               "make_mesh_s", "create_device_mesh_s", "placement_gain_vs_plain",
               "placement_gain_vs_make_mesh", "placement_gain_vs_create_device_mesh",
               "strategy_candidate", "strategy_s", "strategy_gain", "useful_tflops",
               "plan_tflops", "roofline_s", "roofline_ratio", "bound", "roofline_target",
               "plan_wall_s"]

    recorded: list[str] = []

    def tables() -> PlanQuality:
        summary = pd.DataFrame(rows).reindex(columns=columns)
        config = {"num_layers": num_layers or "full depth", "budget": budget}
        planned = sum(row.get("status") == "ok" for row in rows)
        if len(rows) < len(cases) or planned < len(cases):
            config["cases done"] = f"{planned} of {len(cases)}"
        if recorded:
            config["cases read from records"] = (f"{len(recorded)} (planned "
                                                 f"{', '.join(sorted(set(recorded)))})")
        return PlanQuality(summary, pd.DataFrame(baseline_rows), pd.DataFrame(trial_rows),
                           quality_targets(summary), config)

    for case in cases:
        label = case_label(case)
        path = Path(records) / record_name(*label) if records is not None else None
        record = _read_record(path, num_layers, budget) if resume and path else None
        current = record is not None and _is_current(record)
        if record is not None and plan_missing and not current:
            record = None  # made by other code: plan it again
        if record is not None:
            if progress:
                progress("plan quality: {} on {} (recorded {})".format(*label, record["date"]))
            row = record["row"] | {"ici_model": _recorded_model(record)["order"],
                                   "record": "current" if current
                                   else f"stale: planned {record['date'][:10]}"}
            if not current:  # other code's targets are not today's
                row |= {k: "stale" for k in ("speedup_target", "roofline_target") if k in row}
            rows.append(row)
            baseline_rows.extend(record["baselines"])
            trial_rows.extend(record["trials"])
            recorded.append(record["date"][:10])
        elif not plan_missing:
            rows.append({"workload": label[0], "slice": label[1],
                         "status": "not run yet (no record at this depth and budget)"})
        else:
            if progress:
                progress("plan quality: {} on {}".format(*label))
            done = (len(baseline_rows), len(trial_rows))
            rows.append(case_row(case, lambda workload, topology: _quality_row(
                workload, topology, num_layers=num_layers, budget=budget, cache_dir=cache_dir,
                timeout_s=timeout_s, baseline_rows=baseline_rows, trial_rows=trial_rows))
                        | {"record": "current"})
            if path is not None and rows[-1].get("status") == "ok":
                _write_record(path, num_layers=num_layers, budget=budget, row=rows[-1],
                              baselines=baseline_rows[done[0]:], trials=trial_rows[done[1]:],
                              ici_model=ici_model(),
                              code=code_versions(__name__))
        if on_case:
            on_case(tables())
    return tables()


BEFORE_DEVICE_ORDERS = {"routing": "balanced", "multi_axis": "concurrent", "order": "physical"}
"""The ICI model of a record that does not name one: records were written without it until
the model saw device orders (``comm_model.ModelOptions.order``)."""


def ici_model() -> dict[str, str]:
    """The ICI model plans are priced with now (:class:`~aoizora_lab.comm_model.ModelOptions`
    at its defaults), as a record stores it."""
    return dataclasses.asdict(ModelOptions())


def _recorded_model(record: dict[str, Any]) -> dict[str, str]:
    return record.get("ici_model", BEFORE_DEVICE_ORDERS)


def _is_current(record: dict[str, Any]) -> bool:
    """Whether today's code made ``record`` (its library versions and the digest of every
    source the plan runs): a record of other code is planned again, or shown as stale."""
    return record.get("code") == code_versions(__name__)


def record_name(workload: str, slice_name: str) -> str:
    """The file name of a case's record, e.g. ``wan2.1-t2v-14b_1280x720x81_v5e-4x4.json``."""
    name = f"{workload}_{slice_name}".replace("@", "_").replace(":", "-").replace("/", "_")
    return name + ".json"


def _write_record(path: Path, **record: Any) -> None:
    record["date"] = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC")
    # numpy scalars as Python numbers; NaN stays NaN (Python's json reads it back).
    text = json.dumps(record, indent=1,
                      default=lambda v: v.item() if hasattr(v, "item") else str(v))
    write_atomically(path, text + "\n")


def _read_record(path: Path, num_layers: int | None, budget: int) -> dict[str, Any] | None:
    """The record at ``path`` when it was planned at this depth and budget, else None."""
    try:
        record = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    if record.get("num_layers") != num_layers or record.get("budget") != budget:
        return None
    return record


def _quality_row(workload: Workload, topology: Topology, *, num_layers: int | None,
                 budget: int, cache_dir: str | Path | None, timeout_s: float,
                 baseline_rows: list[dict[str, Any]], trial_rows: list[dict[str, Any]]
                 ) -> dict[str, Any]:
    from aoizora_lab.cost import roofline_seconds
    from aoizora_lab.hardware import chip_spec
    from aoizora_lab.options import FULL_SEARCH
    from aoizora_lab.planner import plan
    from aoizora_lab.uncertainty import assess

    start = time.perf_counter()
    result = plan(workload, topology, FULL_SEARCH.replace(
        budget=budget, num_layers=num_layers, cache_dir=cache_dir, timeout_s=timeout_s))
    wall = time.perf_counter() - start
    best, head = result.best, result.headline
    sure = assess(result)
    # The headline's odds, where the headline is known (a time limit leaves it NaN).
    against = None if head.unchecked else {o.system: o for o in sure.odds}.get(
        head.best_system)
    own = sure.option(sure.plan)
    median_change, p90_change = sure.tradeoff()
    plan_s = best.predicted.total_s
    where = {"workload": workload.name, "slice": topology.name}
    baseline_rows.extend(where | b for b in result.baselines.to_frame().to_dict("records"))
    trial_rows.extend(where | t for t in result.baselines.trials().to_dict("records"))
    row: dict[str, Any] = {
        "status": "ok", "ici_model": ici_model()["order"], "candidate": best.candidate.name,
        "flags": best.flags.label,
        "placement": best.placement.description, "plan_s": plan_s,
        "compute_s": best.predicted.compute_s, "comm_s": best.predicted.comm_s,
        "exposed_s": best.predicted.exposed_s, "plan_wall_s": wall,
        "searched_candidate": f"{result.searched.candidate.name} "
                              f"({result.searched.flags.label} flags)",
        "searched_s": result.searched.predicted.total_s,
        **{f"{name}_s": seconds for name, seconds in head.systems.items()},
        "best_system": head.best_system or "none priced", "vs_best_system": head.vs_existing,
        "vs_best_system_p10": against.speedup[0] if against else math.nan,
        "vs_best_system_p90": against.speedup[2] if against else math.nan,
        "p_plan_faster": against.probability if against else math.nan,
        "searched_p10_s": own.low_s, "searched_p90_s": own.high_s,
        "median_winner": sure.median_winner, "robust_choice": sure.robust,
        "least_regret_choice": sure.least_regret,
        "robust_median_change": median_change, "robust_p90_change": p90_change,
        "speedup_target": (met(head.vs_existing >= SPEEDUP_TARGET) if head.best_system
                           else "n/a"),
        "plain_order_s": head.plain_s, "make_mesh_s": head.make_mesh_s,
        "create_device_mesh_s": head.create_device_mesh_s,
        **{f"placement_gain_vs_{k}": v for k, v in head.placement_gain.items()},
        "strategy_candidate": head.strategy_candidate, "strategy_s": head.strategy_s,
        "strategy_gain": head.strategy_gain}
    chip = chip_spec(topology.generation)
    flops = useful_flops(workload, best.candidate.attention)
    row["useful_tflops"] = flops / 1e12
    row["plan_tflops"] = best.program.flops * best.candidate.num_devices / 1e12
    row["roofline_s"] = roofline_seconds(flops / topology.num_chips, 0.0, chip)
    row["roofline_ratio"] = plan_s / row["roofline_s"] if row["roofline_s"] > 0 else math.nan
    compute_bound = best.predicted.compute_s >= best.predicted.comm_s
    row["bound"] = "compute" if compute_bound else "communication"
    row["roofline_target"] = (met(row["roofline_ratio"] <= ROOFLINE_TARGET) if compute_bound
                              else "n/a")
    return row


def quality_targets(summary: pd.DataFrame) -> pd.DataFrame:
    """Whether a :func:`plan_quality` summary meets :data:`SPEEDUP_TARGET` (on its best case)
    and :data:`ROOFLINE_TARGET` (on every compute-bound case): ``target``, ``value``, ``met``.
    Only cases planned by today's code count; stale records (``record``) are named, not
    counted."""
    ok = summary[summary["status"] == "ok"]
    stale = ok.get("record", pd.Series("", index=ok.index)).fillna("").str.startswith("stale")
    ok, left = ok[~stale], (f"; {int(stale.sum())} stale cases not counted" if stale.any()
                            else "")
    speedups = ok["vs_best_system"].dropna()
    top = ok.loc[speedups.idxmax()] if not speedups.empty else None
    bound = ok[(ok["bound"] == "compute") & ok["roofline_ratio"].notna()]
    worst = bound.loc[bound["roofline_ratio"].idxmax()] if not bound.empty else None
    return pd.DataFrame([
        {"target": f">= {SPEEDUP_TARGET:g}x over the best existing system on at least one "
                   "workload",
         "value": (f"{top['vs_best_system']:.3g}x ({top['workload']} on {top['slice']})"
                   if top is not None else "no case scored") + left,
         "met": met(top is not None and top["vs_best_system"] >= SPEEDUP_TARGET)},
        {"target": f"within {ROOFLINE_TARGET:g}x of the compute roofline wherever "
                   "compute-bound",
         "value": (f"worst {worst['roofline_ratio']:.3g}x ({worst['workload']} on "
                   f"{worst['slice']}); {len(bound)} of {len(ok)} cases compute-bound"
                   if worst is not None else f"no compute-bound case of {len(ok)}") + left,
         "met": ("n/a" if worst is None
                 else met(bool((bound["roofline_ratio"] <= ROOFLINE_TARGET).all())))},
    ])
