"""Timing realised plans on live devices, alone or side by side with their predictions.

Plans run only on live devices (:func:`~aoizora_lab.measure.clock.live_devices`); on CPU host
devices they run too, but the seconds prove the mechanics, not TPU speed.

**Timing a plan** (:func:`time_plan`): the plan's step is compiled once (:meth:`Plan.compile`,
the same program the planner scored); weights (random, or an official checkpoint) and inputs
are made once on the host and laid out under the plan's shardings; ``warmup`` runs are
discarded and ``steps`` runs are timed one by one, each up to ``block_until_ready``. A
:class:`~aoizora_lab.measure.clock.Timing` keeps every sample.

**Comparing plans** (:func:`compare_plans`): the plans are timed in ``rounds``, round-robin
(plan A, B, C, then A, B, C again...), so slow drift of the machine (clocks, thermals, a
neighbour process) hits every plan alike instead of whichever ran last. Only one plan's
weights are on the devices at a time. The table gives predicted and measured seconds per plan
and, in ``frame.attrs``, the Spearman and Kendall rank correlations between them: the question
is whether the model *ranks* plans right. :func:`plans_to_compare` picks the planner's top
placements and every baseline from a :class:`~aoizora_lab.planner.PlanResult`.
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from aoizora_lab.errors import AoizoraError
from aoizora_lab.measure.clock import Timing, check_counts, live_devices, timed
from aoizora_lab.models.wan import init_params, load_official_weights
from aoizora_lab.placement import Placement
from aoizora_lab.realize import Plan, device_slots
from aoizora_lab.topology import Topology
from aoizora_lab.workload import Workload

if TYPE_CHECKING:
    import pandas as pd

    from aoizora_lab.planner import PlanResult

WeightsSource = str | Path | Sequence[str | Path] | None
"""An official Wan 2.1 checkpoint (file, folder or list of shards), or ``None`` for random."""

# One jitted initialiser for all calls: compiled once per (model, dtype), reused by every plan.
_random_params = jax.jit(init_params, static_argnums=(0, 2))


@dataclass(frozen=True, eq=False)
class _Runnable:
    """A plan compiled once, with a way to lay out its weights and inputs on the devices."""

    step: Any
    """The compiled step: ``step(params, inputs)``."""
    arguments: Callable[[], tuple[Any, Any]]
    """Weights and inputs under the plan's shardings (fresh each call: nothing stays put)."""

    def time(self, *, steps: int, warmup: int) -> Timing:
        params, inputs = self.arguments()
        # The arguments go out of scope on return, so only one plan's weights use the devices.
        return timed(lambda: self.step(params, inputs), steps=steps, warmup=warmup)


@contextlib.contextmanager
def _on_host() -> Iterator[None]:
    """Create arrays on the host CPU (so a 14B model never lands whole on one chip), or on
    the default device where jax runs without its CPU backend."""
    try:
        host = jax.devices("cpu")[0]
    except RuntimeError:
        yield
        return
    with jax.default_device(host):
        yield


def _host_arguments(workload: Workload, *, weights: WeightsSource, key: int,
                    dtype: Any) -> tuple[Any, Any]:
    """Weights (the checkpoint ``weights``, or random from ``key``) and random inputs, on the
    host: made once and placed under each plan's shardings, so every plan runs the same
    numbers."""
    model = workload.config()
    with _on_host():
        root = jax.random.key(key)
        if weights is None:
            params = _random_params(model, root, dtype)
        else:
            source = [str(w) for w in weights] if isinstance(weights, list | tuple) else weights
            params = load_official_weights(source, model, dtype)
        inputs = workload.random_inputs(jax.random.fold_in(root, 1), dtype)
    return params, inputs


def _runnable(plan: Plan, host_arguments: tuple[Any, Any], *, dtype: Any,
              devices: Sequence[Any] | None) -> _Runnable:
    pool = live_devices(plan.topology, devices)
    step = plan.compile(pool, dtype=dtype)
    shardings = plan.shardings(pool)
    replicated = NamedSharding(plan.mesh(pool), P())
    params, inputs = host_arguments

    def arguments() -> tuple[Any, Any]:
        return jax.device_put(params, shardings), jax.device_put(inputs, replicated)

    return _Runnable(step, arguments)


