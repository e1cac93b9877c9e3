"""Live measurements: time realised plans, microbenchmark collectives, calibrate the ICI model.

Everything here runs the real program on the devices of the plan's :class:`~aoizora_lab.Topology`
and reads the wall clock. On a TPU VM those are the chips the planner modelled; on CPU host
devices (``Topology.simulated((2, 4), devices=jax.devices()[:8])``) the same code runs, which is
how the tests prove the mechanics, but **CPU numbers mean nothing for a TPU**: a CPU
"collective" is a memory copy, so neither a ranking nor a calibration measured there says
anything about ICI links. A deviceless (libtpu) or simulated topology compiles but cannot run:
measuring one is refused with an error that says how to get live devices.

**Timing a plan** (:func:`time_plan`): the plan's step is compiled once (:meth:`Plan.compile`,
the same program the planner scored); weights (random, or an official checkpoint) and inputs
are made once on the host and laid out under the plan's shardings; ``warmup`` runs are
discarded and ``steps`` runs are timed one by one, each up to ``block_until_ready``. A
:class:`Timing` keeps every sample.

**Comparing plans** (:func:`compare_plans`): the plans are timed in ``rounds``, round-robin
(plan A, B, C, then A, B, C again...), so slow drift of the machine (clocks, thermals, a
neighbour process) hits every plan alike instead of whichever ran last. Only one plan's
weights are on the devices at a time. The table gives predicted and measured seconds per plan
and, in ``frame.attrs``, the Spearman and Kendall rank correlations between them: the question
is whether the model *ranks* plans right. :func:`plans_to_compare` picks the planner's top
placements and every baseline from a :class:`~aoizora_lab.planner.PlanResult`.

**Microbenchmarks** (:func:`microbenchmarks`): collectives over physical groups of the slice,
each built with ``shard_map`` over a ``Mesh`` whose device order makes the mesh axes physical
axes, so a group is exactly the intended chips. On ``v5e:2x4`` (x: 2, y: 4, no wraparound):

- ``collective-permute``: shift +1 and -1 along x and along y (one hop each, the end of a line
  sends nothing), and the cyclic shifts along y (the closing transfer crosses the line; on an
  axis with wraparound it takes the wraparound link);
- ``all-gather`` and ``all-to-all`` over x lines (2 chips), y lines (4), 2x2 blocks and the
  whole slice (8);

each at every size of ``sizes`` (default 4 KiB .. 64 MiB result per device: latency-bound to
bandwidth-bound). A program runs the collective ``inner`` times in a loop (so one dispatch is
spread over many collectives); the table has the measured seconds per collective and the ICI
model's prediction for the same :class:`~aoizora_lab.Collective` on the same devices.

**Calibration** (:func:`calibrate`): the model is linear in its two constants. For one
collective it predicts ``t = critical_bytes / (bandwidth * efficiency) + hops * latency``, where
``critical_bytes`` (bytes on the busiest link, summed over the algorithm's phases) and ``hops``
depend only on the groups and the routing. A non-negative least-squares fit of the measured
seconds, each row weighted by ``1 / measured`` so microsecond and millisecond points count
alike, gives ``1 / (bandwidth * efficiency)`` and ``latency``. Only their product is
identifiable, so the published link bandwidth is kept and the efficiency is fitted, unless the
slice beats the published figure. Example: a fit of ``bandwidth * efficiency = 4.0e10 B/s``
and 1.2 us per hop on v5e (nominal 4.5e10) writes ``ici_efficiency = 0.889`` and
``ici_hop_latency = 1.2e-6``; a fit of 5.2e10 writes ``ici_link_bandwidth = 5.2e10`` with
``ici_efficiency = 1``. :func:`write_calibration` stores them in
``data/calibration/<generation>.json`` (or ``$AOIZORA_LAB_CALIBRATION_DIR``), where
:func:`~aoizora_lab.chip_spec` applies them from then on (``calibrated=False`` ignores them).

**Slices larger than one host** (e.g. ``v5e:4x4`` = 4 hosts of 2x2 chips): JAX runs one
process per host and every process must run the same program (SPMD), or the collectives wait
forever. Call ``jax.distributed.initialize()`` first on every host, then run the same code
(script or notebook) on all of them with the same plan file and calibration folder; the
timings are global programs, so every process measures the same steps. Files are written by
process 0 only (:func:`is_writer`, used by :func:`write_calibration`); copy the calibration
file to the other hosts (or point ``$AOIZORA_LAB_CALIBRATION_DIR`` at a shared folder) before
planning there, so every process plans with the same constants.
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
import statistics
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from aoizora_lab.comm_model import Collective, CommEstimate, ModelOptions, estimate
from aoizora_lab.errors import AoizoraError, is_whole
from aoizora_lab.hardware import ChipSpec, chip_spec, save_calibration
from aoizora_lab.models.wan import init_params, load_official_weights
from aoizora_lab.placement import Placement
from aoizora_lab.realize import Plan, Predicted, device_slots
from aoizora_lab.topology import Topology
from aoizora_lab.workload import Workload

if TYPE_CHECKING:
    import pandas as pd

    from aoizora_lab.planner import PlanResult

KiB = 2**10

DEFAULT_SIZES: tuple[int, ...] = tuple(4 * KiB * 4**i for i in range(8))
"""Result bytes per device of each microbenchmark: 4 KiB, 16 KiB, ... 64 MiB."""

MICROBENCHMARK_KINDS: tuple[str, ...] = ("collective-permute", "all-gather", "all-to-all")

WeightsSource = str | Path | Sequence[str | Path] | None
"""An official Wan 2.1 checkpoint (file, folder or list of shards), or ``None`` for random."""

_AXES = "xyz"

# One jitted initialiser for all calls: compiled once per (model, dtype), reused by every plan.
_random_params = jax.jit(init_params, static_argnums=(0, 2))


# ----------------------------------------------------------------------------- timing


@dataclass(frozen=True)
class Timing:
    """Wall-clock seconds of repeated runs of one program, each to ``block_until_ready``."""

    samples: tuple[float, ...]
    """Every timed run, in the order they ran (warm-up runs excluded)."""

    def __post_init__(self) -> None:
        samples = tuple(float(s) for s in self.samples)
        if not samples or min(samples) < 0:
            raise AoizoraError(f"Timing needs one or more non-negative samples, got {samples!r}.")
        object.__setattr__(self, "samples", samples)

    @property
    def median_s(self) -> float:
        """Median seconds: the figure plans are compared by (robust to a stray slow run)."""
        return statistics.median(self.samples)

    @property
    def min_s(self) -> float:
        """Fastest run."""
        return min(self.samples)

    @property
    def max_s(self) -> float:
        """Slowest run."""
        return max(self.samples)

    @property
    def spread(self) -> float:
        """``(max - min) / median``: 0.05 means the runs lie within 5 % of the median."""
        median = self.median_s
        return (self.max_s - self.min_s) / median if median > 0 else 0.0


def _timed(call: Callable[[], Any], *, steps: int, warmup: int) -> Timing:
    """Run ``call`` ``warmup`` times untimed, then ``steps`` times timed to completion."""
    for _ in range(warmup):
        call().block_until_ready()
    samples = []
    for _ in range(steps):
        start = time.perf_counter()
        call().block_until_ready()
        samples.append(time.perf_counter() - start)
    return Timing(tuple(samples))


def _check_counts(**counts: int) -> None:
    for name, value in counts.items():
        minimum = 0 if name == "warmup" else 1
        if not is_whole(value, minimum):
            raise AoizoraError(f"{name}={value!r} must be an integer >= {minimum}.")


def live_devices(topology: Topology, devices: Sequence[Any] | None = None) -> list[Any]:
    """The devices to run on: ``devices`` or the topology's, refused unless they can run.

    A simulated topology has no devices and a deviceless (libtpu) one has devices that only
    compile; both are an error saying how to get live ones.
    """
    pool = list(devices) if devices is not None else topology.devices
    if pool is None:
        raise AoizoraError(
            f"{topology.name} is a simulated slice ({topology.note or 'no devices'}): there is "
            "nothing to run or time. On a TPU VM move the plan onto the live slice: "
            "retarget(plan, Topology.from_devices(jax.devices())), or for a plan file "
            "Plan.from_json(path, Topology.from_devices(jax.devices())); on CPU "
            f"host devices use Topology.simulated({topology.shape}, devices=jax.devices()"
            f"[:{topology.num_devices}]) — CPU timings prove the mechanics, not TPU speed."
        )
    if len(pool) != topology.num_devices:
        raise AoizoraError(
            f"{topology.name} has {topology.num_devices} devices but {len(pool)} were passed; "
            "pass one device per row of topology.coords, in that order."
        )
    running = set(jax.devices())
    if not all(d in running for d in pool):
        raise AoizoraError(
            f"The devices of {topology.name} ({topology.source}) are not devices this process "
            f"runs on ({jax.devices()[0].platform} x {len(running)}): deviceless TPU devices "
            "compile but cannot run. On a TPU VM move the plan onto the live slice: "
            "retarget(plan, Topology.from_devices(jax.devices())), or for a plan file "
            "Plan.from_json(path, Topology.from_devices(jax.devices())); or pass devices= "
            "with one live device per row of topology.coords."
        )
    return pool


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
        return _timed(lambda: self.step(params, inputs), steps=steps, warmup=warmup)


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
    _check_counts(steps=steps, warmup=warmup)
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

    _check_counts(rounds=rounds, steps=steps, warmup=warmup)
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
    ``"maxdiffusion: cfg2-ctx4-fsdp | mesh_utils.create_device_mesh"``; a plan that is the
    same candidate on the same placement as an earlier one is listed once, its labels joined
    with ``" = "`` (``"rank 1 = aoizora-lab = jax-default: ..."``). Baselines that were not
    built or did not compile are skipped. With ``topology`` (the live slice, when the plan
    was made deviceless) every plan is :func:`retarget`-ed onto it.
    """
    from aoizora_lab.candidates import Candidate, default_attention

    _check_counts(top=top)
    best = result.best
    workload, planned = best.workload, best.topology
    attention = default_attention(planned)
    entries: list[tuple[list[str], Plan]] = []

    def add(label: str, plan: Plan) -> None:
        for labels, known in entries:
            if (known.candidate.name, known.placement.order) == (plan.candidate.name,
                                                                 plan.placement.order):
                labels.append(label)
                return
        entries.append(([label], plan))

    for rank, (_, row) in enumerate(result.placements.head(top).iterrows(), start=1):
        candidate = Candidate.from_name(row["candidate"], attention=attention)
        add(f"rank {rank}", Plan(workload, planned, candidate, row["placement"],
                                 _predicted(row), result.programs.get(candidate.name)))
    add("aoizora-lab", best)
    for name, baseline in result.baseline_plans.items():
        add(name, baseline)
    return {f"{' = '.join(labels)}: {plan.candidate.name} | {plan.placement.description}":
            plan if topology is None else retarget(plan, topology) for labels, plan in entries}


