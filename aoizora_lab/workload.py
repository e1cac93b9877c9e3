"""What the planner optimises: one denoising step of a Wan model on a video of a given size.

A :class:`Workload` fixes the model, the video size and whether classifier-free guidance runs
(a conditional and an unconditional pass per step). From it follow the latent shape and the
token count, e.g. 832x480, 81 frames:

    latent = (16, (81 - 1) / 4 + 1, 480 / 8, 832 / 8) = (16, 21, 60, 104)
    tokens = 21 * (60 / 2) * (104 / 2) = 32,760

The model's VAE sets the latent: Wan 2.2 TI2V-5B's compresses 16 x 16 pixels into 48 channels,
so its official 1280x704, 121 frames is (48, 31, 44, 80) and 27,280 tokens, each with its own
timestep (the model's per-token modulation).

:func:`denoise_step` is the unit the planner compiles and times: both passes batched (batch 2,
so a ``cfg`` mesh axis of 2 puts them on different devices, as MaxDiffusion does) and the
guidance combine ``uncond + scale * (cond - uncond)``.
"""

from __future__ import annotations

import dataclasses
import math
import re
from dataclasses import dataclass
from typing import Any

import jax
import jax.numpy as jnp

from aoizora_lab.errors import AoizoraError, is_whole
from aoizora_lab.models.parallel import ParallelPlan
from aoizora_lab.models.wan import (
    CLIP_DIM,
    CLIP_TOKENS,
    SAMPLING,
    Params,
    Sampling,
    WanConfig,
    forward,
    preset_key,
)

RESOLUTIONS: dict[str, tuple[int, int]] = {"480p": (832, 480), "720p": (1280, 720)}
"""Named video sizes (width, height) of the official Wan 2.1 presets."""
DEFAULT_TEXT_LEN = 512  # the official T5 context length (wan/configs: text_len)
_SPEC = re.compile(
    r"([^@\s]+)@(?:(\d+p)|(\d+)x(\d+))(?:x(\d+))?(-nocfg)?(?:-text(\d+))?(-swap)?")


