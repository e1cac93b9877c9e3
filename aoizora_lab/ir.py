"""Cheap pre-compilation estimates read from a program's jaxpr and its sharding annotations.

Tracing a jitted step (``jax.make_jaxpr`` on an abstract mesh: no devices, no compile) takes a
fraction of a second; this module reads the resulting jaxpr and, from its shapes and shardings
alone, counts per device:

- **FLOPs** of every ``dot_general`` (``2 * output elements * contracted size``, divided by the
  shards of its output and of a contraction both operands split) and of attention kernels
  (``pallas_call``s named like splash/flash attention: ``4 * B * H * Sq * Sk * D`` from their
  q/k shapes, since custom calls carry no FLOP count); loops multiply by their trip counts
  (``scan`` length; a ``while`` is counted once and noted);
- **HBM bytes** those ops must at least read and write;
- **parameter bytes** (the inputs' shardings) and the **largest activation**;
- **communication**, per logical axis: explicit collectives inside ``shard_map`` (all-to-all,
  ppermute, all-gather, psum) and the collectives GSPMD must insert where a
  ``sharding_constraint`` or a ``shard_map`` boundary changes a value's sharding (axes removed
  from a dim: all-gather; moved between dims: all-to-all), where a matmul contracts a dim both
  operands split (all-reduce of the partial sums), or a reduction runs over a split dim.

Sharding is propagated GSPMD-style through the ops in between: elementwise ops take their
operands' sharding, ``dot_general`` keeps batch and free dims' axes, reshapes keep a merged
group's major-dim axes and give a split dim's axes to its major part, transposes permute.
It is an estimate of what the partitioner will do, not a copy of it: the compiled HLO
(:mod:`aoizora_lab.hlo`) is the ground truth the planner ranks with.

From the counts :func:`estimate_ir` derives a **lower bound** (the roofline of the totals,
``max(FLOPs / peak, bytes / HBM bandwidth)``, plus each collective at the bytes a device must
receive over all ``2 * ndim`` of its links at full speed: no placement can beat it) and a
quick **estimate** (ops at :data:`COMPUTE_EFFICIENCY` of peak and :data:`HBM_EFFICIENCY` of
HBM bandwidth, typical of large bf16 matmuls and streaming on TPUs; collectives priced by the
ICI model on the default row-major placement). Both apply the planner's overlap rule
(:meth:`~aoizora_lab.realize.Predicted.overlapped`): collectives of :data:`ASYNC_KINDS` hide
behind compute up to its length, the others add.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
import os
import re
import tempfile
import time
from collections import defaultdict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import jax
import numpy as np
from jax.sharding import PartitionSpec as P

from aoizora_lab.candidates import Candidate
from aoizora_lab.comm_model import Collective, estimate, mesh_axis_groups
from aoizora_lab.hardware import chip_spec
from aoizora_lab.models.wan import abstract_params
from aoizora_lab.realize import Predicted
from aoizora_lab.topology import Topology
from aoizora_lab.workload import Workload, denoise_step

ASYNC_KINDS = ("all-gather", "collective-permute")
"""Kinds the TPU compiler schedules asynchronously next to compute in the Wan step (compiled
14B@720p on v5e:4x4 and 1.3B@480p on v5e:2x4: 97-99 % of all-gather bytes (FSDP weights,
context K/V) and every ring permute were ``*-start`` ops; every all-to-all and the tensor-
parallel all-reduces synchronous); the IR applies the planner's overlap rule with them."""
IR_CACHE_DIR = Path(__file__).resolve().parent.parent / "data" / "cache" / "ir"
IRCacheDir = str | Path | Literal[False] | None
"""Where IR traces are cached: a folder, ``None`` for :data:`IR_CACHE_DIR`, ``False`` for none."""
COMPUTE_EFFICIENCY = 0.6  # typical fraction of peak for large bf16 matmuls / splash on TPU
HBM_EFFICIENCY = 0.8  # typical fraction of HBM bandwidth for streaming reads and writes
_ATTENTION_KERNEL = re.compile(r"splash|flash|attention|mha", re.IGNORECASE)

Spec = tuple[tuple[str, ...], ...]
"""Per array dim, the mesh axes splitting it (outermost first)."""


