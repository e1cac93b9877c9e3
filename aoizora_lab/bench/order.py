"""Device order: what the TPU compiler does with a group's order, and what order-only changes
published by MaxText, axlearn and JAX gained against what the ICI model predicts.

Two tables, the "Device order" section of ``reports/benchmarks.md``
(``benchmarks/device_order.py`` writes it and keeps the other sections):

1. **The compiler's own labels** (:data:`PROBES`): one collective over a mesh in a given device
   order, compiled deviceless by libtpu in a child process; its ``collective_algorithm_config``
   says which emitter and strategy run it and whether it maps the group's order onto an order
   of its own (``has_reordering_map``). These labels are what
   :data:`~aoizora_lab.comm_model.RING_IN_ORDER_MAX_MEMBERS` and the ``"compiler"`` order model
   rest on.
2. **Published order-only measurements** (:data:`MEASUREMENTS`): the same chips, the same
   program, only the device order changed, with a published step time or throughput before
   and after. Each is rebuilt as the two orders on the libtpu slice and the collective the
   change targets, priced by :func:`aoizora_lab.comm_model.estimate` under every order model
   (:data:`~aoizora_lab.comm_model.ORDER_MODELS`). A step holds more than its collectives,
   so its gain is at most theirs: a model *reaches* a measurement when its predicted
   collective ratio is at least the published step ratio. A miss stays in the table with its
   why.

Worked example (MaxText PR #1239, v6e-8): JAX's generic torus path put an 8-way mesh axis on
the 2x4 slice in x-major order, (0,0) (0,1) (0,2) (0,3) (1,0) ... (1,3), whose closing hops
cross the slice; MaxText's ``optimize_mesh_for_tpu_v6e`` reverses the second half, (1,3) (1,2)
(1,1) (1,0), which makes it a ring of one-link hops; tokens per second rose 11.6 %.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd

from aoizora_lab.bench.report import markdown_table, met
from aoizora_lab.comm_model import (
    ORDER_MODELS,
    RING_IN_ORDER_MAX_MEMBERS,
    Collective,
    CommEstimate,
    ModelOptions,
    estimate,
    mesh_axis_groups,
    order_algorithm,
)
from aoizora_lab.hlo import CommProgram
from aoizora_lab.placement import (
    LibraryRefuses,
    Placement,
    block_ring,
    create_device_mesh_order,
    order_of,
    plain_order,
)
from aoizora_lab.topology import Topology
from aoizora_lab.uncertainty import DEFAULT_ENSEMBLE, price

SECTION = "## Device order"
"""The section's heading in ``reports/benchmarks.md``."""

MESSAGE_BYTES = 64e6
"""Result bytes per device of each rebuilt collective: bandwidth-bound, where an order's link
loads decide its time (the published programs' collective sizes are not published)."""

SMALL_MESSAGE_BYTES = 256e3
"""A latency-leaning size, shown beside: hop latency dilutes an order's effect there."""

OrderBuilder = Callable[[Topology], Placement]
"""A device order of a slice, built from its (libtpu) devices."""


# ----------------------------------------------------------------------------- orders


def coordinate_order(*axes: int) -> OrderBuilder:
    """Devices sorted by chip coordinates, ``axes[0]`` slowest (then the core on the chip):
    ``coordinate_order(0, 1)`` is x-major, ``coordinate_order(1, 0)`` x fastest."""
    def build(topology: Topology) -> Placement:
        coords = topology.chip_coords[topology.device_chip]
        keys = [np.arange(topology.num_devices)] + [coords[:, a] for a in reversed(axes)]
        order = np.lexsort(keys)
        names = "".join("xyz"[a] for a in axes)
        return Placement(tuple(int(i) for i in order), f"coordinates, {names} major first")
    return build


