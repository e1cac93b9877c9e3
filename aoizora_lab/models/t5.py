"""Wan 2.1's UMT5-XXL text encoder in JAX, faithful to the official ``wan/modules/t5.py``.

Source: github.com/Wan-Video/Wan2.1, ``wan/modules/t5.py`` at commit
9737cba9c1c3c4d04b33fcad41c111989865d315 (``T5Encoder`` and its blocks, built by
``umt5_xxl(encoder_only=True)`` and called by ``T5EncoderModel``); ``tests/data/umt5_tiny.*``
is a golden output of that code (``tools/make_t5_fixture.py``).

:func:`encode` maps token ids ``[B, L]`` and the tokenizer's 0/1 attention mask to the text
states ``[B, L, dim]``, as ``T5Encoder.forward(ids, mask)``:

1. ``token_embedding`` lookup (no scaling; dropout is the identity at inference);
2. ``num_layers`` pre-norm blocks, each ``x + attn(norm1(x))`` then ``x + ffn(norm2(x))``:

   - ``T5LayerNorm``: RMS over channels in float32, no mean, no bias, eps 1e-6, times weight;
   - attention: ``q k^T`` per head *without* the ``1 / sqrt(head_dim)`` scale, plus a learned
     relative position bias ``[heads, L, L]``; keys whose mask is 0 get the dtype's most
     negative value instead (the bias is replaced, not added to); softmax in float32; output
     projection ``o``. Padded positions still act as queries: their rows are computed, and
     later cut off by ``T5EncoderModel``;
   - position bias: each block has its own ``T5RelativeEmbedding`` (``shared_pos=False``, the
     UMT5 way; T5 shares one): ``key - query`` goes into one of ``num_buckets`` buckets,
     bidirectional (:func:`relative_position_bucket`), which indexes a ``[num_buckets, heads]``
     table;
   - FFN: gated GELU, ``fc2(fc1(x) * gelu_tanh(gate(x)))``, all without bias;
3. a final ``T5LayerNorm``.

``T5EncoderModel`` tokenises every prompt to ``text_len = 512`` tokens (right padding with
id 0, EOS id 1 ending the prompt), encodes them, and returns each prompt's first
``sum(mask)`` rows; ``WanModel.forward`` pads those back to ``text_len`` with zeros.
:func:`zero_padded_context` gives that array in one piece, which is what the DiT consumes.

Shapes for one 512-token prompt through the :meth:`T5Config.umt5_xxl` preset (64 heads of 64):
ids ``[1, 512]`` -> embedding ``[1, 512, 4096]``; per block q, k, v ``[1, 512, 64, 64]``,
position bias and logits ``[1, 64, 512, 512]``, FFN hidden ``[1, 512, 10240]``; out
``[1, 512, 4096]``. 5.68e9 parameters (1.05e9 of them the embedding table; 11.4 GB in
bfloat16, the released ``models_t5_umt5-xxl-enc-bf16.pth``), about 4.8e12 FLOPs a prompt
(2 x 4.63e9 non-embedding parameters x 512 tokens, plus 1.0e11 for attention).

Parameters keep the official state-dict names and layouts (Linear ``[out, in]``, Embedding
``[num, dim]``, T5LayerNorm weight ``[dim]``), so a checkpoint's tensors are used as they are.
Computation runs in the parameters' dtype (the released ``t5_dtype`` is bfloat16) with the
official float32 islands (RMS statistics, softmax); :func:`encode` returns float32.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from aoizora_lab.errors import AoizoraError, is_whole
from aoizora_lab.models.checkpoint import load_named

Params = dict[str, jax.Array]

WAN21_TEXT_LEN = 512
"""Tokens every prompt is padded or truncated to (official ``shared_config.text_len``)."""
PAD_ID = 0
"""``google/umt5-xxl``'s padding id; the mask, not the id, is what hides padding."""
EOS_ID = 1
"""``google/umt5-xxl``'s end-of-sequence id, the last token of every tokenised prompt."""
_NORM_EPS = 1e-6  # official T5LayerNorm default


