"""Wan 2.1 and 2.2 diffusion transformers in JAX, faithful to the official ``model.py``.

One forward pass maps a noisy latent video ``x`` ``[B, C_in, F, H, W]``, timesteps ``t`` ``[B]``
(or ``[B, tokens]``, one per token, as Wan 2.2's TI2V runs) and text embeddings ``context``
``[B, L, text_dim]`` to the model's prediction ``[B, C_out, F, H, W]``:

1. patch embedding: a Conv3d with kernel = stride = ``patch_size``, tokens in (f, h, w) order;
2. time: a ``[cos, sin]`` sinusoid (frequencies ``10000^(-i/half)``) -> Linear-SiLU-Linear ->
   ``e``; SiLU-Linear -> six modulation vectors ``e0`` (float32), per sample or per token;
3. text: zero-padded to ``text_len`` *before* the Linear-GELU(tanh)-Linear embedding (the
   padding is not masked later); Wan 2.1's i2v adds 257 CLIP tokens through an MLP projection
   (Wan 2.2's i2v has none: its image enters only as the ``y`` latent channels);
4. ``num_layers`` blocks under ``lax.scan`` over stacked parameters, each: modulated LayerNorm
   -> self-attention (full-width RMSNorm on q and k, 3D RoPE on interleaved pairs with the head
   dim split 44/42/42 for frame/height/width when it is 128) -> gated residual; cross-attention
   (affine LayerNorm, no modulation, no gate); modulated LayerNorm -> tanh-GELU FFN -> gated
   residual. The residual stream is float32, as under the official autocast;
5. head: two modulation vectors from ``e``, LayerNorm, Linear; unpatchify with per-token
   features ordered ``(pt, ph, pw, c)``.

Wan 2.2 (``wan2.2-*`` presets; official ``Wan-Video/Wan2.2``) changes three things: the
modulation may differ per token (TI2V gives the image's first latent frame ``t = 0``), i2v drops
the CLIP tokens, and TI2V-5B has its own widths, a 48-channel latent and a VAE that compresses
16 x 16 pixels. The A14B models are two experts of Wan 2.1 14B's shape, one before and one
after a boundary timestep (:data:`SAMPLING`): each step runs one of them, so a step's program
is one expert's.

Sharding comes from a :class:`~aoizora_lab.models.parallel.ParallelPlan`; without one the model
runs unsharded. Padding added to make the token axis divisible is masked out of self-attention
keys and dropped before unpatchify, as the official code masks tokens beyond ``seq_lens``.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from aoizora_lab.errors import AoizoraError, is_whole
from aoizora_lab.models.parallel import ParallelPlan
from aoizora_lab.models.safetensors_io import load_safetensors

Params = dict[str, Any]

CLIP_TOKENS = 257  # CLIP ViT-H/14 image tokens (official i2v)
CLIP_DIM = 1280  # their width
_CLIP_LN_EPS = 1e-5  # torch.nn.LayerNorm default, used by the official MLPProj


@dataclass(frozen=True)
class WanConfig:
    """Wan 2.1 / 2.2 model hyper-parameters, named exactly as the official config keys."""

    model_type: str = "t2v"
    """``"t2v"`` (text-to-video), ``"i2v"`` (image-to-video: the ``y`` condition latents, and
    CLIP tokens where :attr:`clip`) or ``"ti2v"`` (Wan 2.2 TI2V-5B: text, or text and image
    through the first latent frame and per-token timesteps)."""
    patch_size: tuple[int, int, int] = (1, 2, 2)
    """Patch (frames, height, width) of the patch embedding."""
    text_len: int = 512
    """Text tokens the context is zero-padded to."""
    in_dim: int = 16
    """Input latent channels (36 for i2v: 16 noisy + 4 mask + 16 image latents)."""
    dim: int = 2048
    """Transformer width."""
    ffn_dim: int = 8192
    """FFN hidden width."""
    freq_dim: int = 256
    """Width of the time sinusoid."""
    text_dim: int = 4096
    """Width of the text-encoder (umT5) embeddings."""
    out_dim: int = 16
    """Output latent channels."""
    num_heads: int = 16
    """Attention heads."""
    num_layers: int = 32
    """Transformer blocks."""
    window_size: tuple[int, int] = (-1, -1)
    """Local attention window; only global attention (-1, -1) is used by Wan 2.1."""
    qk_norm: bool = True
    """RMSNorm on q and k over the full width."""
    cross_attn_norm: bool = True
    """Affine LayerNorm before cross-attention."""
    eps: float = 1e-6
    """Epsilon of every norm."""
    clip: bool = True
    """i2v only: CLIP image tokens as a second cross-attention context (Wan 2.1's ``img_emb``).
    Wan 2.2's i2v has none: ``False``."""
    vae_stride: tuple[int, int, int] = (4, 8, 8)
    """Pixels per latent (frames, height, width): (4, 8, 8) for the Wan 2.1 VAE (every 2.1 model
    and the 2.2 A14B ones), (4, 16, 16) for the Wan 2.2 VAE of TI2V-5B."""

    def __post_init__(self) -> None:
        for name, example in (("patch_size", "(1, 2, 2)"), ("window_size", "(-1, -1)"),
                              ("vae_stride", "(4, 8, 8)")):
            value = getattr(self, name)
            try:
                object.__setattr__(self, name, tuple(int(v) for v in value))
            except (TypeError, ValueError):
                raise AoizoraError(
                    f"WanConfig.{name}={value!r} must be a sequence of integers, e.g. {example}."
                ) from None
        self.validate()

    def validate(self) -> None:
        """Raise :class:`AoizoraError` on values the model cannot run."""
        if self.model_type not in ("t2v", "i2v", "ti2v"):
            raise AoizoraError(
                f"WanConfig.model_type={self.model_type!r}; supported types are 't2v', 'i2v' "
                "and 'ti2v'."
            )
        if not isinstance(self.clip, bool):
            raise AoizoraError(f"WanConfig.clip={self.clip!r} must be True (Wan 2.1 i2v) or "
                               "False (Wan 2.2).")
        for name in ("text_len", "in_dim", "dim", "ffn_dim", "freq_dim", "text_dim", "out_dim",
                     "num_heads", "num_layers"):
            value = getattr(self, name)
            if not is_whole(value):
                raise AoizoraError(f"WanConfig.{name}={value!r} must be a positive integer.")
        if self.dim % self.num_heads or (self.dim // self.num_heads) % 2:
            raise AoizoraError(
                f"WanConfig.dim={self.dim} must split into num_heads={self.num_heads} heads of "
                "even width (RoPE rotates pairs)."
            )
        if self.window_size != (-1, -1):
            raise AoizoraError(
                f"WanConfig.window_size={self.window_size}: only global attention (-1, -1) is "
                "implemented, as in every released Wan 2.1 model."
            )
        if len(self.patch_size) != 3 or min(self.patch_size) < 1 or self.freq_dim % 2:
            raise AoizoraError(
                f"WanConfig.patch_size={self.patch_size} must be three positive ints and "
                f"freq_dim={self.freq_dim} even."
            )
        if len(self.vae_stride) != 3 or min(self.vae_stride) < 1:
            raise AoizoraError(
                f"WanConfig.vae_stride={self.vae_stride} must be three positive ints, e.g. "
                "(4, 8, 8) (Wan 2.1 VAE) or (4, 16, 16) (Wan 2.2 VAE)."
            )

    @property
    def uses_clip(self) -> bool:
        """Whether the model reads CLIP image tokens (Wan 2.1's i2v)."""
        return self.model_type == "i2v" and self.clip

    @property
    def condition_channels(self) -> int:
        """Channels of the i2v condition ``y`` (4 mask + 16 image latents = 20), else 0."""
        return self.in_dim - self.out_dim if self.model_type == "i2v" else 0

    @property
    def head_dim(self) -> int:
        """Width of one attention head."""
        return self.dim // self.num_heads

    @property
    def rope_dims(self) -> tuple[int, int, int]:
        """Head-dim channels rotated by frame, height and width position (44/42/42 at 128)."""
        d = self.head_dim
        return d - 4 * (d // 6), 2 * (d // 6), 2 * (d // 6)

    @classmethod
    def preset(cls, name: str) -> WanConfig:
        """One of :data:`PRESETS` (``"wan2.1-t2v-1.3b"``, ``"wan2.1-t2v-14b"``...)."""
        return PRESETS[preset_key(name)]

    def with_layers(self, num_layers: int) -> WanConfig:
        """The same model with another depth (for folded compiles and small tests)."""
        return dataclasses.replace(self, num_layers=num_layers)


# Official configs: Wan2.1 wan/configs/wan_t2v_1_3B.py, wan_t2v_14B.py, wan_i2v_14B.py;
# Wan2.2 wan/configs/wan_t2v_A14B.py, wan_i2v_A14B.py (one expert each), wan_ti2v_5B.py, with
# in_dim / out_dim from the released checkpoints' config.json.
PRESETS: dict[str, WanConfig] = {
    "wan2.1-t2v-1.3b": WanConfig(dim=1536, ffn_dim=8960, num_heads=12, num_layers=30),
    "wan2.1-t2v-14b": WanConfig(dim=5120, ffn_dim=13824, num_heads=40, num_layers=40),
    "wan2.1-i2v-14b": WanConfig(model_type="i2v", in_dim=36, dim=5120, ffn_dim=13824,
                                num_heads=40, num_layers=40),
    "wan2.2-t2v-a14b": WanConfig(dim=5120, ffn_dim=13824, num_heads=40, num_layers=40),
    "wan2.2-i2v-a14b": WanConfig(model_type="i2v", clip=False, in_dim=36, dim=5120,
                                 ffn_dim=13824, num_heads=40, num_layers=40),
    "wan2.2-ti2v-5b": WanConfig(model_type="ti2v", in_dim=48, out_dim=48, dim=3072,
                                ffn_dim=14336, num_heads=24, num_layers=30,
                                vae_stride=(4, 16, 16)),
}


def preset_key(name: str) -> str:
    """``name`` as :data:`PRESETS` and :data:`SAMPLING` spell it; raises naming the presets."""
    key = str(name).strip().lower()
    if key not in PRESETS:
        raise AoizoraError(f"Unknown Wan preset {name!r}; presets are {sorted(PRESETS)}.")
    return key


@dataclass(frozen=True)
class Sampling:
    """A preset's official sampler: what one video runs (``wan/configs``, ``generate.py``)."""

    steps: int
    """``sample_steps``: denoising steps, each one DiT call per CFG pass."""
    shift: float
    """``sample_shift`` of the flow-matching UniPC schedule (:func:`sampling_timesteps`)."""
    boundary: float | None = None
    """A14B only: steps whose timestep is at least ``boundary`` x 1000 run the high-noise
    expert, the rest the low-noise one (two 14B models; :func:`expert_steps`)."""

    @property
    def experts(self) -> int:
        """Denoisers a generation holds: 2 for A14B (a step runs one), else 1."""
        return 1 if self.boundary is None else 2


# Wan 2.1's configs leave steps and shift to generate.py: 50 steps (40 for i2v) and shift 5.0
# (3.0 for i2v at 480p, not a preset here).
SAMPLING: dict[str, Sampling] = {
    "wan2.1-t2v-1.3b": Sampling(steps=50, shift=5.0),
    "wan2.1-t2v-14b": Sampling(steps=50, shift=5.0),
    "wan2.1-i2v-14b": Sampling(steps=40, shift=5.0),
    "wan2.2-t2v-a14b": Sampling(steps=40, shift=12.0, boundary=0.875),
    "wan2.2-i2v-a14b": Sampling(steps=40, shift=5.0, boundary=0.900),
    "wan2.2-ti2v-5b": Sampling(steps=50, shift=5.0),
}
TRAIN_TIMESTEPS = 1000  # official num_train_timesteps


def sampling_timesteps(steps: int, shift: float) -> np.ndarray:
    """The official ``FlowUniPCMultistepScheduler.set_timesteps(steps, shift=shift)``
    timesteps (int64), built as its ``__init__`` (``shift=1``) and ``set_timesteps`` do: sigmas
    ``linspace(sigma_max, 0, steps + 1)[:-1]`` with ``sigma_max`` = 0.999 as float32, shifted
    ``shift s / (1 + (shift - 1) s)``, times 1000, truncated. Example: 40 steps at shift 12
    start 999, 997, 995 and stay above 875 for 26 steps."""
    sigma_max = float(np.float32(1.0 - 1.0 / TRAIN_TIMESTEPS))
    sigmas = np.linspace(sigma_max, 0.0, steps + 1)[:-1]
    sigmas = shift * sigmas / (1 + (shift - 1) * sigmas)
    return (sigmas * TRAIN_TIMESTEPS).astype(np.int64)


def expert_steps(sampling: Sampling) -> tuple[int, int]:
    """``(high-noise steps, low-noise steps)`` of an A14B sampler: the official pipelines run
    the high-noise expert while ``t >= boundary * 1000``. A single model: ``(steps, 0)``."""
    if sampling.boundary is None:
        return sampling.steps, 0
    high = int((sampling_timesteps(sampling.steps, sampling.shift)
                >= sampling.boundary * TRAIN_TIMESTEPS).sum())
    return high, sampling.steps - high


# ----------------------------------------------------------------------------- parameters

# Each leaf: (shape, init, tp_dim). init: "normal" weight, "zeros" bias, "ones" norm scale,
# "modulation" randn / sqrt(dim). tp_dim: the dim tensor parallelism shards (None: replicated).
_Leaf = tuple[tuple[int, ...], str, int | None]


def _linear(fan_in: int, fan_out: int, layers: tuple[int, ...] = (),
            tp: str | None = None) -> dict[str, _Leaf]:
    """A Linear layer; ``tp="column"`` shards its outputs, ``"row"`` its inputs."""
    rank = len(layers)
    w_dim = {"column": rank + 1, "row": rank, None: None}[tp]
    return {"w": ((*layers, fan_in, fan_out), "normal", w_dim),
            "b": ((*layers, fan_out), "zeros", rank if tp == "column" else None)}


def _attention_leaves(cfg: WanConfig, layers: tuple[int, ...], *, image: bool) -> dict:
    d = cfg.dim
    tree: dict[str, Any] = {name: _linear(d, d, layers, "column") for name in ("q", "k", "v")}
    tree["o"] = _linear(d, d, layers, "row")
    norms = ["norm_q", "norm_k"]
    if image:
        tree["k_img"] = _linear(d, d, layers, "column")
        tree["v_img"] = _linear(d, d, layers, "column")
        norms.append("norm_k_img")
    if cfg.qk_norm:
        for name in norms:
            tree[name] = ((*layers, d), "ones", len(layers))
    return tree


def param_leaves(cfg: WanConfig) -> Params:
    """The parameter tree as ``(shape, init, tp_dim)`` leaves; every other view derives from it."""
    d, layers = cfg.dim, (cfg.num_layers,)
    pt, ph, pw = cfg.patch_size
    blocks: dict[str, Any] = {
        "modulation": ((*layers, 6, d), "modulation", None),
        "self_attn": _attention_leaves(cfg, layers, image=False),
        "cross_attn": _attention_leaves(cfg, layers, image=cfg.uses_clip),
        "ffn": {"fc1": _linear(d, cfg.ffn_dim, layers, "column"),
                "fc2": _linear(cfg.ffn_dim, d, layers, "row")},
    }
    if cfg.cross_attn_norm:
        blocks["norm3"] = {"scale": ((*layers, d), "ones", None),
                           "bias": ((*layers, d), "zeros", None)}
    tree: Params = {
        "patch_embedding": {"w": ((cfg.in_dim, pt, ph, pw, d), "normal", None),
                            "b": ((d,), "zeros", None)},
        "text_embedding": {"fc1": _linear(cfg.text_dim, d), "fc2": _linear(d, d)},
        "time_embedding": {"fc1": _linear(cfg.freq_dim, d), "fc2": _linear(d, d)},
        "time_projection": _linear(d, 6 * d),
        "blocks": blocks,
        "head": {"modulation": ((2, d), "modulation", None),
                 **_linear(d, pt * ph * pw * cfg.out_dim)},
    }
    if cfg.uses_clip:
        tree["img_emb"] = {
            "ln1": {"scale": ((CLIP_DIM,), "ones", None), "bias": ((CLIP_DIM,), "zeros", None)},
            "fc1": _linear(CLIP_DIM, CLIP_DIM), "fc2": _linear(CLIP_DIM, d),
            "ln2": {"scale": ((d,), "ones", None), "bias": ((d,), "zeros", None)},
        }
    return tree


def _is_leaf(node: Any) -> bool:
    return isinstance(node, tuple) and len(node) == 3 and isinstance(node[0], tuple)


def _map_leaves(fn: Any, tree: Params) -> Params:
    return jax.tree.map(fn, tree, is_leaf=_is_leaf)


def abstract_params(cfg: WanConfig, dtype: Any = jnp.bfloat16) -> Params:
    """The parameters as ``ShapeDtypeStruct``s: shapes for lowering, nothing allocated."""
    return _map_leaves(lambda leaf: jax.ShapeDtypeStruct(leaf[0], dtype), param_leaves(cfg))


def init_params(cfg: WanConfig, key: jax.Array, dtype: Any = jnp.float32, *,
                std: float = 0.02) -> Params:
    """Random parameters: normal(std) weights, zero biases, unit norms, official modulation."""
    leaves, treedef = jax.tree.flatten(param_leaves(cfg), is_leaf=_is_leaf)
    keys = jax.random.split(key, len(leaves))
    values = []
    for (shape, init, _), k in zip(leaves, keys, strict=True):
        if init == "normal":
            value = std * jax.random.normal(k, shape, jnp.float32)
        elif init == "modulation":
            value = jax.random.normal(k, shape, jnp.float32) / math.sqrt(cfg.dim)
        else:
            value = (jnp.ones if init == "ones" else jnp.zeros)(shape, jnp.float32)
        values.append(value.astype(dtype))
    return jax.tree.unflatten(treedef, values)


def param_specs(cfg: WanConfig, plan: ParallelPlan, *, stored: bool = True) -> Params:
    """``PartitionSpec`` per parameter: tp dims, plus FSDP dims when ``stored``."""
    return _map_leaves(lambda leaf: plan.weight_spec(leaf[0], leaf[2], stored=stored),
                       param_leaves(cfg))


def param_shardings(cfg: WanConfig, plan: ParallelPlan) -> Params:
    """``NamedSharding`` per parameter as stored (for ``jax.jit`` / ``jax.device_put``)."""
    if plan.mesh is None:
        raise AoizoraError("param_shardings needs a ParallelPlan with a mesh.")
    return jax.tree.map(lambda spec: NamedSharding(plan.mesh, spec),
                        param_specs(cfg, plan), is_leaf=lambda x: isinstance(x, P))


def param_count(cfg: WanConfig) -> int:
    """Number of parameters (t2v-1.3b: 1.42e9; t2v-14b: 1.43e10, 28.6 GB in bf16)."""
    leaves = jax.tree.leaves(param_leaves(cfg), is_leaf=_is_leaf)
    return sum(math.prod(leaf[0]) for leaf in leaves)


# ----------------------------------------------------------------------------- official weights

def _official_names(cfg: WanConfig) -> dict[tuple[str, ...], str]:
    """JAX parameter path -> official state-dict name (``{i}`` for the block index)."""
    names: dict[tuple[str, ...], str] = {
        ("patch_embedding", "w"): "patch_embedding.weight",
        ("patch_embedding", "b"): "patch_embedding.bias",
        ("time_projection", "w"): "time_projection.1.weight",
        ("time_projection", "b"): "time_projection.1.bias",
        ("head", "modulation"): "head.modulation",
        ("head", "w"): "head.head.weight",
        ("head", "b"): "head.head.bias",
        ("blocks", "modulation"): "blocks.{i}.modulation",
    }
    for module in ("text_embedding", "time_embedding"):
        for ours, theirs in (("fc1", 0), ("fc2", 2)):
            for p, suffix in (("w", "weight"), ("b", "bias")):
                names[(module, ours, p)] = f"{module}.{theirs}.{suffix}"
    leaves = param_leaves(cfg)["blocks"]
    for attn in ("self_attn", "cross_attn"):
        for name, node in leaves[attn].items():
            if _is_leaf(node):
                names[("blocks", attn, name)] = f"blocks.{{i}}.{attn}.{name}.weight"
            else:
                for p, suffix in (("w", "weight"), ("b", "bias")):
                    names[("blocks", attn, name, p)] = f"blocks.{{i}}.{attn}.{name}.{suffix}"
    for ours, theirs in (("fc1", 0), ("fc2", 2)):
        for p, suffix in (("w", "weight"), ("b", "bias")):
            names[("blocks", "ffn", ours, p)] = f"blocks.{{i}}.ffn.{theirs}.{suffix}"
    if cfg.cross_attn_norm:
        names[("blocks", "norm3", "scale")] = "blocks.{i}.norm3.weight"
        names[("blocks", "norm3", "bias")] = "blocks.{i}.norm3.bias"
    if cfg.uses_clip:
        for ours, theirs in (("ln1", 0), ("fc1", 1), ("fc2", 3), ("ln2", 4)):
            keys = ("scale", "bias") if ours.startswith("ln") else ("w", "b")
            for p, suffix in zip(keys, ("weight", "bias"), strict=True):
                names[("img_emb", ours, p)] = f"img_emb.proj.{theirs}.{suffix}"
    return names


def _to_jax_layout(path: tuple[str, ...], value: np.ndarray) -> np.ndarray:
    """Official tensor layout -> ours: Linear [out, in] -> [in, out]; Conv3d -> [in, p, q, r, out];
    modulation [1, k, dim] -> [k, dim]."""
    if path == ("patch_embedding", "w"):
        return np.moveaxis(value, 0, -1)
    if path[-1] == "modulation":
        return value.reshape(value.shape[-2:])
    if path[-1] == "w":
        return value.T
    return value


def load_official_weights(source: Mapping[str, Any] | str | Path | list[str | Path],
                          cfg: WanConfig, dtype: Any = jnp.float32) -> Params:
    """Map an official Wan 2.1 state dict onto this model's parameters.

    ``source`` is a mapping of names to arrays (numpy, or torch tensors via ``.numpy()``), a
    ``.safetensors`` file, a list of them (sharded checkpoints) or a folder holding them.
    Keys the model does not use (e.g. a fixture's inputs) are ignored; a missing or misshaped
    parameter is an error naming it.
    """
    tensors = _read_state(source)
    expected = param_leaves(cfg)
    names = _official_names(cfg)
    flat, treedef = jax.tree.flatten_with_path(expected, is_leaf=_is_leaf)
    values = []
    for key_path, (shape, _, _) in flat:
        path = tuple(k.key for k in key_path)
        template = names[path]
        if path[0] == "blocks":
            parts = [_fetch(tensors, template.format(i=i)) for i in range(cfg.num_layers)]
            value = np.stack([_to_jax_layout(path[1:], p) for p in parts])
        else:
            value = _to_jax_layout(path, _fetch(tensors, template))
        if value.shape != shape:
            raise AoizoraError(
                f"Official parameter {template!r} has shape {value.shape} after layout "
                f"conversion, but {cfg} needs {shape}; is the config right for this checkpoint?"
            )
        values.append(jnp.asarray(value, dtype=dtype))
    return jax.tree.unflatten(treedef, values)


def _read_state(source: Mapping[str, Any] | str | Path | list[str | Path]) -> Mapping[str, Any]:
    if isinstance(source, Mapping):
        return source
    paths = [Path(p) for p in (source if isinstance(source, list) else [source])]
    files = [f for p in paths for f in (sorted(p.glob("*.safetensors")) if p.is_dir() else [p])]
    if not files:
        raise AoizoraError(f"No .safetensors files at {source!r}.")
    state: dict[str, Any] = {}
    for f in files:
        if not f.exists():
            raise AoizoraError(f"Checkpoint file {f} does not exist.")
        state.update(load_safetensors(f))
    return state


def _fetch(tensors: Mapping[str, Any], name: str) -> np.ndarray:
    if name not in tensors:
        raise AoizoraError(
            f"The checkpoint has no {name!r}; it holds {len(tensors)} tensors such as "
            f"{sorted(tensors)[:3]}. Is it a Wan 2.1 checkpoint of this model type and size?"
        )
    value = tensors[name]
    value = value.numpy() if hasattr(value, "numpy") else value
    return np.asarray(value, dtype=np.float32)


# ----------------------------------------------------------------------------- forward

def _dense(x: jax.Array, p: Params) -> jax.Array:
    w = p["w"]
    return jnp.dot(x.astype(w.dtype), w, preferred_element_type=jnp.float32) + p["b"]


def _layer_norm(x: jax.Array, eps: float, scale: jax.Array | None = None,
                bias: jax.Array | None = None) -> jax.Array:
    x = x.astype(jnp.float32)
    mean = x.mean(-1, keepdims=True)
    var = jnp.square(x - mean).mean(-1, keepdims=True)
    out = (x - mean) * lax.rsqrt(var + eps)
    if scale is not None:
        out = out * scale.astype(jnp.float32) + bias.astype(jnp.float32)
    return out


def _rms_norm(x: jax.Array, weight: jax.Array, eps: float) -> jax.Array:
    x = x.astype(jnp.float32)
    return x * lax.rsqrt(jnp.square(x).mean(-1, keepdims=True) + eps) * weight.astype(jnp.float32)


def time_sinusoid(t: jax.Array, dim: int) -> jax.Array:
    """``[cos, sin]`` of ``t * 10000^(-i/half)``, float32 ``[B, dim]``, as accurate as float64.

    The official code computes the angle in float64; an angle near 1000 held in float32 is off
    by up to 6e-5, which would show in the output. Without x64 the angle is instead reduced
    modulo 2*pi exactly: with ``t = t_int + t_frac`` and ``f = f_hi + f_lo`` (``f_hi`` on a
    1/4096 grid), ``t_int * f_hi`` is an exact float32 for timesteps up to 1024 (Wan samples
    0..1000), and so is ``turns * C1`` for ``C1`` = 2*pi on a 1/8192 grid. Example: t = 999,
    f = 1 is 159 turns plus 0.9955; the reduced angle keeps that remainder to float32 rounding
    (~1e-7) where a float32 angle of 999 would be off by up to 3e-5.
    """
    half = dim // 2
    freqs = np.power(10000.0, -np.arange(half, dtype=np.float64) / half)
    f_hi = np.round(freqs * 4096) / 4096
    f_lo = (freqs - f_hi).astype(np.float32)
    c1 = np.round(2 * np.pi * 8192) / 8192
    c2 = np.float32(2 * np.pi - c1)
    t = jnp.asarray(t, jnp.float32)[:, None]
    t_int = jnp.round(t)
    big = t_int * f_hi.astype(np.float32)  # exact
    turns = jnp.round(big / np.float32(2 * np.pi))
    small = t_int * f_lo + (t - t_int) * freqs.astype(np.float32)
    angle = (big - turns * np.float32(c1)) - turns * c2 + small
    return jnp.concatenate([jnp.cos(angle), jnp.sin(angle)], axis=1)


def rope_tables(cfg: WanConfig, grid: tuple[int, int, int], padded: int) -> tuple[np.ndarray,
                                                                                   np.ndarray]:
    """cos and sin ``[padded, head_dim // 2]`` (float32 from float64) for tokens in (f, h, w)
    order; padding tokens get the identity rotation (the official code leaves them as is)."""
    tables = []
    for size, dims in zip(grid, cfg.rope_dims, strict=True):
        inv = 1.0 / np.power(10000.0, np.arange(0, dims, 2, dtype=np.float64) / dims)
        tables.append(np.outer(np.arange(size, dtype=np.float64), inv))
    f, h, w = grid
    angles = np.concatenate([
        np.broadcast_to(tables[0][:, None, None, :], (f, h, w, tables[0].shape[1])),
        np.broadcast_to(tables[1][None, :, None, :], (f, h, w, tables[1].shape[1])),
        np.broadcast_to(tables[2][None, None, :, :], (f, h, w, tables[2].shape[1])),
    ], axis=-1).reshape(f * h * w, -1)
    angles = np.concatenate([angles, np.zeros((padded - len(angles), angles.shape[1]))])
    return np.cos(angles).astype(np.float32), np.sin(angles).astype(np.float32)


def _apply_rope(x: jax.Array, cos: jax.Array, sin: jax.Array) -> jax.Array:
    """Rotate interleaved pairs (2i, 2i+1) of ``x`` ``[B, S, H, D]`` (a complex multiply)."""
    pairs = x.astype(jnp.float32).reshape(*x.shape[:-1], -1, 2)
    re, im = pairs[..., 0], pairs[..., 1]
    cos, sin = cos[None, :, None, :], sin[None, :, None, :]
    rotated = jnp.stack([re * cos - im * sin, re * sin + im * cos], axis=-1)
    return rotated.reshape(x.shape).astype(x.dtype)


def _heads(x: jax.Array, cfg: WanConfig) -> jax.Array:
    return x.reshape(*x.shape[:2], cfg.num_heads, cfg.head_dim)


def _block(x: jax.Array, layer: Params, *, cfg: WanConfig, plan: ParallelPlan, e0: jax.Array,
           text: jax.Array, image: jax.Array | None, cos: jax.Array, sin: jax.Array,
           valid_tokens: int) -> jax.Array:
    """One transformer block on the float32 residual stream ``x`` ``[B, S, D]``; ``e0``
    ``[B, 6, D]`` (one modulation per video) or ``[B, S, 6, D]`` (per token)."""
    table = layer["modulation"].astype(jnp.float32)
    if e0.ndim == 3:
        e = [m[:, None, :] for m in jnp.unstack(table[None] + e0, axis=1)]
    else:
        e = jnp.unstack(table + e0, axis=2)
    act_dtype = layer["ffn"]["fc1"]["w"].dtype
    heads_spec = plan.heads_spec(sequence=True)
    kv_spec = plan.heads_spec(sequence=False)

    def qk(h: jax.Array, attn: Params, name: str, norm: str) -> jax.Array:
        out = _dense(h, attn[name])
        if cfg.qk_norm:
            out = _rms_norm(out, attn[norm], cfg.eps)
        return _heads(out.astype(act_dtype), cfg)

    # self-attention
    sa = layer["self_attn"]
    h = (_layer_norm(x, cfg.eps) * (1 + e[1]) + e[0]).astype(act_dtype)
    q = plan.constrain(_apply_rope(qk(h, sa, "q", "norm_q"), cos, sin), heads_spec)
    k = plan.constrain(_apply_rope(qk(h, sa, "k", "norm_k"), cos, sin), heads_spec)
    v = plan.constrain(_heads(_dense(h, sa["v"]).astype(act_dtype), cfg), heads_spec)
    attn = plan.self_attention(q, k, v, valid_tokens=valid_tokens)
    y = _dense(attn.reshape(x.shape).astype(act_dtype), sa["o"])
    x = plan.constrain(x + y * e[2], plan.activation_spec)

    # cross-attention to text (and image) tokens
    ca = layer["cross_attn"]
    h = x
    if cfg.cross_attn_norm:
        h = _layer_norm(x, cfg.eps, layer["norm3"]["scale"], layer["norm3"]["bias"])
    h = h.astype(act_dtype)
    q = plan.constrain(qk(h, ca, "q", "norm_q"), heads_spec)
    k = plan.constrain(qk(text, ca, "k", "norm_k"), kv_spec)
    v = plan.constrain(_heads(_dense(text, ca["v"]).astype(act_dtype), cfg), kv_spec)
    attn = plan.cross_attention(q, k, v)
    if image is not None:
        k_img = plan.constrain(qk(image, ca, "k_img", "norm_k_img"), kv_spec)
        v_img = plan.constrain(_heads(_dense(image, ca["v_img"]).astype(act_dtype), cfg), kv_spec)
        attn = attn + plan.cross_attention(q, k_img, v_img)
    x = x + _dense(attn.reshape(x.shape).astype(act_dtype), ca["o"])
    x = plan.constrain(x, plan.activation_spec)

    # FFN
    ffn = layer["ffn"]
    h = (_layer_norm(x, cfg.eps) * (1 + e[4]) + e[3]).astype(act_dtype)
    hidden = jax.nn.gelu(_dense(h, ffn["fc1"]), approximate=True).astype(act_dtype)
    x = x + _dense(hidden, ffn["fc2"]) * e[5]
    return plan.constrain(x, plan.activation_spec)


def forward(params: Params, cfg: WanConfig, x: jax.Array, t: jax.Array, context: jax.Array, *,
            clip_fea: jax.Array | None = None, y: jax.Array | None = None,
            plan: ParallelPlan | None = None) -> jax.Array:
    """The Wan 2.1 prediction ``[B, C_out, F, H, W]`` (float32) for latents ``x``.

    ``x`` ``[B, C, F, H, W]`` (C = ``in_dim``, or ``in_dim - y's channels`` for i2v), ``t``
    ``[B]`` or ``[B, tokens]`` (one timestep per token in (f, h, w) order: Wan 2.2 TI2V gives
    an image's first latent frame 0), ``context`` ``[B, L <= text_len, text_dim]``; i2v also
    needs ``y`` ``[B, in_dim - C, F, H, W]`` and, with :attr:`WanConfig.clip`, ``clip_fea``
    ``[B, 257, 1280]``.
    """
    plan = plan or ParallelPlan()
    if y is not None:
        x = jnp.concatenate([x, y.astype(x.dtype)], axis=1)
    _check_inputs(cfg, x, t, context, clip_fea)
    batch, _, frames, height, width = x.shape
    plan.check_model(num_heads=cfg.num_heads, batch=batch)
    pt, ph, pw = cfg.patch_size
    grid = (frames // pt, height // ph, width // pw)
    tokens = math.prod(grid)
    padded = plan.padded_tokens(tokens)
    pe = params["patch_embedding"]
    act_dtype = pe["w"].dtype

    patches = x.astype(act_dtype).reshape(batch, cfg.in_dim, grid[0], pt, grid[1], ph, grid[2], pw)
    h = jnp.einsum("bcfphqwr,cpqrd->bfhwd", patches, pe["w"],
                   preferred_element_type=jnp.float32) + pe["b"]
    h = jnp.pad(h.reshape(batch, tokens, cfg.dim), ((0, 0), (0, padded - tokens), (0, 0)))
    h = plan.constrain(h, plan.activation_spec)

    # e [B, D], e0 [B, 6, D]; per token (t [B, tokens]) e [B, S, D], e0 [B, S, 6, D], split
    # with the tokens, zeros on the padding.
    te = params["time_embedding"]
    per_token = t.ndim == 2
    sinusoid = time_sinusoid(t.reshape(-1) if per_token else t, cfg.freq_dim)
    e = _dense(jax.nn.silu(_dense(sinusoid, te["fc1"])), te["fc2"])
    if per_token:
        e = jnp.pad(e.reshape(batch, tokens, cfg.dim), ((0, 0), (0, padded - tokens), (0, 0)))
        e = plan.constrain(e, plan.activation_spec)
        e0 = _dense(jax.nn.silu(e), params["time_projection"]).reshape(batch, padded, 6, cfg.dim)
        e0 = plan.constrain(e0, P(*plan.activation_spec[:2], None, None))
    else:
        e0 = _dense(jax.nn.silu(e), params["time_projection"]).reshape(batch, 6, cfg.dim)

    text_in = jnp.pad(context, ((0, 0), (0, cfg.text_len - context.shape[1]), (0, 0)))
    tx = params["text_embedding"]
    text = _dense(jax.nn.gelu(_dense(text_in, tx["fc1"]), approximate=True), tx["fc2"])
    text = text.astype(act_dtype)
    image = None
    if cfg.uses_clip:
        im = params["img_emb"]
        g = _layer_norm(clip_fea, _CLIP_LN_EPS, im["ln1"]["scale"], im["ln1"]["bias"])
        g = _dense(jax.nn.gelu(_dense(g, im["fc1"]), approximate=False), im["fc2"])
        image = _layer_norm(g, _CLIP_LN_EPS, im["ln2"]["scale"], im["ln2"]["bias"])
        image = image.astype(act_dtype)

    cos, sin = (jnp.asarray(a) for a in rope_tables(cfg, grid, padded))
    compute_specs = param_specs(cfg, plan, stored=False)["blocks"]

    def body(carry: jax.Array, layer: Params) -> tuple[jax.Array, None]:
        # FSDP: gather this layer's weights to their compute sharding (tp only).
        layer = jax.tree.map(lambda w, s: plan.constrain(w, P(*s[1:])), layer, compute_specs,
                             is_leaf=lambda n: isinstance(n, P))
        out = _block(carry, layer, cfg=cfg, plan=plan, e0=e0, text=text, image=image,
                     cos=cos, sin=sin, valid_tokens=tokens)
        return out, None

    h, _ = lax.scan(body, h, params["blocks"])

    head = params["head"]
    if per_token:
        mod = head["modulation"].astype(jnp.float32) + e[:, :, None, :]
        h = _layer_norm(h, cfg.eps) * (1 + mod[:, :, 1]) + mod[:, :, 0]
    else:
        mod = head["modulation"].astype(jnp.float32)[None] + e[:, None, :]
        h = _layer_norm(h, cfg.eps) * (1 + mod[:, 1:2]) + mod[:, 0:1]
    out = _dense(h.astype(act_dtype), head)
    # Gather the (small) head output over the token shards before dropping the padding.
    out = plan.constrain(out, P(plan.activation_spec[0], None, None))[:, :tokens]
    out = out.reshape(batch, *grid, pt, ph, pw, cfg.out_dim)
    out = jnp.einsum("bfhwpqrc->bcfphqwr", out)
    return out.reshape(batch, cfg.out_dim, frames, height, width).astype(jnp.float32)


def _check_inputs(cfg: WanConfig, x: jax.Array, t: jax.Array, context: jax.Array,
                  clip_fea: jax.Array | None) -> None:
    if x.ndim != 5 or x.shape[1] != cfg.in_dim:
        raise AoizoraError(
            f"x has shape {tuple(x.shape)}; the model needs [B, {cfg.in_dim}, F, H, W] "
            "(i2v: x and y together)."
        )
    if any(n % p for n, p in zip(x.shape[2:], cfg.patch_size, strict=True)):
        raise AoizoraError(
            f"Latent F, H, W = {tuple(x.shape[2:])} must divide by patch_size {cfg.patch_size}."
        )
    tokens = math.prod(n // p for n, p in zip(x.shape[2:], cfg.patch_size, strict=True))
    if t.shape not in ((x.shape[0],), (x.shape[0], tokens)):
        raise AoizoraError(
            f"t has shape {tuple(t.shape)}; the model needs [{x.shape[0]}] (one timestep per "
            f"video) or [{x.shape[0]}, {tokens}] (one per token)."
        )
    if (context.ndim != 3 or context.shape[0] != x.shape[0] or context.shape[2] != cfg.text_dim
            or context.shape[1] > cfg.text_len):
        raise AoizoraError(
            f"context has shape {tuple(context.shape)}; the model needs [{x.shape[0]}, "
            f"L <= {cfg.text_len}, {cfg.text_dim}]."
        )
    if cfg.uses_clip and (clip_fea is None or clip_fea.shape[1:] != (CLIP_TOKENS, CLIP_DIM)):
        raise AoizoraError(
            f"Wan 2.1 i2v needs clip_fea [B, {CLIP_TOKENS}, {CLIP_DIM}] and y; got clip_fea "
            f"{None if clip_fea is None else tuple(clip_fea.shape)}."
        )
    if clip_fea is not None and not cfg.uses_clip:
        raise AoizoraError(
            f"clip_fea given to a {cfg.model_type} model without CLIP tokens (WanConfig.clip="
            f"{cfg.clip}); leave it out (Wan 2.2 i2v reads the image only through y)."
        )