def generic_torus_order(mesh: Sequence[int], *, allow_split: bool = False) -> OrderBuilder:
    """What ``mesh_utils.create_device_mesh`` builds without a device-kind handler: its
    generic N-D torus path (what v6e got before JAX routed it to the v5e tray handler)."""
    def build(topology: Topology) -> Placement:
        from jax._src import mesh_utils

        physical = mesh_utils._get_physical_tpu_mesh(list(topology.devices))
        devices, _ = mesh_utils._create_device_mesh_for_nd_torus(
            physical, tuple(mesh), allow_split_physical_axes=allow_split)
        return order_of(devices, topology, "mesh_utils generic torus path")
    return build


def library_order(mesh: Sequence[int], *, allow_split: bool | None = None) -> OrderBuilder:
    """``mesh_utils.create_device_mesh(mesh)`` as JAX 0.10.2 builds it."""
    return lambda topology: create_device_mesh_order(mesh, topology, allow_split=allow_split)


def reversed_tail(base: OrderBuilder, start: int) -> OrderBuilder:
    """``base`` with positions ``start..`` reversed: MaxText's ``optimize_mesh_for_tpu_v6e``
    (``new_mesh[4:] = new_mesh[-1:3:-1]`` on an 8-device axis)."""
    def build(topology: Topology) -> Placement:
        built = base(topology)
        order = list(built.order)
        order[start:] = order[start:][::-1]
        return Placement(tuple(order), f"{built.description}, tail reversed")
    return build


def block_rings(ring: tuple[int, int], axes: tuple[int, int], *, serpentine: bool = True,
                ring_last: bool = False) -> OrderBuilder:
    """A 2-D mesh ``(ring size, blocks)`` (``ring_last``: ``(blocks, ring size)``) whose ring
    axis runs a :func:`~aoizora_lab.placement.block_ring` of a ``ring[0]`` x ``ring[1]``
    block on physical ``axes``, the blocks walked row by row (``serpentine``: every other row
    backwards) as the other axis. MaxText PR #4911's ``mesh_ring_axis`` (k x 2 blocks) and
    axlearn PR #952's rings of 2x2 blocks."""
    def build(topology: Topology) -> Placement:
        grid = topology.device_grid()[..., 0]  # one device per chip
        a, b = axes
        rows, cols = topology.shape[a] // ring[0], topology.shape[b] // ring[1]
        blocks = [(r, c if not (serpentine and r % 2) else cols - 1 - c)
                  for r in range(rows) for c in range(cols)]
        order = np.empty((ring[0] * ring[1], len(blocks)), dtype=np.int64)
        for position, (da, db) in enumerate(block_ring(*ring)):
            for block, (r, c) in enumerate(blocks):
                index = [0] * topology.ndim
                index[a], index[b] = r * ring[0] + da, c * ring[1] + db
                order[position, block] = grid[tuple(index)]
        return Placement(tuple(int(i) for i in (order.T if ring_last else order).ravel()),
                         f"rings of {ring[0]}x{ring[1]} blocks")
    return build


def physical_axes_order(*axes: str) -> OrderBuilder:
    """Devices with the physical grid's axes (``x``, ``y``, ``z``, ``core``) transposed into
    ``axes`` (slowest first), then flattened: the mesh axes take them in that order."""
    def build(topology: Topology) -> Placement:
        names = [*"xyz"[:topology.ndim], "core"]
        grid = topology.device_grid().transpose([names.index(a) for a in axes])
        return Placement(tuple(int(i) for i in grid.ravel()), "·".join(axes))
    return build


# ----------------------------------------------------------------------------- probes


@dataclass(frozen=True)
class Probe:
    """One collective compiled deviceless in one device order, for its strategy labels."""

    slice_name: str
    """The libtpu slice."""
    mesh: tuple[int, ...]
    """The logical mesh."""
    axes: tuple[int, ...]
    """The mesh axes the collective runs over."""
    kind: str
    """``all-reduce`` or ``all-gather``."""
    order_label: str
    """What the order is, for people."""
    order: OrderBuilder
    """How the order is built on the slice."""


