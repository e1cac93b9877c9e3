"""A chosen plan as ordinary JAX objects: a ``Mesh`` in the placement's device order, the
candidate's shardings, a portable JSON file, and the compiled step.

:meth:`Plan.verify` checks that the realised plan is what was scored: it compiles the plan on
its own mesh (its device order, not the plain order the compile sweep used) and compares the
collectives (kind, logical replica groups, bytes, runs, the compiler's algorithm and schedule)
and the predicted step with the program the search priced (a :class:`Realisation`).

The plan file (schema version 1) stores the placement as the *physical coordinates* of each
logical device, not as device indices, so it moves between VMs of the same slice shape:

    {"version": 1, "workload": {...}, "slice": "v5e:4x4", "candidate": "cfg2-uly8-fsdp",
     "attention": "splash", "coords": [[0, 0], [1, 0], ...], "cores": [0, 0, ...],
     "predicted": {"compute_s": 4.47, "comm_s": 1.02, "total_s": 4.9},
     "libtpu_init_args": "--xla_tpu_enable_async_all_to_all=true"}

``libtpu_init_args`` (optional, default none) are the compiler flags the plan was priced with:
export them as ``LIBTPU_INIT_ARGS`` before JAX starts, or let :meth:`Plan.compile` pass them.
"""

from __future__ import annotations

import dataclasses
import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from aoizora_lab.candidates import Candidate
from aoizora_lab.comm_model import ModelOptions
from aoizora_lab.compile import DEFAULT_FLAGS, CompilerFlags, compiler_flags
from aoizora_lab.cost import Predicted, predict
from aoizora_lab.errors import AoizoraError
from aoizora_lab.placement import Placement
from aoizora_lab.records import Records
from aoizora_lab.topology import DeviceSource, Topology
from aoizora_lab.versions import memoized
from aoizora_lab.workload import Workload

if TYPE_CHECKING:
    import pandas as pd

    from aoizora_lab.hlo import CommProgram

PLAN_SCHEMA_VERSION = 1