@dataclass(frozen=True)
class T5Config:
    """UMT5 encoder hyper-parameters, named as the official ``T5Encoder`` arguments.

    The defaults are the released UMT5-XXL encoder, spelled out by :meth:`umt5_xxl`.
    """

    vocab: int = 256384
    """Token-embedding rows (the official ``vocab_size``, ``google/umt5-xxl``'s vocabulary)."""
    dim: int = 4096
    """Width of the residual stream and of the output states."""
    dim_attn: int = 4096
    """Width of q, k and v over all heads (``num_heads * head_dim``)."""
    dim_ffn: int = 10240
    """Hidden width of the gated-GELU feed-forward."""
    num_heads: int = 64
    """Attention heads; ``dim_attn`` must divide by it."""
    num_layers: int = 24
    """Encoder blocks (the official ``encoder_layers``)."""
    num_buckets: int = 32
    """Relative-position buckets, half for keys before the query and half for keys after."""
    shared_pos: bool = False
    """One position-bias table for all blocks (T5) rather than one per block (UMT5: False)."""
    max_dist: int = 128
    """Distance from which every position falls in the farthest bucket (official
    ``T5RelativeEmbedding`` default; not a ``T5Encoder`` argument)."""

    def __post_init__(self) -> None:
        self.validate()

    def validate(self) -> None:
        """Raise :class:`AoizoraError` on values the official encoder cannot be built with."""
        for name in ("vocab", "dim", "dim_attn", "dim_ffn", "num_heads", "num_layers"):
            if not is_whole(getattr(self, name)):
                raise AoizoraError(
                    f"T5Config.{name}={getattr(self, name)!r} must be an integer >= 1."
                )
        if self.dim_attn % self.num_heads:
            raise AoizoraError(
                f"T5Config.dim_attn={self.dim_attn} must divide into num_heads={self.num_heads} "
                "heads (the official T5Attention asserts it), e.g. 4096 and 64."
            )
        if not is_whole(self.num_buckets, minimum=4) or self.num_buckets % 2:
            raise AoizoraError(
                f"T5Config.num_buckets={self.num_buckets!r} must be an even integer >= 4: the "
                "bidirectional buckets split it in two halves, each with num_buckets // 4 exact "
                "distances, e.g. 32."
            )
        if not is_whole(self.max_dist, minimum=self.num_buckets // 4 + 1):
            raise AoizoraError(
                f"T5Config.max_dist={self.max_dist!r} must be an integer above the "
                f"{self.num_buckets // 4} exact distances of num_buckets={self.num_buckets}, "
                "e.g. 128."
            )
        if not isinstance(self.shared_pos, bool | np.bool_):
            raise AoizoraError(f"T5Config.shared_pos={self.shared_pos!r} must be True or False.")

    @classmethod
    def umt5_xxl(cls) -> T5Config:
        """The released encoder (``models_t5_umt5-xxl-enc-bf16.pth``, official ``umt5_xxl``)."""
        return cls(vocab=256384, dim=4096, dim_attn=4096, dim_ffn=10240, num_heads=64,
                   num_layers=24, num_buckets=32, shared_pos=False, max_dist=128)

    @property
    def head_dim(self) -> int:
        """Width of one head's q, k and v."""
        return self.dim_attn // self.num_heads


# ----------------------------------------------------------------------------- parameters

def param_shapes(config: T5Config) -> dict[str, tuple[int, ...]]:
    """Official state-dict name -> shape of every parameter, in ``named_parameters`` order."""
    d, a, f, nb, n = config.dim, config.dim_attn, config.dim_ffn, config.num_buckets, \
        config.num_heads
    shapes: dict[str, tuple[int, ...]] = {"token_embedding.weight": (config.vocab, d)}
    if config.shared_pos:
        shapes["pos_embedding.embedding.weight"] = (nb, n)
    for i in range(config.num_layers):
        p = f"blocks.{i}"
        shapes[f"{p}.norm1.weight"] = (d,)
        for proj in "qkv":
            shapes[f"{p}.attn.{proj}.weight"] = (a, d)
        shapes[f"{p}.attn.o.weight"] = (d, a)
        shapes[f"{p}.norm2.weight"] = (d,)
        shapes[f"{p}.ffn.gate.0.weight"] = (f, d)
        shapes[f"{p}.ffn.fc1.weight"] = (f, d)
        shapes[f"{p}.ffn.fc2.weight"] = (d, f)
        if not config.shared_pos:
            shapes[f"{p}.pos_embedding.embedding.weight"] = (nb, n)
    shapes["norm.weight"] = (d,)
    return shapes


def abstract_encoder_params(config: T5Config, dtype: Any = jnp.bfloat16) -> Params:
    """The parameters as ``ShapeDtypeStruct``s: shapes for lowering, nothing allocated."""
    return {n: jax.ShapeDtypeStruct(s, dtype) for n, s in param_shapes(config).items()}


def init_encoder_params(config: T5Config, key: jax.Array, dtype: Any = jnp.float32) -> Params:
    """Random parameters: Linear weights normal of variance 1 / fan_in, unit norm weights.

    The token embedding is standard normal (as the official init), the position tables normal
    of standard deviation 1 / sqrt(2 num_buckets num_heads) (as the official init), so a random
    encoder gives states of order one for timing and sharding work. Each parameter is drawn in
    ``dtype`` with its own key; the blocks repeat a handful of shapes, so only those few
    generators compile. (The full UMT5-XXL is 11.4 GB in bfloat16, 22.7 GB in float32.)
    """
    params = {}
    pos_std = (2 * config.num_buckets * config.num_heads) ** -0.5
    for i, (name, shape) in enumerate(param_shapes(config).items()):
        if name.endswith(("norm.weight", "norm1.weight", "norm2.weight")):
            params[name] = jnp.ones(shape, dtype)
            continue
        std = (1.0 if name == "token_embedding.weight"
               else pos_std if name.endswith("pos_embedding.embedding.weight")
               else shape[1] ** -0.5)
        params[name] = jax.random.normal(jax.random.fold_in(key, i), shape, dtype) * \
            jnp.asarray(std, dtype)
    return params


def load_encoder_params(source: Mapping[str, Any] | str | Path, config: T5Config,
                        dtype: Any = jnp.float32) -> Params:
    """The encoder's parameters from an official state dict or a ``.safetensors`` file.

    ``source`` maps official names to arrays (numpy, or torch tensors, e.g. a ``torch.load``-ed
    ``models_t5_umt5-xxl-enc-bf16.pth``, whose bfloat16 tensors pass through float32, one at a
    time, as numpy has no torch bfloat16) or is a ``.safetensors`` path. Other keys (a
    fixture's inputs) are ignored; a missing or misshaped parameter is an error naming it.
    """
    return load_named(source, param_shapes(config), what="a UMT5 encoder checkpoint", config=config,
                      dtype=dtype)


# ----------------------------------------------------------------------------- position bias

def relative_position_bucket(rel_pos: Any, num_buckets: int = 32, max_dist: int = 128,
                             bidirectional: bool = True) -> np.ndarray:
    """Official ``T5RelativeEmbedding._relative_position_bucket`` of ``key - query`` offsets.

    Bidirectional (the encoder): keys after the query (``rel_pos > 0``) use the upper half of
    the buckets. Within a half of ``nb = num_buckets // 2``, distances below ``nb // 2`` are
    their own bucket; larger ones get ``nb // 2 + trunc(log(d / (nb // 2)) / log(max_dist /
    (nb // 2)) * (nb - nb // 2))``, at most ``nb - 1``, in float32 as the official code. For 32
    buckets: offsets 0, -1, -7 -> 0, 1, 7; -8 -> 8; -16 -> 10; 1 -> 17; 12 -> 25; +-128 and
    beyond -> 15 and 31. Plain numpy: the sequence length is static, so the buckets are a
    constant of the compiled program.
    """
    rel_pos = np.asarray(rel_pos, np.int64)
    if bidirectional:
        num_buckets //= 2
        buckets = (rel_pos > 0).astype(np.int64) * num_buckets
        rel_pos = np.abs(rel_pos)
    else:
        buckets = np.zeros_like(rel_pos)
        rel_pos = -np.minimum(rel_pos, 0)
    max_exact = num_buckets // 2
    # float32 throughout, as torch: log(rel / max_exact) / log(max_dist / max_exact) * width.
    # (The official code takes log(0) = -inf where the exact branch is chosen; 1 avoids it.)
    scaled = (np.log(np.maximum(rel_pos, 1).astype(np.float32) / np.float32(max_exact))
              / np.float32(math.log(max_dist / max_exact))
              * np.float32(num_buckets - max_exact))
    large = np.minimum(max_exact + scaled.astype(np.int64), num_buckets - 1)
    return buckets + np.where(rel_pos < max_exact, rel_pos, large)


def position_bias(table: jax.Array, length: int, config: T5Config) -> jax.Array:
    """Official ``T5RelativeEmbedding(length, length)``: ``[1, num_heads, L, L]`` from a
    ``[num_buckets, num_heads]`` table; entry ``[0, h, i, j]`` is head h's bias of key j for
    query i."""
    rel = np.arange(length)[None, :] - np.arange(length)[:, None]
    buckets = relative_position_bucket(rel, config.num_buckets, config.max_dist, True)
    return jnp.transpose(jnp.take(table, jnp.asarray(buckets, jnp.int32), axis=0), (2, 0, 1))[None]


# ----------------------------------------------------------------------------- forward

def _layer_norm(x: jax.Array, weight: jax.Array) -> jax.Array:
    """Official ``T5LayerNorm``: ``x / rms(x)`` with float32 statistics, then times weight."""
    xf = x.astype(jnp.float32)
    y = xf * jax.lax.rsqrt(jnp.mean(jnp.square(xf), axis=-1, keepdims=True) + _NORM_EPS)
    return weight.astype(x.dtype) * y.astype(x.dtype)


def _gelu_tanh(x: jax.Array) -> jax.Array:
    """Official ``GELU``: the tanh approximation, spelled as the official code."""
    return 0.5 * x * (1.0 + jnp.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * x ** 3)))