def _probes() -> tuple[Probe, ...]:
    v6e8 = [("create_device_mesh", library_order((8,))), ("x-major", coordinate_order(0, 1)),
            ("x fastest", coordinate_order(1, 0)),
            ("ring", block_rings((2, 4), (0, 1)))]
    probes = [Probe("v6e:2x4", (8,), (0,), kind, label, build)
              for kind in ("all-reduce", "all-gather") for label, build in v6e8]
    probes += [Probe("v5e:4x4", (16,), (0,), "all-reduce", label, build) for label, build in (
        ("libtpu device order", plain_order), ("create_device_mesh (4x4 tray ring)",
                                               library_order((16,))),
        ("x fastest", coordinate_order(1, 0)))]
    probes += [Probe("v5e:4x4", (2, 8), (1,), "all-reduce", label, build) for label, build in (
        ("8 = 4x2 block, x fastest", coordinate_order(1, 0)),
        ("8 = ring of a 4x2 block", block_rings((4, 2), (0, 1))))]
    probes += [Probe("v5e:8x8", (4, 16), (1,), "all-reduce", "16 = 8x2 block, x fastest",
                     coordinate_order(1, 0)),
               Probe("v5p:2x2x4", (16,), (0,), "all-reduce", "libtpu device order",
                     plain_order),
               Probe("v6e:8x16", (8, 16), (0,), "all-reduce", "create_device_mesh",
                     library_order((8, 16))),
               Probe("v6e:8x16", (8, 16), (0,), "all-reduce", "rings of 4x2 blocks",
                     block_rings((4, 2), (0, 1))),
               Probe("tpu7x:2x2x1", (8,), (0,), "all-reduce", "libtpu device order",
                     plain_order)]
    return tuple(probes)


PROBES: tuple[Probe, ...] = _probes()
"""The collectives whose labels the section shows."""


def collective_labels(slice_name: str, order: tuple[int, ...], mesh: tuple[int, ...],
                      axes: tuple[int, ...], kind: str) -> dict[str, str]:
    """Compile ``kind`` over mesh ``axes`` (``mesh`` in device ``order`` on the deviceless
    ``slice_name``) and read its ``collective_algorithm_config``: emitter, strategy (with its
    ring sizes) and ``has_reordering_map``. Run it in a child process (libtpu may abort)."""
    import jax
    import jax.numpy as jnp
    from jax.sharding import Mesh, NamedSharding
    from jax.sharding import PartitionSpec as P

    from aoizora_lab.deviceless import deviceless_devices

    devices = deviceless_devices(slice_name)
    names = tuple(f"a{i}" for i in range(len(mesh)))
    grid = Mesh(np.array([devices[i] for i in order]).reshape(mesh), names)
    over = tuple(names[a] for a in axes)

    def body(x: Any) -> Any:
        if kind == "all-reduce":
            return jax.lax.psum(x, over)
        return jax.lax.all_gather(x, over, tiled=True)

    run = jax.shard_map(body, mesh=grid, in_specs=P(names), out_specs=P(names),
                        check_vma=False)
    spec = jax.ShapeDtypeStruct((len(devices) * 512, 4096), jnp.bfloat16,
                                sharding=NamedSharding(grid, P(names)))
    text = jax.jit(run).lower(spec).compile().as_text()
    for line in text.splitlines():
        if re.search(rf"= \S+ {kind}(-start)?\(", line) and "replica_groups" in line:
            config = re.search(r'"collective_algorithm_config":(\{.*?"\})', line)
            found = config.group(1) if config else ""
            pick = {"emitter": r'"emitter":"([^"]+)"', "strategy": r'"strategy":"([^"]+)"',
                    "rings": r"cores:(\{[0-9 ]*\}(?:,\{[0-9 ]*\})*)",
                    "reordering map": r"has_reordering_map:\s*(\w+)"}
            out = {k: (m.group(1) if (m := re.search(p, found)) else "-")
                   for k, p in pick.items()}
            out["reordering map"] = {"1": "yes", "true": "yes", "0": "no", "false": "no"}.get(
                out["reordering map"], out["reordering map"])
            return out
    return {"emitter": "-", "strategy": "-", "rings": "-", "reordering map": "-"}