def time_plan(plan: Plan, *, steps: int = 10, warmup: int = 2, weights: WeightsSource = None,
              key: int = 0, dtype: Any = jnp.bfloat16,
              devices: Sequence[Any] | None = None) -> Timing:
    """Time one denoising step of ``plan`` on its live devices.

    The step is compiled once (:meth:`Plan.compile`) in ``dtype`` (bf16, as the planner
    compiled it); weights are random (``init_params`` seeded by ``key``) or the official
    checkpoint at ``weights`` (``load_official_weights``), made on the host and placed under
    the plan's shardings; inputs are random. ``warmup`` runs are discarded, then ``steps`` runs
    are timed.
    ``devices`` stand in for the topology's (same order as ``topology.coords``). Example::

        timing = time_plan(Plan.from_json("plan.json", Topology.from_devices(jax.devices())))
        timing.median_s, timing.spread

    On CPU host devices this runs too, but the seconds say nothing about a TPU.
    """
    check_counts(steps=steps, warmup=warmup)
    live_devices(plan.topology, devices)  # refuse before any work
    arguments = _host_arguments(plan.workload, weights=weights, key=key, dtype=dtype)
    runnable = _runnable(plan, arguments, dtype=dtype, devices=devices)
    return runnable.time(steps=steps, warmup=warmup)


def compare_plans(plans: Mapping[str, Plan] | Sequence[Plan], *, rounds: int = 3,
                  steps: int = 5, warmup: int = 1, weights: WeightsSource = None, key: int = 0,
                  dtype: Any = jnp.bfloat16,
                  devices: Sequence[Any] | None = None) -> pd.DataFrame:
    """Time ``plans`` interleaved and set their predicted latency beside the measured one.

    Every plan is compiled first; then each of ``rounds`` rounds times every plan in turn
    (``warmup`` untimed runs, then ``steps`` timed), so drift of the machine spreads over all
    plans; every plan runs the same weights and inputs (``weights``, ``key`` and ``dtype`` as
    in :func:`time_plan`). Columns: ``plan``, ``candidate``, ``placement``, ``predicted_s``,
    ``measured_s`` (median of all ``rounds * steps`` samples), ``min_s``, ``max_s``,
    ``spread``, ``samples``, ``predicted_rank`` and ``measured_rank`` (1 = fastest).
    ``frame.attrs`` holds ``spearman`` and ``kendall`` (rank correlation of predicted vs
    measured, in [-1, 1]; NaN with fewer than two plans or when either column is constant)
    and ``platform``.
    Example: ``compare_plans(plans_to_compare(result, top=3))``.
    """
    import pandas as pd

    check_counts(rounds=rounds, steps=steps, warmup=warmup)
    named = _named(plans)
    workloads = {p.workload for p in named.values()}
    if len(workloads) != 1:
        raise AoizoraError(
            f"compare_plans ranks plans of one workload; got {len(workloads)}: "
            f"{sorted(w.name for w in workloads)}. Compare each workload's plans separately."
        )
    for plan in named.values():
        live_devices(plan.topology, devices)  # refuse before any work
    arguments = _host_arguments(workloads.pop(), weights=weights, key=key, dtype=dtype)
    runnables = {name: _runnable(p, arguments, dtype=dtype, devices=devices)
                 for name, p in named.items()}
    samples: dict[str, list[float]] = {name: [] for name in named}
    for _ in range(rounds):
        for name, runnable in runnables.items():
            samples[name].extend(runnable.time(steps=steps, warmup=warmup).samples)
    rows = []
    for name, plan in named.items():
        timing = Timing(tuple(samples[name]))
        rows.append({"plan": name, "candidate": plan.candidate.name,
                     "placement": plan.placement.description,
                     "predicted_s": plan.predicted.total_s, "measured_s": timing.median_s,
                     "min_s": timing.min_s, "max_s": timing.max_s, "spread": timing.spread,
                     "samples": len(timing.samples)})
    frame = pd.DataFrame(rows)
    frame["predicted_rank"] = frame["predicted_s"].rank(method="min").astype(int)
    frame["measured_rank"] = frame["measured_s"].rank(method="min").astype(int)
    spearman, kendall = rank_correlations(frame["predicted_s"], frame["measured_s"])
    pool = devices if devices is not None else next(iter(named.values())).topology.devices
    frame.attrs.update(spearman=spearman, kendall=kendall, platform=pool[0].platform)
    return frame


