"""Parallel strategies of the Wan forward: which mesh axis does what, as ordinary JAX sharding.

A :class:`ParallelPlan` names a ``jax.sharding.Mesh`` and gives each of its axes one *role*:

- ``cfg``: the conditional and unconditional passes (batch of 2) on different devices;
- ``ulysses``: tokens sharded; an all-to-all turns token shards into head shards for attention
  and back (heads per device must divide by the degree: no head padding, the candidate
  enumerator excludes such degrees);
- ``ring``: tokens sharded; K/V blocks rotate around the axis with ``ppermute`` while each device
  merges partial attentions with an online softmax;
- ``context`` (MaxDiffusion): queries sharded by token, K/V all-gathered on every device;
- ``tp``: Megatron tensor parallelism: q/k/v/FFN-in column-sharded (heads split), o/FFN-out
  row-sharded;

and, independently, ``fsdp_axes``: weights stored sharded over those axes and gathered layer by
layer inside the scan (what lets 14B fit on 16 GB chips). Ulysses and ring compose on two axes
(USP); the token axis is split over ``context``, ``ring`` and ``ulysses`` axes in that order, so
that after the Ulysses all-to-all each device holds one contiguous run of tokens.

Example: ``ParallelPlan(mesh, {"c": "cfg", "u": "ulysses", "r": "ring"}, fsdp_axes=("u", "r"))``
on a ``(2, 4, 2)`` mesh is cfg2 x ulysses4 x ring2 with weights sharded 8 ways.

Everything outside attention is plain GSPMD (``with_sharding_constraint`` on activations and
weights); attention runs inside ``shard_map`` because its collective pattern (all-to-all,
ring ``ppermute``, Pallas splash) must be spelled out.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import jax
import jax.numpy as jnp
from jax import lax
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from aoizora_lab.errors import AoizoraError, is_whole
from aoizora_lab.models.attention import (
    Partial,
    attention_fn,
    check_backend,
    merge_partials,
)

ROLES: tuple[str, ...] = ("cfg", "ulysses", "ring", "context", "tp")
SEQUENCE_ROLES: tuple[str, ...] = ("context", "ring", "ulysses")


def spec_shards(spec: P | tuple[Any, ...], axis_sizes: Mapping[str, int]) -> int:
    """Into how many pieces ``spec`` splits an array: the product of the axes it names."""
    shards = 1
    for entry in spec:
        for axis in (entry,) if isinstance(entry, str) else (entry or ()):
            shards *= axis_sizes[axis]
    return shards


@dataclass(frozen=True)
class ParallelPlan:
    """A mesh and the parallel role of each of its axes (see the module docstring)."""

    mesh: Mesh | None = None
    """The device mesh; ``None`` runs unsharded on the default device."""
    roles: Mapping[str, str] = field(default_factory=dict)
    """Mesh axis name -> role, one of :data:`ROLES`; every mesh axis needs one."""
    fsdp_axes: tuple[str, ...] = ()
    """Mesh axes the weights are sharded over (gathered layer by layer)."""
    attention: str = "blockwise"
    """Attention backend inside each device: ``dense``, ``blockwise`` or ``splash`` (TPU)."""
    attention_block: int = 512
    """Query and key block length of the ``blockwise`` backend."""
    ulysses_chunks: int = 1
    """Self-attention in this many head chunks, each with its own all-to-alls (MaxDiffusion's
    ``ulysses_attention_chunks``): the compiler may run one chunk's all-to-all while another
    attends (:func:`ulysses_head_chunks`). 1: one pass."""

    def __post_init__(self) -> None:
        check_backend(self.attention)
        check_ulysses_chunks(self.ulysses_chunks, bool(self.axes("ulysses")))
        names = tuple(self.mesh.axis_names) if self.mesh is not None else ()
        if set(self.roles) != set(names):
            raise AoizoraError(
                f"ParallelPlan roles name axes {sorted(self.roles)} but the mesh has axes "
                f"{list(names)}; give every mesh axis exactly one role from {list(ROLES)}."
            )
        bad = {a: r for a, r in self.roles.items() if r not in ROLES}
        if bad:
            raise AoizoraError(f"Unknown parallel roles {bad}; roles are {list(ROLES)}.")
        for role in ROLES:
            if len(self.axes(role)) > 1:
                raise AoizoraError(
                    f"Role {role!r} is given to several mesh axes {self.axes(role)}; "
                    "merge them into one axis."
                )
        unknown = [a for a in self.fsdp_axes if a not in names]
        if unknown or set(self.fsdp_axes) & set(self.axes("tp")):
            raise AoizoraError(
                f"fsdp_axes {self.fsdp_axes} must be mesh axes {list(names)} other than the tp "
                "axis (tp already shards the weights it splits)."
            )

    # ------------------------------------------------------------------ axes

    def axes(self, role: str) -> tuple[str, ...]:
        """Mesh axes with ``role`` (zero or one)."""
        return tuple(a for a, r in self.roles.items() if r == role)

    def size(self, role: str) -> int:
        """Degree of ``role`` (1 when no axis has it)."""
        return math.prod(self.mesh.shape[a] for a in self.axes(role)) if self.mesh else 1

    @property
    def sequence_axes(self) -> tuple[str, ...]:
        """Axes splitting the token axis, outermost first: context, ring, ulysses."""
        return tuple(a for role in SEQUENCE_ROLES for a in self.axes(role))

    @property
    def sequence_degree(self) -> int:
        """How many shards the token axis is split into."""
        return math.prod(self.size(r) for r in SEQUENCE_ROLES)

    @property
    def fsdp_degree(self) -> int:
        """How many shards FSDP splits each weight into."""
        return math.prod(self.mesh.shape[a] for a in self.fsdp_axes) if self.mesh else 1

    def padded_tokens(self, tokens: int) -> int:
        """Token count padded up to a multiple of the sequence degree."""
        return self.sequence_degree * -(-tokens // self.sequence_degree)

    def check_model(self, *, num_heads: int, batch: int) -> None:
        """Raise unless heads and batch divide by the degrees that split them."""
        tp, uly, cfg = self.size("tp"), self.size("ulysses"), self.size("cfg")
        if num_heads % (tp * uly):
            raise AoizoraError(
                f"{num_heads} attention heads do not divide by tp x ulysses = {tp} x {uly}; "
                "pick degrees whose product divides the head count (heads are not padded)."
            )
        if self.ulysses_chunks > num_heads // (tp * uly):
            raise AoizoraError(
                f"ulysses_chunks={self.ulysses_chunks} exceeds the {num_heads // (tp * uly)} "
                f"groups of {uly} heads each device holds ({num_heads} heads / tp {tp}): give "
                "at most that many chunks.")
        if batch % cfg:
            raise AoizoraError(
                f"Batch {batch} does not divide by the cfg degree {cfg}; cfg parallelism needs "
                "the conditional and unconditional passes batched (batch 2)."
            )

    # ------------------------------------------------------------------ specs

    def _one(self, role: str) -> str | None:
        axes = self.axes(role)
        return axes[0] if axes else None

    @property
    def activation_spec(self) -> P:
        """Spec of token activations ``[B, S, D]``."""
        return P(self._one("cfg"), self.sequence_axes or None, None)

    def heads_spec(self, *, sequence: bool) -> P:
        """Spec of ``[B, S, H, D]`` attention inputs; ``sequence=False`` for text/image K/V."""
        return P(self._one("cfg"), (self.sequence_axes or None) if sequence else None,
                 self._one("tp"), None)

    def constrain(self, x: jax.Array, spec: P) -> jax.Array:
        """``with_sharding_constraint`` on the plan's mesh; identity when unsharded."""
        if self.mesh is None:
            return x
        return lax.with_sharding_constraint(x, NamedSharding(self.mesh, spec))

    def weight_spec(self, shape: tuple[int, ...], tp_dim: int | None, *,
                    stored: bool) -> P:
        """Spec of one weight: tp on ``tp_dim``; when ``stored``, FSDP on the largest other dim.

        The stacked layer axis (dim 0 of block weights) is never sharded. FSDP picks the largest
        dim that divides by the FSDP degree; a weight with none stays replicated over those axes.
        """
        spec: list[Any] = [None] * len(shape)
        if tp_dim is not None and self._one("tp") is not None:
            spec[tp_dim] = self._one("tp")
        if stored and self.fsdp_axes and len(shape) >= 2:
            candidates = [d for d in range(len(shape)) if d != tp_dim
                          and shape[d] % self.fsdp_degree == 0 and shape[d] >= self.fsdp_degree]
            if candidates:
                spec[max(candidates, key=lambda d: shape[d])] = self.fsdp_axes
        return P(*spec)

    # ------------------------------------------------------------------ attention

    def _local_attention(self) -> Any:
        if self.attention == "blockwise":
            return attention_fn("blockwise", block_q=self.attention_block,
                                block_kv=self.attention_block)
        return attention_fn(self.attention)

    def self_attention(self, q: jax.Array, k: jax.Array, v: jax.Array, *,
                       valid_tokens: int) -> jax.Array:
        """Attention over the (sharded) token axis; keys at ``>= valid_tokens`` are padding."""
        local = self._local_attention()
        if self.mesh is None:
            return local(q, k, v, kv_valid=valid_tokens)[0]
        spec = self.heads_spec(sequence=True)
        body = _SelfAttentionBody(self, local, valid_tokens)
        return jax.shard_map(body, mesh=self.mesh, in_specs=(spec, spec, spec),
                             out_specs=spec, check_vma=False)(q, k, v)

    def cross_attention(self, q: jax.Array, k: jax.Array, v: jax.Array) -> jax.Array:
        """Attention of token queries to replicated text/image keys (no masking)."""
        local = self._local_attention()
        if self.mesh is None:
            return local(q, k, v)[0]
        q_spec, kv_spec = self.heads_spec(sequence=True), self.heads_spec(sequence=False)
        return jax.shard_map(lambda a, b, c: local(a, b, c)[0], mesh=self.mesh,
                             in_specs=(q_spec, kv_spec, kv_spec), out_specs=q_spec,
                             check_vma=False)(q, k, v)