def probe_rows(probes: Sequence[Probe] = PROBES, *, workers: int | None = None
               ) -> pd.DataFrame:
    """One row per probe: the slice, group, order, the compiler's labels (or why not), and
    the order model's reading (:func:`~aoizora_lab.comm_model.order_algorithm`)."""
    from aoizora_lab.workers import run_in_workers

    calls, rows = [], []
    for probe in probes:
        topology = Topology.from_name(probe.slice_name)
        members = math.prod(probe.mesh[a] for a in probe.axes)
        rows.append({"slice": probe.slice_name, "mesh": "x".join(map(str, probe.mesh)),
                     "kind": probe.kind, "group": members, "order": probe.order_label,
                     "model reads": order_algorithm(probe.kind, members, topology,
                                                    ModelOptions(order="compiler"))})
        calls.append((probe.slice_name, probe.order(topology).order, probe.mesh, probe.axes,
                      probe.kind))
    labels = run_in_workers(_labels_or_reason, calls, workers=workers)
    return pd.DataFrame([row | found for row, found in zip(rows, labels, strict=True)])


def _labels_or_reason(*args: Any) -> dict[str, str]:
    """:func:`collective_labels`, or the reason it failed as the emitter."""
    try:
        return collective_labels(*args)
    except Exception as err:  # a failed compile is a row
        return {"emitter": f"error: {type(err).__name__}: {str(err)[:80]}", "strategy": "-",
                "rings": "-", "reordering map": "-"}


# ----------------------------------------------------------------------------- measurements


@dataclass(frozen=True)
class OrderMeasurement:
    """A published order-only change: the same program and chips, two device orders."""

    key: str
    """A short name."""
    source: str
    """Where it was published (pull request)."""
    workload: str
    """What ran, as the source says."""
    slice_name: str
    """The libtpu slice."""
    mesh: tuple[int, ...]
    """The logical mesh (axes that are 1 left out)."""
    kind: str
    """The collective the change targets (as the source says, or its mesh axis's role)."""
    axes: tuple[int, ...]
    """The mesh axes that collective runs over."""
    before: tuple[str, OrderBuilder]
    """The order before the change, with its label."""
    after: tuple[str, OrderBuilder]
    """The order after it."""
    published_ratio: float
    """Step time before / after (or throughput after / before): above 1, the change won."""
    quoted: str
    """The published figures, as quoted."""
    measured_setup: bool = True
    """Whether the rebuild is the setup that was measured (``False``: the same change with
    today's JAX, shown for what it would do now; not counted in the targets)."""
    note: str = ""


PR_1239 = "https://github.com/AI-Hypercomputer/maxtext/pull/1239"
PR_1430 = "https://github.com/AI-Hypercomputer/maxtext/pull/1430"
PR_4911 = "https://github.com/AI-Hypercomputer/maxtext/pull/4911"
AXLEARN_952 = "https://github.com/apple/axlearn/pull/952"
JAX_39340 = "https://github.com/jax-ml/jax/pull/39340"

_V6E8_BEFORE = ("x-major (JAX's generic torus path, before JAX 50b46546)",
                generic_torus_order((8,)))
_V6E8_AFTER = ("optimize_mesh_for_tpu_v6e: tail reversed",
               reversed_tail(generic_torus_order((8,)), 4))

