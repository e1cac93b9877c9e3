"""Attention backends: dense reference, memory-bounded blockwise, Pallas splash (TPU).

Every backend computes ``softmax(q k^T / sqrt(d)) v`` for ``q`` ``[B, Sq, H, D]`` and ``k``, ``v``
``[B, Sk, H, D]`` and returns the output ``[B, Sq, H, D]`` **and** the row log-sum-exp
``[B, H, Sq]`` (float32) of the scaled scores. The log-sum-exp is what lets partial results
over different key blocks be merged exactly (:func:`merge_partials`): ring attention computes
one partial per K/V block it receives and merges them as it goes.

Keys at positions ``>= kv_valid`` are masked (padding added to make the token axis divisible
by a parallel degree or a kernel block); ``kv_valid`` may be a traced integer, so a ring step
can mask by the global offset of the block it holds.

- ``dense``: materialises the ``[B, H, Sq, Sk]`` scores; a reference for tiny tests only.
- ``blockwise``: a flash-style online softmax in plain JAX, scanning over query blocks and,
  inside, over key blocks; live score memory is ``[B, H, block_q, block_kv]``, never ``S x S``.
  Example: 32,768 tokens, 12 heads, blocks of 512 -> 12.6 MB of scores at a time instead of
  51.5 GB.
- ``splash``: ``jax.experimental.pallas.ops.tpu.splash_attention`` (TPU only, also deviceless);
  block sizes are chosen per sequence length (:func:`splash_block_sizes`) and both token axes
  are padded to a block multiple with padded keys masked by segment ids.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Literal

import jax
import jax.numpy as jnp
from jax import lax

from aoizora_lab.errors import AoizoraError

AttentionBackend = Literal["dense", "blockwise", "splash"]
ATTENTION_BACKENDS: tuple[str, ...] = ("dense", "blockwise", "splash")

Partial = tuple[jax.Array, jax.Array]
"""(output ``[B, Sq, H, D]``, log-sum-exp ``[B, H, Sq]`` float32)."""

_MASKED = -1e30  # finite, so fully masked rows give weight 0 after a merge, never NaN


def check_backend(backend: str) -> str:
    """Return ``backend`` if known, else raise naming the known ones."""
    if backend not in ATTENTION_BACKENDS:
        raise AoizoraError(
            f"Unknown attention backend {backend!r}; backends are {list(ATTENTION_BACKENDS)}."
        )
    return backend


def dense_attention(q: jax.Array, k: jax.Array, v: jax.Array, *,
                    kv_valid: jax.Array | int | None = None) -> Partial:
    """Reference attention that materialises all scores (tiny inputs only)."""
    scale = q.shape[-1] ** -0.5
    scores = jnp.einsum("bqhd,bkhd->bhqk", q, k, preferred_element_type=jnp.float32) * scale
    if kv_valid is not None:
        scores = jnp.where(jnp.arange(k.shape[1]) < kv_valid, scores, _MASKED)
    lse = jax.nn.logsumexp(scores, axis=-1)
    probs = jnp.exp(scores - lse[..., None])
    out = jnp.einsum("bhqk,bkhd->bqhd", probs, v.astype(jnp.float32))
    return out.astype(q.dtype), lse


def blockwise_attention(q: jax.Array, k: jax.Array, v: jax.Array, *,
                        kv_valid: jax.Array | int | None = None,
                        block_q: int = 512, block_kv: int = 512) -> Partial:
    """Flash-style attention: online softmax over key blocks, one query block at a time."""
    batch, sq, heads, dim = q.shape
    sk = k.shape[1]
    bq, bk = min(block_q, sq), min(block_kv, sk)
    nq, nk = -(-sq // bq), -(-sk // bk)
    valid = sk if kv_valid is None else kv_valid
    q = _pad_axis(q, 1, nq * bq) * jnp.asarray(dim ** -0.5, q.dtype)
    k, v = _pad_axis(k, 1, nk * bk), _pad_axis(v, 1, nk * bk)
    q_blocks = q.reshape(batch, nq, bq, heads, dim).swapaxes(0, 1)
    k_blocks = k.reshape(batch, nk, bk, heads, dim).swapaxes(0, 1)
    v_blocks = v.reshape(batch, nk, bk, heads, dim).swapaxes(0, 1)

    def one_query_block(_, q_block):
        def one_key_block(carry, inputs):
            m, denom, acc = carry
            k_block, v_block, start = inputs
            s = jnp.einsum("bqhd,bkhd->bhqk", q_block, k_block,
                           preferred_element_type=jnp.float32)
            s = jnp.where(start + jnp.arange(bk) < valid, s, _MASKED)
            m_new = jnp.maximum(m, s.max(axis=-1))
            p = jnp.exp(s - m_new[..., None])
            correction = jnp.exp(m - m_new)
            denom = denom * correction + p.sum(axis=-1)
            acc = acc * correction[..., None] + jnp.einsum(
                "bhqk,bkhd->bhqd", p.astype(v_block.dtype), v_block,
                preferred_element_type=jnp.float32)
            return (m_new, denom, acc), None

        init = (jnp.full((batch, heads, bq), _MASKED, jnp.float32),
                jnp.zeros((batch, heads, bq), jnp.float32),
                jnp.zeros((batch, heads, bq, dim), jnp.float32))
        starts = jnp.arange(nk) * bk
        (m, denom, acc), _ = lax.scan(one_key_block, init, (k_blocks, v_blocks, starts))
        out = (acc / denom[..., None]).transpose(0, 2, 1, 3)
        return None, (out.astype(q.dtype), m + jnp.log(denom))

    _, (out, lse) = lax.scan(one_query_block, None, q_blocks)
    out = out.swapaxes(0, 1).reshape(batch, nq * bq, heads, dim)[:, :sq]
    lse = lse.transpose(1, 2, 0, 3).reshape(batch, heads, nq * bq)[..., :sq]
    return out, lse


def splash_block_sizes(q_len: int, kv_len: int) -> tuple[int, int, int]:
    """(block_q, block_kv, block_kv_compute) for splash attention on these lengths.

    Measured with deviceless v5e compiles (libtpu 0.0.42.1): at 75k tokens the default blocks
    overflow the 1 MiB SMEM with mask metadata and ``block_q=2048`` overflows the 16 MiB
    scoped VMEM, while
    ``1024 / 1024 / 512`` compiles. Shorter sequences use blocks no longer than the padded
    sequence, in multiples of 128 (the TPU lane width).
    """
    def fit(length: int, preferred: int) -> int:
        return min(preferred, 128 * -(-length // 128))
    block_q, block_kv = fit(q_len, 1024), fit(kv_len, 1024)
    return block_q, block_kv, min(512, block_kv)


def splash_attention(q: jax.Array, k: jax.Array, v: jax.Array, *,
                     kv_valid: jax.Array | int | None = None,
                     interpret: bool = False) -> Partial:
    """Pallas splash attention (TPU): one kernel per batch element, all heads at once.

    ``interpret=True`` runs the same kernel in the Pallas interpreter (any backend, slowly):
    how the tests check it against dense attention on CPU."""
    from jax.experimental.pallas.ops.tpu.splash_attention import (
        splash_attention_kernel as kernel,
    )
    from jax.experimental.pallas.ops.tpu.splash_attention import (
        splash_attention_mask as masks,
    )

    _, sq, heads, dim = q.shape
    sk = k.shape[1]
    block_q, block_kv, block_kv_compute = splash_block_sizes(sq, sk)
    sq_pad, sk_pad = block_q * -(-sq // block_q), block_kv * -(-sk // block_kv)
    valid = sk if kv_valid is None else kv_valid
    mha = kernel.make_splash_mha(
        mask=masks.MultiHeadMask([masks.FullMask((sq_pad, sk_pad))] * heads),
        head_shards=1, q_seq_shards=1, save_residuals=True,
        block_sizes=kernel.BlockSizes(block_q=block_q, block_kv=block_kv,
                                      block_kv_compute=block_kv_compute),
        interpret=interpret)
    scaled = _pad_axis(q * jnp.asarray(dim ** -0.5, q.dtype), 1, sq_pad)
    k, v = _pad_axis(k, 1, sk_pad), _pad_axis(v, 1, sk_pad)
    segments = kernel.SegmentIds(
        q=jnp.zeros((sq_pad,), jnp.int32),
        kv=jnp.where(jnp.arange(sk_pad) < valid, 0, 1).astype(jnp.int32))

    def one(qb, kb, vb):
        out, (lse,) = mha(qb.swapaxes(0, 1), kb.swapaxes(0, 1), vb.swapaxes(0, 1),
                          segment_ids=segments)
        return out.swapaxes(0, 1), lse

    out, lse = jax.vmap(one)(scaled, k, v)
    return out[:, :sq].astype(q.dtype), lse[..., :sq].astype(jnp.float32)


def attention_fn(backend: str, **options: int) -> Callable[..., Partial]:
    """The backend's function ``(q, k, v, *, kv_valid=None) -> (out, lse)``."""
    fn = {"dense": dense_attention, "blockwise": blockwise_attention,
          "splash": splash_attention}[check_backend(backend)]
    return functools.partial(fn, **options) if options else fn


def merge_partials(a: Partial, b: Partial) -> Partial:
    """Exact softmax merge of two partial attentions over disjoint key sets."""
    (out_a, lse_a), (out_b, lse_b) = a, b
    lse = jnp.logaddexp(lse_a, lse_b)
    weight_a = jnp.exp(lse_a - lse).transpose(0, 2, 1)[..., None]
    weight_b = jnp.exp(lse_b - lse).transpose(0, 2, 1)[..., None]
    out = out_a.astype(jnp.float32) * weight_a + out_b.astype(jnp.float32) * weight_b
    return out.astype(out_a.dtype), lse


def _pad_axis(x: jax.Array, axis: int, size: int) -> jax.Array:
    extra = size - x.shape[axis]
    if extra == 0:
        return x
    widths = [(0, 0)] * x.ndim
    widths[axis] = (0, extra)
    return jnp.pad(x, widths)