@dataclass(frozen=True, eq=False)
class Plan:
    """A candidate, a placement on a slice, and what the model predicts for them."""

    workload: Workload
    topology: Topology
    candidate: Candidate
    placement: Placement
    predicted: Predicted
    program: Any = None
    """The candidate's :class:`~aoizora_lab.hlo.CommProgram` (None for a loaded plan)."""
    breakdown: Any = field(default=None, repr=False)
    """Per-collective time and busiest link (a DataFrame), when known."""
    flags: CompilerFlags = DEFAULT_FLAGS
    """The compiler flags it was compiled and priced with (``LIBTPU_INIT_ARGS``)."""

    def __post_init__(self) -> None:
        sizes = {len(self.placement), self.topology.num_devices, self.candidate.num_devices}
        if len(sizes) > 1:
            raise AoizoraError(
                f"Plan: candidate {self.candidate.name!r} spans {self.candidate.num_devices} "
                f"devices, the placement {len(self.placement)} and {self.topology.name} "
                f"{self.topology.num_devices}; all three must be equal."
            )

    def mesh(self, devices: Any = None) -> Any:
        """The ``jax.sharding.Mesh``: the topology's devices (or ``devices``, same order as
        ``topology.coords``) in the placement's order, shaped like the candidate's mesh."""
        from jax.sharding import Mesh

        pool = list(devices) if devices is not None else self.topology.devices
        if pool is None:
            raise AoizoraError(
                f"{self.topology.name} is simulated: pass devices= to build a mesh."
            )
        ordered = np.empty(len(self.placement), dtype=object)
        ordered[:] = [pool[i] for i in self.placement.order]
        return Mesh(ordered.reshape(self.candidate.mesh_shape), self.candidate.axis_names)

    def parallel_plan(self, devices: Any = None) -> Any:
        """The candidate's :class:`~aoizora_lab.ParallelPlan` on :meth:`mesh`."""
        return self.candidate.plan(self.mesh(devices).devices.ravel())

    def shardings(self, devices: Any = None) -> Any:
        """``NamedSharding`` per model parameter as stored under this plan."""
        from aoizora_lab.models.wan import param_shardings

        return param_shardings(self.workload.config(), self.parallel_plan(devices))

    def compile(self, devices: Any = None, **lower_options: Any) -> Any:
        """Compile the Wan step for this plan (deviceless TPU devices work), with its
        :attr:`flags` as compiler options (TPU only: CPU host devices ignore TPU flags)."""
        from aoizora_lab.workload import lower_step

        lowered = lower_step(self.workload, self.parallel_plan(devices), **lower_options)
        tpu = self.topology.source is not DeviceSource.HOST
        return lowered.compile(compiler_options=(self.flags.options or None) if tpu else None)

    def compiled_program(self, num_layers: int | None = None, devices: Any = None
                         ) -> CommProgram:
        """The :class:`~aoizora_lab.hlo.CommProgram` of this plan as compiled: what the realised
        mesh and shardings really communicate per step.

        Compiles with :meth:`compile` (``num_layers`` deep; ``None``: the model's depth) and
        reads the program with :func:`~aoizora_lab.hlo.program_at_depth`, as
        :func:`~aoizora_lab.compile.compile_candidates` does for the programs the ranking
        scores. For a plan from the planner, compiled at the planner's depth, its
        collectives (kind, bytes, runs, groups) should equal those of :attr:`program`; a
        difference means the realised mesh or shardings are not what was scored.
        """
        from aoizora_lab.compile import check_num_layers
        from aoizora_lab.hlo import program_at_depth

        depth = self.workload.config().num_layers
        check_num_layers(num_layers, depth)

        def compile_and_read() -> CommProgram:
            compiled = self.compile(devices, num_layers=num_layers)
            return program_at_depth(compiled.as_text(), self.candidate.num_devices,
                                    num_layers, depth)

        if devices is not None:  # live devices: compile what is there
            return compile_and_read()
        # Deviceless compiles are deterministic: a notebook re-run reads this one back.
        return memoized("realised", (self.workload, self.candidate, self.topology.cache_key,
                                     self.placement.order, self.flags, num_layers),
                        compile_and_read, code=__name__)

    def verify(self, num_layers: int | None = None, scored: CommProgram | None = None, *,
               options: ModelOptions | None = None) -> Realisation:
        """Compile this plan on its own mesh (the placement's device order on the topology's
        devices: the ``Mesh`` that :meth:`mesh` realises) and compare it with the program the
        search scored (``scored``; default :attr:`program`): collectives and predicted step
        (:func:`compare_realised`).

        Pass the ``num_layers`` the scored program was compiled at (the planner's): a fold has
        the full depth's collectives and layer-loop compute, but ops outside the loop that
        touch the whole weight stack do not fold, so another depth may differ in time.
        ``options``: the ICI model the plan was priced under (``PlanResult.model``).
        """
        return compare_realised(self, self.compiled_program(num_layers), scored,
                                options=options)

    def run(self, params: Any, inputs: dict[str, Any], devices: Any = None) -> Any:
        """Run one denoising step under this plan on live devices."""
        import jax

        from aoizora_lab.workload import denoise_step

        plan = self.parallel_plan(devices)
        model = self.workload.config()
        params = jax.device_put(params, self.shardings(devices))
        return jax.jit(lambda p, i: denoise_step(p, model, plan=plan, **i))(params, inputs)

    # ------------------------------------------------------------------ files

    def to_json(self, path: str | Path) -> None:
        """Write the plan file (see the module docstring)."""
        slots = device_slots(self.topology)
        workload = dataclasses.asdict(self.workload)
        if not isinstance(self.workload.model, str):
            workload["model"] = dataclasses.asdict(self.workload.model)
        payload = {
            "version": PLAN_SCHEMA_VERSION, "workload": workload, "slice": self.topology.name,
            "candidate": self.candidate.name, "attention": self.candidate.attention,
            "coords": [list(slots[i][0]) for i in self.placement.order],
            "cores": [slots[i][1] for i in self.placement.order],
            "predicted": dataclasses.asdict(self.predicted),
            **({"libtpu_init_args": self.flags.args} if self.flags.args else {}),
        }
        Path(path).write_text(json.dumps(payload, indent=1))

    @classmethod
    def from_json(cls, path: str | Path, topology: Topology | None = None) -> Plan:
        """Read a plan file; ``topology`` defaults to ``Topology.from_name(<its slice>)``.

        Anything that is not a plan file this version wrote (not JSON, a missing key, a value
        of the wrong type, a placement that is not a permutation of the slice's devices, a
        candidate of another size) raises :class:`AoizoraError` naming the file and the value.
        """
        try:
            payload = json.loads(Path(path).read_text())
        except (OSError, ValueError) as err:
            raise AoizoraError(f"Plan file {path} is not readable JSON: {err}") from err
        if not isinstance(payload, dict):
            raise AoizoraError(
                f"Plan file {path} holds {type(payload).__name__} {str(payload)[:60]!r}, not a "
                f"plan: a JSON object with keys {list(_PLAN_KEYS)}."
            )
        if payload.get("version") != PLAN_SCHEMA_VERSION:
            raise AoizoraError(
                f"Plan file {path} has schema version {payload.get('version')!r}; this "
                f"AoiZora Lab reads version {PLAN_SCHEMA_VERSION}."
            )
        missing = [key for key in _PLAN_KEYS if key not in payload]
        if missing:
            raise AoizoraError(
                f"Plan file {path} lacks key(s) {missing}; a plan file has {list(_PLAN_KEYS)} "
                "(write one with Plan.to_json)."
            )
        for key, kind in _PLAN_KEYS.items():
            if not isinstance(payload[key], kind):
                raise AoizoraError(
                    f"Plan file {path}: {key}={repr(payload[key])[:80]} must be a JSON "
                    f"{_JSON_NAMES[kind]}; see the plan file format in aoizora_lab.realize."
                )
        try:
            topology = topology or Topology.from_name(payload["slice"])
            if topology.name != payload["slice"]:
                raise AoizoraError(f"it is for slice {payload['slice']!r}, not {topology.name!r}.")
            workload = _workload_from_json(payload["workload"])
            candidate = Candidate.from_name(payload["candidate"], attention=payload["attention"])
            predicted = _predicted_from_json(payload["predicted"])
            args = payload.get("libtpu_init_args", "")
            if not isinstance(args, str):
                raise AoizoraError(f"libtpu_init_args={args!r} must be a string of flags.")
            flags = compiler_flags(args) if args else DEFAULT_FLAGS
            index = {slot: device for device, slot in device_slots(topology).items()}
            try:
                order = tuple(index[(tuple(int(v) for v in c), int(k))] for c, k in
                              zip(payload["coords"], payload["cores"], strict=True))
            except (KeyError, TypeError, ValueError, OverflowError) as err:  # inf, 1e999
                raise AoizoraError(
                    f"a placement coordinate is not a chip of {topology.name} ({err}); coords "
                    f"must list one [x, y{', z' if topology.ndim == 3 else ''}] chip and cores "
                    "one core index per logical device."
                ) from None
            if len(order) != topology.num_devices:
                raise AoizoraError(
                    f"coords and cores place {len(order)} devices; {topology.name} has "
                    f"{topology.num_devices}: list every device of the slice once."
                )
            try:
                placement = Placement(order, "from " + str(path))
            except AoizoraError as err:
                raise AoizoraError(f"coords and cores: {err}") from None
            return cls(workload=workload, topology=topology, candidate=candidate,
                       placement=placement, predicted=predicted, flags=flags)
        except AoizoraError as err:
            raise AoizoraError(f"Plan file {path}: {err}") from None