MEASUREMENTS: tuple[OrderMeasurement, ...] = (
    OrderMeasurement(
        "MaxText #1239 v6e-8", PR_1239, "MLPerf inference (offline) on MaxText, 8-way axis",
        "v6e:2x4", (8,), "all-reduce", (0,), _V6E8_BEFORE, _V6E8_AFTER,
        3272.4449 / 2931.8419, "2931.8 -> 3272.4 tokens/s",
        note="the axis holds all 8 chips (`mesh_is_1d_ring`); its collective is not named: "
             "an inference axis of 8 is tensor parallelism, whose collective is the "
             "all-reduce"),
    OrderMeasurement(
        "MaxText #1430 v6e-8", PR_1430, "llama-7b inference on MaxText, 8-way axis",
        "v6e:2x4", (8,), "all-reduce", (0,), _V6E8_BEFORE, _V6E8_AFTER,
        4413.04 / 4253.64, "4253.64 -> 4413.04 tokens/s (flag off -> on)",
        note="same orders as #1239 (March 2025, before JAX routed v6e to the v5e handler)"),
    OrderMeasurement(
        "MaxText #1239 with JAX 0.10.2", PR_1239, "the same flag on today's create_device_mesh",
        "v6e:2x4", (8,), "all-reduce", (0,),
        ("create_device_mesh (JAX 0.10.2: v5e tray order)", library_order((8,))),
        ("tail reversed", reversed_tail(library_order((8,)), 4)),
        3272.4449 / 2931.8419, "(the gain measured on the older order)",
        measured_setup=False,
        note="not the measured setup: JAX now gives v6e the v5e tray order "
             "(0,1,2,3,7,6,5,4), and reversing its tail no longer makes a ring"),
    OrderMeasurement(
        "MaxText #4911 v6e-128", PR_4911,
        "DeepSeek-V4-Flash 284B LoRA, seq 16384; tensor 8 x expert 16 (HLO byte-identical)",
        "v6e:8x16", (8, 16), "all-reduce", (0,),
        ("create_device_mesh", library_order((8, 16))),
        ("mesh_ring_axis=tensor: rings of 4x2 blocks", block_rings((4, 2), (0, 1))),
        4.632 / 4.138, "4.632 -> 4.138 s/step (1.12x)",
        note="tensor-parallel collectives over the 8-way axis; the x axis (8) has no "
             "wraparound, so create_device_mesh's lines close across 7 links"),
    OrderMeasurement(
        "axlearn #952 v6e-256", AXLEARN_952, "a 150B model (Fuji), mesh 64 x 4",
        "v6e:16x16", (64, 4), "all-reduce", (1,),
        ("create_device_mesh(allow_split_physical_axes=True)",
         library_order((64, 4), allow_split=True)),
        ("rings of 2x2 blocks", block_rings((2, 2), (0, 1), serpentine=False,
                                             ring_last=True)),
        1 / 0.95, "\"1.5% MFU (or 5% step time)\" on the non-native 64x4 mesh",
        note="the 4-way axis is the model (tensor) axis; 5 % less step time read as 1 / 0.95"),
    OrderMeasurement(
        "JAX #39340 TPU7x", JAX_39340, "a pretraining workload, FSDP 32 of 64 devices",
        "tpu7x:2x4x4", (2, 32), "all-gather", (1,),
        ("fsdp on x·y·z (greedy, before)", physical_axes_order("core", "x", "y", "z")),
        ("fsdp on y·z·core (after)", physical_axes_order("x", "y", "z", "core")),
        11.2819 / 10.8431, "11.2819 -> 10.8431 s/step (~4 %)",
        note="the FSDP all-gather / reduce-scatter moves onto the intra-chip (core) axis: a "
             "change of the group's chips as well as its order, which every order model "
             "sees"),
)
"""Every published order-only measurement found (sources quoted in each row)."""

NOT_REBUILT = (
    ("TPU v4 twisted tori (ISCA 2023)", "twisted vs regular torus all-to-all",
     "a twisted torus rewires the links: Topology describes regular tori and meshes only, "
     "and libtpu names no twisted slice; the paper's figures were not found in a primary "
     "source here"),
)
"""Order-related measurements the workbench cannot rebuild, with why."""


def _estimates(collective: Collective, topology: Topology, before: Placement,
               after: Placement, order_model: str) -> tuple[CommEstimate, CommEstimate]:
    """``collective`` on the orders before and after the change, under ``order_model``."""
    options = ModelOptions(order=order_model)
    return (estimate(collective, topology, before, options=options),
            estimate(collective, topology, after, options=options))