@dataclass(frozen=True)
class IRCollective:
    """A collective the IR implies: kind, the mesh axes it spans, bytes, how often, why."""

    kind: str
    """``all-gather``, ``reduce-scatter``, ``all-reduce``, ``all-to-all`` or
    ``collective-permute`` (the kinds of :class:`~aoizora_lab.Collective`)."""
    axes: tuple[str, ...]
    """Mesh axes its groups run over."""
    bytes: float
    """Result bytes on one device."""
    count: int
    """Runs per step (loop trip counts included)."""
    source: str
    """``explicit`` (written in a shard_map), ``reshard`` (a sharding change), ``partial-sum``
    (a contraction or reduction over a split dim)."""


@dataclass
class IRCounts:
    """What :func:`count_jaxpr` read from one program, per device."""

    flops: float = 0.0
    hbm_bytes: float = 0.0
    param_bytes: float = 0.0
    largest_activation_bytes: float = 0.0
    collectives: list[IRCollective] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    def comm_bytes_by_axes(self) -> dict[tuple[str, ...], float]:
        """Result bytes times runs, summed per group of mesh axes."""
        totals: dict[tuple[str, ...], float] = defaultdict(float)
        for c in self.collectives:
            totals[c.axes] += c.bytes * c.count
        return dict(totals)


@dataclass(frozen=True)
class IREstimate:
    """IR counts of one candidate and the latency bounds derived from them."""

    candidate: str
    flops: float
    hbm_bytes: float
    param_bytes: float
    largest_activation_bytes: float
    memory_lower_bound_bytes: float
    """Parameters plus the largest activation: a device needs at least this much HBM."""
    comm_bytes: float
    """Bytes of every implied collective's result, times runs, summed."""
    comm_bytes_by_axes: dict[tuple[str, ...], float]
    collectives: tuple[IRCollective, ...]
    lower_bound_seconds: float
    compute_lower_bound_seconds: float
    comm_lower_bound_seconds: float
    estimate_seconds: float
    compute_estimate_seconds: float
    comm_estimate_seconds: float
    trace_seconds: float
    notes: tuple[str, ...]


# ----------------------------------------------------------------------------- generic reader


def spec_of(sharding_or_spec: Any, ndim: int) -> Spec:
    """A ``PartitionSpec`` (or a ``NamedSharding``) as a :data:`Spec` of ``ndim`` dims."""
    spec = getattr(sharding_or_spec, "spec", sharding_or_spec)
    entries = list(spec) if spec is not None else []
    entries += [None] * (ndim - len(entries))
    return tuple(() if e is None else ((e,) if isinstance(e, str) else tuple(e))
                 for e in entries[:ndim])


def count_jaxpr(closed_jaxpr: Any, in_specs: Sequence[Spec],
                axis_sizes: Mapping[str, int]) -> IRCounts:
    """Read per-device FLOPs, bytes and implied collectives from a traced program.

    ``in_specs`` gives the sharding of each input (the shardings the program is called with);
    ``axis_sizes`` the mesh. Works for any jitted function, not only the Wan step.
    """
    reader = _Reader(dict(axis_sizes))
    jaxpr = closed_jaxpr.jaxpr
    for var, spec in zip(jaxpr.invars, in_specs, strict=True):
        reader.counts.param_bytes += reader.device_bytes(var.aval, spec)
    reader.walk(jaxpr, list(in_specs), multiplier=1, local=False)
    return reader.counts


def count_function(fn: Callable[..., Any], args: Sequence[Any],
                   in_specs: Sequence[Any], axis_sizes: Mapping[str, int]) -> IRCounts:
    """Trace ``fn(*args)`` (pytrees of ShapeDtypeStructs) and :func:`count_jaxpr` it.

    ``in_specs`` mirrors ``args`` with a ``PartitionSpec`` per leaf.
    """
    closed = jax.make_jaxpr(fn)(*args)
    leaves = jax.tree.leaves(args)
    specs = jax.tree.leaves(list(in_specs), is_leaf=lambda x: isinstance(x, P) or x is None)
    return count_jaxpr(closed, [spec_of(s, len(a.shape)) for s, a in
                                zip(specs, leaves, strict=True)], axis_sizes)


