"""Read per-device work and communication from any traced program's jaxpr and its shardings.

Tracing a jitted function (``jax.make_jaxpr`` on an abstract mesh: no devices, no compile)
takes a fraction of a second; :func:`count_jaxpr` reads the resulting jaxpr and, from its
shapes and shardings alone, counts per device:

- **FLOPs** of every ``dot_general`` (``2 * output elements * contracted size``, divided by the
  shards of its output and of a contraction both operands split) and of attention kernels
  (``pallas_call``s named like splash/flash attention, counted by
  :func:`aoizora_lab.flops.attention_flops` from their q/k shapes, since custom calls carry no
  FLOP count); loops multiply by their trip counts (``scan`` length; a ``while`` is counted once
  and noted);
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
(:mod:`aoizora_lab.hlo`) is the ground truth.

**The rule table.** Each equation is read by its primitive's :class:`Rule` in :data:`RULES`;
a primitive not in the table goes to :func:`default_rule` (nested jaxprs read inline,
reductions, and elementwise / shape ops, which add no FLOPs or bytes). Reading a new primitive
is adding one entry.

Worked example: ``x @ w`` with ``x: f32[16, 32]`` split ``P("dp", None)`` and
``w: f32[32, 64]`` split ``P(None, "tp")`` on a ``{"dp": 2, "tp": 4}`` mesh, its result then
constrained to ``P("dp", None)``::

    dot_general  -> result P("dp", "tp"): 8 shards
                    FLOPs 2 * 16 * 64 * 32 / 8 = 8192
                    HBM bytes 1024 (x) + 2048 (w) + 512 (result) = 3584
    sharding_constraint P("dp", "tp") -> P("dp", None): "tp" removed from dim 1
                    IRCollective("all-gather", ("tp",), bytes=2048, count=1, source="reshard")

with ``param_bytes`` 1024 + 2048 = 3072 and ``largest_activation_bytes`` 2048 (the gathered
result on one device). Nothing here knows about Wan: :mod:`aoizora_lab.ir_estimate` traces the
Wan step and derives its bounds from these counts.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import PartitionSpec as P

from aoizora_lab.flops import ATTENTION_KERNEL, attention_flops

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
    """Matmul and attention FLOPs, loops multiplied out."""
    hbm_bytes: float = 0.0
    """Bytes the matmuls and kernels must at least read and write."""
    param_bytes: float = 0.0
    """The inputs' bytes under their shardings."""
    largest_activation_bytes: float = 0.0
    """The largest value the program computes, on one device."""
    collectives: list[IRCollective] = field(default_factory=list)
    """Every collective the program implies, in program order."""
    notes: list[str] = field(default_factory=list)
    """What could not be counted (a ``while`` loop's trips, an unknown kernel's FLOPs)."""

    def comm_bytes_by_axes(self) -> dict[tuple[str, ...], float]:
        """Result bytes times runs, summed per group of mesh axes."""
        totals: dict[tuple[str, ...], float] = defaultdict(float)
        for c in self.collectives:
            totals[c.axes] += c.bytes * c.count
        return dict(totals)


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
    reader = Reader(axis_sizes)
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


