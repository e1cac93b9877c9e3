"""Bounds of the Wan denoise step under a candidate, read from its jaxpr before any compile.

:func:`estimate_ir` traces the step on an abstract mesh (no devices, no compile), counts the
jaxpr with the generic reader (:func:`aoizora_lab.ir.count_jaxpr`: per-device FLOPs, HBM bytes,
parameter and activation bytes, implied collectives) and derives from the counts:

- a **lower bound**: the roofline of the totals, ``max(FLOPs / peak, bytes / HBM bandwidth)``,
  plus each collective at the bytes a device must receive over all ``2 * ndim`` of its links at
  full speed: no placement can beat it;
- a quick **estimate**: FLOPs at the chip's attention-kernel efficiency (most of the step's
  FLOPs are attention; the jaxpr does not split them by op) and bytes at its HBM efficiency,
  constants compiled predictions use too (:class:`~aoizora_lab.hardware.ChipSpec`);
  collectives priced by the ICI model on the default row-major placement (a candidate on part
  of the slice has no such placement: its collectives count at the bound).

Both apply the overlap rule (:meth:`~aoizora_lab.cost.Predicted.overlapped`): collectives of
:data:`ASYNC_KINDS` hide behind compute up to its length, the others add. Compiler flags
change which kinds run asynchronously (``CompilerFlags.async_kinds``: MaxDiffusion's Ulysses
flags make all-to-alls start / done pairs), so a plan that compiles with several flag sets
passes each set's kinds (``flag_async``) and both numbers are the lowest over them
(:attr:`IREstimate.estimates_by_kinds` keeps each set's estimate): a Ulysses candidate whose
all-to-alls fit under its compute estimates at its compute rather than at compute plus
all-to-all. Still an optimistic bet: the pooled rule hides a collective behind all of the
step's compute where a compiled schedule hides it only between its start and done, and
libtpu refuses asynchronous all-to-all in some programs on some slices
(``compile.ASYNC_FLAGS``), which no trace can tell. All prices come from
:mod:`aoizora_lab.cost`.

The counts of a trace are cached as JSON (``ir/`` under the cache root); the bounds are derived
afresh for the slice asked for.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import math
import time
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import jax
import jax.numpy as jnp
from jax.sharding import PartitionSpec as P

from aoizora_lab.candidates import Candidate
from aoizora_lab.comm_model import COLLECTIVE_KINDS, Collective, mesh_axis_groups
from aoizora_lab.cost import Predicted, comm_seconds, roofline_seconds
from aoizora_lab.errors import AoizoraError
from aoizora_lab.hardware import device_spec
from aoizora_lab.ir import IRCollective, IRCounts, count_jaxpr, spec_of
from aoizora_lab.models.wan import WanConfig, abstract_params
from aoizora_lab.topology import Topology
from aoizora_lab.versions import (
    cache_root,
    code_versions,
    digest,
    memoized,
    write_atomically,
)
from aoizora_lab.workload import Workload, denoise_step

ASYNC_KINDS: tuple[str, ...] = tuple(sorted(("all-gather", "collective-permute")))
"""Kinds the TPU compiler schedules asynchronously next to compute in the Wan step (compiled
14B@720p on v5e:4x4 and 1.3B@480p on v5e:2x4: 97-99 % of all-gather bytes (FSDP weights,
context K/V) and every ring permute were ``*-start`` ops; every all-to-all and the tensor-
parallel all-reduces synchronous, under libtpu's defaults and MaxDiffusion's Wan flags); the IR
applies the overlap rule of :mod:`aoizora_lab.cost` with them, and with what a searched flag
set adds (``flag_async``)."""
IRCacheDir = str | Path | Literal[False] | None
"""Where IR traces are cached: a folder, ``None`` for ``ir/`` under
:func:`~aoizora_lab.versions.cache_root`, ``False`` for none."""


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
    async_kinds: tuple[str, ...] = ASYNC_KINDS
    """The collective kinds the estimate lets hide behind compute: :data:`ASYNC_KINDS` plus
    those of the flag set that gives the lowest estimate (``flag_async``; the fewest kinds
    among equal estimates)."""
    estimates_by_kinds: tuple[tuple[tuple[str, ...], float], ...] = ()
    """``(kinds, estimate seconds)`` for each flag set's asynchronous kinds derived (empty:
    only :attr:`async_kinds`)."""

    def estimate_under(self, kinds: frozenset[str]) -> float:
        """The estimate with ``kinds`` asynchronous besides :data:`ASYNC_KINDS` (a flag set's
        ``async_kinds``, e.g. a system's setup compiled with its own flags); the lowest
        estimate where that set was not derived."""
        return dict(self.estimates_by_kinds).get(_async_set(kinds), self.estimate_seconds)


FlagAsync = tuple[frozenset[str], ...]
"""Per flag set a plan compiles with, the collective kinds it makes asynchronous beyond
:data:`ASYNC_KINDS` (``CompilerFlags.async_kinds``)."""
LIBTPU_DEFAULTS: FlagAsync = (frozenset(),)
"""``flag_async`` of a plan that compiles with libtpu's defaults only."""


def _async_set(kinds: Iterable[str]) -> tuple[str, ...]:
    """The collective kinds asynchronous under a flag set making ``kinds`` so: libtpu's
    defaults too, sorted (the key of :attr:`IREstimate.estimates_by_kinds`)."""
    return tuple(sorted({*ASYNC_KINDS, *kinds}))


def estimate_ir(candidate: Candidate, workload: Workload, topology: Topology, *,
                dtype: Any = None, num_layers: int | None = None,
                cache_dir: IRCacheDir = None,
                flag_async: FlagAsync = LIBTPU_DEFAULTS) -> IREstimate:
    """Trace ``workload``'s denoise step under ``candidate`` and derive its bounds.

    Tracing uses an abstract mesh: no devices, no compile. ``num_layers`` estimates a
    shallower model of the same width (to compare with a compile of that depth). See the
    module docstring for the lower bound and estimate; ``flag_async``: what each flag set the
    candidate will be compiled with makes asynchronous, both bounds the lowest over them.
    The counts of a trace are cached as JSON under ``cache_dir`` (default ``ir/`` under
    :func:`~aoizora_lab.versions.cache_root`; ``False``: no cache), keyed by the candidate,
    the model, the workload, the dtype and :func:`~aoizora_lab.versions.code_versions` of
    this module; the bounds are derived afresh for ``topology``.
    """
    check_flag_async(flag_async)
    counts, trace_seconds = trace_counts(candidate, workload, dtype=dtype,
                                         num_layers=num_layers, cache_dir=cache_dir)
    derived = [_bounds(candidate, counts, topology, trace_seconds, _async_set(kinds),
                       keep=cache_dir is not False)
               for kinds in dict.fromkeys(flag_async)]
    # More asynchronous kinds never price higher, so the lowest estimate's lower bound is
    # the lowest too; among equal estimates the fewest kinds (order-independent).
    best = min(derived, key=lambda e: (e.estimate_seconds, e.lower_bound_seconds,
                                       len(e.async_kinds)))
    return dataclasses.replace(
        best, lower_bound_seconds=min(e.lower_bound_seconds for e in derived),
        estimates_by_kinds=tuple((e.async_kinds, e.estimate_seconds) for e in derived))


def check_flag_async(flag_async: Any) -> None:
    """Raise :class:`AoizoraError` unless ``flag_async`` is a non-empty tuple of frozensets
    of collective kinds (before any trace runs)."""
    if not (isinstance(flag_async, tuple) and flag_async and all(
            isinstance(k, frozenset) and k <= set(COLLECTIVE_KINDS) for k in flag_async)):
        raise AoizoraError(
            f"flag_async={flag_async!r}: give a tuple of one frozenset of collective kinds "
            f"(of {list(COLLECTIVE_KINDS)}) per flag set, e.g. "
            "PlanOptions().flag_async(topology), or (frozenset(),) for libtpu's defaults.")


def trace_counts(candidate: Candidate, workload: Workload, *, dtype: Any = None,
                 num_layers: int | None = None, cache_dir: IRCacheDir = None
                 ) -> tuple[IRCounts, float]:
    """The counts of ``candidate``'s trace and the seconds the trace took, from the cache
    (:func:`estimate_ir`'s arguments) or traced and cached: what a slice does not change."""
    dtype = dtype or jnp.bfloat16
    model = _traced_model(workload, num_layers)
    entry = _trace_entry(candidate, workload, model, dtype, cache_dir)
    cached = _read_counts(entry) if entry is not None else None
    if cached is not None:
        return cached
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
    return counts, trace_seconds


def is_traced(candidate: Candidate, workload: Workload, *, dtype: Any = None,
              num_layers: int | None = None, cache_dir: IRCacheDir = None) -> bool:
    """Whether :func:`trace_counts` with these arguments reads its trace from the cache."""
    entry = _trace_entry(candidate, workload, _traced_model(workload, num_layers),
                         dtype or jnp.bfloat16, cache_dir)
    return entry is not None and entry.exists()


def _traced_model(workload: Workload, num_layers: int | None) -> WanConfig:
    """``workload``'s model, ``num_layers`` deep where given."""
    model = workload.config()
    return model if num_layers is None else model.with_layers(num_layers)


def _trace_entry(candidate: Candidate, workload: Workload, model: WanConfig, dtype: Any,
                 cache_dir: IRCacheDir) -> Path | None:
    """The cache file of a trace of ``model`` (``workload``'s, at the depth traced;
    ``None``: the cache is off)."""
    if cache_dir is False:
        return None
    job = {"candidate": candidate.name, "attention": candidate.attention,
           "model": dataclasses.asdict(model), "dtype": jnp.dtype(dtype).name,
           "workload": workload.program_fields(),
           "versions": code_versions(__name__)}
    key = digest(json.dumps(job, sort_keys=True))
    return Path(cache_dir or cache_root() / "ir") / f"{key}.json"


def _write_counts(entry: Path, counts: IRCounts, trace_seconds: float) -> None:
    """Write a trace's counts atomically (a temporary file renamed into place), best effort:
    a cache that cannot be written (full disk, read-only folder) costs a retrace next time,
    never the estimate."""
    payload = {**dataclasses.asdict(counts), "trace_seconds": trace_seconds}
    with contextlib.suppress(OSError):
        write_atomically(entry, json.dumps(payload))


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
            trace_seconds: float, async_kinds: tuple[str, ...], *, keep: bool) -> IREstimate:
    """:func:`_derive_bounds`, kept on disk when ``keep`` (the IR cache is on): pricing a
    trace's collectives on the slice takes ~0.1 s a candidate, and a plan prices every valid
    candidate."""
    if not keep:
        return _derive_bounds(candidate, counts, topology, trace_seconds, async_kinds)
    return memoized("ir-bounds", (candidate, digest(repr(counts)), topology.cache_key,
                                  device_spec(topology), trace_seconds, async_kinds),
                    lambda: _derive_bounds(candidate, counts, topology, trace_seconds,
                                           async_kinds),
                    code=__name__)