class _Reader:
    """Walks a jaxpr, propagating shardings and adding up counts."""

    def __init__(self, axis_sizes: dict[str, int]):
        self.sizes = axis_sizes
        self.counts = IRCounts()

    # -- helpers

    def shards(self, spec: Spec) -> int:
        return math.prod(self.sizes[a] for dim in spec for a in dim)

    def device_bytes(self, aval: Any, spec: Spec | None) -> float:
        if not hasattr(aval, "shape"):
            return 0.0
        size = math.prod(aval.shape) * np.dtype(aval.dtype).itemsize
        return size / (self.shards(spec) if spec else 1)

    def collect(self, kind: str, axes: Sequence[str], size: float, multiplier: int,
                source: str) -> None:
        axes = tuple(dict.fromkeys(axes))
        if axes and size > 0:
            self.counts.collectives.append(IRCollective(kind, axes, size, multiplier, source))

    def reshard(self, aval: Any, old: Spec, new: Spec, multiplier: int) -> None:
        """Collectives that turn sharding ``old`` into ``new`` (GSPMD's choice, estimated)."""
        if old == new or not hasattr(aval, "shape"):
            return
        old_axes = {a for dim in old for a in dim}
        new_axes = {a for dim in new for a in dim}
        moved = [a for a in old_axes & new_axes
                 if next(i for i, d in enumerate(old) if a in d)
                 != next(i for i, d in enumerate(new) if a in d)]
        removed = sorted(old_axes - new_axes)
        if moved:
            self.collect("all-to-all", moved, self.device_bytes(aval, new), multiplier,
                         "reshard")
        if removed:
            self.collect("all-gather", removed, self.device_bytes(aval, new), multiplier,
                         "reshard")

    # -- the walk

    def walk(self, jaxpr: Any, in_specs: list[Spec | None], *, multiplier: int,
             local: bool) -> list[Spec | None]:
        env: dict[Any, Spec | None] = {}
        for var, spec in zip(jaxpr.invars, in_specs, strict=True):
            env[var] = spec
        for var in jaxpr.constvars:
            env[var] = None

        def read(v: Any) -> Spec | None:
            if hasattr(v, "val") or v not in env:  # literal or unknown: replicated
                return tuple(() for _ in getattr(v.aval, "shape", ()))
            return env[v]

        for eqn in jaxpr.eqns:
            specs = [read(v) for v in eqn.invars]
            outs = self.equation(eqn, specs, multiplier=multiplier, local=local)
            for var, spec in zip(eqn.outvars, outs, strict=True):
                env[var] = spec
                # Inside a shard_map shapes are already per device: no spec divides them.
                self.counts.largest_activation_bytes = max(
                    self.counts.largest_activation_bytes,
                    self.device_bytes(var.aval, None if local else spec))
        return [read(v) for v in jaxpr.outvars]

    def equation(self, eqn: Any, specs: list[Spec | None], *, multiplier: int,
                 local: bool) -> list[Spec | None]:
        name = eqn.primitive.name
        params = eqn.params
        outs = [v.aval for v in eqn.outvars]
        if local:
            specs = [tuple(() for _ in getattr(v.aval, "shape", ())) for v in eqn.invars]

        if name == "sharding_constraint":
            new = spec_of(params["sharding"], len(outs[0].shape))
            if not local:
                self.reshard(outs[0], specs[0], new, multiplier)
            return [new]
        if name == "dot_general":
            return [self.dot_general(eqn, specs, multiplier)]
        if name == "pallas_call":
            return self.pallas_call(eqn, multiplier)
        if name == "scan":
            return self.scan(eqn, specs, multiplier, local)
        if name == "shard_map":
            return self.shard_map(eqn, specs, multiplier)
        if name in ("all_to_all", "ppermute", "all_gather", "psum", "psum_scatter",
                    "reduce_scatter"):
            self.explicit_collective(eqn, multiplier)
            return [tuple(() for _ in o.shape) for o in outs]
        if name == "while":
            self.counts.notes.append("a while loop was counted once (trip count unknown)")
            body = params["body_jaxpr"].jaxpr
            self.walk(body, [None] * len(body.invars), multiplier=multiplier, local=local)
            return [None] * len(outs)
        if name == "cond":
            return self.cond(eqn, specs, multiplier, local)
        sub = self.sub_jaxpr(params)
        if sub is not None:
            result = self.walk(sub.jaxpr, specs[-len(sub.jaxpr.invars):] if specs else [],
                               multiplier=multiplier, local=local)
            return result
        if name.startswith("reduce_") or name in ("argmax", "argmin"):
            return [self.reduction(eqn, specs, multiplier, local)]
        return [self.shape_op(eqn, specs, o) for o in outs]

    @staticmethod
    def sub_jaxpr(params: Mapping[str, Any]) -> Any:
        for key in ("jaxpr", "call_jaxpr", "fun_jaxpr"):
            sub = params.get(key)
            if sub is not None and hasattr(sub, "jaxpr"):
                return sub
            if sub is not None and hasattr(sub, "eqns"):
                return jax.extend.core.ClosedJaxpr(sub, ())
        return None

    # -- op rules

    def dot_general(self, eqn: Any, specs: list[Spec | None], multiplier: int) -> Spec:
        (lc, rc), (lb, rb) = eqn.params["dimension_numbers"]
        lhs, rhs = (v.aval for v in eqn.invars)
        ls = specs[0] or tuple(() for _ in lhs.shape)
        rs = specs[1] or tuple(() for _ in rhs.shape)
        lfree = [d for d in range(len(lhs.shape)) if d not in lc and d not in lb]
        rfree = [d for d in range(len(rhs.shape)) if d not in rc and d not in rb]
        used: set[str] = set()

        def take(axes: tuple[str, ...]) -> tuple[str, ...]:
            kept = tuple(a for a in axes if a not in used)
            used.update(kept)
            return kept

        out = [take(ls[i] or rs[j]) for i, j in zip(lb, rb, strict=True)]
        out += [take(ls[d]) for d in lfree] + [take(rs[d]) for d in rfree]
        contracted_axes = [a for i, j in zip(lc, rc, strict=True) for a in ls[i] if a in rs[j]
                           and a not in used]
        one_sided = {a for i, j in zip(lc, rc, strict=True) for a in set(ls[i]) ^ set(rs[j])}
        out_aval = eqn.outvars[0].aval
        out_spec: Spec = tuple(out)
        if one_sided:  # GSPMD gathers the operand split on its contraction alone
            self.collect("all-gather", sorted(one_sided),
                         max(self.device_bytes(lhs, ls), self.device_bytes(rhs, rs)),
                         multiplier, "reshard")
        if contracted_axes:
            self.collect("all-reduce", contracted_axes, self.device_bytes(out_aval, out_spec),
                         multiplier, "partial-sum")
        contracted = math.prod(lhs.shape[i] for i in lc)
        shards = self.shards(out_spec) * math.prod(self.sizes[a] for a in contracted_axes)
        self.counts.flops += multiplier * 2.0 * math.prod(out_aval.shape) * contracted / shards
        self.counts.hbm_bytes += multiplier * (self.device_bytes(lhs, ls)
                                               + self.device_bytes(rhs, rs)
                                               + self.device_bytes(out_aval, out_spec))
        return out_spec

    def pallas_call(self, eqn: Any, multiplier: int) -> list[Spec | None]:
        avals = [v.aval for v in eqn.invars]
        kernel = str(eqn.params.get("name") or eqn.params.get("name_and_src_info") or "")
        floats = [a for a in avals if len(a.shape) >= 3
                  and jax.numpy.issubdtype(a.dtype, jax.numpy.floating)]
        if _ATTENTION_KERNEL.search(kernel) and len(floats) >= 3:
            q, k = floats[0], floats[1]
            self.counts.flops += (multiplier * 4.0 * math.prod(q.shape[:-1]) * k.shape[-2]
                                  * q.shape[-1])
        else:
            self.counts.notes.append(f"pallas kernel {kernel or '?'}: FLOPs not counted")
        self.counts.hbm_bytes += multiplier * (
            sum(self.device_bytes(a, None) for a in avals)
            + sum(self.device_bytes(v.aval, None) for v in eqn.outvars))
        return [tuple(() for _ in v.aval.shape) for v in eqn.outvars]

    def scan(self, eqn: Any, specs: list[Spec | None], multiplier: int,
             local: bool) -> list[Spec | None]:
        params = eqn.params
        n_consts, n_carry = params["num_consts"], params["num_carry"]
        body_specs = list(specs[:n_consts + n_carry]) + [
            None if s is None else s[1:] for s in specs[n_consts + n_carry:]]
        outs = self.walk(params["jaxpr"].jaxpr, body_specs,
                         multiplier=multiplier * params["length"], local=local)
        carries, ys = outs[:n_carry], outs[n_carry:]
        return carries + [None if s is None else ((), *s) for s in ys]

    def cond(self, eqn: Any, specs: list[Spec | None], multiplier: int,
             local: bool) -> list[Spec | None]:
        best, best_flops = None, -1.0
        for branch in eqn.params["branches"]:
            probe = _Reader(self.sizes)
            probe.walk(branch.jaxpr, specs[1:], multiplier=multiplier, local=local)
            if probe.counts.flops > best_flops:
                best, best_flops = probe, probe.counts.flops
        self.merge(best.counts)
        return [None] * len(eqn.outvars)

    def merge(self, other: IRCounts) -> None:
        self.counts.flops += other.flops
        self.counts.hbm_bytes += other.hbm_bytes
        self.counts.collectives += other.collectives
        self.counts.notes += other.notes
        self.counts.largest_activation_bytes = max(self.counts.largest_activation_bytes,
                                                   other.largest_activation_bytes)

    def shard_map(self, eqn: Any, specs: list[Spec | None], multiplier: int) -> list[Spec]:
        params = eqn.params
        in_specs = [spec_of(s, len(v.aval.shape)) for s, v in
                    zip(params["in_specs"], eqn.invars, strict=True)]
        for var, old, new in zip(eqn.invars, specs, in_specs, strict=True):
            if old is not None:
                self.reshard(var.aval, old, new, multiplier)
        body = params["jaxpr"]
        body = body.jaxpr if hasattr(body, "jaxpr") else body
        self.walk(body, [None] * len(body.invars), multiplier=multiplier, local=True)
        return [spec_of(s, len(v.aval.shape)) for s, v in
                zip(params["out_specs"], eqn.outvars, strict=True)]

    def explicit_collective(self, eqn: Any, multiplier: int) -> None:
        params = eqn.params
        axes = params.get("axis_name", params.get("axes"))
        axes = (axes,) if isinstance(axes, str) else tuple(axes)
        kind = {"all_to_all": "all-to-all", "ppermute": "collective-permute",
                "all_gather": "all-gather", "psum": "all-reduce",
                "psum_scatter": "reduce-scatter",
                "reduce_scatter": "reduce-scatter"}[eqn.primitive.name]
        size = sum(self.device_bytes(v.aval, None) for v in eqn.outvars)
        self.collect(kind, axes, size, multiplier, "explicit")

    def reduction(self, eqn: Any, specs: list[Spec | None], multiplier: int,
                  local: bool) -> Spec:
        reduced = set(eqn.params.get("axes", ()))
        spec = specs[0] or tuple(() for _ in eqn.invars[0].aval.shape)
        split = [a for d in reduced for a in spec[d]]
        out: Spec = tuple(s for d, s in enumerate(spec) if d not in reduced)
        if split and not local:
            self.collect("all-reduce", split, self.device_bytes(eqn.outvars[0].aval, out),
                         multiplier, "partial-sum")
        return out

    def shape_op(self, eqn: Any, specs: list[Spec | None], out: Any) -> Spec:
        """Elementwise, broadcast, reshape, transpose and friends."""
        shape = tuple(getattr(out, "shape", ()))
        name = eqn.primitive.name
        params = eqn.params
        first = specs[0] if specs else None
        if name == "transpose" and first is not None:
            return tuple(first[p] for p in params["permutation"])
        if name == "broadcast_in_dim" and first is not None:
            result: list[tuple[str, ...]] = [() for _ in shape]
            for src, dst in enumerate(params["broadcast_dimensions"]):
                if eqn.invars[0].aval.shape[src] == shape[dst]:
                    result[dst] = first[src]
            return tuple(result)
        if name == "stack" and first is not None:  # a new dim at `axis`, unsplit
            axis = params["axis"]
            return (*first[:axis], (), *first[axis:])
        if name in ("reshape", "squeeze", "expand_dims") and first is not None:
            return _reshape_spec(eqn.invars[0].aval.shape, shape, first)
        # Elementwise and same-rank ops: per dim, the first operand's axes on a same-sized dim.
        result = [() for _ in shape]
        used: set[str] = set()
        for var, spec in zip(eqn.invars, specs, strict=True):
            operand = tuple(getattr(var.aval, "shape", ()))
            if spec is None or len(operand) != len(shape):
                continue
            for d, axes in enumerate(spec):
                if (not result[d] and axes and operand[d] == shape[d]
                        and not used & set(axes)):
                    result[d] = axes
                    used.update(axes)
        return tuple(result)