class Reader:
    """Walks a jaxpr, propagating shardings and adding up :attr:`counts`; each equation is read
    by its primitive's rule in :data:`RULES`, or by :func:`default_rule`."""

    def __init__(self, axis_sizes: Mapping[str, int]):
        self.sizes = dict(axis_sizes)
        """Mesh axis name -> size."""
        self.counts = IRCounts()
        """What the rules have added up so far."""

    def shards(self, spec: Spec) -> int:
        """How many pieces ``spec`` cuts an array into."""
        return math.prod(self.sizes[a] for dim in spec for a in dim)

    def device_bytes(self, aval: Any, spec: Spec | None) -> float:
        """Bytes of ``aval`` on one device under ``spec`` (``None``: whole)."""
        if not hasattr(aval, "shape"):
            return 0.0
        size = math.prod(aval.shape) * np.dtype(aval.dtype).itemsize
        return size / (self.shards(spec) if spec else 1)

    def collect(self, kind: str, axes: Sequence[str], size: float, multiplier: int,
                source: str) -> None:
        """Add a collective (one over no axes or of no bytes is nothing)."""
        axes = tuple(dict.fromkeys(axes))
        if axes and size > 0:
            self.counts.collectives.append(IRCollective(kind, axes, size, multiplier, source))

    def reshard(self, aval: Any, old: Spec, new: Spec, multiplier: int) -> None:
        """Collectives that turn sharding ``old`` into ``new`` (GSPMD's choice, estimated)."""
        if old == new or not hasattr(aval, "shape"):
            return
        old_axes = {a for dim in old for a in dim}
        new_axes = {a for dim in new for a in dim}
        moved = [a for a in sorted(old_axes & new_axes)
                 if next(i for i, d in enumerate(old) if a in d)
                 != next(i for i, d in enumerate(new) if a in d)]
        removed = sorted(old_axes - new_axes)
        if moved:
            self.collect("all-to-all", moved, self.device_bytes(aval, new), multiplier,
                         "reshard")
        if removed:
            self.collect("all-gather", removed, self.device_bytes(aval, new), multiplier,
                         "reshard")

    def merge(self, other: IRCounts) -> None:
        """Add another reader's counts to these."""
        self.counts.flops += other.flops
        self.counts.hbm_bytes += other.hbm_bytes
        self.counts.collectives += other.collectives
        self.counts.notes += other.notes
        self.counts.largest_activation_bytes = max(self.counts.largest_activation_bytes,
                                                   other.largest_activation_bytes)

    def walk(self, jaxpr: Any, in_specs: list[Spec | None], *, multiplier: int,
             local: bool) -> list[Spec | None]:
        """Read every equation of ``jaxpr`` whose inputs have ``in_specs``; the outputs' specs.

        ``multiplier``: runs per step of the body; ``local``: inside a ``shard_map``.
        """
        env: dict[Any, Spec | None] = {}
        for var, spec in zip(jaxpr.invars, in_specs, strict=True):
            env[var] = spec
        for var in jaxpr.constvars:
            env[var] = None

        def read(v: Any) -> Spec | None:
            if hasattr(v, "val") or v not in env:  # literal or unknown: replicated
                return _replicated(v.aval)
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
        """Read one equation with its primitive's rule; the specs of its results."""
        if local:  # shapes are per device: every operand is whole on its device
            specs = [_replicated(v.aval) for v in eqn.invars]
        rule = RULES.get(eqn.primitive.name, default_rule)
        return rule(self, eqn, specs, multiplier=multiplier, local=local)


class Rule(Protocol):
    """How one primitive is read.

    Called with the reader, the equation, the spec of each operand (``None``: unknown), the
    equation's runs per step (``multiplier``, loop trip counts included) and whether it sits
    inside a ``shard_map`` (``local``: shapes are per device and GSPMD inserts nothing). It adds
    FLOPs, HBM bytes and notes to ``reader.counts``, records collectives with
    ``reader.collect`` and returns the spec of each result.
    """

    def __call__(self, reader: Reader, eqn: Any, specs: list[Spec | None], *,
                 multiplier: int, local: bool) -> list[Spec | None]: ...


def _replicated(aval: Any) -> Spec:
    """The spec of an array no axis splits."""
    return tuple(() for _ in getattr(aval, "shape", ()))


# ----------------------------------------------------------------------------- the rules


def _sharding_constraint(reader: Reader, eqn: Any, specs: list[Spec | None], *,
                         multiplier: int, local: bool) -> list[Spec | None]:
    out = eqn.outvars[0].aval
    new = spec_of(eqn.params["sharding"], len(out.shape))
    if not local:
        reader.reshard(out, specs[0], new, multiplier)
    return [new]


def _dot_general(reader: Reader, eqn: Any, specs: list[Spec | None], *, multiplier: int,
                 local: bool) -> list[Spec | None]:
    (lc, rc), (lb, rb) = eqn.params["dimension_numbers"]
    lhs, rhs = (v.aval for v in eqn.invars)
    ls = specs[0] or _replicated(lhs)
    rs = specs[1] or _replicated(rhs)
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
        reader.collect("all-gather", sorted(one_sided),
                       max(reader.device_bytes(lhs, ls), reader.device_bytes(rhs, rs)),
                       multiplier, "reshard")
    if contracted_axes:
        reader.collect("all-reduce", contracted_axes, reader.device_bytes(out_aval, out_spec),
                       multiplier, "partial-sum")
    contracted = math.prod(lhs.shape[i] for i in lc)
    shards = reader.shards(out_spec) * math.prod(reader.sizes[a] for a in contracted_axes)
    reader.counts.flops += multiplier * 2.0 * math.prod(out_aval.shape) * contracted / shards
    reader.counts.hbm_bytes += multiplier * (reader.device_bytes(lhs, ls)
                                             + reader.device_bytes(rhs, rs)
                                             + reader.device_bytes(out_aval, out_spec))
    return [out_spec]


