"""Wan 2.1 video VAE in JAX, faithful to the official ``wan/modules/vae.py``: the decoder,
and the encoder an image-to-video generation runs on its conditioning video.

Source: github.com/Wan-Video/Wan2.1, ``wan/modules/vae.py`` at commit
9737cba9c1c3c4d04b33fcad41c111989865d315 (``WanVAE_.decode`` / ``.encode``, ``Decoder3d``,
``Encoder3d`` and their blocks); ``tests/data/wan21_vae_tiny.*`` and
``tests/data/wan21_vae_encoder_tiny.*`` are golden outputs of that code
(``tools/make_vae_fixture.py``). The encoder is :func:`encode`, at the end of this module.

:func:`decode` maps a normalised latent video ``z`` ``[B, z_dim, T, h, w]`` (what the DiT
produces) to RGB video ``[B, 3, 1 + 4 (T - 1), 8 h, 8 w]`` in ``[-1, 1]``:

1. un-normalise per channel, ``z / (1 / std) + mean``, then ``conv2`` (1x1x1);
2. ``Decoder3d``: causal 3x3x3 ``conv1``; middle = residual block, single-head attention over
   each frame's pixels, residual block; then per level ``num_res_blocks + 1`` residual blocks
   (RMS norm, SiLU, causal 3x3x3 conv, twice, plus a 1x1x1 shortcut where the width changes)
   and, except on the last level, an upsampler: ``upsample3d`` levels first double the frames
   (below), then every upsampler repeats pixels 2x2 (nearest) and applies a 3x3 conv that
   halves the channels;
3. head: RMS norm, SiLU, causal 3x3x3 conv to 3 channels; clamp to ``[-1, 1]``.

The official decode runs the decoder one latent frame at a time, carrying the last
``CACHE_T = 2`` input frames of each causal conv in ``feat_cache``. For every causal conv that
equals one conv over the whole sequence with ``k_t - 1 = 2`` zero frames padded in front, which
is what this module does, all frames at once. The exception is the time upsampler: on the first
chunk the official code only stores the marker ``'Rep'`` and skips ``time_conv``, so the first
frame goes through once, not doubled; on the second chunk ``time_conv`` runs without a cache
(zero padding), so it never sees the first frame. Here that is
``concat(x[:1], interleave(causal_conv(x[1:])))``: ``T`` frames become ``1 + 2 (T - 1)``, the
two output frames of input frame ``t`` being the two channel halves of the conv's output.

Shapes for 720p (dim 96, the :meth:`VAEConfig.wan21` preset), latent ``[1, 16, 21, 90, 160]``:
``conv1`` -> ``[1, 384, 21, 90, 160]``; level 0 (384 wide, ``upsample3d``) ->
``[1, 192, 41, 180, 320]``; level 1 (384, ``upsample3d``) -> ``[1, 192, 81, 360, 640]``;
level 2 (192, ``upsample2d``) -> ``[1, 96, 81, 720, 1280]``; level 3 (96) and head ->
video ``[1, 3, 81, 720, 1280]``.

Layout: activations are NCDHW (``[B, C, T, H, W]``, as the official code) and parameters keep
the official state-dict names, shapes and layouts (Conv3d ``[O, I, kt, kh, kw]``, Conv2d
``[O, I, kh, kw]``, RMS-norm gamma ``[C, 1, 1, 1]`` or ``[C, 1, 1]``), so a checkpoint's
tensors are used as they are. The layouts are logical only: XLA chooses the physical ones.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from aoizora_lab.errors import AoizoraError, is_whole
from aoizora_lab.models.checkpoint import load_named
from aoizora_lab.models.config import freeze_fields

Params = dict[str, jax.Array]
Constrain = Callable[[jax.Array], jax.Array] | None

# Per-channel statistics of the Wan 2.1 latent (official ``WanVAE.__init__``).
WAN21_LATENT_MEAN = (
    -0.7571, -0.7089, -0.9113, 0.1075, -0.1745, 0.9653, -0.1517, 1.5508,
    0.4134, -0.0715, 0.5517, -0.3632, -0.1922, -0.9497, 0.2503, -0.2921,
)
WAN21_LATENT_STD = (
    2.8184, 1.4541, 2.3275, 2.6558, 1.2196, 1.7708, 2.6052, 2.0743,
    3.2687, 2.1526, 2.8652, 1.5579, 1.6382, 1.1253, 2.8251, 1.9160,
)
_NORM_EPS = 1e-12  # torch.nn.functional.normalize's default, used by the official RMS_norm
_CONV_DIMS = ("NCDHW", "OIDHW", "NCDHW")


@dataclass(frozen=True)
class VAEConfig:
    """Wan VAE hyper-parameters, named as the official ``WanVAE_`` arguments.

    The defaults are the released Wan 2.1 VAE, spelled out by :meth:`wan21`.
    """

    dim: int = 96
    """Base width; level widths are ``dim * dim_mult`` (the official ``_video_vae`` uses 96)."""
    z_dim: int = 16
    """Latent channels."""
    dim_mult: tuple[int, ...] = (1, 2, 4, 4)
    """Width multipliers per encoder level; the decoder walks them in reverse, at most 4."""
    num_res_blocks: int = 2
    """Residual blocks per encoder level; the decoder has one more per level."""
    attn_scales: tuple[float, ...] = ()
    """Scales (1 = the latent grid, 2, 4...) whose levels get attention after each residual
    block; the middle attention is always there. Empty in Wan 2.1."""
    temperal_downsample: tuple[bool, ...] = (False, True, True)
    """Whether each encoder downsampler halves time (official spelling). The decoder upsamples
    time where the reversed tuple says so: (True, True, False) gives 1 + 4 (T - 1) frames."""
    latent_mean: tuple[float, ...] = WAN21_LATENT_MEAN
    """Per-channel mean that :func:`decode` adds back to the normalised latent."""
    latent_std: tuple[float, ...] = WAN21_LATENT_STD
    """Per-channel standard deviation that :func:`decode` multiplies back."""

    def __post_init__(self) -> None:
        freeze_fields(self, {"dim_mult": int, "attn_scales": float,
                             "temperal_downsample": bool, "latent_mean": float,
                             "latent_std": float})
        self.validate()

    def validate(self) -> None:
        """Raise :class:`AoizoraError` on values the official decoder cannot be built with."""
        check_decoder_config(self, "dim")
        if not 1 <= len(self.dim_mult) <= 4 or min(self.dim_mult) < 1:
            raise AoizoraError(
                f"VAEConfig.dim_mult={self.dim_mult} must hold 1 to 4 positive multipliers: the "
                "official Decoder3d halves the input width of levels 1-3 only, e.g. (1, 2, 4, 4)."
            )

    @classmethod
    def wan21(cls) -> VAEConfig:
        """The released Wan 2.1 VAE (``Wan2.1_VAE.pth``, official ``WanVAE`` / ``_video_vae``)."""
        return cls(dim=96, z_dim=16, dim_mult=(1, 2, 4, 4), num_res_blocks=2, attn_scales=(),
                   temperal_downsample=(False, True, True))

    @property
    def temperal_upsample(self) -> tuple[bool, ...]:
        """Whether each decoder upsampler doubles time (the official reversal of downsample)."""
        return self.temperal_downsample[::-1]


# ----------------------------------------------------------------------------- structure

def check_decoder_config(config: Any, width: str) -> None:
    """What every Wan VAE decoder config needs (Wan 2.1's and 2.2's): whole ``width``,
    ``z_dim`` and ``num_res_blocks``, a time flag per resampler, one latent mean and one
    positive standard deviation per latent channel. Errors name the config's class."""
    owner = type(config).__name__
    for name, minimum in ((width, 1), ("z_dim", 1), ("num_res_blocks", 0)):
        if not is_whole(getattr(config, name), minimum=minimum):
            raise AoizoraError(
                f"{owner}.{name}={getattr(config, name)!r} must be an integer >= {minimum}."
            )
    if len(config.temperal_downsample) != len(config.dim_mult) - 1:
        raise AoizoraError(
            f"{owner}.temperal_downsample={config.temperal_downsample} needs one flag per "
            f"resampler, len(dim_mult) - 1 = {len(config.dim_mult) - 1}."
        )
    for name in ("latent_mean", "latent_std"):
        if len(getattr(config, name)) != config.z_dim:
            raise AoizoraError(
                f"{owner}.{name} has {len(getattr(config, name))} values; it needs one per "
                f"latent channel (z_dim={config.z_dim})."
            )
    if min(config.latent_std) <= 0:
        raise AoizoraError(f"{owner}.latent_std={config.latent_std} must all be positive.")