def measurement_rows(measurements: Sequence[OrderMeasurement] = MEASUREMENTS,
                     topology_of: Callable[[str], Topology] = Topology.from_name
                     ) -> pd.DataFrame:
    """One row per measurement: the published ratio, the predicted collective ratio (before
    / after) under every order model at :data:`MESSAGE_BYTES` (and the default model at
    :data:`SMALL_MESSAGE_BYTES`), whether each reaches the published ratio, and the busiest
    link before and after under the default model."""
    rows = []
    for m in measurements:
        row: dict[str, Any] = {"measurement": m.key, "slice": m.slice_name,
                               "mesh": "x".join(map(str, m.mesh)), "collective": m.kind,
                               "group": math.prod(m.mesh[a] for a in m.axes),
                               "before": m.before[0], "after": m.after[0],
                               "published": m.quoted, "published_ratio": m.published_ratio}
        try:
            topology = topology_of(m.slice_name)
            before, after = m.before[1](topology), m.after[1](topology)
        except Exception as err:  # a setup that cannot be rebuilt is a row
            rows.append(row | {"status": f"not rebuilt: {type(err).__name__}: {err}"[:160],
                               "measured_setup": m.measured_setup, "note": m.note})
            continue
        groups = mesh_axis_groups(m.mesh, list(m.axes))
        big = Collective(m.kind, groups, MESSAGE_BYTES)
        by_model = {model: _estimates(big, topology, before, after, model)
                    for model in ORDER_MODELS}
        for model, (was, now) in by_model.items():
            row[f"{model}_ratio"] = was.seconds / now.seconds
            row[f"{model}_reaches"] = bool(row[f"{model}_ratio"] >= m.published_ratio)
        default = ModelOptions().order
        small = _estimates(Collective(m.kind, groups, SMALL_MESSAGE_BYTES), topology, before,
                           after, default)
        row["default_ratio_small"] = small[0].seconds / small[1].seconds
        # How sure: the ratio draw by draw under the ensemble, which draws the order model
        # ("compiler" or "logical") with the link constants.
        drawn = [price(CommProgram((big,), topology.num_devices), topology, order)
                 for order in (before, after)]
        ratios = drawn[0] / drawn[1]
        row["ratio_p10"], row["ratio_p90"] = np.quantile(ratios, [0.1, 0.9])
        row["p_reaches"] = float(np.mean(ratios >= m.published_ratio))
        for side, each in zip(("before", "after"), by_model[default], strict=True):
            row[f"busiest_{side}"] = (f"{each.busiest_link} "
                                      f"{each.busiest_link_bytes / 1e6:.0f} MB")
        rows.append(row | {"status": "ok", "measured_setup": m.measured_setup,
                           "note": m.note})
    for key, what, why in NOT_REBUILT:
        rows.append({"measurement": key, "published": what, "status": f"not rebuilt: {why}",
                     "measured_setup": True})
    return pd.DataFrame(rows)


ENSEMBLE_ROW = "ensemble: the 80 % interval's top (ratio_p90)"
"""The calibration row of :func:`order_targets`: a published step gain bounds its collective's
gain from below, so the one-sided check of an interval is that its top reaches the gain (at
least 10 % of the draws do; ``p_reaches`` gives the share)."""


def order_targets(rows: pd.DataFrame) -> pd.DataFrame:
    """Per order model: how many rebuilt measured setups it reaches; then, where the rows have
    intervals, how many the ensemble's 80 % interval reaches (:data:`ENSEMBLE_ROW`)."""
    done = rows[(rows["status"] == "ok") & rows["measured_setup"].astype(bool)]
    out = [{"order model": model, "reaches": f"{int(done[f'{model}_reaches'].sum())} of "
                                            f"{len(done)}",
            "every published gain reached": met(bool(done[f"{model}_reaches"].all())),
            "default": "yes" if model == ModelOptions().order else ""}
           for model in ORDER_MODELS]
    if "ratio_p90" in done:
        reached = done["ratio_p90"] >= done["published_ratio"]
        out.append({"order model": ENSEMBLE_ROW, "reaches": f"{int(reached.sum())} of "
                                                            f"{len(done)}",
                    "every published gain reached": met(bool(reached.all())), "default": ""})
    return pd.DataFrame(out)


