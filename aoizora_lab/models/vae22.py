"""Wan 2.2 video VAE (the TI2V-5B VAE) in JAX, faithful to the official ``vae2_2.py``.

Source: github.com/Wan-Video/Wan2.2, ``wan/modules/vae2_2.py`` at commit
42bf4cfaa384bc21833865abc2f9e6c0e67233dc (``Wan2_2_VAE.decode``, ``WanVAE_.decode``,
``Decoder3d``, ``Up_ResidualBlock``, ``DupUp3D``, ``unpatchify``; for :func:`encode`
``WanVAE_.encode``, ``Encoder3d``, ``Down_ResidualBlock``, ``AvgDown3D``, ``patchify``);
``tests/data/wan22_vae_tiny.*`` and ``wan22_vae_encoder_tiny.*`` are golden outputs of that
code (``tools/make_vae22_fixture.py``, ``--encoder``). The blocks it shares with
Wan 2.1 (causal conv, RMS norm, residual block, attention, ``Resample``) come from
:mod:`aoizora_lab.models.vae`.

:func:`decode` maps a normalised latent video ``z`` ``[B, 48, T, h, w]`` (what the DiT
produces) to RGB video ``[B, 3, 1 + 4 (T - 1), 16 h, 16 w]`` in ``[-1, 1]``:

1. un-normalise per channel, ``z / (1 / std) + mean``, then ``conv2`` (1x1x1);
2. ``Decoder3d``: causal 3x3x3 ``conv1``; middle = residual block, single-head attention over
   each frame's pixels, residual block (as Wan 2.1); then per level an ``Up_ResidualBlock``:
   ``num_res_blocks + 1`` residual blocks and, except on the last level, a ``Resample`` that
   keeps the width (Wan 2.1's halves it) -- ``upsample3d`` doubles the frames first, as in
   Wan 2.1 -- plus a parameter-free ``DupUp3D`` shortcut from the level's input (below);
3. head: RMS norm, SiLU, causal 3x3x3 conv to 12 = 3 x 2 x 2 channels; ``unpatchify`` turns
   them into 3 channels at twice the height and width; clamp to ``[-1, 1]``.

The official decode runs the decoder one latent frame at a time with a ``feat_cache``; every
causal conv then equals one conv over the whole sequence with 2 zero frames in front, and the
time upsampler skips its ``time_conv`` on the first chunk and runs it uncached on the second,
so the first frame passes once and the conv never sees it (all as in Wan 2.1, see
:mod:`aoizora_lab.models.vae`). ``DupUp3D`` is new: it copies each input channel
``out * f_t * 4 / in`` times, then reads the copies as ``[out, f_t, 2, 2]`` (time phase, row,
column), so a phase or pixel may come from a different input channel (1024 -> 512 with
``f_t = 1`` in TI2V-5B: row offset ``a`` of channel ``o`` is input channel ``2 o + a``; the two
time-doubling levels keep 1024 channels, so there every copy is the same channel). The
official decode passes ``first_chunk=True`` for the first latent frame, which keeps only the
last time phase of that frame; here that is the full ``DupUp3D`` over all frames with its first
``f_t - 1`` output frames dropped, ``T -> 1 + f_t (T - 1)``, matching the main path.

``unpatchify`` is ``b (c r q) f h w -> b c f (h q) (w r)``: channel ``4 c + 2 r + q`` gives
row offset ``q`` and column offset ``r`` (the column offset is the slower one).

Shapes for TI2V-5B at 1280x704, 121 frames (the :meth:`VAE22Config.wan22` preset; the
pipeline's latent is ``[48, (121 - 1) // 4 + 1, 704 // 16, 1280 // 16]``), latent
``[1, 48, 31, 44, 80]``: ``conv1`` and middle -> ``[1, 1024, 31, 44, 80]``; level 0 (1024,
time and space) -> ``[1, 1024, 61, 88, 160]``; level 1 (1024, time and space) ->
``[1, 1024, 121, 176, 320]``; level 2 (1024 -> 512, space) -> ``[1, 512, 121, 352, 640]``;
level 3 (512 -> 256) -> ``[1, 256, 121, 352, 640]``; head -> ``[1, 12, 121, 352, 640]``;
unpatchify -> video ``[1, 3, 121, 704, 1280]``.

:func:`encode` is the way back, a video ``[B, 3, 1 + 4 k, H, W]`` in [-1, 1] to the normalised
latent ``[B, 48, 1 + k, H / 16, W / 16]``: ``patchify`` (``b c f (h q) (w r) -> b (c r q) f h
w``, 12 channels), ``Encoder3d`` (causal ``conv1`` to ``dim``; per level a
``Down_ResidualBlock``: ``num_res_blocks`` residual blocks and, except on the last level, a
``Resample`` that keeps the width, plus a parameter-free ``AvgDown3D`` shortcut from the
level's input; Wan 2.1's middle and head), ``conv1`` and the mean half normalised, as in
Wan 2.1. ``AvgDown3D`` averages each output channel's group of (input channel, time phase,
row, column) entries; on a level that halves time it pads the chunk with one zero frame in
front when it has an odd count, which the official encode meets on its first chunk (one
frame) only, so over the whole sequence it is the same pad in front. TI2V-5B encodes its image
as a one-frame video (``textimage2video.py``: ``vae.encode([img])``, ``img`` ``[3, 1, H, W]``):
``[1, 3, 1, 704, 1280] -> [1, 48, 1, 44, 80]``.

Layout: activations NCDHW and parameters under the official state-dict names, shapes and
layouts (``decoder.upsamples.{level}.upsamples.{block}...``,
``encoder.downsamples.{level}.downsamples.{block}...``), as in the Wan 2.1 module.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp

from aoizora_lab.errors import AoizoraError, is_whole
from aoizora_lab.models.checkpoint import load_named
from aoizora_lab.models.config import freeze_fields
from aoizora_lab.models.vae import (
    FORWARD,
    LAYER_SHAPES,
    Constrain,
    Layer,
    Params,
    Stream,
    check_decoder_config,
    conv_shapes,
    decoder_ends,
    encoder_ends,
    encoder_shapes,
    middle_layers,
    random_params,
    streamed,
    time_factor,
)

# Per-channel statistics of the Wan 2.2 latent (official ``Wan2_2_VAE.__init__``).
WAN22_LATENT_MEAN = (
    -0.2289, -0.0052, -0.1323, -0.2339, -0.2799, 0.0174, 0.1838, 0.1557,
    -0.1382, 0.0542, 0.2813, 0.0891, 0.1570, -0.0098, 0.0375, -0.1825,
    -0.2246, -0.1207, -0.0698, 0.5109, 0.2665, -0.2108, -0.2158, 0.2502,
    -0.2055, -0.0322, 0.1109, 0.1567, -0.0729, 0.0899, -0.2799, -0.1230,
    -0.0313, -0.1649, 0.0117, 0.0723, -0.2839, -0.2083, -0.0520, 0.3748,
    0.0152, 0.1957, 0.1433, -0.2944, 0.3573, -0.0548, -0.1681, -0.0667,
)
WAN22_LATENT_STD = (
    0.4765, 1.0364, 0.4514, 1.1677, 0.5313, 0.4990, 0.4818, 0.5013,
    0.8158, 1.0344, 0.5894, 1.0901, 0.6885, 0.6165, 0.8454, 0.4978,
    0.5759, 0.3523, 0.7135, 0.6804, 0.5833, 1.4146, 0.8986, 0.5659,
    0.7069, 0.5338, 0.4889, 0.4917, 0.4069, 0.4999, 0.6866, 0.4093,
    0.5709, 0.6065, 0.6415, 0.4944, 0.5726, 1.2042, 0.5458, 1.6887,
    0.3971, 1.0600, 0.3943, 0.5537, 0.5444, 0.4089, 0.7468, 0.7744,
)
PATCH_SIZE = 2
"""The official ``unpatchify(out, patch_size=2)``; the head's 12 channels are 3 x 2 x 2."""


