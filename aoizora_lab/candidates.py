"""Logical sharding candidates: every way to split one Wan denoising step over a slice's chips.

A :class:`Candidate` gives each parallel role a degree (``cfg``, ``ulysses``, ``ring``,
``context``, ``tp``; degree 1 = role unused) with the product equal to the device count, plus
``fsdp``: whether the weights are stored sharded over every non-tp axis and gathered layer by
layer. FSDP is a flag, not an axis of its own: in inference (batch <= 2) an axis that only
shards weights would repeat the same computation on each of its devices, so FSDP rides on the
axes that already split the work. ``fsdp_over_cfg=False`` keeps the cfg axis out of it (weights
sharded over the sequence axes only, as MaxDiffusion's logical-axis rules shard ``embed`` over
``context`` and ``fsdp`` but never over ``data``): twice the weight bytes per device, gathers
within each CFG half.

Names are short and stable, roles in the order above: ``cfg2-uly4-ring2``, ``cfg2-ctx4-fsdp``,
``cfg2-ctx4-fsdpseq`` (FSDP not over cfg), ``tp8``; ``single`` on one device. Which logical
axis sits where on the chips is a *placement* question (:mod:`aoizora_lab.placement`), so
candidates are never multiplied by axis orders.

:func:`explain_candidates` lists *every* combination of role degrees considered, with
the reasons each invalid one is excluded (a :class:`CandidateSpace`); :func:`enumerate_candidates`
returns the valid ones. Example, Wan 2.1 14B at 720p on 16 chips: ``cfg4-uly4`` is out (a step has 2
passes), ``uly16`` is out (40 heads do not divide by 16), ``cfg2-uly8`` (no fsdp) is out
(the 28.6 GB of bf16 weights replicated do not fit 15.75 GiB), ``cfg2-uly8-fsdp`` is in.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import jax
import jax.numpy as jnp
from jax.sharding import AbstractMesh, Mesh
from jax.sharding import PartitionSpec as P

from aoizora_lab.errors import AoizoraError, is_whole
from aoizora_lab.hardware import chip_spec
from aoizora_lab.models.attention import check_backend
from aoizora_lab.models.parallel import ROLES, ParallelPlan, check_ulysses_chunks, spec_shards
from aoizora_lab.models.wan import WanConfig, param_leaves, param_specs
from aoizora_lab.records import Records
from aoizora_lab.topology import DeviceSource, Topology
from aoizora_lab.workload import Workload

if TYPE_CHECKING:
    import pandas as pd

ABBREVIATIONS = {"cfg": "cfg", "ulysses": "uly", "ring": "ring", "context": "ctx", "tp": "tp"}
_ROLE_OF = {abbr: role for role, abbr in ABBREVIATIONS.items()}


@dataclass(frozen=True)
class MeshAxis:
    """One logical mesh axis: its name, size and parallel role."""

    name: str
    """Axis name in the ``Mesh`` (the role's name)."""
    size: int
    """Devices along the axis (> 1; size-1 axes are dropped)."""
    role: str
    """One of ``cfg``, ``ulysses``, ``ring``, ``context``, ``tp``."""


@dataclass(frozen=True)
class Candidate:
    """A logical sharding of the Wan step: mesh axes with roles, FSDP, attention backend."""

    axes: tuple[MeshAxis, ...]
    """Logical mesh axes in role order (cfg, ulysses, ring, context, tp)."""
    fsdp: bool = False
    """Weights stored sharded over every non-tp axis, gathered layer by layer."""
    attention: str = "splash"
    """Attention backend inside each device (``splash`` on TPU, ``blockwise`` on CPU)."""
    fsdp_over_cfg: bool = True
    """With ``fsdp``, the cfg axis shards the weights too; ``False``: only the other non-tp
    axes do (MaxDiffusion's rules). Always ``True`` without a cfg axis or without fsdp."""
    ulysses_chunks: int = 1
    """Self-attention in this many head chunks, each with its own all-to-alls (MaxDiffusion's
    ``ulysses_attention_chunks``; name part ``chunksN``); 1: one pass."""

    def __post_init__(self) -> None:
        check_backend(self.attention)
        check_ulysses_chunks(self.ulysses_chunks, self.degree("ulysses") >= 2,
                             "cfg2-uly4-chunks2")
        roles = [a.role for a in self.axes]
        if roles != [r for r in ROLES if r in roles] or any(a.size < 2 for a in self.axes):
            raise AoizoraError(
                f"Candidate axes {self.axes} must have distinct roles in the order {list(ROLES)} "
                "and sizes of at least 2 (drop size-1 axes)."
            )
        if not self.fsdp_over_cfg and not (self.fsdp and self.degree("cfg") > 1):
            object.__setattr__(self, "fsdp_over_cfg", True)  # one name per distinct program
        if self.fsdp and not self.fsdp_axes:
            raise AoizoraError(
                "fsdp needs a mesh axis besides tp (and cfg, with fsdp_over_cfg=False) to shard "
                "the weights over.")

    @classmethod
    def from_degrees(cls, degrees: dict[str, int], *, fsdp: bool = False,
                     attention: str = "splash", fsdp_over_cfg: bool = True,
                     ulysses_chunks: int = 1) -> Candidate:
        """``Candidate.from_degrees({"cfg": 2, "ulysses": 4})``; degree-1 roles are dropped."""
        if not isinstance(degrees, Mapping):
            raise AoizoraError(
                f"Role degrees {degrees!r} must be a mapping of role -> degree, e.g. "
                f"{{'cfg': 2, 'ulysses': 4}}; roles are {list(ROLES)}."
            )
        unknown = sorted(map(repr, set(degrees) - set(ROLES)))
        if unknown:
            raise AoizoraError(f"Unknown roles [{', '.join(unknown)}]; roles are {list(ROLES)}.")
        bad = {role: d for role, d in degrees.items()
               if not is_whole(d)}
        if bad:
            raise AoizoraError(
                f"Role degrees {bad} must be whole numbers of at least 1 (1 = role unused)."
            )
        axes = tuple(MeshAxis(role, int(degrees[role]), role) for role in ROLES
                     if int(degrees.get(role, 1)) > 1)
        return cls(axes, fsdp=fsdp, attention=attention, fsdp_over_cfg=fsdp_over_cfg,
                   ulysses_chunks=ulysses_chunks)

    @classmethod
    def from_name(cls, name: str, *, attention: str = "splash") -> Candidate:
        """Parse a candidate name such as ``cfg2-uly4-ring2-fsdp``, ``cfg2-uly4-chunks2`` (or
        ``single``)."""
        check_backend(attention)
        parts = str(name).strip().lower().split("-")
        fsdp = parts[-1] in ("fsdp", "fsdpseq")
        over_cfg = parts[-1] != "fsdpseq"
        parts = parts[:-1] if fsdp else parts
        chunked = re.fullmatch(r"chunks(\d+)", parts[-1]) if parts else None
        parts = parts[:-1] if chunked else parts
        degrees: dict[str, int] = {}
        for part in parts if parts != ["single"] else []:
            match = re.fullmatch(r"([a-z]+)(\d+)", part)
            if not match or match.group(1) not in _ROLE_OF or _ROLE_OF[match.group(1)] in degrees:
                raise AoizoraError(
                    f"Candidate name {name!r}: part {part!r} is not ROLE+DEGREE with a role from "
                    f"{list(_ROLE_OF)} used once, e.g. 'cfg2-uly4-ring2-fsdp'."
                )
            degrees[_ROLE_OF[match.group(1)]] = int(match.group(2))
        try:
            candidate = cls.from_degrees(degrees, fsdp=fsdp, attention=attention,
                                         fsdp_over_cfg=over_cfg,
                                         ulysses_chunks=int(chunked.group(1)) if chunked else 1)
        except AoizoraError as err:
            raise AoizoraError(f"Candidate name {name!r}: {err}") from None
        if not over_cfg and candidate.fsdp_over_cfg:  # the type drops fsdpseq without cfg
            raise AoizoraError(
                f"Candidate name {name!r}: '-fsdpseq' (weights not sharded over cfg) needs a cfg "
                f"axis of degree 2 or more, e.g. 'cfg2-ring4-fsdpseq'; without one, write "
                f"{candidate.name!r}.")
        return candidate

    @property
    def name(self) -> str:
        """Short stable name: ``cfg2-uly4-ring2``, ``cfg2-ctx4-fsdp``, ``cfg2-ctx4-fsdpseq``."""
        core = "-".join(f"{ABBREVIATIONS[a.role]}{a.size}" for a in self.axes) or "single"
        core += f"-chunks{self.ulysses_chunks}" if self.ulysses_chunks > 1 else ""
        return core + ("" if not self.fsdp else "-fsdp" if self.fsdp_over_cfg else "-fsdpseq")

    @property
    def fsdp_axes(self) -> tuple[str, ...]:
        """The mesh axes the weights are sharded over (empty without fsdp)."""
        if not self.fsdp:
            return ()
        skip = ("tp",) if self.fsdp_over_cfg else ("tp", "cfg")
        return tuple(a.name for a in self.axes if a.role not in skip)

    @property
    def mesh_shape(self) -> tuple[int, ...]:
        """Sizes of the logical mesh axes."""
        return tuple(a.size for a in self.axes)

    @property
    def axis_names(self) -> tuple[str, ...]:
        """Names of the logical mesh axes."""
        return tuple(a.name for a in self.axes)

    @property
    def num_devices(self) -> int:
        """Devices the candidate spans."""
        return math.prod(self.mesh_shape)

    def degree(self, role: str) -> int:
        """Degree of ``role`` (1 if unused)."""
        return math.prod(a.size for a in self.axes if a.role == role)

    def plan(self, devices: Any = None) -> ParallelPlan:
        """The :class:`ParallelPlan`: on ``devices`` (any array of devices in logical order,
        reshaped to the mesh) or, with ``None``, on an abstract mesh for tracing only."""
        if devices is None:
            mesh: Mesh | AbstractMesh = AbstractMesh(self.mesh_shape, self.axis_names)
        else:
            import numpy as np

            array = np.asarray(devices, dtype=object)
            if array.size != self.num_devices:
                raise AoizoraError(
                    f"Candidate {self.name!r} needs {self.num_devices} devices, got {array.size}."
                )
            mesh = Mesh(array.reshape(self.mesh_shape), self.axis_names)
        return ParallelPlan(mesh, {a.name: a.role for a in self.axes}, fsdp_axes=self.fsdp_axes,
                            attention=self.attention, ulysses_chunks=self.ulysses_chunks)

    def partition_specs(self, cfg: WanConfig) -> dict[str, Any]:
        """Specs of the parameters (as stored), token activations and attention inputs."""
        plan = self.plan()
        return {"params": param_specs(cfg, plan), "activations": plan.activation_spec,
                "attention": plan.heads_spec(sequence=True)}

    def weight_bytes_per_device(self, cfg: WanConfig, dtype: Any = jnp.bfloat16) -> float:
        """Bytes of stored weights on one device under this candidate's sharding."""
        sizes = dict(zip(self.axis_names, self.mesh_shape, strict=True))
        itemsize = jnp.dtype(dtype).itemsize
        leaves = jax.tree.leaves(param_leaves(cfg), is_leaf=lambda n: isinstance(n, tuple)
                                 and len(n) == 3 and isinstance(n[0], tuple))
        specs = jax.tree.leaves(self.partition_specs(cfg)["params"],
                                is_leaf=lambda n: isinstance(n, P))
        return sum(math.prod(leaf[0]) * itemsize / spec_shards(spec, sizes)
                   for leaf, spec in zip(leaves, specs, strict=True))


def _degree_tuples(devices: int, slots: int) -> list[tuple[int, ...]]:
    """Every ordered tuple of ``slots`` positive ints whose product is ``devices``."""
    if slots == 1:
        return [(devices,)]
    divisors = [d for d in range(1, devices + 1) if devices % d == 0]
    return [(d, *rest) for d in divisors for rest in _degree_tuples(devices // d, slots - 1)]


def default_attention(topology: Topology) -> str:
    """``blockwise`` when CPU host devices stand in for the chips, else ``splash`` (TPU)."""
    return "blockwise" if topology.source is DeviceSource.HOST else "splash"


@dataclass(frozen=True)
class CandidateOption:
    """One combination of role degrees (and fsdp on/off) and whether it is a valid candidate."""

    degrees: tuple[tuple[str, int], ...]
    """(role, degree) for every role, in role order (degree 1: role unused)."""
    fsdp: bool
    """Weights sharded over the non-tp axes."""
    fsdp_over_cfg: bool
    """With fsdp: the cfg axis shards weights too (see :attr:`Candidate.fsdp_over_cfg`)."""
    candidate: Candidate | None
    """The candidate (``None`` only where fsdp has no axis to shard over)."""
    weight_bytes_per_device: float
    """Stored weight bytes on one device, every resident expert's (NaN without a candidate)."""
    reasons: tuple[str, ...]
    """Why it is excluded; empty for a valid candidate."""

    @property
    def valid(self) -> bool:
        """No exclusion rule applies."""
        return not self.reasons

    @property
    def name(self) -> str:
        """The candidate name, also for an invalid option (e.g. ``uly16``)."""
        core = Candidate.from_degrees(dict(self.degrees)).name
        return core + ("" if not self.fsdp else "-fsdp" if self.fsdp_over_cfg else "-fsdpseq")


class CandidateSpace(Records[CandidateOption]):
    """Every option :func:`explain_candidates` considered, valid or not."""

    COLUMNS = ("name", *ROLES, "fsdp", "fsdp_over_cfg", "weight_gib_per_device", "valid",
               "reason")

    @property
    def valid(self) -> list[Candidate]:
        """The valid candidates, in enumeration order: what pruning receives."""
        return [o.candidate for o in self if o.valid and o.candidate is not None]

    def exclusions(self, *, examples: int = 6) -> pd.DataFrame:
        """Why options were excluded: one row per exclusion reason, most combinations first.

        Columns ``reason``, ``combinations`` (the invalid options that reason applies to) and
        ``examples`` (the names of the first ``examples`` of them, comma-separated). An option
        breaking several rules counts under each, so ``combinations`` may add up to more than
        the invalid options. Example (14B on ``v5e:4x4``): ``cfg degree 4 > 2 passes per step``
        is one row, counting every option with cfg 4 (with and without fsdp).
        """
        import pandas as pd

        names: dict[str, list[str]] = {}
        for option in self:
            for reason in option.reasons:
                names.setdefault(reason, []).append(option.name)
        frame = pd.DataFrame(
            [{"reason": reason, "combinations": len(listed),
              "examples": ", ".join(listed[:examples])} for reason, listed in names.items()],
            columns=["reason", "combinations", "examples"])
        return frame.sort_values("combinations", ascending=False,
                                 kind="stable").reset_index(drop=True)

    def row(self, item: CandidateOption) -> dict[str, Any]:
        return {"name": item.name, **dict(item.degrees), "fsdp": item.fsdp,
                "fsdp_over_cfg": item.fsdp_over_cfg,
                "weight_gib_per_device": item.weight_bytes_per_device / 2**30,
                "valid": item.valid, "reason": "; ".join(item.reasons)}


def explain_candidates(workload: Workload, topology: Topology, *, allow_padding: bool = True,
                       attention: str | None = None, dtype: Any = jnp.bfloat16
                       ) -> CandidateSpace:
    """Every combination of role degrees (times fsdp off / over every non-tp axis / over the
    non-tp axes but cfg), valid or not, with the reasons.

    Exclusion rules, each named in ``reasons`` (several may apply):

    - a cfg degree above the passes per step (2 with guidance, 1 without);
    - heads not divisible by ``ulysses x tp`` (heads are never padded);
    - tokens not divisible by the sequence degree ``context x ring x ulysses`` when
      ``allow_padding=False``; by default such a split is valid with the token axis padded up
      to a multiple of the degree (padded keys masked, the padding's compute paid), as the
      official Wan code and MaxDiffusion pad;
    - fsdp with no axis besides tp (and cfg, for ``-fsdpseq``) to shard over;
    - stored weights per device above the chip's usable HBM even with this sharding (every
      resident expert's: Wan 2.2 A14B holds two unless it swaps one,
      :attr:`Workload.resident_experts`).
    """
    cfg = workload.config()
    attention = check_backend(attention or default_attention(topology))
    usable = chip_spec(topology.generation).hbm_usable_bytes
    options = []
    for degrees in _degree_tuples(topology.num_devices, len(ROLES)):
        by_role = dict(zip(ROLES, degrees, strict=True))
        weightings = [(False, True), (True, True)] + ([(True, False)] if by_role["cfg"] > 1
                                                      else [])
        for fsdp, over_cfg in weightings:
            reasons = _exclusions(by_role, fsdp, over_cfg, workload, cfg, allow_padding)
            candidate, weights = None, math.nan
            if not (fsdp and _nothing_to_shard_over(by_role, over_cfg)):
                candidate = Candidate.from_degrees(by_role, fsdp=fsdp, attention=attention,
                                                   fsdp_over_cfg=over_cfg)
                resident = workload.resident_experts
                weights = resident * candidate.weight_bytes_per_device(cfg, dtype)
                if weights > usable:
                    held = "" if resident == 1 else f" ({resident} experts)"
                    reasons.append(
                        f"weights{held} {weights / 2**30:.1f} GiB per device exceed the "
                        f"{usable / 2**30:.2f} GiB usable HBM")
            options.append(CandidateOption(tuple(by_role.items()), fsdp, over_cfg, candidate,
                                           weights, tuple(reasons)))
    return CandidateSpace(options)


def _nothing_to_shard_over(degrees: dict[str, int], over_cfg: bool = True) -> bool:
    """No axis besides tp (and cfg, unless ``over_cfg``): fsdp would have nothing to shard
    the weights over."""
    skip = ("tp",) if over_cfg else ("tp", "cfg")
    return all(d == 1 for role, d in degrees.items() if role not in skip)


def _exclusions(degrees: dict[str, int], fsdp: bool, over_cfg: bool, workload: Workload,
                cfg: WanConfig, allow_padding: bool) -> list[str]:
    reasons = []
    if degrees["cfg"] > workload.batch:
        reasons.append(f"cfg degree {degrees['cfg']} > {workload.batch} passes per step")
    heads_split = degrees["ulysses"] * degrees["tp"]
    if cfg.num_heads % heads_split:
        reasons.append(f"{cfg.num_heads} heads not divisible by ulysses x tp = {heads_split}")
    sequence = degrees["context"] * degrees["ring"] * degrees["ulysses"]
    if workload.tokens % sequence and not allow_padding:
        padding = -workload.tokens % sequence
        reasons.append(f"{workload.tokens:,} tokens not divisible by sequence degree "
                       f"{sequence} (would pad {padding})")
    if fsdp and _nothing_to_shard_over(degrees, over_cfg):
        reasons.append("fsdp needs an axis besides tp to shard weights over" if over_cfg else
                       "fsdp needs an axis besides tp and cfg to shard weights over (fsdpseq)")
    return reasons


def enumerate_candidates(workload: Workload, topology: Topology, *,
                         allow_padding: bool = True, attention: str | None = None,
                         dtype: Any = jnp.bfloat16) -> list[Candidate]:
    """The valid candidates of :func:`explain_candidates`."""
    return explain_candidates(workload, topology, allow_padding=allow_padding,
                              attention=attention, dtype=dtype).valid