TIME_TOLERANCE = 1e-9
"""Relative difference under which two predicted times are the same (summation order)."""

_Key = tuple[str, tuple[tuple[int, ...], ...], float, int]


@dataclass(frozen=True)
class Difference:
    """One way a realised plan's compile differs from the program the search scored."""

    what: str
    """``missing`` (scored, absent from the realised compile), ``extra`` (realised, never
    scored), ``algorithm`` (the same collectives under another compiler strategy label or
    schedule, synchronous or asynchronous) or ``time`` (another predicted step)."""
    kind: str = ""
    """The collective's kind ("" for ``time``)."""
    groups: tuple[tuple[int, ...], ...] = ()
    """Its replica groups as sorted logical ids (``collective-permute``: its sorted
    (source, target) pairs)."""
    bytes: float = 0.0
    """Result bytes on one device."""
    count: int = 0
    """Runs per step."""
    copies: int = 0
    """How many HLO collectives with these values differ."""
    detail: str = ""
    """Both sides' values, in words."""


class Differences(Records[Difference]):
    """The differences of a :class:`Realisation`, collectives first, the time last."""

    COLUMNS = ("what", "kind", "group_size", "num_groups", "bytes", "count", "copies", "groups",
               "detail")

    def row(self, item: Difference) -> dict[str, Any]:
        return {"what": item.what, "kind": item.kind,
                "group_size": len(item.groups[0]) if item.groups else 0,
                "num_groups": len(item.groups), "bytes": item.bytes, "count": item.count,
                "copies": item.copies, "groups": item.groups, "detail": item.detail}