def _linear(x: jax.Array, weight: jax.Array) -> jax.Array:
    return jnp.einsum("...i,oi->...o", x, weight.astype(x.dtype))


def _fp16_clamp(x: jax.Array) -> jax.Array:
    """Official ``fp16_clamp``: float16 only, and only once something overflowed."""
    if x.dtype != jnp.float16:
        return x
    limit = float(jnp.finfo(jnp.float16).max) - 1000
    return jnp.where(jnp.isinf(x).any(), jnp.clip(x, -limit, limit), x)


def _attention(x: jax.Array, params: Params, p: str, bias: jax.Array, keep: jax.Array,
               config: T5Config) -> jax.Array:
    """Official ``T5Attention`` (self-attention): no scaling, mask replaces the bias."""
    b, length, _ = x.shape
    q, k, v = (_linear(x, params[f"{p}.attn.{n}.weight"]).reshape(
        b, length, config.num_heads, config.head_dim) for n in "qkv")
    # attn_bias = zeros + pos_bias, then masked_fill(mask == 0, finfo.min): [B, N, L, L]
    attn_bias = jnp.where(keep[:, None, None, :], bias.astype(x.dtype),
                          jnp.finfo(x.dtype).min)
    logits = jnp.einsum("binc,bjnc->bnij", q, k) + attn_bias
    attn = jax.nn.softmax(logits.astype(jnp.float32), axis=-1).astype(x.dtype)
    out = jnp.einsum("bnij,bjnc->binc", attn, v).reshape(b, length, config.dim_attn)
    return _linear(out, params[f"{p}.attn.o.weight"])