def _reshape_spec(old_shape: Sequence[int], new_shape: Sequence[int], spec: Spec) -> Spec:
    """Carry axes through a reshape: merged dims keep the axes of their major (first non-unit)
    dim; a split dim gives its axes to its major (first non-unit) part."""
    result: list[tuple[str, ...]] = [() for _ in new_shape]
    i = j = 0
    while i < len(old_shape) and j < len(new_shape):
        if old_shape[i] == new_shape[j]:
            result[j] = spec[i]
            i, j = i + 1, j + 1
        elif old_shape[i] < new_shape[j]:  # several old dims merge into new dim j
            start, size = i, 1
            while i < len(old_shape) and size < new_shape[j]:
                size *= old_shape[i]
                i += 1
            major = next((k for k in range(start, i) if old_shape[k] > 1), start)
            result[j] = spec[major]
            j += 1
        else:  # old dim i splits into several new dims
            start, size = j, 1
            while j < len(new_shape) and size < old_shape[i]:
                size *= new_shape[j]
                j += 1
            major = next((k for k in range(start, j) if new_shape[k] > 1), start)
            result[major] = spec[i]
            i += 1
    return tuple(result)


# ----------------------------------------------------------------------------- the Wan step


def estimate_ir(candidate: Candidate, workload: Workload, topology: Topology, *,
                dtype: Any = None, num_layers: int | None = None,
                cache_dir: IRCacheDir = None) -> IREstimate:
    """Trace ``workload``'s denoise step under ``candidate`` and derive its bounds.

    Tracing uses an abstract mesh: no devices, no compile. ``num_layers`` estimates a
    shallower model of the same width (to compare with a compile of that depth). See the
    module docstring for the lower bound and estimate. The counts of a trace are cached as
    JSON under ``cache_dir`` (default ``data/cache/ir``; ``False``: no cache), keyed by the
    candidate, the model, the workload, the dtype and the versions and sources they depend on;
    the bounds are derived afresh for ``topology``.
    """
    import jax.numpy as jnp

    dtype = dtype or jnp.bfloat16
    model = workload.config()
    if num_layers is not None:
        model = model.with_layers(num_layers)
    entry = None
    if cache_dir is not False:
        from aoizora_lab.compile import program_versions

        job = {"candidate": candidate.name, "attention": candidate.attention,
               "model": dataclasses.asdict(model), "dtype": jnp.dtype(dtype).name,
               "workload": {k: v for k, v in dataclasses.asdict(workload).items()
                            if k != "model"},
               "versions": program_versions(("ir.py",))}
        key = hashlib.sha256(json.dumps(job, sort_keys=True).encode()).hexdigest()[:32]
        entry = Path(cache_dir or IR_CACHE_DIR) / f"{key}.json"
        cached = _read_counts(entry)
        if cached is not None:
            counts, trace_seconds = cached
            return _bounds(candidate, counts, topology, trace_seconds)
    plan = candidate.plan()
    start = time.perf_counter()
    params = abstract_params(model, dtype)
    inputs = workload.abstract_inputs(dtype)
    closed = jax.make_jaxpr(lambda p, i: denoise_step(p, model, plan=plan, **i))(params, inputs)
    param_specs = jax.tree.leaves(candidate.partition_specs(model)["params"],
                                  is_leaf=lambda x: isinstance(x, P))
    in_specs = [spec_of(s, len(a.shape)) for s, a in
                zip(param_specs, jax.tree.leaves(params), strict=True)]
    in_specs += [tuple(() for _ in a.shape) for a in jax.tree.leaves(inputs)]
    sizes = dict(zip(candidate.axis_names, candidate.mesh_shape, strict=True))
    counts = count_jaxpr(closed, in_specs, sizes)
    counts.param_bytes = candidate.weight_bytes_per_device(model, dtype)
    trace_seconds = time.perf_counter() - start
    if entry is not None:
        _write_counts(entry, counts, trace_seconds)
    return _bounds(candidate, counts, topology, trace_seconds)