@dataclass(frozen=True)
class VAE22Config:
    """Wan 2.2 VAE hyper-parameters (decoder and encoder), named as the official ``WanVAE_``
    arguments.

    The defaults are the released TI2V-5B VAE (``Wan2.2_VAE.pth``), spelled out by
    :meth:`wan22`.
    """

    dec_dim: int = 256
    """Decoder base width; level widths are ``dec_dim * dim_mult`` (official default 256)."""
    dim: int = 160
    """Encoder base width (``Wan2_2_VAE``'s ``c_dim``, 160); :func:`encode` only."""
    z_dim: int = 48
    """Latent channels."""
    dim_mult: tuple[int, ...] = (1, 2, 4, 4)
    """Width multipliers per encoder level; the decoder walks them in reverse."""
    num_res_blocks: int = 2
    """Residual blocks per encoder level; the decoder has one more per level."""
    temperal_downsample: tuple[bool, ...] = (False, True, True)
    """Whether each encoder downsampler halves time (official spelling; ``Wan2_2_VAE`` passes
    (False, True, True)). The decoder upsamples time where the reversed tuple says so."""
    latent_mean: tuple[float, ...] = WAN22_LATENT_MEAN
    """Per-channel mean that :func:`decode` adds back to the normalised latent."""
    latent_std: tuple[float, ...] = WAN22_LATENT_STD
    """Per-channel standard deviation that :func:`decode` multiplies back."""

    def __post_init__(self) -> None:
        freeze_fields(self, {"dim_mult": int, "temperal_downsample": bool,
                             "latent_mean": float, "latent_std": float})
        self.validate()

    def validate(self) -> None:
        """Raise :class:`AoizoraError` on values the official decoder or encoder cannot be
        built with."""
        if not self.dim_mult or min(self.dim_mult) < 1:
            raise AoizoraError(
                f"VAE22Config.dim_mult={self.dim_mult} must hold positive multipliers, "
                "e.g. (1, 2, 4, 4)."
            )
        check_decoder_config(self, "dec_dim")
        if not is_whole(self.dim):
            raise AoizoraError(f"VAE22Config.dim={self.dim!r} must be an integer >= 1.")
        for level in _levels(self):
            if level.shortcut_t and (level.out_dim * level.shortcut_t * 4) % level.in_dim:
                raise AoizoraError(
                    f"VAE22Config.dim_mult={self.dim_mult}: decoder level {level.index} goes "
                    f"from {level.in_dim} to {level.out_dim} channels, which the official "
                    "DupUp3D cannot (out * factor must be a multiple of in)."
                )
        for index, level in enumerate(_down_levels(self)):
            factor = level.factor_t * level.factor_s**2
            if (level.in_dim * factor) % level.out_dim:
                raise AoizoraError(
                    f"VAE22Config.dim_mult={self.dim_mult}: encoder level {index} goes from "
                    f"{level.in_dim} to {level.out_dim} channels, which the official AvgDown3D "
                    f"cannot (in x {factor} must be a multiple of out).")

    @classmethod
    def wan22(cls) -> VAE22Config:
        """The released Wan 2.2 VAE of TI2V-5B (``Wan2.2_VAE.pth``, official ``Wan2_2_VAE``)."""
        return cls(dec_dim=256, dim=160, z_dim=48, dim_mult=(1, 2, 4, 4), num_res_blocks=2,
                   temperal_downsample=(False, True, True))

    @property
    def temperal_upsample(self) -> tuple[bool, ...]:
        """Whether each decoder upsampler doubles time (the official reversal of downsample)."""
        return self.temperal_downsample[::-1]