def _pallas_call(reader: Reader, eqn: Any, specs: list[Spec | None], *, multiplier: int,
                 local: bool) -> list[Spec | None]:
    avals = [v.aval for v in eqn.invars]
    kernel = str(eqn.params.get("name") or eqn.params.get("name_and_src_info") or "")
    floats = [a for a in avals if len(a.shape) >= 3 and jnp.issubdtype(a.dtype, jnp.floating)]
    if ATTENTION_KERNEL.search(kernel) and len(floats) >= 3:
        reader.counts.flops += multiplier * attention_flops(floats[0].shape, floats[1].shape)
    else:
        reader.counts.notes.append(f"pallas kernel {kernel or '?'}: FLOPs not counted")
    reader.counts.hbm_bytes += multiplier * (
        sum(reader.device_bytes(a, None) for a in avals)
        + sum(reader.device_bytes(v.aval, None) for v in eqn.outvars))
    return [_replicated(v.aval) for v in eqn.outvars]


def _scan(reader: Reader, eqn: Any, specs: list[Spec | None], *, multiplier: int,
          local: bool) -> list[Spec | None]:
    params = eqn.params
    n_consts, n_carry = params["num_consts"], params["num_carry"]
    # Scanned-over inputs lose their leading (loop) dim in the body; stacked outputs gain it.
    body_specs = list(specs[:n_consts + n_carry]) + [
        None if s is None else s[1:] for s in specs[n_consts + n_carry:]]
    outs = reader.walk(params["jaxpr"].jaxpr, body_specs,
                       multiplier=multiplier * params["length"], local=local)
    carries, ys = outs[:n_carry], outs[n_carry:]
    return carries + [None if s is None else ((), *s) for s in ys]


def _while(reader: Reader, eqn: Any, specs: list[Spec | None], *, multiplier: int,
           local: bool) -> list[Spec | None]:
    reader.counts.notes.append("a while loop was counted once (trip count unknown)")
    body = eqn.params["body_jaxpr"].jaxpr
    reader.walk(body, [None] * len(body.invars), multiplier=multiplier, local=local)
    return [None] * len(eqn.outvars)


def _cond(reader: Reader, eqn: Any, specs: list[Spec | None], *, multiplier: int,
          local: bool) -> list[Spec | None]:
    # The branch with the most FLOPs: a bound must assume the costlier path is taken.
    best, best_flops = None, -1.0
    for branch in eqn.params["branches"]:
        probe = Reader(reader.sizes)
        probe.walk(branch.jaxpr, specs[1:], multiplier=multiplier, local=local)
        if probe.counts.flops > best_flops:
            best, best_flops = probe, probe.counts.flops
    reader.merge(best.counts)
    return [None] * len(eqn.outvars)


def _shard_map(reader: Reader, eqn: Any, specs: list[Spec | None], *, multiplier: int,
               local: bool) -> list[Spec | None]:
    params = eqn.params
    in_specs = [spec_of(s, len(v.aval.shape)) for s, v in
                zip(params["in_specs"], eqn.invars, strict=True)]
    for var, old, new in zip(eqn.invars, specs, in_specs, strict=True):
        if old is not None:
            reader.reshard(var.aval, old, new, multiplier)
    body = params["jaxpr"]
    body = body.jaxpr if hasattr(body, "jaxpr") else body
    reader.walk(body, [None] * len(body.invars), multiplier=multiplier, local=True)
    return [spec_of(s, len(v.aval.shape)) for s, v in
            zip(params["out_specs"], eqn.outvars, strict=True)]


_EXPLICIT_KINDS = {"all_to_all": "all-to-all", "ppermute": "collective-permute",
                   "all_gather": "all-gather", "psum": "all-reduce",
                   "psum_scatter": "reduce-scatter", "reduce_scatter": "reduce-scatter"}
"""Collective primitives written in a ``shard_map`` and the :class:`IRCollective` kind of each."""


def _explicit_collective(reader: Reader, eqn: Any, specs: list[Spec | None], *,
                         multiplier: int, local: bool) -> list[Spec | None]:
    params = eqn.params
    axes = params.get("axis_name", params.get("axes"))
    axes = (axes,) if isinstance(axes, str) else tuple(axes)
    size = sum(reader.device_bytes(v.aval, None) for v in eqn.outvars)
    reader.collect(_EXPLICIT_KINDS[eqn.primitive.name], axes, size, multiplier, "explicit")
    return [_replicated(v.aval) for v in eqn.outvars]