@dataclass(frozen=True)
class _SelfAttentionBody:
    """The per-device body of sharded self-attention (inside ``shard_map``)."""

    plan: ParallelPlan
    local: Any
    valid_tokens: int

    def __call__(self, q: jax.Array, k: jax.Array, v: jax.Array) -> jax.Array:
        if self.plan.ulysses_chunks == 1:
            return self._attend(q, k, v)
        ranges = ulysses_head_chunks(q.shape[2], self.plan.size("ulysses"),
                                     self.plan.ulysses_chunks)
        return jnp.concatenate([self._attend(q[:, :, a:b], k[:, :, a:b], v[:, :, a:b])
                                for a, b in ranges], axis=2)

    def _attend(self, q: jax.Array, k: jax.Array, v: jax.Array) -> jax.Array:
        plan = self.plan
        uly, ring, ctx = (plan._one(r) for r in ("ulysses", "ring", "context"))
        if uly is not None:  # tokens -> heads
            q, k, v = (lax.all_to_all(t, uly, split_axis=2, concat_axis=1, tiled=True)
                       for t in (q, k, v))
        if ctx is not None:  # MaxDiffusion context: every device gets all K/V of its ring slot
            k, v = (lax.all_gather(t, ctx, axis=1, tiled=True) for t in (k, v))
        run = q.shape[1]  # tokens of one contiguous run after the all-to-all
        ring_size = plan.size("ring")
        ring_index = lax.axis_index(ring) if ring is not None else 0
        contexts = plan.size("context")

        def attend(k_held: jax.Array, v_held: jax.Array, held: jax.Array | int) -> Partial:
            # Local keys: one run per context block c, at ring slot `held`. Padding is the global
            # end, so the valid keys are a prefix of this concatenation: count them.
            starts = (jnp.arange(contexts) * ring_size + held) * run
            kv_valid = jnp.clip(self.valid_tokens - starts, 0, run).sum()
            return self.local(q, k_held, v_held, kv_valid=kv_valid)

        result = attend(k, v, ring_index)
        for step in range(1, ring_size):  # K/V move one slot forward per step
            perm = [(j, (j + 1) % ring_size) for j in range(ring_size)]
            k, v = lax.ppermute(k, ring, perm), lax.ppermute(v, ring, perm)
            result = merge_partials(result, attend(k, v, (ring_index - step) % ring_size))
        out = result[0]
        if uly is not None:  # heads -> tokens
            out = lax.all_to_all(out, uly, split_axis=1, concat_axis=2, tiled=True)
        return out