def _feed_forward(x: jax.Array, params: Params, p: str) -> jax.Array:
    """Official ``T5FeedForward``: ``fc2(fc1(x) * gelu_tanh(gate(x)))``."""
    gate = _gelu_tanh(_linear(x, params[f"{p}.ffn.gate.0.weight"]))
    return _linear(_linear(x, params[f"{p}.ffn.fc1.weight"]) * gate,
                   params[f"{p}.ffn.fc2.weight"])


def encode(params: Params, ids: jax.Array, mask: jax.Array | None, config: T5Config) -> jax.Array:
    """Text states ``[B, L, dim]`` float32: the official ``T5Encoder.forward(ids, mask)``.

    ``ids`` is ``[B, L]`` integer token ids, ``mask`` the tokenizer's ``[B, L]`` attention mask
    (nonzero = token, 0 = padding; ``None`` = no padding). Every position is computed, padded
    ones included (their rows are what the official encoder gives, and are discarded
    downstream: :func:`zero_padded_context`). Computes in the token embedding's dtype. Ids
    outside the vocabulary are an error when their values are known; under ``jit`` they are
    not, and such a token's row would be NaN (``jnp.take``'s fill).
    """
    _check_tokens(config, ids, mask)
    embedding = params["token_embedding.weight"]
    b, length = ids.shape
    keep = (jnp.ones((b, length), bool) if mask is None else jnp.asarray(mask) != 0)
    x = jnp.take(embedding, jnp.asarray(ids), axis=0)
    shared = (position_bias(params["pos_embedding.embedding.weight"], length, config)
              if config.shared_pos else None)
    for i in range(config.num_layers):
        p = f"blocks.{i}"
        bias = shared if config.shared_pos else position_bias(
            params[f"{p}.pos_embedding.embedding.weight"], length, config)
        x = _fp16_clamp(x + _attention(_layer_norm(x, params[f"{p}.norm1.weight"]), params, p,
                                       bias, keep, config))
        x = _fp16_clamp(x + _feed_forward(_layer_norm(x, params[f"{p}.norm2.weight"]), params, p))
    return _layer_norm(x, params["norm.weight"]).astype(jnp.float32)