# ----------------------------------------------------------------------------- plans


def plan_rows(cases: Sequence[Any], *, num_layers: int | None = 2, budget: int = 20_000,
              cache_dir: Any = None, progress: Callable[[str], None] | None = None
              ) -> pd.DataFrame:
    """Where order matters in real plans: per case, the plan's compiled program (planned as
    the planner plans it, read from the caches where they hold it) searched and priced under
    every order model: its placement gain over plain device order and over
    ``create_device_mesh``'s (NaN where that refuses the mesh), and what follows its order
    under the default (collectives, and their share of the communication in plain order)."""
    from aoizora_lab.bench.report import case_row
    from aoizora_lab.cost import predict
    from aoizora_lab.options import FULL_SEARCH
    from aoizora_lab.placement import rank_placements
    from aoizora_lab.planner import plan

    def measure(workload: Any, topology: Topology) -> dict[str, Any]:
        best = plan(workload, topology, FULL_SEARCH.replace(
            num_layers=num_layers, budget=budget, cache_dir=cache_dir)).best
        program, candidate = best.program, best.candidate
        default = ModelOptions()
        follows = [c for c in program.collectives
                   if order_algorithm(c.kind, len(c.groups[0]), topology, default) == "ring"
                   and len(c.groups[0]) > 2]
        plain = plain_order(topology)
        every = estimate(program, topology, plain).seconds
        ordered = estimate(follows, topology, plain).seconds if follows else 0.0
        row: dict[str, Any] = {"candidate": candidate.name, "flags": best.flags.label,
                               "collectives following their order": len(follows),
                               "their share of comm": ordered / every if every else 0.0}
        try:
            library = create_device_mesh_order(candidate.mesh_shape, topology,
                                               allow_split=False)
        except LibraryRefuses:
            library = None
        for model in ORDER_MODELS:
            options = ModelOptions(order=model)
            found = rank_placements(program, candidate, topology, budget=budget,
                                    flags=best.flags, options=options)[0].predicted.total_s
            row[f"{model}: vs plain"] = (predict(program, topology, plain, options=options)
                                         .total_s / found)
            row[f"{model}: vs create_device_mesh"] = (
                predict(program, topology, library, options=options).total_s / found
                if library is not None else math.nan)
        return row

    rows = []
    for case in cases:
        if progress:
            progress(f"device order: planning {case}")
        rows.append(case_row(case, measure))
    return pd.DataFrame(rows)


# ----------------------------------------------------------------------------- the section