def _predicted(row: Mapping[str, Any]) -> Predicted:
    return Predicted(float(row["compute_s"]), float(row["comm_s"]), float(row["total_s"]))


# ----------------------------------------------------------------------------- microbenchmarks


@dataclass(frozen=True)
class Probe:
    """One microbenchmark: a collective over groups of physically placed chips."""

    kind: str
    """``"collective-permute"``, ``"all-gather"`` or ``"all-to-all"``."""
    group: str
    """What the groups are, for people: ``"y line"``, ``"2x2 block"``, ``"y +1"``..."""
    block: tuple[int, ...]
    """Chips per physical axis in one group; the groups tile the slice (a line along y of
    ``v5e:2x4`` is ``(1, 4)``)."""
    shift: tuple[tuple[int, int], ...] = ()
    """For a permute: (source, target) positions along the group's one long axis."""

    @property
    def group_size(self) -> int:
        """Chips in one group (2 for a permute: a source and its target)."""
        return 2 if self.kind == "collective-permute" else math.prod(self.block)


def probes(topology: Topology, kinds: Sequence[str] = MICROBENCHMARK_KINDS) -> list[Probe]:
    """The microbenchmarks of ``topology`` (module docstring), in a fixed order.

    Permutes: per axis longer than 1, shift +1 and -1 within each line, and for an axis longer
    than 2 the cyclic shifts (the closing transfer takes the wraparound link where the axis
    wraps and crosses the whole line where it does not). Gathers and all-to-alls: per axis
    longer than 1 its lines, a 2x2 block of the first two axes where both are even and the
    block is not the whole slice, and the whole slice when it is more than one line.
    """
    unknown = sorted(set(kinds) - set(MICROBENCHMARK_KINDS))
    if unknown:
        raise AoizoraError(
            f"Unknown microbenchmark kind(s) {unknown}; kinds are {list(MICROBENCHMARK_KINDS)}."
        )
    shape = topology.shape
    long_axes = [a for a, n in enumerate(shape) if n > 1]

    def line(axis: int) -> tuple[int, ...]:
        return tuple(n if a == axis else 1 for a, n in enumerate(shape))

    out: list[Probe] = []
    if "collective-permute" in kinds:
        for a in long_axes:
            n, name = shape[a], _AXES[a]
            out.append(Probe("collective-permute", f"{name} +1", line(a),
                             tuple((i, i + 1) for i in range(n - 1))))
            out.append(Probe("collective-permute", f"{name} -1", line(a),
                             tuple((i + 1, i) for i in range(n - 1))))
            if n > 2:
                closing = "wraparound" if topology.wrap[a] else "closing hop crosses the line"
                for step in (1, -1):
                    out.append(Probe("collective-permute", f"{name} cyclic {step:+d} ({closing})",
                                     line(a), tuple((i, (i + step) % n) for i in range(n))))
    blocks = [(f"{_AXES[a]} line", line(a)) for a in long_axes]
    square = (2, 2) + (1,) * (len(shape) - 2)
    if len(shape) >= 2 and all(n % 2 == 0 for n in shape[:2]) and square != shape:
        blocks.append(("2x2 block", square))
    if len(long_axes) > 1:
        blocks.append(("whole slice", shape))
    for kind in ("all-gather", "all-to-all"):
        if kind in kinds:
            out.extend(Probe(kind, label, block) for label, block in blocks)
    return out