def zero_padded_context(states: jax.Array, mask: jax.Array) -> jax.Array:
    """What the DiT is given: each prompt's first ``sum(mask)`` rows, zeros after.

    ``T5EncoderModel`` returns ``u[:v]`` for ``v = mask.gt(0).sum()`` and ``WanModel.forward``
    pads it back to ``text_len`` with zeros; this is the same array without the ragged step.
    """
    mask = jnp.asarray(mask)
    if states.ndim != 3 or mask.shape != states.shape[:2]:
        raise AoizoraError(
            f"zero_padded_context needs states [B, L, dim] and mask [B, L]; got "
            f"{tuple(states.shape)} and {tuple(mask.shape)}."
        )
    lengths = jnp.sum(mask > 0, axis=1)
    rows = jnp.arange(states.shape[1])[None, :] < lengths[:, None]
    return jnp.where(rows[:, :, None], states, jnp.zeros((), states.dtype))


def _check_tokens(config: T5Config, ids: Any, mask: Any) -> None:
    shape = tuple(np.shape(ids))
    if len(shape) != 2 or min(shape) < 1 or not jnp.issubdtype(jnp.result_type(ids), jnp.integer):
        raise AoizoraError(
            f"Token ids of shape {shape} and dtype {jnp.result_type(ids)} must be a [B, L] "
            f"integer array with B, L >= 1, e.g. ({1}, {WAN21_TEXT_LEN}) int32 from the "
            "google/umt5-xxl tokenizer."
        )
    if mask is not None and tuple(np.shape(mask)) != shape:
        raise AoizoraError(
            f"Attention mask shape {tuple(np.shape(mask))} must equal the ids' shape {shape} "
            "(1 = token, 0 = padding), or be None for no padding."
        )
    if not isinstance(ids, jax.core.Tracer):  # the values are only known outside jit
        low, high = int(np.min(ids)), int(np.max(ids))
        if low < 0 or high >= config.vocab:
            raise AoizoraError(
                f"Token ids range over [{low}, {high}], outside the vocabulary [0, "
                f"{config.vocab - 1}] of T5Config.vocab={config.vocab}; were they made by "
                "another tokenizer?"
            )