@dataclass(frozen=True, eq=False)
class DeviceOrderCheck:
    """The section's tables."""

    measurements: pd.DataFrame
    """:func:`measurement_rows`."""
    targets: pd.DataFrame
    """:func:`order_targets`."""
    probes: pd.DataFrame | None = None
    """:func:`probe_rows` (``None``: not compiled this run)."""
    plans: pd.DataFrame | None = None
    """:func:`plan_rows` (``None``: no cases this run)."""

    def markdown(self) -> str:
        """The "Device order" section."""
        shown = self.measurements.drop(columns=["measured_setup"], errors="ignore")
        return "\n\n".join([
            SECTION,
            "Does the order of the devices in a collective's group change its time, and does "
            "the ICI model see it? (`python benchmarks/device_order.py` rewrites this "
            "section and keeps the others; nothing ran on a TPU.)",
            *(["**What the compiler says.** Each row compiles one collective deviceless with "
               "libtpu (in a child process), the mesh in the order given, and reads its "
               "`collective_algorithm_config`: the emitter and strategy, the ring sizes "
               "(`cores`, one set per colour: two colours run both ways) and whether the "
               "emitter maps the group's order onto one of its own (`has_reordering_map`). "
               f"All-reduces of up to {RING_IN_ORDER_MAX_MEMBERS} devices run a "
               "bidirectional 1D ring without a reordering map whatever the order: they run "
               "along it; larger groups get per-axis (ND) rings or a reordered ring; "
               "all-gathers carry a reordering map. TPU7x compiles carry no such label (its "
               "collectives run on the SparseCores): the same rule is applied there without "
               "evidence of its own. `model reads`: the `compiler` order "
               "model's reading (`comm_model.order_algorithm`: `ring` runs along the "
               "order, `physical` does not).",
               markdown_table(self.probes)] if self.probes is not None else []),
            "**Published order-only changes, rebuilt and predicted.** Each source changed "
            "only the device order of one mesh (same chips and program); the two orders are "
            "rebuilt on the libtpu slice and the collective the change targets is priced "
            f"with {MESSAGE_BYTES / 1e6:.0f} MB per device (bandwidth-bound; the programs' "
            "sizes are not published) under each order model: `<model>_ratio` = before / "
            "after. A step's gain is at most its collectives', so a model *reaches* a "
            "measurement when its ratio is at least `published_ratio`; "
            f"`default_ratio_small` is the default model (`{ModelOptions().order}`) at "
            f"{SMALL_MESSAGE_BYTES / 1e3:.0f} "
            "kB, where hop latency dilutes the order. `busiest_*`: the busiest link and its "
            "bytes under the default model. How sure: `ratio_p10` / `ratio_p90`, the 80 % "
            f"interval of the ratio under the {DEFAULT_ENSEMBLE.count} draws of "
            "`uncertainty.DEFAULT_ENSEMBLE` "
            "(both orders under the same draws, which draw the order model, `compiler` or "
            "`logical`, with the link constants; each side priced as `cost.predict` prices "
            "it, at least its HBM time), and `p_reaches`, the share of draws whose "
            "ratio reaches the published one. Rows whose `note` says *not the measured setup* "
            "are predictions for today's JAX, not counted.",
            markdown_table(shown),
            "Which order model reaches every measured gain. The default is the one the "
            "compiler's labels above describe among those that reach them all; a model "
            "that misses one is rejected by the measurements. The last row is the "
            "calibration of the intervals on these gains: a step's gain bounds its "
            "collective's from below, so an interval is right about a gain when its top "
            "(`ratio_p90`) reaches it (one-sided, not an 80 % coverage):",
            markdown_table(self.targets),
            *(["**Where order matters in the plans.** Each case's plan (its compiled "
               "program, as the full search (`aoizora-lab plan --full`) plans it, compiled at "
               "the depth `benchmarks/device_order.py` was given, 2 layers by default) "
               "searched and priced "
               "under each order model: `<model>: vs plain` and `vs create_device_mesh` are "
               "the program's step in that order over its best placement under the model. "
               "`collectives following their order`: those the default model runs as a ring "
               "in group order (all-reduces and reduce-scatters of 3 to "
               f"{RING_IN_ORDER_MAX_MEMBERS} devices), with "
               "their share of the communication in plain order. A plan whose heavy "
               "collectives are all-to-alls, permutes and all-gathers sees no order effect "
               "under the default: the compiler lays those out itself.",
               markdown_table(self.plans)] if self.plans is not None else []),
        ])


def device_order_check(*, compile_probes: bool = True, workers: int | None = None,
                       topology_of: Callable[[str], Topology] = Topology.from_name,
                       cases: Sequence[Any] = (), num_layers: int | None = 2,
                       progress: Callable[[str], None] | None = None) -> DeviceOrderCheck:
    """The section: the measurements (with ``compile_probes``, the compiler's labels; with
    ``cases``, :func:`plan_rows` of them)."""
    rows = measurement_rows(topology_of=topology_of)
    return DeviceOrderCheck(
        rows, order_targets(rows), probe_rows(workers=workers) if compile_probes else None,
        plan_rows(cases, num_layers=num_layers, progress=progress) if cases else None)


__all__ = ["ENSEMBLE_ROW", "MEASUREMENTS", "PROBES", "DeviceOrderCheck", "OrderMeasurement",
           "Probe", "collective_labels", "device_order_check", "measurement_rows", "order_targets",
           "plan_rows", "probe_rows"]
