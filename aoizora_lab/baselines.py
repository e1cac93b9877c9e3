"""The solutions people use today, as candidates + device orders scored by the same model.

- ``maxdiffusion``: data 2 as CFG x ``context`` over the rest (K/V gathered), weights sharded
  over the context axis (FSDP), devices ordered by ``mesh_utils.create_device_mesh`` (with
  ``allow_split_physical_axes`` where its default refuses the shape);
- ``xdit-usp``: no CFG parallelism, the best Ulysses x ring split (by IR estimate; FSDP when the
  weights need it), devices in plain id order;
- ``jax-default``: the planner's best candidate placed by ``jax.make_mesh``;
- ``logical-only``: the candidate a topology-blind search would pick: the best prediction with
  devices in plain id order.

Each returns ``(candidate, placement)``; :mod:`aoizora_lab.planner` compiles and scores them.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from aoizora_lab.candidates import Candidate, default_attention, explain_candidates
from aoizora_lab.errors import AoizoraError
from aoizora_lab.ir import IRCacheDir, estimate_ir
from aoizora_lab.placement import Placement
from aoizora_lab.topology import Topology
from aoizora_lab.workload import Workload

BASELINES = ("maxdiffusion", "xdit-usp", "jax-default", "logical-only")


def _placement_of(devices: Sequence[object], topology: Topology, how: str) -> Placement:
    position = {id(d): i for i, d in enumerate(topology.devices)}
    return Placement(tuple(position[id(d)] for d in np.asarray(devices).ravel()), how)


def maxdiffusion(workload: Workload, topology: Topology) -> tuple[Candidate, Placement]:
    """CFG 2 x context, FSDP over context, ``create_device_mesh`` order."""
    n = topology.num_devices
    cfg = 2 if workload.cfg and n % 2 == 0 else 1
    candidate = Candidate.from_degrees({"cfg": cfg, "context": n // cfg}, fsdp=True,
                                       attention=default_attention(topology))
    return candidate, device_mesh_order(candidate.mesh_shape, topology)


def device_mesh_order(mesh_shape: Sequence[int], topology: Topology) -> Placement:
    """Where ``mesh_utils.create_device_mesh`` puts a mesh of ``mesh_shape``, retried with
    ``allow_split_physical_axes=True`` when its default refuses the shape."""
    from jax.experimental import mesh_utils

    try:
        devices = mesh_utils.create_device_mesh(tuple(mesh_shape), list(topology.devices))
        how = "mesh_utils.create_device_mesh"
    except (ValueError, NotImplementedError, AssertionError):
        devices = mesh_utils.create_device_mesh(tuple(mesh_shape), list(topology.devices),
                                                allow_split_physical_axes=True)
        how = "mesh_utils.create_device_mesh(allow_split_physical_axes=True)"
    return _placement_of(devices, topology, how)


def xdit_usp(workload: Workload, topology: Topology, *,
             ir_cache_dir: IRCacheDir = None,
             ) -> tuple[Candidate, Placement]:
    """Best Ulysses x ring (no CFG parallelism) by IR estimate, plain device order."""
    table = explain_candidates(workload, topology)
    usp = table[table["valid"] & (table["cfg"] == 1) & (table["context"] == 1)
                & (table["tp"] == 1)]
    if usp.empty:
        raise AoizoraError(f"No valid Ulysses x ring split of {workload.name} on {topology.name}.")
    candidates = [Candidate.from_name(n, attention=default_attention(topology))
                  for n in usp["name"]]
    best = min(candidates,
               key=lambda c: estimate_ir(c, workload, topology,
                                         cache_dir=ir_cache_dir).estimate_seconds)
    return best, Placement(tuple(range(topology.num_devices)), "plain device order")


def jax_default(candidate: Candidate, topology: Topology) -> Placement:
    """Where ``jax.make_mesh`` puts ``candidate``'s mesh."""
    import jax

    mesh = jax.make_mesh(candidate.mesh_shape, candidate.axis_names,
                         devices=list(topology.devices))
    return _placement_of(mesh.devices, topology, "jax.make_mesh")