# ----------------------------------------------------------------------------- structure

class _Level(NamedTuple):
    """One official ``Up_ResidualBlock``: its layers and its ``DupUp3D`` shortcut."""

    index: int
    in_dim: int
    out_dim: int
    layers: list[Layer]
    shortcut_t: int  # DupUp3D's factor_t (1 or 2); 0 when the level has no shortcut


def _levels(config: VAE22Config) -> list[_Level]:
    """``Decoder3d.upsamples`` in order, built as the official constructor builds it."""
    widths = [config.dec_dim * m for m in (config.dim_mult[-1], *config.dim_mult[::-1])]
    levels = []
    for i in range(len(config.dim_mult)):
        prefix, in_dim, out_dim = f"decoder.upsamples.{i}.upsamples", widths[i], widths[i + 1]
        layers = [Layer("residual", f"{prefix}.{j}", out_dim if j else in_dim, out_dim)
                  for j in range(config.num_res_blocks + 1)]
        up = i != len(config.dim_mult) - 1
        if up:
            kind = "upsample3d" if config.temperal_upsample[i] else "upsample2d"
            layers.append(Layer(kind, f"{prefix}.{len(layers)}", out_dim, out_dim))
        shortcut_t = (2 if config.temperal_upsample[i] else 1) if up else 0
        levels.append(_Level(i, in_dim, out_dim, layers, shortcut_t))
    return levels