def _derive_bounds(candidate: Candidate, counts: IRCounts, topology: Topology,
                   trace_seconds: float, async_kinds: tuple[str, ...]) -> IREstimate:
    chip = device_spec(topology)
    compute_bound = roofline_seconds(counts.flops, counts.hbm_bytes, chip)
    compute_estimate = roofline_seconds(counts.flops, counts.hbm_bytes, chip,
                                        compute_efficiency=chip.attention_efficiency,
                                        hbm_efficiency=chip.hbm_efficiency)
    links_per_chip = 2 * topology.ndim
    placement = topology.device_grid().ravel()[:candidate.num_devices]
    bound = {True: 0.0, False: 0.0}  # by asynchronous
    collectives: dict[bool, list[Collective]] = {True: [], False: []}
    for c in counts.collectives:
        group = math.prod(candidate.mesh_shape[candidate.axis_names.index(a)] for a in c.axes)
        received = {"all-reduce": 2 * (group - 1) / group, "collective-permute": 1.0}.get(
            c.kind, (group - 1) / group) * c.bytes
        asynchronous = c.kind in async_kinds
        bound[asynchronous] += c.count * received / (links_per_chip * chip.ici_link_bandwidth)
        axis_ids = [candidate.axis_names.index(a) for a in c.axes]
        groups = mesh_axis_groups(candidate.mesh_shape, axis_ids)
        if c.kind == "collective-permute":  # shift by one along the axes (the ring pattern)
            groups = [(g[i], g[(i + 1) % len(g)]) for g in groups for i in range(len(g))]
        collectives[asynchronous].append(Collective(c.kind, groups, c.bytes, count=c.count))
    whole_slice = candidate.num_devices == topology.num_devices
    modelled = {a: (comm_seconds(items, topology, placement, chip=chip) if whole_slice
                    else bound[a])
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
        async_kinds=async_kinds,
    )