def _write_counts(entry: Path, counts: IRCounts, trace_seconds: float) -> None:
    """Write a trace's counts atomically (a temporary file renamed into place), best effort:
    a cache that cannot be written (full disk, read-only folder) costs a retrace next time,
    never the estimate."""
    payload = {**dataclasses.asdict(counts), "trace_seconds": trace_seconds}
    temporary = None
    try:
        entry.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile("w", dir=entry.parent, suffix=".tmp",
                                         delete=False) as handle:
            temporary = Path(handle.name)
            json.dump(payload, handle)
        os.replace(temporary, entry)
    except OSError:
        if temporary is not None:
            temporary.unlink(missing_ok=True)


def _read_counts(entry: Path) -> tuple[IRCounts, float] | None:
    """A cached trace's counts and trace seconds, or ``None`` (a damaged entry is removed)."""
    try:
        payload = json.loads(entry.read_text())
        trace_seconds = float(payload.pop("trace_seconds"))
        collectives = [IRCollective(**{**c, "axes": tuple(c["axes"])})
                       for c in payload.pop("collectives")]
        counts = IRCounts(**payload, collectives=collectives)
        numbers = [counts.flops, counts.hbm_bytes, counts.param_bytes,
                   counts.largest_activation_bytes,
                   *(x for c in collectives for x in (c.bytes, c.count))]
        if not all(isinstance(x, int | float) and not isinstance(x, bool) for x in numbers):
            raise ValueError("a count is not a number")
        return counts, trace_seconds
    except FileNotFoundError:
        return None
    except (OSError, ValueError, TypeError, KeyError, AttributeError):
        entry.unlink(missing_ok=True)
        return None


