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
from typing import Any

import numpy as np

from aoizora_lab.candidates import Candidate
from aoizora_lab.errors import AoizoraError
from aoizora_lab.placement import Placement
from aoizora_lab.topology import Topology
from aoizora_lab.workload import Workload

PLAN_SCHEMA_VERSION = 1


@dataclass(frozen=True)
class Predicted:
    """Predicted one-step latency and its parts, in seconds."""

    compute_s: float
    comm_s: float
    total_s: float

    @classmethod
    def overlapped(cls, compute_s: float, sync_comm_s: float,
                   async_comm_s: float) -> Predicted:
        """The overlap rule: asynchronous collectives hide behind compute up to its length,
        synchronous ones add. Example: 4 s compute, 0.5 s sync, 1 s async -> 4.5 s; with 5 s
        async -> 5.5 s (1 s of it exposed)."""
        return cls(float(compute_s), float(sync_comm_s + async_comm_s),
                   float(compute_s + sync_comm_s + max(0.0, async_comm_s - compute_s)))


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
        slots = _slots(self.topology)
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
        """Read a plan file; ``topology`` defaults to ``Topology.from_name(<its slice>)``."""
        try:
            payload = json.loads(Path(path).read_text())
        except (OSError, ValueError) as err:
            raise AoizoraError(f"Plan file {path} is not readable JSON: {err}") from err
        if payload.get("version") != PLAN_SCHEMA_VERSION:
            raise AoizoraError(
                f"Plan file {path} has schema version {payload.get('version')!r}; this "
                f"AoiZora Lab reads version {PLAN_SCHEMA_VERSION}."
            )
        topology = topology or Topology.from_name(payload["slice"])
        if topology.name != payload["slice"]:
            raise AoizoraError(
                f"Plan file {path} is for slice {payload['slice']!r}, not {topology.name!r}."
            )
        from aoizora_lab.models.wan import WanConfig

        workload_fields = dict(payload["workload"])
        if isinstance(workload_fields["model"], dict):
            workload_fields["model"] = WanConfig(**workload_fields["model"])
        index = {slot: device for device, slot in _slots(topology).items()}
        try:
            order = tuple(index[(tuple(int(v) for v in c), int(k))] for c, k in
                          zip(payload["coords"], payload["cores"], strict=True))
        except (KeyError, TypeError, ValueError) as err:
            raise AoizoraError(
                f"Plan file {path}: a placement coordinate is not a chip of {topology.name} "
                f"({err})."
            ) from err
        return cls(workload=Workload(**workload_fields), topology=topology,
                   candidate=Candidate.from_name(payload["candidate"],
                                                 attention=payload["attention"]),
                   placement=Placement(order, "from " + str(path)),
                   predicted=Predicted(**payload["predicted"]))


def _slots(topology: Topology) -> dict[int, tuple[tuple[int, ...], int]]:
    """Device index -> (chip coordinates, core on the chip)."""
    grid = topology.device_grid().reshape(topology.num_chips, -1)
    return {int(device): (tuple(int(c) for c in topology.coords[device]), core)
            for row in grid for core, device in enumerate(row)}