class Layer(NamedTuple):
    """One official module of the decoder or encoder: its kind, state-dict prefix and widths."""

    kind: str  # "residual", "attention", "upsample2d/3d" or "downsample2d/3d"
    name: str
    in_dim: int
    out_dim: int


def _upsample_layers(config: VAEConfig) -> list[Layer]:
    """``Decoder3d.upsamples`` in order, built as the official constructor builds it."""
    widths = [config.dim * m for m in (config.dim_mult[-1], *config.dim_mult[::-1])]
    scale = 1.0 / 2 ** (len(config.dim_mult) - 2)
    layers: list[Layer] = []

    def add(kind: str, in_dim: int, out_dim: int) -> None:
        layers.append(Layer(kind, f"decoder.upsamples.{len(layers)}", in_dim, out_dim))

    for i, (in_dim, out_dim) in enumerate(itertools.pairwise(widths)):
        if i > 0:  # the previous upsampler's conv halved the width
            in_dim //= 2
        for _ in range(config.num_res_blocks + 1):
            add("residual", in_dim, out_dim)
            if scale in config.attn_scales:
                add("attention", out_dim, out_dim)
            in_dim = out_dim
        if i != len(config.dim_mult) - 1:
            kind = "upsample3d" if config.temperal_upsample[i] else "upsample2d"
            add(kind, out_dim, out_dim // 2)
            scale *= 2.0
    return layers


def middle_layers(width: int, prefix: str = "decoder") -> list[Layer]:
    """``{prefix}.middle``: residual block, attention, residual block, all ``width`` wide."""
    return [Layer("residual", f"{prefix}.middle.0", width, width),
            Layer("attention", f"{prefix}.middle.1", width, width),
            Layer("residual", f"{prefix}.middle.2", width, width)]


def _middle_width(config: VAEConfig) -> int:
    return config.dim * config.dim_mult[-1]


def _out_width(config: VAEConfig) -> int:
    return config.dim * config.dim_mult[0]


def param_shapes(config: VAEConfig) -> dict[str, tuple[int, ...]]:
    """Official state-dict name -> shape of every parameter :func:`decode` uses."""
    z, mid = config.z_dim, _middle_width(config)
    shapes: dict[str, tuple[int, ...]] = {}
    conv_shapes(shapes, "conv2", z, z, (1, 1, 1))
    conv_shapes(shapes, "decoder.conv1", z, mid, (3, 3, 3))
    for layer in middle_layers(mid) + _upsample_layers(config):
        LAYER_SHAPES[layer.kind](shapes, layer)
    out = _out_width(config)
    shapes["decoder.head.0.gamma"] = (out, 1, 1, 1)
    conv_shapes(shapes, "decoder.head.2", out, 3, (3, 3, 3))
    return shapes


def conv_shapes(shapes: dict, name: str, in_dim: int, out_dim: int,
                kernel: tuple[int, ...]) -> None:
    shapes[f"{name}.weight"] = (out_dim, in_dim, *kernel)
    shapes[f"{name}.bias"] = (out_dim,)


def residual_shapes(shapes: dict, layer: Layer) -> None:
    p, i, o = layer.name, layer.in_dim, layer.out_dim
    shapes[f"{p}.residual.0.gamma"] = (i, 1, 1, 1)
    conv_shapes(shapes, f"{p}.residual.2", i, o, (3, 3, 3))
    shapes[f"{p}.residual.3.gamma"] = (o, 1, 1, 1)
    conv_shapes(shapes, f"{p}.residual.6", o, o, (3, 3, 3))
    if i != o:
        conv_shapes(shapes, f"{p}.shortcut", i, o, (1, 1, 1))


def attention_shapes(shapes: dict, layer: Layer) -> None:
    p, c = layer.name, layer.in_dim
    shapes[f"{p}.norm.gamma"] = (c, 1, 1)
    conv_shapes(shapes, f"{p}.to_qkv", c, 3 * c, (1, 1))
    conv_shapes(shapes, f"{p}.proj", c, c, (1, 1))


def upsample_shapes(shapes: dict, layer: Layer) -> None:
    conv_shapes(shapes, f"{layer.name}.resample.1", layer.in_dim, layer.out_dim, (3, 3))
    if layer.kind == "upsample3d":
        conv_shapes(shapes, f"{layer.name}.time_conv", layer.in_dim, 2 * layer.in_dim, (3, 1, 1))
    elif layer.kind == "downsample3d":
        conv_shapes(shapes, f"{layer.name}.time_conv", layer.in_dim, layer.in_dim, (3, 1, 1))


LAYER_SHAPES = {"residual": residual_shapes, "attention": attention_shapes,
                "upsample2d": upsample_shapes, "upsample3d": upsample_shapes,
                "downsample2d": upsample_shapes, "downsample3d": upsample_shapes}
"""Each official module kind's parameter shapes (both Wan VAEs' resamplers have the same)."""


def time_factor(config: VAEConfig) -> int:
    """Video frames per latent frame after the first (4 in Wan 2.1)."""
    return 2 ** sum(config.temperal_downsample)


def space_factor(config: VAEConfig) -> int:
    """Video pixels per latent pixel along a side: each resampler halves or doubles (8)."""
    return 2 ** len(config.temperal_downsample)


def video_shape(config: VAEConfig, latent_shape: tuple[int, ...]) -> tuple[int, ...]:
    """Shape of :func:`decode`'s output for a latent of ``latent_shape`` ``[B, z, T, h, w]``."""
    _check_latent_shape(config, tuple(latent_shape))
    b, _, t, h, w = latent_shape
    for doubles in config.temperal_upsample:
        t = 1 + 2 * (t - 1) if doubles else t
    s = space_factor(config)
    return b, 3, t, h * s, w * s


# ----------------------------------------------------------------------------- parameters

def abstract_decoder_params(config: VAEConfig, dtype: Any = jnp.bfloat16) -> Params:
    """The parameters as ``ShapeDtypeStruct``s: shapes for lowering, nothing allocated."""
    return {n: jax.ShapeDtypeStruct(s, dtype) for n, s in param_shapes(config).items()}


def init_decoder_params(config: VAEConfig, key: jax.Array, dtype: Any = jnp.float32) -> Params:
    """Random parameters: normal weights of variance 1 / fan_in, zero biases, unit gammas.

    Fan-in scaling keeps activations of order one through the depth, so a random decoder gives
    values in range for timing and sharding work; it is not the official initialisation. All
    weights come from one normal draw, cut up: a draw per weight compiles a generator per shape.
    """
    return random_params(param_shapes(config), key, dtype)


def random_params(shapes: Mapping[str, tuple[int, ...]], key: jax.Array, dtype: Any) -> Params:
    """:func:`init_decoder_params`'s draw for any official names and shapes (also Wan 2.2's)."""
    total = sum(math.prod(s) for n, s in shapes.items() if not n.endswith((".gamma", ".bias")))
    flat = np.asarray(jax.random.normal(key, (total,), jnp.float32))
    params, offset = {}, 0
    for name, shape in shapes.items():
        if name.endswith(".gamma"):
            value = np.ones(shape, np.float32)
        elif name.endswith(".bias"):
            value = np.zeros(shape, np.float32)
        else:
            size = math.prod(shape)
            value = flat[offset:offset + size].reshape(shape) / math.sqrt(size // shape[0])
            offset += size
        params[name] = jnp.asarray(value, dtype)
    return params


def load_decoder_params(source: Mapping[str, Any] | str | Path, config: VAEConfig,
                        dtype: Any = jnp.float32) -> Params:
    """The decoder's parameters from an official state dict or a ``.safetensors`` file.

    ``source`` maps official names to arrays (numpy, or torch tensors via ``.numpy()``, e.g. a
    ``torch.load``-ed ``Wan2.1_VAE.pth``) or is a ``.safetensors`` path. Other keys (the
    encoder, a fixture's inputs) are ignored; a missing or misshaped parameter is an error
    naming it.
    """
    return load_named(source, param_shapes(config), what="a Wan VAE checkpoint", config=config,
                      dtype=dtype)


# ----------------------------------------------------------------------------- forward

class Stream:
    """Where a chunk of latent frames sits in a frame-by-frame decode (the official
    ``feat_cache``): each causal conv's last ``k_t - 1`` input frames before the chunk
    (``before``; zeros where a conv has none yet, as the official zero padding) and after it
    (``after``, filled as the chunk runs: the next chunk's ``before``)."""

    def __init__(self, before: dict[str, jax.Array] | None = None) -> None:
        self.first = before is None
        """The first chunk (one latent frame): the time upsamplers pass it through."""
        self.before = dict(before or {})
        self.after: dict[str, jax.Array] = {}

    def extend(self, x: jax.Array, name: str, frames: int) -> jax.Array:
        """``x`` with the ``frames`` input frames before it in front; keeps the last
        ``frames`` of the result for the next chunk."""
        before = self.before.get(name)
        if before is None:
            before = jnp.zeros((*x.shape[:2], frames, *x.shape[3:]), x.dtype)
        full = jnp.concatenate([before, x], axis=2)
        self.after[name] = full[:, :, full.shape[2] - frames:]
        return full


def causal_conv(x: jax.Array, params: Params, name: str, stream: Stream | None = None
                ) -> jax.Array:
    """The official ``CausalConv3d`` (or a per-frame ``Conv2d``) over the whole sequence.

    ``k_t - 1`` zero frames in front and none after: output frame ``t`` sees input frames
    ``t - k_t + 1 .. t``, which is what the official frame-by-frame cache feeds it. Space is
    padded by ``k // 2`` on both sides, as the official ``padding=1`` of every 3x3 conv. With
    a ``stream``, ``x`` is one chunk and the frames in front are the previous chunk's.
    """
    kt, kh, kw = _weight(params, name).shape[2:]
    front = kt - 1
    if stream is not None and front:
        x, front = stream.extend(x, name, front), 0
    return conv(x, params, name, (1, 1, 1), ((front, 0), (kh // 2, kh // 2), (kw // 2, kw // 2)))


def conv(x: jax.Array, params: Params, name: str, strides: tuple[int, int, int],
         padding: tuple[tuple[int, int], ...]) -> jax.Array:
    """The official conv ``name`` (weight and bias) with these ``strides`` and explicit
    ``padding`` per axis (time, height, width)."""
    y = lax.conv_general_dilated(x, _weight(params, name).astype(x.dtype), strides, padding,
                                 dimension_numbers=_CONV_DIMS)
    return y + params[f"{name}.bias"].astype(x.dtype)[:, None, None, None]


def _weight(params: Params, name: str) -> jax.Array:
    """A conv's weight as Conv3d's ``[O, I, kt, kh, kw]``: a Conv2d applied frame by frame is a
    Conv3d with a kernel one frame long."""
    w = params[f"{name}.weight"]
    return w[:, :, None] if w.ndim == 4 else w


def rms_norm(x: jax.Array, gamma: jax.Array) -> jax.Array:
    """Official ``RMS_norm``: L2-normalise over channels, times ``sqrt(C) * gamma`` (no bias)."""
    norm = jnp.sqrt(jnp.sum(jnp.square(x), axis=1, keepdims=True))
    gamma = gamma.astype(x.dtype).reshape(1, -1, 1, 1, 1)
    return x / jnp.maximum(norm, _NORM_EPS) * math.sqrt(x.shape[1]) * gamma


def _residual(x: jax.Array, params: Params, layer: Layer, stream: Stream | None = None
              ) -> jax.Array:
    p = layer.name
    h = causal_conv(x, params, f"{p}.shortcut") if layer.in_dim != layer.out_dim else x
    x = causal_conv(jax.nn.silu(rms_norm(x, params[f"{p}.residual.0.gamma"])), params,
                     f"{p}.residual.2", stream)
    x = causal_conv(jax.nn.silu(rms_norm(x, params[f"{p}.residual.3.gamma"])), params,
                     f"{p}.residual.6", stream)
    return x + h


def _attention(x: jax.Array, params: Params, layer: Layer, stream: Stream | None = None
               ) -> jax.Array:
    """Official ``AttentionBlock``: one head over the pixels of each frame, frames apart."""
    p = layer.name
    b, c, t, h, w = x.shape
    qkv = causal_conv(rms_norm(x, params[f"{p}.norm.gamma"]), params, f"{p}.to_qkv")
    q, k, v = (a.reshape(b, c, t, h * w) for a in jnp.split(qkv, 3, axis=1))
    logits = jnp.einsum("bctn,bctm->btnm", q, k) / math.sqrt(c)
    out = jnp.einsum("btnm,bctm->bctn", jax.nn.softmax(logits, axis=-1), v)
    return causal_conv(out.reshape(b, c, t, h, w), params, f"{p}.proj") + x


def _upsample(x: jax.Array, params: Params, layer: Layer, stream: Stream | None = None
              ) -> jax.Array:
    """Official ``Resample`` (``upsample2d`` / ``upsample3d``): time first, then space."""
    if layer.kind == "upsample3d":
        # The first frame passes once; the others, without it, go through time_conv, each
        # giving two frames: the first and second halves of its 2C channels.
        time_conv = f"{layer.name}.time_conv"
        if stream is None and x.shape[2] > 1:
            x = jnp.concatenate([x[:, :, :1], _doubled(causal_conv(x[:, :, 1:], params,
                                                                   time_conv))], axis=2)
        elif stream is not None and stream.first:  # official 'Rep': time_conv starts after
            stream.after[time_conv] = jnp.zeros((*x.shape[:2], 2, *x.shape[3:]), x.dtype)
        elif stream is not None:
            x = _doubled(causal_conv(x, params, time_conv, stream))
    x = jnp.repeat(jnp.repeat(x, 2, axis=3), 2, axis=4)  # nearest-exact at scale 2
    return causal_conv(x, params, f"{layer.name}.resample.1")


def _doubled(y: jax.Array) -> jax.Array:
    """``time_conv``'s ``2C`` channels as two frames of ``C`` per input frame."""
    b, c2, t, h, w = y.shape
    return jnp.moveaxis(y.reshape(b, 2, c2 // 2, t, h, w), 1, 3).reshape(b, c2 // 2, 2 * t, h, w)


FORWARD = {"residual": _residual, "attention": _attention,
            "upsample2d": _upsample, "upsample3d": _upsample}


def decode(params: Params, z: jax.Array, config: VAEConfig, *,
           constrain: Constrain = None, chunk: int | None = None) -> jax.Array:
    """Video ``[B, 3, 1 + 4 (T - 1), 8 h, 8 w]`` in ``[-1, 1]`` from a normalised latent.

    ``z`` is ``[B, z_dim, T, h, w]``, as the DiT produces it (before the official
    un-normalisation). Computes in ``z``'s dtype; shapes for other configs: :func:`video_shape`.
    ``constrain``: applied to the activations after every layer and to the video (a sharding
    constraint that keeps them split the same way, :mod:`aoizora_lab.parts`); none by default.
    ``chunk``: ``None`` decodes all frames at once; ``k`` decodes as the official code does, the
    first latent frame alone and then ``k`` at a time with the causal convs' cache
    (:func:`streamed`), so at most ``k`` latent frames' activations are alive at once.
    """
    _check_latent_shape(config, tuple(z.shape))
    return streamed(lambda x, stream: _decoder(params, x, config, constrain, stream), z, chunk)


def _decoder(params: Params, z: jax.Array, config: VAEConfig, constrain: Constrain,
             stream: Stream | None) -> jax.Array:
    def blocks(x: jax.Array, keep: Callable[[jax.Array], jax.Array]) -> jax.Array:
        for layer in middle_layers(_middle_width(config)) + _upsample_layers(config):
            x = keep(FORWARD[layer.kind](x, params, layer, stream))
        return x

    return decoder_ends(params, z, config, constrain, stream, blocks)


def decoder_ends(params: Params, z: jax.Array, config: Any, constrain: Constrain,
                 stream: Stream | None,
                 blocks: Callable[[jax.Array, Callable[[jax.Array], jax.Array]], jax.Array],
                 finish: Callable[[jax.Array], jax.Array] = lambda x: x) -> jax.Array:
    """What both Wan VAEs' decoders share around their ``blocks``: un-normalise ``z`` with the
    config's ``latent_mean`` / ``latent_std``, ``conv2`` and ``decoder.conv1`` in, then the
    head (RMS norm, SiLU, ``decoder.head.2``), ``finish`` (Wan 2.2: the unpatchify) and the
    clamp to [-1, 1]; ``constrain`` after each step (``blocks`` gets it too)."""
    keep = constrain or (lambda a: a)
    x = unnormalise(z, config.latent_mean, config.latent_std)
    x = keep(causal_conv(causal_conv(keep(x), params, "conv2"), params, "decoder.conv1",
                         stream))
    x = jax.nn.silu(rms_norm(blocks(x, keep), params["decoder.head.0.gamma"]))
    return keep(jnp.clip(finish(causal_conv(x, params, "decoder.head.2", stream)), -1.0, 1.0))


def streamed(decoder: Callable[[jax.Array, Stream | None], jax.Array], z: jax.Array,
             chunk: int | None) -> jax.Array:
    """``decoder(z, None)`` all at once, or as the official ``WanVAE_.decode``: the first latent
    frame alone (:attr:`Stream.first`), then the others ``chunk`` at a time in a ``lax.scan``
    carrying the causal convs' frames (MaxDiffusion's ``vae_decode_chunk``). The last chunk is
    padded with zero frames, whose outputs are cut off: causality keeps them out of the rest.
    The encoder streams video frames the same way (``WanVAE_.encode``: 1, then 4 at a time),
    each chunk giving fewer frames than it takes.
    """
    if chunk is None:
        return decoder(z, None)
    if not is_whole(chunk):
        raise AoizoraError(
            f"chunk={chunk!r} must be a positive number of latent frames, or None to decode "
            "every frame at once; the official decode uses 1."
        )
    first = Stream()
    head = decoder(z[:, :, :1], first)
    rest = z.shape[2] - 1
    if not rest:
        return head
    steps = -(-rest // chunk)
    tail = jnp.pad(z[:, :, 1:], ((0, 0), (0, 0), (0, steps * chunk - rest), (0, 0), (0, 0)))
    chunks = jnp.moveaxis(tail.reshape(*tail.shape[:2], steps, chunk, *tail.shape[3:]), 2, 0)

    def step(cache: dict[str, jax.Array], piece: jax.Array
             ) -> tuple[dict[str, jax.Array], jax.Array]:
        stream = Stream(cache)
        return stream.after, decoder(piece, stream)

    _, out = lax.scan(step, first.after, chunks)  # [steps, B, C, frames per chunk, H, W]
    out = jnp.moveaxis(out, 0, 2)
    out = out.reshape(*out.shape[:2], -1, *out.shape[4:])
    kept = rest * out.shape[2] // (steps * chunk)  # the frames of the unpadded input
    return jnp.concatenate([head, out[:, :, :kept]], axis=2)


def unnormalise(z: jax.Array, latent_mean: tuple[float, ...],
                 latent_std: tuple[float, ...]) -> jax.Array:
    """The official ``z / scale[1] + scale[0]`` with ``scale = [mean, 1 / std]``."""
    mean, inv_std = _scale(latent_mean, latent_std, z.dtype)
    return z / inv_std + mean  # divide by 1 / std, not multiply by std: the official rounding


def _scale(latent_mean: tuple[float, ...], latent_std: tuple[float, ...], dtype: Any
           ) -> tuple[jax.Array, jax.Array]:
    """The official ``scale = [mean, 1 / std]``, per channel, broadcastable over NCDHW."""
    mean = jnp.asarray(latent_mean, dtype).reshape(1, -1, 1, 1, 1)
    return mean, 1.0 / jnp.asarray(latent_std, dtype).reshape(1, -1, 1, 1, 1)


def _check_latent_shape(config: VAEConfig, shape: tuple[int, ...]) -> None:
    if len(shape) != 5 or shape[1] != config.z_dim or min(shape) < 1:
        raise AoizoraError(
            f"Latent shape {shape} must be [B, z_dim={config.z_dim}, T, h, w] with every size "
            f"at least 1, e.g. (1, {config.z_dim}, 21, 90, 160) for 81 frames at 720x1280."
        )


# ----------------------------------------------------------------------------- encoder
#
# The official ``WanVAE_.encode`` maps a video ``[B, 3, 1 + 4 k, H, W]`` in [-1, 1] to the
# normalised latent ``[B, z_dim, 1 + k, H / 8, W / 8]``: ``Encoder3d`` (causal 3x3x3 ``conv1``
# to ``dim``; per level ``num_res_blocks`` residual blocks and, except on the last level, a
# downsampler: zero-pad one row and column after, 3x3 conv of stride 2, then on
# ``downsample3d`` levels ``time_conv``, a 3x1x1 conv of stride 2 in time; the middle blocks;
# RMS norm, SiLU, causal conv to ``2 z_dim``), ``conv1`` (1x1x1), the mean half ``mu``, then
# ``(mu - mean) / std``. It runs the first frame alone and then 4 frames at a time with the
# causal convs' cache: for ``time_conv`` the first chunk is stored and passes through, and each
# later chunk is convolved with the previous chunk's last frame in front, so over the whole
# sequence a ``downsample3d`` is ``concat(x[:1], conv_stride2(x))`` with no padding in time.


def _encoder_layers(config: VAEConfig) -> list[Layer]:
    """``Encoder3d.downsamples`` in order, built as the official constructor builds it."""
    widths = [config.dim * m for m in (1, *config.dim_mult)]
    scale = 1.0
    layers: list[Layer] = []

    def add(kind: str, in_dim: int, out_dim: int) -> None:
        layers.append(Layer(kind, f"encoder.downsamples.{len(layers)}", in_dim, out_dim))

    for i, (in_dim, out_dim) in enumerate(itertools.pairwise(widths)):
        for _ in range(config.num_res_blocks):
            add("residual", in_dim, out_dim)
            if scale in config.attn_scales:
                add("attention", out_dim, out_dim)
            in_dim = out_dim
        if i != len(config.dim_mult) - 1:
            add("downsample3d" if config.temperal_downsample[i] else "downsample2d",
                out_dim, out_dim)
            scale /= 2.0
    return layers


def encoder_param_shapes(config: VAEConfig) -> dict[str, tuple[int, ...]]:
    """Official state-dict name -> shape of every parameter :func:`encode` uses."""
    return encoder_shapes(3, config, _encoder_layers(config), _middle_width(config))


def encoder_shapes(in_dim: int, config: Any, layers: list[Layer], width: int
                   ) -> dict[str, tuple[int, ...]]:
    """The parameter shapes of an encoder around its ``layers`` (both Wan VAEs', the shape
    side of :func:`encoder_ends`): ``encoder.conv1`` from ``in_dim`` channels to the config's
    ``dim``, the layers, the ``width``-wide middle and head, and ``conv1``."""
    z2 = 2 * config.z_dim
    shapes: dict[str, tuple[int, ...]] = {}
    conv_shapes(shapes, "encoder.conv1", in_dim, config.dim, (3, 3, 3))
    for layer in layers + middle_layers(width, "encoder"):
        LAYER_SHAPES[layer.kind](shapes, layer)
    shapes["encoder.head.0.gamma"] = (width, 1, 1, 1)
    conv_shapes(shapes, "encoder.head.2", width, z2, (3, 3, 3))
    conv_shapes(shapes, "conv1", z2, z2, (1, 1, 1))
    return shapes


def abstract_encoder_params(config: VAEConfig, dtype: Any = jnp.bfloat16) -> Params:
    """The encoder's parameters as ``ShapeDtypeStruct``s: shapes for lowering."""
    return {n: jax.ShapeDtypeStruct(s, dtype) for n, s in encoder_param_shapes(config).items()}


def init_encoder_params(config: VAEConfig, key: jax.Array, dtype: Any = jnp.float32) -> Params:
    """Random encoder parameters, drawn as :func:`init_decoder_params` draws the decoder's."""
    return random_params(encoder_param_shapes(config), key, dtype)


def load_encoder_params(source: Mapping[str, Any] | str | Path, config: VAEConfig,
                        dtype: Any = jnp.float32) -> Params:
    """The encoder's parameters from an official state dict or a ``.safetensors`` file (as
    :func:`load_decoder_params`: other keys ignored, a missing or misshaped one an error)."""
    return load_named(source, encoder_param_shapes(config), what="a Wan VAE checkpoint",
                      config=config, dtype=dtype)


def latent_shape(config: VAEConfig, video: tuple[int, ...]) -> tuple[int, ...]:
    """Shape of :func:`encode`'s latent for a video of shape ``video`` ``[B, 3, T, H, W]``."""
    _check_video_shape(config, tuple(video))
    b, _, t, h, w = video
    s = space_factor(config)
    return b, config.z_dim, 1 + (t - 1) // time_factor(config), h // s, w // s


def _downsample(x: jax.Array, params: Params, layer: Layer, stream: Stream | None = None
                ) -> jax.Array:
    """Official ``Resample`` (``downsample2d`` / ``downsample3d``): space first, then time."""
    x = conv(x, params, f"{layer.name}.resample.1", (1, 2, 2), ((0, 0), (0, 1), (0, 1)))
    if layer.kind != "downsample3d":
        return x
    time_conv = f"{layer.name}.time_conv"
    if stream is None:
        return x if x.shape[2] == 1 else jnp.concatenate(
            [x[:, :, :1], conv(x, params, time_conv, (2, 1, 1), ((0, 0),) * 3)], axis=2)
    if stream.first:  # official: the first chunk is cached and passes through
        stream.after[time_conv] = x[:, :, -1:]
        return x
    return conv(stream.extend(x, time_conv, 1), params, time_conv, (2, 1, 1), ((0, 0),) * 3)


FORWARD.update(downsample2d=_downsample, downsample3d=_downsample)


def encode(params: Params, video: jax.Array, config: VAEConfig, *,
           constrain: Constrain = None, chunk: int | None = None) -> jax.Array:
    """The normalised latent ``[B, z_dim, 1 + (T - 1) / 4, H / 8, W / 8]`` of a video
    ``[B, 3, T, H, W]`` in [-1, 1] (the official ``WanVAE.encode``'s ``mu``, no sampling).

    ``constrain``: as :func:`decode`'s, after every layer and on the latent. ``chunk``:
    ``None`` encodes all frames at once; ``k`` as the official code with ``k = 1``: the first
    frame alone, then ``k`` latent frames' worth of video frames (4 k) at a time with the causal
    convs' cache (:func:`streamed`).
    """
    _check_video_shape(config, tuple(video.shape))
    keep = constrain or (lambda a: a)

    def blocks(x: jax.Array, stream: Stream | None) -> jax.Array:
        for layer in _encoder_layers(config):
            x = keep(FORWARD[layer.kind](x, params, layer, stream))
        return x

    return encoder_ends(params, video, config, keep, chunk, blocks, _middle_width(config))


def encoder_ends(params: Params, x: jax.Array, config: Any, keep: Callable[[jax.Array],
                 jax.Array], chunk: int | None,
                 blocks: Callable[[jax.Array, Stream | None], jax.Array], width: int
                 ) -> jax.Array:
    """What both Wan VAEs' encoders share around their ``blocks`` (Wan 2.2: on the patchified
    video): ``encoder.conv1`` in; after the blocks the ``width``-wide middle and the head (RMS
    norm, SiLU, ``encoder.head.2``); all at once or streamed as the official encode (``chunk``
    latent frames a step after the first frame, :func:`streamed`); then ``conv1`` and the mean
    half, normalised with the config's ``latent_mean`` / ``latent_std``; ``keep`` after each
    step."""
    if chunk is not None and not is_whole(chunk):
        raise AoizoraError(
            f"chunk={chunk!r} must be a positive number of latent frames, or None to encode "
            "every frame at once; the official encode uses 1 (4 video frames a step)."
        )

    def encoder(x: jax.Array, stream: Stream | None) -> jax.Array:
        x = blocks(keep(causal_conv(x, params, "encoder.conv1", stream)), stream)
        for layer in middle_layers(width, "encoder"):
            x = keep(FORWARD[layer.kind](x, params, layer, stream))
        x = jax.nn.silu(rms_norm(x, params["encoder.head.0.gamma"]))
        return keep(causal_conv(x, params, "encoder.head.2", stream))

    frames = None if chunk is None else chunk * time_factor(config)
    mu = causal_conv(streamed(encoder, x, frames), params, "conv1")[:, :config.z_dim]
    mean, inv_std = _scale(config.latent_mean, config.latent_std, mu.dtype)
    return keep((mu - mean) * inv_std)  # the official (mu - scale[0]) * scale[1]


def _check_video_shape(config: VAEConfig, shape: tuple[int, ...]) -> None:
    f, s = time_factor(config), space_factor(config)
    if (len(shape) != 5 or shape[1] != 3 or min(shape) < 1 or (shape[2] - 1) % f
            or shape[3] % s or shape[4] % s):
        raise AoizoraError(
            f"Video shape {shape} must be [B, 3, T, H, W] with T = 1 + {f} k frames (the "
            f"official encode drops any others) and H, W multiples of {s}, e.g. "
            "(1, 3, 81, 720, 1280)."
        )