def _bounds(candidate: Candidate, counts: IRCounts, topology: Topology,
            trace_seconds: float) -> IREstimate:
    chip = chip_spec(topology.generation)
    compute_bound = max(counts.flops / chip.peak_bf16_flops,
                        counts.hbm_bytes / chip.hbm_bandwidth)
    compute_estimate = max(counts.flops / (chip.peak_bf16_flops * COMPUTE_EFFICIENCY),
                           counts.hbm_bytes / (chip.hbm_bandwidth * HBM_EFFICIENCY))
    links_per_chip = 2 * topology.ndim
    placement = topology.device_grid().ravel()[:candidate.num_devices]
    bound = {True: 0.0, False: 0.0}  # by asynchronous
    collectives: dict[bool, list[Collective]] = {True: [], False: []}
    for c in counts.collectives:
        group = math.prod(candidate.mesh_shape[candidate.axis_names.index(a)] for a in c.axes)
        received = {"all-reduce": 2 * (group - 1) / group, "collective-permute": 1.0}.get(
            c.kind, (group - 1) / group) * c.bytes
        asynchronous = c.kind in ASYNC_KINDS
        bound[asynchronous] += c.count * received / (links_per_chip * chip.ici_link_bandwidth)
        axis_ids = [candidate.axis_names.index(a) for a in c.axes]
        groups = mesh_axis_groups(candidate.mesh_shape, axis_ids)
        if c.kind == "collective-permute":  # shift by one along the axes (the ring pattern)
            groups = [(g[i], g[(i + 1) % len(g)]) for g in groups for i in range(len(g))]
        collectives[asynchronous].append(Collective(c.kind, groups, c.bytes, count=c.count))
    modelled = {a: (estimate(items, topology, placement, chip=chip).seconds
                    if items and candidate.num_devices == topology.num_devices else bound[a])
                for a, items in collectives.items()}
    lower = Predicted.overlapped(compute_bound, bound[False], bound[True])
    quick = Predicted.overlapped(compute_estimate, modelled[False], modelled[True])
    comm_bound, comm_estimate = lower.comm_s, quick.comm_s
    return IREstimate(
        candidate=candidate.name, flops=counts.flops, hbm_bytes=counts.hbm_bytes,
        param_bytes=counts.param_bytes,
        largest_activation_bytes=counts.largest_activation_bytes,
        memory_lower_bound_bytes=counts.param_bytes + counts.largest_activation_bytes,
        comm_bytes=sum(c.bytes * c.count for c in counts.collectives),
        comm_bytes_by_axes=counts.comm_bytes_by_axes(),
        collectives=tuple(counts.collectives),
        lower_bound_seconds=lower.total_s,
        compute_lower_bound_seconds=compute_bound, comm_lower_bound_seconds=comm_bound,
        estimate_seconds=quick.total_s,
        compute_estimate_seconds=compute_estimate, comm_estimate_seconds=comm_estimate,
        trace_seconds=trace_seconds, notes=tuple(dict.fromkeys(counts.notes)),
    )