def block_groups(topology: Topology, block: Sequence[int]) -> np.ndarray:
    """Device indices of every group tiling the slice in blocks of ``block`` chips.

    ``int`` array ``[groups, members]``, members in row-major order over the block's axes (the
    order ``shard_map`` collectives use over those mesh axes); several devices on one chip
    (deviceless v4) belong to different groups. Example: on ``Topology.simulated((2, 4))``
    (device 1 is chip (1, 0)), block ``(2, 2)`` gives ``[[0, 2, 1, 3], [4, 6, 5, 7]]``.
    """
    grid = _split_grid(topology, block)
    ndim = topology.ndim
    outer = [2 * a for a in range(ndim)] + [2 * ndim]
    inner = [2 * a + 1 for a in range(ndim)]
    return grid.transpose(outer + inner).reshape(-1, math.prod(block))


def _split_grid(topology: Topology, block: Sequence[int]) -> np.ndarray:
    """The device grid with each axis split into (outer, inner = block), then cores."""
    block = tuple(int(b) for b in block)
    if len(block) != topology.ndim or any(n % b for n, b in zip(topology.shape, block,
                                                                    strict=True)):
        raise AoizoraError(
            f"Block {block} must have one entry per axis of {topology.name} and divide its "
            f"shape {topology.shape}."
        )
    split = [d for n, b in zip(topology.shape, block, strict=True) for d in (n // b, b)]
    return topology.device_grid().reshape(*split, topology.devices_per_chip)


def probe_collective(topology: Topology, probe: Probe, size: float) -> Collective:
    """The :class:`Collective` ``probe`` runs with ``size`` result bytes per device.

    Device ids are the topology's device indices, so :func:`~aoizora_lab.estimate` prices it
    with the identity placement.
    """
    groups = block_groups(topology, probe.block)
    if probe.kind == "collective-permute":
        pairs = [(int(g[s]), int(g[t])) for g in groups for s, t in probe.shift]
        return Collective("collective-permute", pairs, size, name=probe.group)
    return Collective(probe.kind, groups.tolist(), size, name=probe.group)


def model_terms(collective: Collective, topology: Topology, *,
                options: ModelOptions | None = None) -> tuple[float, float]:
    """(critical bytes, hops) of ``collective``: the model's time is
    ``critical_bytes / (ici_link_bandwidth * ici_efficiency) + hops * ici_hop_latency``."""
    chip = chip_spec(topology.generation, calibrated=False)
    return _terms(estimate(collective, topology, chip=chip, options=options), chip)


def _terms(result: CommEstimate, chip: ChipSpec) -> tuple[float, float]:
    return (result.bandwidth_seconds * chip.ici_link_bandwidth * chip.ici_efficiency,
            result.latency_seconds / chip.ici_hop_latency)


def _probe_program(topology: Topology, probe: Probe, pool: Sequence[Any], elements: int,
                   inner: int) -> tuple[Any, Any]:
    """The compiled ``inner``-times loop of ``probe`` and its (zero) input array."""
    grid = _split_grid(topology, probe.block)
    names = tuple(n for a in range(topology.ndim) for n in (f"{_AXES[a]}_outer", _AXES[a]))
    names += ("core",)
    devices = np.empty(grid.size, dtype=object)
    devices[:] = [pool[i] for i in grid.ravel()]
    mesh = Mesh(devices.reshape(grid.shape), names)
    members = tuple(_AXES[a] for a, b in enumerate(probe.block) if b > 1)

    def once(x: jax.Array) -> jax.Array:
        if probe.kind == "collective-permute":
            return jax.lax.ppermute(x, members[0], list(probe.shift))
        if probe.kind == "all-to-all":
            return jax.lax.all_to_all(x, members, 0, 0, tiled=True)
        # Keep one member's slice so the loop carries a fixed shape; every gather is needed.
        return jax.lax.all_gather(x, members, tiled=True)[: x.shape[0]]

    def loop(x: jax.Array) -> jax.Array:
        return jax.lax.fori_loop(0, inner, lambda _, y: once(y), x)

    local = elements // (probe.group_size if probe.kind == "all-gather" else 1)
    sharding = NamedSharding(mesh, P(names))
    # Made sharded: the global array of a 64 MiB probe on 256 chips would not fit one chip.
    x = jax.jit(lambda: jnp.zeros((local * topology.num_devices,), jnp.float32),
                out_shardings=sharding)()
    program = jax.jit(jax.shard_map(loop, mesh=mesh, in_specs=P(names), out_specs=P(names),
                                    check_vma=False))
    return program.lower(x).compile(), x


def microbenchmarks(topology: Topology, *, sizes: Sequence[float] = DEFAULT_SIZES,
                    kinds: Sequence[str] = MICROBENCHMARK_KINDS, repeats: int = 5,
                    warmup: int = 2, inner: int = 10, chip: ChipSpec | None = None,
                    options: ModelOptions | None = None,
                    devices: Sequence[Any] | None = None) -> pd.DataFrame:
    """Time every :func:`probes` collective at every size on the live slice; add predictions.

    Each (probe, size) program runs its collective ``inner`` times in a loop; after
    ``warmup`` untimed runs, ``repeats`` runs are timed and ``seconds`` is the median divided
    by ``inner``. Sizes are result bytes per device (float32 elements, rounded down to a
    whole number per member: the ``bytes`` column is the size actually moved). Columns:
    ``kind``, ``group``, ``group_size``, ``num_groups``, ``bytes``, ``seconds``, ``spread``,
    ``predicted_s`` (the ICI model with ``chip``, default ``chip_spec(topology.generation)``),
    ``critical_bytes`` and ``hops`` (:func:`model_terms`), ``platform`` and ``collective``
    (the :class:`Collective`, device ids = topology device indices) for :func:`calibrate`.
    Example (tests, CPU): ``microbenchmarks(topo, sizes=[4096, 65536], repeats=2, inner=2)``.
    """
    import pandas as pd

    _check_counts(repeats=repeats, warmup=warmup, inner=inner)
    pool = live_devices(topology, devices)
    chip = chip or chip_spec(topology.generation)
    itemsize = 4  # float32
    rows = []
    for probe in probes(topology, kinds):
        per_member = probe.group_size if probe.kind != "collective-permute" else 1
        for size in sizes:
            elements = max(1, int(size) // (itemsize * per_member)) * per_member
            collective = probe_collective(topology, probe, elements * itemsize)
            program, x = _probe_program(topology, probe, pool, elements, inner)
            timing = _timed(lambda p=program, a=x: p(a), steps=repeats, warmup=warmup)
            result = estimate(collective, topology, chip=chip, options=options)
            critical, hops = _terms(result, chip)
            rows.append({"kind": probe.kind, "group": probe.group,
                         "group_size": probe.group_size, "num_groups": len(collective.groups),
                         "bytes": collective.bytes, "seconds": timing.median_s / inner,
                         "spread": timing.spread, "predicted_s": result.seconds,
                         "critical_bytes": critical, "hops": hops,
                         "platform": pool[0].platform, "collective": collective})
    return pd.DataFrame(rows)


# ----------------------------------------------------------------------------- calibration


@dataclass(frozen=True, eq=False)
class Calibration:
    """ICI constants fitted to microbenchmarks, the fit's error, and what to write."""

    generation: str
    """Chip generation the constants are for."""
    slice: str
    """The slice measured, e.g. ``"v5e:2x4"``."""
    platform: str
    """Platform of the measured devices (``"tpu"``; anything else is a test of mechanics)."""
    effective_bandwidth: float
    """Fitted ``ici_link_bandwidth * ici_efficiency`` in bytes/s (``inf`` if unresolved)."""
    hop_latency: float
    """Fitted seconds per hop (0 if unresolved)."""
    overrides: dict[str, float]
    """The :class:`~aoizora_lab.ChipSpec` fields to write (resolved constants only)."""
    rms_relative_error: float
    """Root mean square of ``(fitted - measured) / measured`` over the points."""
    max_relative_error: float
    """Largest ``|fitted - measured| / measured``."""
    points: int
    """Number of measurements fitted."""
    notes: tuple[str, ...] = ()
    """What the fit could not determine, or other facts a reader should know."""
    table: pd.DataFrame | None = field(default=None, repr=False)
    """The measurements with ``critical_bytes``, ``hops``, ``fitted_s`` and ``relative_error``."""


def calibrate(measurements: pd.DataFrame, topology: Topology, *, generation: str | None = None,
              options: ModelOptions | None = None) -> Calibration:
    """Fit the ICI model's bandwidth and per-hop latency to ``measurements`` (module docstring).

    ``measurements`` needs a ``collective`` column (:class:`Collective` over ``topology``'s
    device indices) and a ``seconds`` column, as :func:`microbenchmarks` returns; a
    ``platform`` column is carried into the result. The regressors are recomputed with
    ``options``, so a fit can be tried under each modelling choice. Use sizes from latency- to
    bandwidth-bound and groups of several hop counts, or one constant stays undetermined (a
    note says so and it is left out of ``overrides``).
    """
    from scipy.optimize import nnls

    nominal = chip_spec(generation or topology.generation, calibrated=False)
    missing = {"collective", "seconds"} - set(measurements.columns)
    if missing or measurements.empty:
        raise AoizoraError(
            f"calibrate needs measurements with 'collective' and 'seconds' columns (as "
            f"microbenchmarks() returns); got {len(measurements)} rows, missing {sorted(missing)}."
        )
    table = measurements.copy()
    seconds = table["seconds"].to_numpy(dtype=float)
    if not (np.isfinite(seconds).all() and (seconds > 0).all()):
        raise AoizoraError("calibrate: every measured 'seconds' must be a positive number.")
    terms = np.array([model_terms(c, topology, options=options) for c in table["collective"]])
    table["critical_bytes"], table["hops"] = terms[:, 0], terms[:, 1]
    # Relative least squares: each row divided by its measurement; columns scaled to unit
    # norm so bytes (1e3..1e8) and hops (1..10) are solved with equal precision.
    rows = terms / seconds[:, None]
    scale = np.linalg.norm(rows, axis=0)
    scale[scale == 0] = 1.0
    solution, _ = nnls(rows / scale, np.ones(len(seconds)))
    per_byte, latency = (float(v) for v in solution / scale)
    fitted = terms @ np.array([per_byte, latency])
    relative = (fitted - seconds) / seconds
    table["fitted_s"], table["relative_error"] = fitted, relative
    effective = 1.0 / per_byte if per_byte > 0 else math.inf
    overrides: dict[str, float] = {}
    notes: list[str] = []
    if math.isfinite(effective):
        # Only bandwidth x efficiency is identifiable: keep the published bandwidth unless the
        # slice beats it.
        bandwidth = max(nominal.ici_link_bandwidth, effective)
        overrides["ici_link_bandwidth"] = bandwidth
        overrides["ici_efficiency"] = effective / bandwidth
    else:
        notes.append("bandwidth not determined (fitted seconds per byte is 0): add "
                     "bandwidth-bound sizes (MiB and more); the default is kept")
    if latency > 0:
        overrides["ici_hop_latency"] = latency
    else:
        notes.append("per-hop latency not determined (fitted 0): add latency-bound sizes "
                     "(a few KiB) and groups of several hop counts; the default is kept")
    platforms = sorted(set(table["platform"])) if "platform" in table else ["unknown"]
    if platforms != ["tpu"]:
        notes.append(f"measured on {'/'.join(map(str, platforms))} devices: these constants "
                     "say nothing about TPU links")
    return Calibration(
        generation=nominal.generation, slice=topology.name, platform="/".join(platforms),
        effective_bandwidth=effective, hop_latency=latency, overrides=overrides,
        rms_relative_error=float(np.sqrt(np.mean(relative**2))),
        max_relative_error=float(np.abs(relative).max()), points=len(seconds),
        notes=tuple(notes), table=table)


def is_writer() -> bool:
    """Whether this process writes shared results: process 0 of a multi-host run (or the
    only process). Every process runs the measurements; one writes the files."""
    return jax.process_index() == 0


def write_calibration(calibration: Calibration, directory: str | Path | None = None, *,
                      allow_non_tpu: bool = False) -> Path | None:
    """Write ``calibration`` to ``<directory>/<generation>.json`` for :func:`chip_spec`.

    ``directory`` defaults to ``$AOIZORA_LAB_CALIBRATION_DIR`` or ``data/calibration``. Only
    process 0 writes (:func:`is_writer`); the others return ``None``. A calibration measured on
    anything but TPU devices is refused unless ``allow_non_tpu`` (tests of the mechanics):
    written to the default folder it would silently change every prediction.
    """
    if calibration.platform != "tpu" and not allow_non_tpu:
        raise AoizoraError(
            f"This calibration was measured on {calibration.platform!r} devices, whose "
            "timings say nothing about TPU links; measure on a TPU VM, or pass "
            "allow_non_tpu=True with a scratch directory to test the mechanics."
        )
    if not calibration.overrides:
        raise AoizoraError(
            f"The calibration determined no constant ({'; '.join(calibration.notes)}); "
            "nothing to write."
        )
    if not is_writer():
        return None
    return save_calibration(
        calibration.generation, calibration.overrides, directory, slice=calibration.slice,
        platform=calibration.platform, points=calibration.points,
        rms_relative_error=calibration.rms_relative_error,
        max_relative_error=calibration.max_relative_error, notes=list(calibration.notes),
        date=time.strftime("%Y-%m-%dT%H:%M:%S%z"))