@dataclass(frozen=True)
class Workload:
    """One denoising step of ``model`` on a ``width`` x ``height`` video of ``frames`` frames."""

    model: str | WanConfig
    """Wan preset name (``"wan2.1-t2v-1.3b"``...) or a custom :class:`WanConfig`."""
    height: int
    """Video height in pixels (a multiple of 16)."""
    width: int
    """Video width in pixels (a multiple of 16)."""
    frames: int = 81
    """Video frames, ``4n + 1``."""
    cfg: bool = True
    """Classifier-free guidance: a conditional and an unconditional pass per step."""
    text_len: int = DEFAULT_TEXT_LEN
    """Text tokens fed to the model (at most the model's ``text_len``)."""
    swap_experts: bool = False
    """Wan 2.2 A14B only: keep one expert in HBM and swap the other in from the host at the
    boundary step (the official code's ``offload_model``), so a step has the HBM of one
    expert; ``False`` (MaxDiffusion's way): both stay resident. What the swaps add to a video
    is :attr:`aoizora_lab.generation.Generation.expert_swap_s`."""

    def __post_init__(self) -> None:
        self.validate()

    def validate(self) -> None:
        """Raise :class:`AoizoraError` naming any value the model cannot take."""
        model = self.config()
        for name in ("height", "width", "frames", "text_len"):
            value = getattr(self, name)
            if not is_whole(value):
                raise AoizoraError(f"Workload.{name}={value!r} must be a positive integer.")
        if not isinstance(self.cfg, bool):
            raise AoizoraError(
                f"Workload.cfg={self.cfg!r} must be True (guidance: two passes per step) or "
                "False (one pass)."
            )
        if not isinstance(self.swap_experts, bool):
            raise AoizoraError(
                f"Workload.swap_experts={self.swap_experts!r} must be True (one A14B expert "
                "resident, the other swapped in from the host) or False (both resident).")
        if self.swap_experts and self.experts == 1:
            raise AoizoraError(
                f"Workload.swap_experts=True for {self.name.split('@')[0]}: only a model with "
                "two experts (wan2.2-t2v-a14b, wan2.2-i2v-a14b) can swap one through the host; "
                "leave it False.")
        stride = model.vae_stride
        spatial = stride[1] * model.patch_size[1]
        if self.height % spatial or self.width % (stride[2] * model.patch_size[2]):
            example = "832x480 or 1280x720" if spatial == 16 else "1280x704"
            raise AoizoraError(
                f"Workload {self.width}x{self.height}: width and height must be multiples of "
                f"{spatial} (VAE stride {stride[1]} x patch {model.patch_size[1]}), e.g. "
                f"{example}."
            )
        if (self.frames - 1) % stride[0]:
            raise AoizoraError(
                f"Workload.frames={self.frames} must be {stride[0]}n + 1 (e.g. 81) for the Wan "
                "VAE."
            )
        if self.text_len > model.text_len:
            raise AoizoraError(
                f"Workload.text_len={self.text_len} exceeds the model's text_len "
                f"{model.text_len}."
            )

    @classmethod
    def preset(cls, model: str, resolution: str, *, frames: int = 81, cfg: bool = True) -> Workload:
        """``Workload.preset("wan2.1-t2v-14b", "720p")``: a named size from :data:`RESOLUTIONS`."""
        if resolution not in RESOLUTIONS:
            raise AoizoraError(
                f"Unknown resolution {resolution!r}; named resolutions are {list(RESOLUTIONS)} "
                "(or pass width and height to Workload)."
            )
        width, height = RESOLUTIONS[resolution]
        return cls(model=model, height=height, width=width, frames=frames, cfg=cfg)

    def config(self) -> WanConfig:
        """The model's :class:`WanConfig`."""
        return self.model if isinstance(self.model, WanConfig) else WanConfig.preset(self.model)

    @property
    def name(self) -> str:
        """The workload spec, e.g. ``wan2.1-t2v-14b@1280x720x81``; :meth:`parse` reads it back.

        Non-default guidance, text length and expert swapping are suffixes: ``...x81-nocfg``,
        ``...x81-text256``, ``...x81-swap``. A custom :class:`WanConfig` is named ``custom`` (it
        has no preset to parse back to).
        """
        model = self.model if isinstance(self.model, str) else "custom"
        flags = ("" if self.cfg else "-nocfg") + (
            "" if self.text_len == DEFAULT_TEXT_LEN else f"-text{self.text_len}") + (
            "-swap" if self.swap_experts else "")
        return f"{model}@{self.width}x{self.height}x{self.frames}{flags}"

    @classmethod
    def parse(cls, spec: str) -> Workload:
        """``Workload.parse("wan2.1-t2v-14b@1280x720x81")``: the one way a workload is written.

        Grammar: ``MODEL@SIZE[xFRAMES][-nocfg][-textN][-swap]`` with SIZE ``WIDTHxHEIGHT`` or a
        named resolution (``480p``, ``720p``); FRAMES defaults to 81, guidance to on, text
        length to 512, both A14B experts to resident. ``Workload.parse(w.name) == w`` for every
        preset-model workload.
        """
        match = _SPEC.fullmatch(str(spec).strip())
        if not match:
            raise AoizoraError(
                f"Workload {spec!r} must be MODEL@WIDTHxHEIGHT[xFRAMES][-nocfg][-textN][-swap] "
                "(or a "
                f"named size {list(RESOLUTIONS)} for WIDTHxHEIGHT), e.g. "
                "'wan2.1-t2v-14b@1280x720x81' or 'wan2.1-t2v-1.3b@480p'."
            )
        model, named, width, height, frames, nocfg, text, swap = match.groups()
        if model == "custom":
            raise AoizoraError(
                f"Workload {spec!r}: a custom WanConfig has no name to parse; build it with "
                "Workload(model=WanConfig(...), height=..., width=...).")
        if named is not None:
            if named not in RESOLUTIONS:
                raise AoizoraError(
                    f"Workload {spec!r}: unknown resolution {named!r}; named resolutions are "
                    f"{list(RESOLUTIONS)}, or write WIDTHxHEIGHT (e.g. 1280x720).")
            width, height = RESOLUTIONS[named]
        try:
            return cls(model=model, height=int(height), width=int(width),
                       frames=int(frames) if frames else 81, cfg=nocfg is None,
                       text_len=int(text) if text else DEFAULT_TEXT_LEN,
                       swap_experts=swap is not None)
        except AoizoraError as err:
            raise AoizoraError(f"Workload {spec!r}: {err}") from None

    @property
    def sampling(self) -> Sampling | None:
        """The preset's official sampler (steps, shift, expert boundary); ``None`` for a
        custom :class:`WanConfig`, which has none."""
        return SAMPLING[preset_key(self.model)] if isinstance(self.model, str) else None

    @property
    def experts(self) -> int:
        """The model's denoisers: 2 for Wan 2.2 A14B (a high- and a low-noise expert, a step
        runs one), else 1."""
        return self.sampling.experts if self.sampling else 1

    @property
    def resident_experts(self) -> int:
        """Experts in HBM while a step runs: both A14B experts unless :attr:`swap_experts`
        (MaxDiffusion keeps both); the one a step does not run is HBM its program cannot
        use."""
        return 1 if self.swap_experts else self.experts

    def program_fields(self) -> dict[str, Any]:
        """The fields the step's program depends on, as plain values: all but the model (it
        travels as its :class:`WanConfig`) and :attr:`swap_experts` (where the idle expert
        waits changes the HBM left, not the step). Compile and trace caches key on these, so
        a swapping workload reuses the resident one's programs."""
        return {k: v for k, v in dataclasses.asdict(self).items()
                if k not in ("model", "swap_experts")}

    @property
    def batch(self) -> int:
        """Forward passes batched per step: 2 with guidance, else 1."""
        return 2 if self.cfg else 1

    @property
    def latent_shape(self) -> tuple[int, int, int, int]:
        """``(channels, latent frames, latent height, latent width)`` of the noisy latent."""
        model = self.config()
        stride = model.vae_stride
        return (model.out_dim, (self.frames - 1) // stride[0] + 1, self.height // stride[1],
                self.width // stride[2])

    @property
    def token_grid(self) -> tuple[int, int, int]:
        """Tokens along (frames, height, width) after patching."""
        _, f, h, w = self.latent_shape
        pt, ph, pw = self.config().patch_size
        return f // pt, h // ph, w // pw

    @property
    def tokens(self) -> int:
        """Video tokens per pass (32,760 at 480p, 75,600 at 720p, 81 frames)."""
        return math.prod(self.token_grid)

    def abstract_inputs(self, dtype: Any = jnp.bfloat16) -> dict[str, jax.ShapeDtypeStruct]:
        """Shapes of :func:`denoise_step`'s inputs for one video (batch 1), nothing allocated.
        TI2V takes one timestep per token (as the official pipeline always passes it)."""
        model = self.config()
        shapes: dict[str, tuple[tuple[int, ...], Any]] = {
            "latents": ((1, *self.latent_shape), dtype),
            "t": ((1, self.tokens) if model.model_type == "ti2v" else (1,), jnp.float32),
            "context": ((1, self.text_len, model.text_dim), dtype),
        }
        if self.cfg:
            shapes["negative_context"] = shapes["context"]
        if model.uses_clip:
            shapes["clip_fea"] = ((1, CLIP_TOKENS, CLIP_DIM), dtype)
        if model.condition_channels:
            shapes["y"] = ((1, model.condition_channels, *self.latent_shape[1:]), dtype)
        return {name: jax.ShapeDtypeStruct(shape, dt) for name, (shape, dt) in shapes.items()}

    def random_inputs(self, key: jax.Array, dtype: Any = jnp.float32) -> dict[str, jax.Array]:
        """Random inputs of :meth:`abstract_inputs`' shapes (timestep 500)."""
        specs = self.abstract_inputs(dtype)
        keys = dict(zip(specs, jax.random.split(key, len(specs)), strict=True))
        inputs = {name: jax.random.normal(keys[name], s.shape, s.dtype)
                  for name, s in specs.items() if name != "t"}
        inputs["t"] = jnp.full(specs["t"].shape, 500.0, jnp.float32)
        return inputs


def denoise_step(params: Params, model: WanConfig, latents: jax.Array, t: jax.Array,
                 context: jax.Array, negative_context: jax.Array | None = None, *,
                 guidance_scale: float = 5.0, clip_fea: jax.Array | None = None,
                 y: jax.Array | None = None, plan: ParallelPlan | None = None) -> jax.Array:
    """One denoising step's model prediction for one video ``latents`` ``[1, C, F, H, W]``.

    With ``negative_context`` (guidance) the conditional and unconditional passes run batched
    and combine as ``uncond + guidance_scale * (cond - uncond)``; without it one pass runs.
    """
    if negative_context is None:
        return forward(params, model, latents, t, context, clip_fea=clip_fea, y=y, plan=plan)

    def twice(a: jax.Array | None) -> jax.Array | None:
        return None if a is None else jnp.concatenate([a, a])

    both = forward(params, model, twice(latents), twice(t),
                   jnp.concatenate([context, negative_context]),
                   clip_fea=twice(clip_fea), y=twice(y), plan=plan)
    cond, uncond = both[:1], both[1:]
    return uncond + guidance_scale * (cond - uncond)


def lower_step(workload: Workload, plan: ParallelPlan, *, num_layers: int | None = None,
               dtype: Any = jnp.bfloat16, guidance_scale: float = 5.0) -> jax.stages.Lowered:
    """Lower :func:`denoise_step` for ``workload`` under ``plan`` from shapes alone.

    Weights are laid out as the plan stores them (tp and FSDP sharded), inputs and the output
    replicated. ``num_layers`` lowers a shallower model of the same width (the layer loop is a
    ``scan``, so a compile of few layers shows the per-layer program). Works with live or
    deviceless TPU devices and with CPU host devices in ``plan.mesh``.
    """
    from jax.sharding import NamedSharding
    from jax.sharding import PartitionSpec as P

    from aoizora_lab.models.wan import abstract_params, param_shardings

    if plan.mesh is None:
        raise AoizoraError("lower_step needs a ParallelPlan with a mesh.")
    model = workload.config()
    if num_layers is not None:
        model = model.with_layers(num_layers)
    replicated = NamedSharding(plan.mesh, P())
    shardings = param_shardings(model, plan)
    params = jax.tree.map(lambda a, s: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=s),
                          abstract_params(model, dtype), shardings)
    inputs = {name: jax.ShapeDtypeStruct(s.shape, s.dtype, sharding=replicated)
              for name, s in workload.abstract_inputs(dtype).items()}

    def step(params: Params, inputs: dict[str, jax.Array]) -> jax.Array:
        return denoise_step(params, model, guidance_scale=guidance_scale, plan=plan, **inputs)

    return jax.jit(step, out_shardings=replicated).lower(params, inputs)