def param_shapes(config: VAE22Config) -> dict[str, tuple[int, ...]]:
    """Official state-dict name -> shape of every parameter :func:`decode` uses."""
    z, mid = config.z_dim, config.dec_dim * config.dim_mult[-1]
    shapes: dict[str, tuple[int, ...]] = {}
    conv_shapes(shapes, "conv2", z, z, (1, 1, 1))
    conv_shapes(shapes, "decoder.conv1", z, mid, (3, 3, 3))
    layers = middle_layers(mid) + [la for lv in _levels(config) for la in lv.layers]
    for layer in layers:
        LAYER_SHAPES[layer.kind](shapes, layer)
    out = config.dec_dim * config.dim_mult[0]
    shapes["decoder.head.0.gamma"] = (out, 1, 1, 1)
    conv_shapes(shapes, "decoder.head.2", out, 3 * PATCH_SIZE**2, (3, 3, 3))
    return shapes


def video_shape(config: VAE22Config, latent_shape: tuple[int, ...]) -> tuple[int, ...]:
    """Shape of :func:`decode`'s output for a latent of ``latent_shape`` ``[B, z, T, h, w]``."""
    _check_latent_shape(config, tuple(latent_shape))
    b, _, t, h, w = latent_shape
    for doubles in config.temperal_upsample:
        t = 1 + 2 * (t - 1) if doubles else t
    s = 2 ** len(config.temperal_upsample) * PATCH_SIZE
    return b, 3, t, h * s, w * s


# ----------------------------------------------------------------------------- parameters

def abstract_decoder_params(config: VAE22Config, dtype: Any = jnp.bfloat16) -> Params:
    """The parameters as ``ShapeDtypeStruct``s: shapes for lowering, nothing allocated."""
    return {n: jax.ShapeDtypeStruct(s, dtype) for n, s in param_shapes(config).items()}


def init_decoder_params(config: VAE22Config, key: jax.Array,
                        dtype: Any = jnp.float32) -> Params:
    """Random parameters: normal weights of variance 1 / fan_in, zero biases, unit gammas.

    The same draw as the Wan 2.1 module's ``init_decoder_params``: values in range for timing
    and sharding work, not the official initialisation.
    """
    return random_params(param_shapes(config), key, dtype)


def load_decoder_params(source: Mapping[str, Any] | str | Path, config: VAE22Config,
                        dtype: Any = jnp.float32) -> Params:
    """The decoder's parameters from an official state dict or a ``.safetensors`` file.

    ``source`` maps official names to arrays (numpy, or torch tensors, e.g. a ``torch.load``-ed
    ``Wan2.2_VAE.pth``) or is a ``.safetensors`` path. Other keys (the encoder, a fixture's
    inputs) are ignored; a missing or misshaped parameter is an error naming it.
    """
    return load_named(source, param_shapes(config), what="a Wan 2.2 VAE checkpoint",
                      config=config, dtype=dtype)


# ----------------------------------------------------------------------------- forward