@dataclass(frozen=True, eq=False)
class Realisation:
    """A plan compiled on its own mesh against the program the search scored
    (:meth:`Plan.verify`, :func:`compare_realised`)."""

    scored: CommProgram
    """The program the search priced the plan with."""
    realised: CommProgram
    """The plan's own compile, read as the compile sweep reads programs."""
    scored_predicted: Predicted
    """:func:`~aoizora_lab.cost.predict` of :attr:`scored` on the plan's placement."""
    realised_predicted: Predicted
    """:func:`~aoizora_lab.cost.predict` of :attr:`realised` on the plan's placement."""
    differences: Differences
    """Every difference; empty when the realised plan is what was scored."""

    @property
    def equal(self) -> bool:
        """Whether the realised plan is what was scored: the same collectives (kind, logical
        groups, bytes, runs), each under the same algorithm and schedule, and the same
        predicted step."""
        return not self.differences

    def summary(self) -> str:
        """One sentence: equal or not, and how."""
        if self.equal:
            return (f"The realised plan is what was scored: {len(self.realised.collectives)} "
                    "collectives (kind, logical groups, bytes, runs, algorithm) and the "
                    f"predicted step ({self.realised_predicted.total_s:.4g} s) are equal.")
        tally: dict[str, int] = {}
        for d in self.differences:
            tally[d.what] = tally.get(d.what, 0) + (d.copies or 1)
        return ("The realised plan DIFFERS from what was scored: "
                + ", ".join(f"{n} {what}" for what, n in tally.items())
                + f"; predicted step {self.scored_predicted.total_s:.4g} s scored, "
                f"{self.realised_predicted.total_s:.4g} s realised.")

    def to_frame(self) -> pd.DataFrame:
        """One row per difference (no rows when :attr:`equal`)."""
        return self.differences.to_frame()


def compare_realised(plan: Plan, realised: CommProgram, scored: CommProgram | None = None, *,
                     options: ModelOptions | None = None) -> Realisation:
    """Compare ``realised`` (a compile of ``plan`` on its own mesh) with ``scored`` (default
    ``plan.program``): collectives as multisets of (kind, logical groups, bytes, runs), the
    algorithm and schedule of each, and :func:`~aoizora_lab.cost.predict` of both on the
    plan's placement."""
    scored = scored if scored is not None else plan.program
    if scored is None:
        raise AoizoraError(
            f"Plan {plan.candidate.name!r} has no scored program to compare with (a plan read "
            "from a file has none): pass scored=, e.g. PlanResult.programs"
            f"[{plan.candidate.name!r}] of plan(...) at the same depth."
        )
    before, after = _labelled(scored), _labelled(realised)
    found = []
    for key in sorted(before.keys() | after.keys()):
        was, now = before.get(key, []), after.get(key, [])
        if len(was) != len(now):
            found.append(Difference("missing" if len(was) > len(now) else "extra", *key,
                                    abs(len(was) - len(now)),
                                    f"{len(was)} scored, {len(now)} realised"))
        elif was != now:
            found.append(Difference("algorithm", *key,
                                    sum(a != b for a, b in zip(was, now, strict=True)),
                                    f"scored {_labels(was)}; realised {_labels(now)}"))
    prices = [predict(p, plan.topology, plan.placement, options=options)
              for p in (scored, realised)]
    moved = [f"{name} {getattr(prices[0], name):.6g} s scored, {getattr(prices[1], name):.6g} s "
             "realised" for name in ("compute_s", "comm_s", "total_s")
             if not math.isclose(getattr(prices[0], name), getattr(prices[1], name),
                                 rel_tol=TIME_TOLERANCE)]
    if moved:
        found.append(Difference("time", detail="; ".join(moved)))
    return Realisation(scored, realised, *prices, Differences(found))