def _maps_spec(spec_rule: Callable[[Any, Spec], Spec]) -> Rule:
    """The rule of a one-result shape op whose result spec ``spec_rule(eqn, operand spec)``
    gives; the elementwise rule when the operand's spec is unknown."""

    def rule(reader: Reader, eqn: Any, specs: list[Spec | None], *, multiplier: int,
             local: bool) -> list[Spec | None]:
        if not specs or specs[0] is None:
            return _elementwise(eqn, specs)
        return [spec_rule(eqn, specs[0])]

    return rule


def _broadcast_spec(eqn: Any, spec: Spec) -> Spec:
    shape = eqn.outvars[0].aval.shape
    result: list[tuple[str, ...]] = [() for _ in shape]
    for src, dst in enumerate(eqn.params["broadcast_dimensions"]):
        if eqn.invars[0].aval.shape[src] == shape[dst]:  # a stretched unit dim is unsplit
            result[dst] = spec[src]
    return tuple(result)


def _stack_spec(eqn: Any, spec: Spec) -> Spec:
    axis = eqn.params["axis"]  # a new dim at `axis`, unsplit
    return (*spec[:axis], (), *spec[axis:])


def _reshape_rule_spec(eqn: Any, spec: Spec) -> Spec:
    return _reshape_spec(eqn.invars[0].aval.shape, eqn.outvars[0].aval.shape, spec)


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


def default_rule(reader: Reader, eqn: Any, specs: list[Spec | None], *, multiplier: int,
                 local: bool) -> list[Spec | None]:
    """The rule of every primitive not in :data:`RULES`, by what the equation is:

    - one that carries a jaxpr (``jit``, ``remat``, ``custom_jvp_call``, ...) is read inline,
      its operands' specs passed to the jaxpr's inputs;
    - a reduction (``reduce_*``, ``argmax``, ``argmin``) drops the reduced dims; reducing a split
      dim outside a ``shard_map`` all-reduces the partial results over its axes;
    - anything else is elementwise-like: each result dim takes the axes of a same-sized dim of
      a same-rank operand (the first operand first), no axis twice.

    None of them adds FLOPs or HBM bytes: next to the matmuls and attention they are small.
    """
    sub = _sub_jaxpr(eqn.params)
    if sub is not None:
        return reader.walk(sub.jaxpr, specs[-len(sub.jaxpr.invars):] if specs else [],
                           multiplier=multiplier, local=local)
    name = eqn.primitive.name
    if name.startswith("reduce_") or name in ("argmax", "argmin"):
        return [_reduction(reader, eqn, specs, multiplier, local)]
    return _elementwise(eqn, specs)


def _sub_jaxpr(params: Mapping[str, Any]) -> Any:
    for key in ("jaxpr", "call_jaxpr", "fun_jaxpr"):
        sub = params.get(key)
        if sub is not None and hasattr(sub, "jaxpr"):
            return sub
        if sub is not None and hasattr(sub, "eqns"):
            return jax.extend.core.ClosedJaxpr(sub, ())
    return None


def _reduction(reader: Reader, eqn: Any, specs: list[Spec | None], multiplier: int,
               local: bool) -> Spec:
    reduced = set(eqn.params.get("axes", ()))
    spec = specs[0] or _replicated(eqn.invars[0].aval)
    split = [a for d in reduced for a in spec[d]]
    out: Spec = tuple(s for d, s in enumerate(spec) if d not in reduced)
    if split and not local:
        reader.collect("all-reduce", split, reader.device_bytes(eqn.outvars[0].aval, out),
                       multiplier, "partial-sum")
    return out


def _elementwise(eqn: Any, specs: list[Spec | None]) -> list[Spec | None]:
    results: list[Spec | None] = []
    for out in eqn.outvars:
        shape = tuple(getattr(out.aval, "shape", ()))
        result: list[tuple[str, ...]] = [() for _ in shape]
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
        results.append(tuple(result))
    return results


RULES: dict[str, Rule] = {
    "sharding_constraint": _sharding_constraint,
    "dot_general": _dot_general,
    "pallas_call": _pallas_call,
    "scan": _scan,
    "while": _while,
    "cond": _cond,
    "shard_map": _shard_map,
    **dict.fromkeys(_EXPLICIT_KINDS, _explicit_collective),
    "transpose": _maps_spec(lambda eqn, spec: tuple(spec[p] for p in
                                                    eqn.params["permutation"])),
    "broadcast_in_dim": _maps_spec(_broadcast_spec),
    "stack": _maps_spec(_stack_spec),
    **dict.fromkeys(("reshape", "squeeze", "expand_dims"), _maps_spec(_reshape_rule_spec)),
}
"""Primitive name -> its :class:`Rule`; :func:`default_rule` reads the others. A new primitive
is a new entry (``RULES["my_kernel"] = my_rule``)."""
