"""AoiZora Lab: topology-aware planning of Wan 2.1 DiT inference on TPU slices.

Public API (docs/architecture.md maps the pipeline)::

    import aoizora_lab as az
    topo = az.Topology.from_name("v5e:4x4")      # deviceless libtpu devices, real coordinates
    ag = az.Collective("all-gather", az.mesh_axis_groups((4, 4), [1]), bytes=32e6)
    az.estimate(ag, topo).seconds                # predicted time on the identity placement
    case = az.parse_case("wan2.1-t2v-14b@1280x720x81/v5e:4x4")   # a workload on a slice
"""

from aoizora_lab.cases import Case, parse_case
from aoizora_lab.comm_model import (
    COLLECTIVE_KINDS,
    Collective,
    CommEstimate,
    ModelOptions,
    estimate,
    mesh_axis_groups,
)
from aoizora_lab.errors import AoizoraError
from aoizora_lab.hardware import (
    GENERATIONS,
    ICI_LINK_BANDWIDTH_CLOUD,
    ChipSpec,
    chip_spec,
)
from aoizora_lab.models.parallel import ROLES, ParallelPlan
from aoizora_lab.models.wan import WanConfig
from aoizora_lab.topology import Link, Topology, default_wrap
from aoizora_lab.workload import Workload, denoise_step, lower_step

__all__ = [
    "COLLECTIVE_KINDS",
    "GENERATIONS",
    "ICI_LINK_BANDWIDTH_CLOUD",
    "ROLES",
    "AoizoraError",
    "Case",
    "ChipSpec",
    "Collective",
    "CommEstimate",
    "Link",
    "ModelOptions",
    "ParallelPlan",
    "Topology",
    "WanConfig",
    "Workload",
    "chip_spec",
    "default_wrap",
    "denoise_step",
    "estimate",
    "lower_step",
    "mesh_axis_groups",
    "parse_case",
]
__version__ = "0.1.0"