def rank_correlations(predicted: Sequence[float], measured: Sequence[float]
                      ) -> tuple[float, float]:
    """(Spearman rho, Kendall tau) of two equally long sequences; NaN where undefined.

    Undefined: fewer than two values, or a constant sequence (no order to agree with).
    Example: predicted (1, 2, 3) vs measured (10, 30, 20) gives (0.5, 0.333).
    """
    from scipy import stats

    a, b = np.asarray(predicted, dtype=float), np.asarray(measured, dtype=float)
    if len(a) < 2 or np.ptp(a) == 0 or np.ptp(b) == 0:
        return math.nan, math.nan
    return float(stats.spearmanr(a, b).statistic), float(stats.kendalltau(a, b).statistic)


def _named(plans: Mapping[str, Plan] | Sequence[Plan]) -> dict[str, Plan]:
    """Plans by name; a sequence is named ``candidate | placement`` (``#2``... on a repeat)."""
    if isinstance(plans, Mapping):
        named = dict(plans)
    else:
        named = {}
        for plan in plans:
            base = f"{plan.candidate.name} | {plan.placement.description or 'placement'}"
            name, n = base, 1
            while name in named:
                n += 1
                name = f"{base} #{n}"
            named[name] = plan
    if not named or not all(isinstance(p, Plan) for p in named.values()):
        raise AoizoraError(
            "compare_plans needs one or more Plan objects (a sequence, or a mapping name -> "
            "Plan), e.g. plans_to_compare(result, top=3)."
        )
    return named


def retarget(plan: Plan, topology: Topology) -> Plan:
    """``plan`` moved onto ``topology``, chip by chip: logical device *i* stays on its chip.

    A plan made on libtpu's deviceless ``v5e:2x4`` indexes *those* devices; the live slice of
    a TPU VM (``Topology.from_devices(jax.devices())``) numbers its devices its own way. As a
    plan file does, devices are matched by chip coordinates and core, so the placement keeps
    its meaning. Example: if deviceless device 3 and live device 5 both sit on chip (1, 1),
    a logical device placed on deviceless device 3 is placed on live device 5.
    """
    if topology.name != plan.topology.name or topology.num_devices != plan.topology.num_devices:
        raise AoizoraError(
            f"Plan for {plan.topology.name} ({plan.topology.num_devices} devices) cannot move "
            f"onto {topology.name} ({topology.num_devices} devices): plan for that slice."
        )
    live = {slot: device for device, slot in device_slots(topology).items()}
    planned = device_slots(plan.topology)
    order = tuple(live[planned[device]] for device in plan.placement.order)
    return dataclasses.replace(plan, topology=topology,
                               placement=Placement(order, plan.placement.description))


def plans_to_compare(result: PlanResult, *, top: int = 3,
                     topology: Topology | None = None) -> dict[str, Plan]:
    """The ``top`` ranked (candidate, placement) pairs and every scored baseline, by name.

    Names are ``"rank 1: cfg2-ctx4 | cfg on x:2 | context on y:4"`` and
    ``"maxdiffusion-best: cfg2-ctx4-fsdpseq | mesh_utils.create_device_mesh"`` (with
    ``+flags`` where compiled with other than the default flags); a plan that is the same
    candidate with the same flags on the same placement as an earlier one is listed once, its
    labels joined with ``" = "`` (``"rank 1 = aoizora-lab: ..."``). Baselines that were not
    built or did not compile are skipped. With ``topology`` (the live slice, when the plan
    was made deviceless) every plan is :func:`retarget`-ed onto it.
    """
    check_counts(top=top)
    best = result.best
    workload, planned = best.workload, best.topology
    entries: list[tuple[list[str], Plan]] = []

    def identity(plan: Plan) -> tuple[str, str, tuple[int, ...]]:
        return plan.candidate.name, plan.flags.label, plan.placement.order

    def add(label: str, plan: Plan) -> None:
        for labels, known in entries:
            if identity(known) == identity(plan):
                labels.append(label)
                return
        entries.append(([label], plan))

    for rank, entry in enumerate(result.ranking[:top], start=1):
        add(f"rank {rank}", Plan(workload, planned, entry.candidate, entry.placement,
                                 entry.predicted,
                                 result.programs.get((entry.candidate.name, entry.flags.label)),
                                 flags=entry.flags))
    add("aoizora-lab", best)
    for name, baseline in result.baseline_plans.items():
        add(name, baseline)

    def label(plan: Plan) -> str:
        flags = f"+{plan.flags.label}" if plan.flags.args else ""
        return f"{plan.candidate.name}{flags} | {plan.placement.description}"

    return {f"{' = '.join(labels)}: {label(plan)}":
            plan if topology is None else retarget(plan, topology) for labels, plan in entries}