def _labelled(program: CommProgram) -> dict[_Key, list[tuple[str, bool]]]:
    """(strategy, asynchronous) of the program's collectives, sorted, by comparison key."""
    sites = [(s.strategy, s.asynchronous) for s in program.sites]
    found: dict[_Key, list[tuple[str, bool]]] = {}
    for c, site in zip(program.collectives, sites or [("", False)] * len(program.collectives),
                       strict=True):
        # Members' order inside a group is the compiler's choice; the model's rings follow it,
        # so a changed order shows in the predicted time, not here.
        groups = c.groups if c.kind == "collective-permute" else map(sorted, c.groups)
        key = (c.kind, tuple(sorted(tuple(g) for g in groups)), float(c.bytes), int(c.count))
        found.setdefault(key, []).append(site)
    return {key: sorted(labels) for key, labels in found.items()}


def _labels(sites: list[tuple[str, bool]]) -> str:
    return ", ".join(f"{strategy or 'no label'} ({'async' if asyn else 'sync'})"
                     for strategy, asyn in sites)


_PLAN_KEYS: dict[str, type] = {
    "version": int, "workload": dict, "slice": str, "candidate": str, "attention": str,
    "coords": list, "cores": list, "predicted": dict}
"""The keys of a plan file and the JSON type of each."""
_JSON_NAMES = {int: "integer", dict: "object", str: "string", list: "array"}


def _workload_from_json(fields: dict[str, Any]) -> Workload:
    """The plan file's ``workload`` object as a :class:`Workload` (model preset or config);
    every error starts with ``workload``."""
    from aoizora_lab.models.wan import WanConfig

    fields = dict(fields)
    known = [f.name for f in dataclasses.fields(Workload)]
    unknown = sorted(map(str, set(fields) - set(known)))
    if unknown or "model" not in fields:
        raise AoizoraError(
            f"workload {str(fields)[:120]!r} must have the keys {known} (model, height, width "
            f"required){f'; unknown: {unknown}' if unknown else ''}."
        )
    try:
        if isinstance(fields["model"], dict):
            config_keys = [f.name for f in dataclasses.fields(WanConfig)]
            unknown = sorted(map(str, set(fields["model"]) - set(config_keys)))
            if unknown:
                raise AoizoraError(
                    f"model has unknown key(s) {unknown}; WanConfig fields are {config_keys}.")
            fields["model"] = WanConfig(**fields["model"])
        return Workload(**fields)
    except AoizoraError as err:
        raise AoizoraError(f"workload: {err}") from None
    except (TypeError, ValueError) as err:  # a missing field, or one WanConfig cannot convert
        raise AoizoraError(f"workload {str(fields)[:120]!r}: {err}.") from None


def _predicted_from_json(values: dict[str, Any]) -> Predicted:
    names = [f.name for f in dataclasses.fields(Predicted)]
    if sorted(values) != sorted(names) or not all(
            isinstance(values[k], int | float) and not isinstance(values[k], bool)
            for k in names):
        raise AoizoraError(
            f"predicted={values!r} must hold the numbers {names} (seconds)."
        )
    return Predicted(*(float(values[k]) for k in names))


def device_slots(topology: Topology) -> dict[int, tuple[tuple[int, ...], int]]:
    """Device index -> (chip coordinates, core on the chip): how plan files and moved plans
    name a device independently of how a VM numbers its devices."""
    grid = topology.device_grid().reshape(topology.num_chips, -1)
    return {int(device): (tuple(int(c) for c in topology.coords[device]), core)
            for row in grid for core, device in enumerate(row)}
