"""A chosen plan as ordinary JAX objects: a ``Mesh`` in the placement's device order, the
candidate's shardings, a portable JSON file, and the compiled step.

The plan file (schema version 1) stores the placement as the *physical coordinates* of each
logical device, not as device indices, so it moves between VMs of the same slice shape:

    {"version": 1, "workload": {...}, "slice": "v5e:4x4", "candidate": "cfg2-uly8-fsdp",
     "attention": "splash", "coords": [[0, 0], [1, 0], ...], "cores": [0, 0, ...],
     "predicted": {"compute_s": 4.47, "comm_s": 1.02, "total_s": 4.9}}
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from aoizora_lab.candidates import Candidate
from aoizora_lab.cost import Predicted
from aoizora_lab.errors import AoizoraError
from aoizora_lab.placement import Placement
from aoizora_lab.topology import Topology
from aoizora_lab.workload import Workload

if TYPE_CHECKING:
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
        """Compile the Wan step for this plan (deviceless TPU devices work)."""
        from aoizora_lab.workload import lower_step

        return lower_step(self.workload, self.parallel_plan(devices), **lower_options).compile()

    def compiled_program(self, num_layers: int | None = None, devices: Any = None
                         ) -> CommProgram:
        """The :class:`~aoizora_lab.hlo.CommProgram` of this plan as compiled: what the realised
        mesh and shardings really communicate per step.

        Compiles with :meth:`compile` (``num_layers`` deep; ``None``: the model's depth) and
        reads the program with :func:`~aoizora_lab.compile.program_at_depth`, as
        :func:`~aoizora_lab.compile.compile_candidates` does for the programs the ranking
        scores. For a plan from the planner, compiled at the planner's depth, its
        collectives (kind, bytes, runs, groups) should equal those of :attr:`program`; a
        difference means the realised mesh or shardings are not what was scored.
        """
        from aoizora_lab.compile import check_num_layers, program_at_depth

        depth = self.workload.config().num_layers
        check_num_layers(num_layers, depth)
        compiled = self.compile(devices, num_layers=num_layers)
        return program_at_depth(compiled.as_text(), self.candidate.num_devices, num_layers,
                                depth)

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
                       placement=placement, predicted=predicted)
        except AoizoraError as err:
            raise AoizoraError(f"Plan file {path}: {err}") from None


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