def check_ulysses_chunks(chunks: Any, ulysses: bool, example: str = "") -> None:
    """Raise unless ``chunks`` is a whole number >= 1, above 1 only with a ulysses axis (the
    chunks split the all-to-alls of Ulysses); ``example`` shows the fix in the caller's
    words."""
    if not is_whole(chunks) or (chunks > 1 and not ulysses):
        raise AoizoraError(
            f"ulysses_chunks={chunks!r}: a whole number >= 1, and above 1 only with a ulysses "
            "axis (the chunks split the all-to-alls of Ulysses)"
            + (f", e.g. {example!r}." if example else "."))


def ulysses_head_chunks(heads: int, ulysses: int, chunks: int) -> list[tuple[int, int]]:
    """The head ranges of chunked Ulysses, as MaxDiffusion's ``_ulysses_head_chunk_ranges``
    cuts them: whole groups of ``ulysses`` heads, ``groups // chunks`` per chunk and the rest
    in the last (at most one chunk per group).

    Example: 40 heads, Ulysses 8 (5 groups), 2 chunks: ``[(0, 16), (16, 40)]``.
    """
    groups = heads // ulysses
    chunks = min(chunks, groups)
    per = groups // chunks
    cuts = [i * per * ulysses for i in range(chunks)] + [heads]
    return list(itertools.pairwise(cuts))