def _dup_up(x: jax.Array, out_dim: int, factor_t: int, first: bool = True) -> jax.Array:
    """Official ``DupUp3D(in, out, factor_t, factor_s=2)`` over all frames, ``first_chunk``
    included: the first frame keeps only its last time phase, ``T -> 1 + f_t (T - 1)``. For a
    later chunk of a streamed decode (``first`` False) every frame keeps every phase."""
    b, c, t, h, w = x.shape
    fs = 2
    x = jnp.repeat(x, out_dim * factor_t * fs * fs // c, axis=1)
    x = x.reshape(b, out_dim, factor_t, fs, fs, t, h, w).transpose(0, 1, 5, 2, 6, 3, 7, 4)
    x = x.reshape(b, out_dim, t * factor_t, h * fs, w * fs)
    return x[:, :, factor_t - 1:] if first else x


def _up_block(x: jax.Array, params: Params, level: _Level, stream: Stream | None = None
              ) -> jax.Array:
    """Official ``Up_ResidualBlock``: residual blocks and resampler, plus the shortcut."""
    y = x
    for layer in level.layers:
        y = FORWARD[layer.kind](y, params, layer, stream)
    if not level.shortcut_t:
        return y
    return y + _dup_up(x, level.out_dim, level.shortcut_t, stream is None or stream.first)


def _unpatchify(x: jax.Array) -> jax.Array:
    """Official ``unpatchify``, ``b (c r q) f h w -> b c f (h q) (w r)`` (r: column offset)."""
    b, c, t, h, w = x.shape
    p = PATCH_SIZE
    x = x.reshape(b, c // (p * p), p, p, t, h, w)  # [b, c, r, q, t, h, w]
    return x.transpose(0, 1, 4, 5, 3, 6, 2).reshape(b, c // (p * p), t, h * p, w * p)


def decode(params: Params, z: jax.Array, config: VAE22Config, *,
           constrain: Constrain = None, chunk: int | None = None) -> jax.Array:
    """Video ``[B, 3, 1 + 4 (T - 1), 16 h, 16 w]`` in ``[-1, 1]`` from a normalised latent.

    ``z`` is ``[B, z_dim, T, h, w]``, as the DiT produces it (before the official
    un-normalisation). Computes in ``z``'s dtype; shapes for other configs: :func:`video_shape`.
    ``constrain`` and ``chunk``: as :func:`aoizora_lab.models.vae.decode`'s (the constraint
    after every layer and level).
    """
    _check_latent_shape(config, tuple(z.shape))
    return streamed(lambda x, stream: _decoder(params, x, config, constrain, stream), z, chunk)


def _decoder(params: Params, z: jax.Array, config: VAE22Config, constrain: Constrain,
             stream: Stream | None) -> jax.Array:
    def blocks(x: jax.Array, keep: Callable[[jax.Array], jax.Array]) -> jax.Array:
        for layer in middle_layers(config.dec_dim * config.dim_mult[-1]):
            x = keep(FORWARD[layer.kind](x, params, layer, stream))
        for level in _levels(config):
            x = keep(_up_block(x, params, level, stream))
        return x

    return decoder_ends(params, z, config, constrain, stream, blocks, finish=_unpatchify)


def _check_latent_shape(config: VAE22Config, shape: tuple[int, ...]) -> None:
    if len(shape) != 5 or shape[1] != config.z_dim or min(shape) < 1:
        raise AoizoraError(
            f"Latent shape {shape} must be [B, z_dim={config.z_dim}, T, h, w] with every size "
            f"at least 1, e.g. (1, {config.z_dim}, 31, 44, 80) for 121 frames at 704x1280."
        )


# ----------------------------------------------------------------------------- encoder

class _DownLevel(NamedTuple):
    """One official ``Down_ResidualBlock``: its layers and its ``AvgDown3D`` shortcut."""

    in_dim: int
    out_dim: int
    layers: list[Layer]
    factor_t: int  # AvgDown3D's time factor (2 where the level halves time)
    factor_s: int  # and space factor (2 where it has a downsampler)


def _down_levels(config: VAE22Config) -> list[_DownLevel]:
    """``Encoder3d.downsamples`` in order, built as the official constructor builds it."""
    widths = [config.dim * m for m in (1, *config.dim_mult)]
    levels = []
    for i, (in_dim, out_dim) in enumerate(itertools.pairwise(widths)):
        prefix = f"encoder.downsamples.{i}.downsamples"
        layers = [Layer("residual", f"{prefix}.{j}", out_dim if j else in_dim, out_dim)
                  for j in range(config.num_res_blocks)]
        down = i != len(config.dim_mult) - 1
        halves_time = down and config.temperal_downsample[i]
        if down:
            kind = "downsample3d" if halves_time else "downsample2d"
            layers.append(Layer(kind, f"{prefix}.{len(layers)}", out_dim, out_dim))
        levels.append(_DownLevel(in_dim, out_dim, layers, 2 if halves_time else 1,
                                 2 if down else 1))
    return levels


def encoder_param_shapes(config: VAE22Config) -> dict[str, tuple[int, ...]]:
    """Official state-dict name -> shape of every parameter :func:`encode` uses."""
    layers = [la for lv in _down_levels(config) for la in lv.layers]
    return encoder_shapes(3 * PATCH_SIZE**2, config, layers, config.dim * config.dim_mult[-1])


def abstract_encoder_params(config: VAE22Config, dtype: Any = jnp.bfloat16) -> Params:
    """The encoder's parameters as ``ShapeDtypeStruct``s: shapes for lowering."""
    return {n: jax.ShapeDtypeStruct(s, dtype) for n, s in encoder_param_shapes(config).items()}


def init_encoder_params(config: VAE22Config, key: jax.Array,
                        dtype: Any = jnp.float32) -> Params:
    """Random encoder parameters, drawn as :func:`init_decoder_params` draws the decoder's."""
    return random_params(encoder_param_shapes(config), key, dtype)


def load_encoder_params(source: Mapping[str, Any] | str | Path, config: VAE22Config,
                        dtype: Any = jnp.float32) -> Params:
    """The encoder's parameters from an official state dict or a ``.safetensors`` file (as
    :func:`load_decoder_params`: other keys ignored, a missing or misshaped one an error)."""
    return load_named(source, encoder_param_shapes(config), what="a Wan 2.2 VAE checkpoint",
                      config=config, dtype=dtype)


def space_factor(config: VAE22Config) -> int:
    """Video pixels per latent pixel along a side: the resamplers' halvings and the 2 x 2
    patch (16 in TI2V-5B)."""
    return 2 ** len(config.temperal_downsample) * PATCH_SIZE


def latent_shape(config: VAE22Config, video: tuple[int, ...]) -> tuple[int, ...]:
    """Shape of :func:`encode`'s latent for a video of shape ``video`` ``[B, 3, T, H, W]``."""
    _check_video_shape(config, tuple(video))
    b, _, t, h, w = video
    s = space_factor(config)
    return b, config.z_dim, 1 + (t - 1) // time_factor(config), h // s, w // s


def _patchify(x: jax.Array) -> jax.Array:
    """Official ``patchify``, ``b c f (h q) (w r) -> b (c r q) f h w`` (r: column offset)."""
    b, c, t, h, w = x.shape
    p = PATCH_SIZE
    x = x.reshape(b, c, t, h // p, p, w // p, p)  # [b, c, t, h, q, w, r]
    return x.transpose(0, 1, 6, 4, 2, 3, 5).reshape(b, c * p * p, t, h // p, w // p)


def _avg_down(x: jax.Array, out_dim: int, factor_t: int, factor_s: int) -> jax.Array:
    """Official ``AvgDown3D``: zero frames in front up to a multiple of ``factor_t``, then each
    output channel the mean of its group of (channel, time phase, row, column) entries."""
    x = jnp.pad(x, ((0, 0), (0, 0), ((-x.shape[2]) % factor_t, 0), (0, 0), (0, 0)))
    b, c, t, h, w = x.shape
    ft, fs = factor_t, factor_s
    x = x.reshape(b, c, t // ft, ft, h // fs, fs, w // fs, fs).transpose(0, 1, 3, 5, 7, 2, 4, 6)
    return x.reshape(b, out_dim, -1, t // ft, h // fs, w // fs).mean(axis=2)


def _down_block(x: jax.Array, params: Params, level: _DownLevel, stream: Stream | None = None
                ) -> jax.Array:
    """Official ``Down_ResidualBlock``: residual blocks and resampler, plus the shortcut."""
    y = x
    for layer in level.layers:
        y = FORWARD[layer.kind](y, params, layer, stream)
    return y + _avg_down(x, level.out_dim, level.factor_t, level.factor_s)


def encode(params: Params, video: jax.Array, config: VAE22Config, *,
           constrain: Constrain = None, chunk: int | None = None) -> jax.Array:
    """The normalised latent ``[B, z_dim, 1 + (T - 1) / 4, H / 16, W / 16]`` of a video
    ``[B, 3, T, H, W]`` in [-1, 1] (the official ``Wan2_2_VAE.encode``'s ``mu``); a one-frame
    video is TI2V-5B's image. ``constrain`` and ``chunk``: as
    :func:`aoizora_lab.models.vae.encode`'s (the constraint after every layer and level)."""
    _check_video_shape(config, tuple(video.shape))
    keep = constrain or (lambda a: a)

    def blocks(x: jax.Array, stream: Stream | None) -> jax.Array:
        for level in _down_levels(config):
            x = keep(_down_block(x, params, level, stream))
        return x

    return encoder_ends(params, keep(_patchify(video)), config, keep, chunk, blocks,
                        config.dim * config.dim_mult[-1])


def _check_video_shape(config: VAE22Config, shape: tuple[int, ...]) -> None:
    f, s = time_factor(config), space_factor(config)
    if (len(shape) != 5 or shape[1] != 3 or min(shape) < 1 or (shape[2] - 1) % f
            or shape[3] % s or shape[4] % s):
        raise AoizoraError(
            f"Video shape {shape} must be [B, 3, T, H, W] with T = 1 + {f} k frames (the "
            f"official encode drops any others) and H, W multiples of {s}, e.g. "
            "(1, 3, 121, 704, 1280), or (1, 3, 1, 704, 1280) for TI2V-5B's image."
        )
