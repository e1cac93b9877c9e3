"""The other programs of a generation, sharded on the slice, compiled and priced like a step.

A Wan generation runs three kinds of program: the text encoder once per prompt, the DiT's
denoising steps (:mod:`aoizora_lab.workload`, planned by :mod:`aoizora_lab.planner`) and the
VAE decoder once per video; an image-to-video generation also runs the VAE encoder on its
condition video. This module owns all but the steps as *parts*: a part is a
program and how it is split over the slice's devices. Each part is lowered with real
shardings (:func:`lower_part`), compiled deviceless by libtpu in a child process through the
compile cache (:func:`compile_part`, the worker :mod:`aoizora_lab.part_worker`), and priced by
:func:`aoizora_lab.cost.predict` on the device orders the libraries give (:func:`price_part`),
exactly as a DiT step is.

The policy, one split per part:

- **Text encoder** (:class:`EncodePart`, UMT5-XXL, :mod:`aoizora_lab.models.t5`): the prompts
  (two with CFG: the prompt and the negative prompt) over ``prompt_split`` devices, and the
  heads and FFN columns over ``tp`` (Megatron: q, k, v, the FFN's fc1 and gate split by output,
  ``o`` and fc2 by input, the embedding by vocabulary row; XLA's SPMD partitioner adds the
  all-reduces). Devices left over hold copies. The official code and MaxDiffusion run the two
  prompts one after the other (MaxDiffusion on the host CPU, in PyTorch); here both go in one
  batch on the TPU.
- **VAE decoder** (:class:`DecodePart`, Wan 2.1's or 2.2's, :mod:`aoizora_lab.models.vae`,
  :mod:`~aoizora_lab.models.vae22`): all frames at once, the latent's rows over ``rows``
  devices and its columns over ``cols``; every level doubles both, so each level's activations
  split alike. Each 3x3 convolution then needs one row or column of its neighbours' pixels:
  the SPMD partitioner adds those halo exchanges (collective-permutes) and the middle
  attention's gather of each frame. Devices left over hold copies. MaxDiffusion splits the
  width only, over every device (``vae_spatial: -1``), and decodes a latent frame at a time
  with the causal cache; xDiT's DistVAE splits the height; the official code decodes on one
  GPU.
- **VAE encoder** (:class:`VideoEncodePart`, :func:`aoizora_lab.models.vae.encode` and
  :func:`~aoizora_lab.models.vae22.encode`): the image-to-video condition (the image, then zero
  frames: the official I2V pipelines of Wan 2.1 and Wan 2.2 A14B encode all 81 frames with the
  Wan 2.1 VAE; TI2V-5B encodes its image alone, one frame, with the Wan 2.2 VAE) split as the
  decoder, in the latent's rows x cols tiles (each level halves both, so each level's
  activations split alike). Wan 2.1 I2V's
  CLIP image encoder is not modelled: ViT-H/14 (about 0.63 B parameters) on one 224 x 224
  image's 257 tokens is about 2 x 0.63e9 x 257 = 0.3 TFLOP, milliseconds on any slice.

Worked example: Wan 2.1 at 720p decodes a latent ``[1, 16, 21, 90, 160]``. On ``v5e:2x4``
(8 devices) the splits whose sizes divide the latent and the devices are rows x cols in
{1, 2} x {1, 2, 4, 8}; :func:`vae_splits` keeps those that use the most devices (2 x 4 and
1 x 8), the squarest first (2 x 4: each device decodes a 45 x 40 latent tile, 360 x 320 pixels
at the last level, and exchanges a tile's edges, 2 x (360 + 320) pixels a row or column per
convolution), each all frames at once and 5 latent frames at a time. Each is compiled (the
first alone, the rest side by side as the memory allows, :func:`plan_part`), and priced in plain
order and in the orders ``jax.make_mesh`` and
``mesh_utils.create_device_mesh`` give its ``(copies, rows, cols)`` mesh.
"""

from __future__ import annotations

import concurrent.futures as cf
import dataclasses
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

from aoizora_lab.comm_model import ModelOptions
from aoizora_lab.compile import (
    CompileStatus,
    default_cache_dir,
    run_job,
    topology_spec,
)
from aoizora_lab.cost import Predicted, predict
from aoizora_lab.errors import AoizoraError, is_whole
from aoizora_lab.hlo import CommProgram, parse_hlo
from aoizora_lab.placement import Placement, library_orders
from aoizora_lab.records import Records
from aoizora_lab.topology import Topology
from aoizora_lab.versions import code_versions, digest, memoized
from aoizora_lab.workers import available_memory, fitting_workers, usable_cpus

VAES = {"wan2.1": 16, "wan2.2": 48}
"""The VAEs a :class:`VaePart` can run, with their latent channels: Wan 2.1's (also Wan 2.2
A14B's) and Wan 2.2 TI2V-5B's."""
DTYPES = ("float32", "bfloat16")
MIN_TILE = 2
"""Fewest latent rows (columns) a split device decodes: with one-row tiles and copies, XLA's
SPMD partitioner (jax 0.10.2, CPU) gave wrong convolutions (a latent of 2 rows in 2 tiles);
real latents have 44 rows or more, so this costs no useful split."""


def vae_for(latent: Sequence[int]) -> str:
    """The VAE that decodes a latent ``[B, C, T, h, w]``: the one with ``C`` channels."""
    names = [name for name, channels in VAES.items() if channels == latent[1]]
    if not names:
        raise AoizoraError(f"No VAE decodes a latent of {latent[1]} channels "
                           f"({tuple(latent)}); the VAEs take {VAES}.")
    return names[0]


@dataclass(frozen=True)
class VaePart:
    """A VAE program on one video's latent, in latent rows x cols tiles (module docstring):
    what :class:`DecodePart` and :class:`VideoEncodePart` share."""

    kind: ClassVar[str]
    prefix: ClassVar[str]
    """How :attr:`name` starts."""
    axes: ClassVar[tuple[str, ...]] = ("copies", "rows", "cols")

    latent: tuple[int, ...]
    """The latent, ``[B, z_dim, T, h, w]`` (``Workload.latent_shape`` with a batch of 1: one
    video): the one the DiT produces and the decoder takes, or the one the encoder makes."""
    vae: str = "wan2.1"
    """Which VAE (:data:`VAES`)."""
    rows: int = 1
    """Devices the latent's rows (and every level's, at its scale) are split over."""
    cols: int = 1
    """Devices the latent's columns are split over."""
    chunk: int | None = None
    """``None``: every frame at once; ``k``: the first frame alone, then ``k`` latent frames at
    a time with the causal convs' cache, as the official code (``k = 1``) and MaxDiffusion's
    ``vae_decode_chunk`` (:func:`aoizora_lab.models.vae.streamed`): less memory, a loop."""
    dtype: str = "float32"
    """Compute and weight dtype. Float32: the official ``WanVAE`` and MaxDiffusion's
    ``vae_dtype`` both run the VAE in float32."""

    def __post_init__(self) -> None:
        owner = type(self).__name__
        object.__setattr__(self, "latent", tuple(self.latent))
        if len(self.latent) != 5 or not all(is_whole(n) for n in self.latent):
            raise AoizoraError(
                f"{owner}.latent={self.latent} must be [B, z_dim, T, h, w] of positive "
                "integers, e.g. (1, 16, 21, 90, 160) for Wan 2.1 at 720p."
            )
        if self.vae not in VAES:
            raise AoizoraError(f"{owner}.vae={self.vae!r} must be one of {tuple(VAES)}.")
        if self.latent[1] != VAES[self.vae]:
            raise AoizoraError(
                f"{owner}.latent={self.latent} has {self.latent[1]} channels; the {self.vae} "
                f"VAE's latent has {VAES[self.vae]}."
            )
        for name, size in (("rows", self.latent[3]), ("cols", self.latent[4])):
            split = getattr(self, name)
            if not (is_whole(split) and (split == 1 or split <= size // MIN_TILE)):
                raise AoizoraError(
                    f"{owner}.{name}={split!r} must be 1 or an integer up to the latent's "
                    f"{size} {name} / {MIN_TILE}: tiles of at least {MIN_TILE} (MIN_TILE; a "
                    "split that does not divide them pads the last tile)."
                )
        if self.chunk is not None and not is_whole(self.chunk, 1, self.latent[2]):
            raise AoizoraError(
                f"{owner}.chunk={self.chunk!r} must be None (every frame at once) or a "
                f"number of latent frames from 1 to the latent's {self.latent[2]}."
            )
        _check_dtype(self)

    @property
    def devices(self) -> int:
        """Devices that run distinct tiles (the others hold copies)."""
        return self.rows * self.cols

    @property
    def name(self) -> str:
        frames = "all" if self.chunk is None else self.chunk
        return f"{self.prefix}-{self.vae}-rows{self.rows}-cols{self.cols}-chunk{frames}"

    def mesh_shape(self, num_devices: int) -> tuple[int, ...]:
        return _mesh_shape(self, num_devices, (self.rows, self.cols))


@dataclass(frozen=True)
class DecodePart(VaePart):
    """One VAE decode of a video's latent, split over the slice (module docstring)."""

    kind: ClassVar[str] = "decode"
    prefix: ClassVar[str] = "vae"


@dataclass(frozen=True)
class VideoEncodePart(VaePart):
    """The VAE encoder on an image-to-video generation's condition, making the ``latent``;
    split as a decode (module docstring): Wan 2.1 I2V and Wan 2.2 I2V-A14B encode the image
    then zero frames (``[1, 3, 1 + 4 (T - 1), 8 h, 8 w]``) with the Wan 2.1 VAE, TI2V-5B its
    image alone (``[1, 3, 1, 16 h, 16 w]``, a latent of one frame) with the Wan 2.2 VAE."""

    kind: ClassVar[str] = "video-encode"
    prefix: ClassVar[str] = "vae-encode"


@dataclass(frozen=True)
class EncodePart:
    """The text encoder on a generation's prompts, split over the slice (module docstring)."""

    kind: ClassVar[str] = "encode"
    axes: ClassVar[tuple[str, ...]] = ("copies", "prompts", "tp")

    prompts: int = 2
    """Prompts encoded together: 2 with CFG (the prompt and the negative prompt), else 1."""
    text_len: int = 512
    """Tokens per prompt (the official ``text_len``: every prompt is padded to it)."""
    prompt_split: int = 1
    """Devices the prompts are split over (divides ``prompts``)."""
    tp: int = 1
    """Devices the heads and FFN columns are split over (divides 64 heads and 10240)."""
    dtype: str = "bfloat16"
    """Compute and weight dtype: the released encoder is bfloat16
    (``models_t5_umt5-xxl-enc-bf16.pth``) and the official ``T5EncoderModel`` runs it so."""

    def __post_init__(self) -> None:
        for name in ("prompts", "text_len", "prompt_split", "tp"):
            if not is_whole(getattr(self, name)):
                raise AoizoraError(
                    f"EncodePart.{name}={getattr(self, name)!r} must be an integer >= 1."
                )
        if self.prompts % self.prompt_split:
            raise AoizoraError(
                f"EncodePart.prompt_split={self.prompt_split} must divide prompts="
                f"{self.prompts}: each device group encodes whole prompts."
            )
        _check_dtype(self)

    @property
    def devices(self) -> int:
        return self.prompt_split * self.tp

    @property
    def name(self) -> str:
        return f"t5-prompts{self.prompt_split}-tp{self.tp}"

    def mesh_shape(self, num_devices: int) -> tuple[int, ...]:
        return _mesh_shape(self, num_devices, (self.prompt_split, self.tp))


Part = DecodePart | VideoEncodePart | EncodePart
_KINDS: dict[str, type] = {"decode": DecodePart, "video-encode": VideoEncodePart,
                           "encode": EncodePart}


def _check_dtype(part: Part) -> None:
    if part.dtype not in DTYPES:
        raise AoizoraError(f"{type(part).__name__}.dtype={part.dtype!r} must be one of {DTYPES}.")


def _mesh_shape(part: Part, num_devices: int, split: tuple[int, ...]) -> tuple[int, ...]:
    if num_devices % part.devices:
        raise AoizoraError(
            f"{part.name} splits over {part.devices} devices, which does not divide the "
            f"slice's {num_devices}: pick splits whose product divides it "
            "(vae_splits / encode_splits list them)."
        )
    return (num_devices // part.devices, *split)


def part_spec(part: Part) -> dict[str, Any]:
    """A part as JSON-able data (a compile job's ``part``); :func:`part_from_spec` inverts it."""
    return {"kind": part.kind, **dataclasses.asdict(part)}


def part_from_spec(spec: dict[str, Any]) -> Part:
    fields = {k: v for k, v in spec.items() if k != "kind"}
    return _KINDS[spec["kind"]](**fields)


# ----------------------------------------------------------------------------- lowering


def part_mesh(part: Part, devices: Sequence[Any]) -> Any:
    """The ``(copies, ...)`` mesh of ``part`` over ``devices``, in this order."""
    import numpy as np
    from jax.sharding import Mesh

    return Mesh(np.asarray(devices, dtype=object).reshape(part.mesh_shape(len(devices))),
                part.axes)


def lower_part(part: Part, devices: Sequence[Any]) -> Any:
    """``part``'s program on the released model, lowered for ``devices`` (:func:`part_mesh`)
    with abstract weights and inputs: a ``jax.stages.Lowered``."""
    return _LOWER[part.kind](part, part_mesh(part, devices))


def vae_of(part: VaePart) -> tuple[Any, Any]:
    """The VAE module and the released config a :class:`VaePart` runs."""
    from aoizora_lab.models import vae, vae22

    return ((vae, vae.VAEConfig.wan21()) if part.vae == "wan2.1"
            else (vae22, vae22.VAE22Config.wan22()))


def sharded_vae(part: VaePart, mesh: Any, config: Any = None) -> Any:
    """``decode(params, z)`` (``encode(params, video)`` for a :class:`VideoEncodePart`) jitted
    with ``part``'s split on ``mesh``: weights and the input copied, every layer's activations
    and the output split in tiles (rows x cols; a constraint, so a split that does not divide
    pads its last tiles, and its output comes back whole on every device: a ``jax.Array`` has
    no padded tiles). ``config``: the VAE's (the released one by default; a small one for
    tests)."""
    import jax
    from jax.sharding import NamedSharding
    from jax.sharding import PartitionSpec as P

    module, released = vae_of(part)
    config = config or released
    tiles = NamedSharding(mesh, P(None, None, None, "rows", "cols"))

    run_vae = module.encode if part.kind == "video-encode" else module.decode

    def run(params: Any, x: Any) -> Any:
        return run_vae(params, x, config, chunk=part.chunk,
                       constrain=lambda a: jax.lax.with_sharding_constraint(a, tiles))

    return jax.jit(run, in_shardings=NamedSharding(mesh, P()))


def _lower_vae(part: VaePart, mesh: Any) -> Any:
    import jax
    import jax.numpy as jnp

    module, config = vae_of(part)
    dtype = jnp.dtype(part.dtype)
    if part.kind == "video-encode":
        params = module.abstract_encoder_params(config, dtype)
        x = jax.ShapeDtypeStruct(module.video_shape(config, part.latent), dtype)
    else:
        params = module.abstract_decoder_params(config, dtype)
        x = jax.ShapeDtypeStruct(part.latent, dtype)
    return sharded_vae(part, mesh).lower(params, x)


def _t5_spec(name: str) -> tuple[Any, ...]:
    """Where a UMT5 parameter's axes go (module docstring: Megatron, by name)."""
    if name.endswith(("attn.q.weight", "attn.k.weight", "attn.v.weight", "ffn.fc1.weight",
                      "ffn.gate.0.weight", "token_embedding.weight")):
        return ("tp", None)
    if name.endswith(("attn.o.weight", "ffn.fc2.weight", "pos_embedding.embedding.weight")):
        return (None, "tp")
    return ()


def sharded_encode(part: EncodePart, mesh: Any, config: Any = None) -> Any:
    """``encode(params, ids, mask)`` jitted with ``part``'s split on ``mesh`` (weights by
    :func:`_t5_spec`'s rule, the prompts over ``prompts``). ``config``: the encoder's (the
    released UMT5-XXL by default; a small one for tests)."""
    import jax
    from jax.sharding import NamedSharding
    from jax.sharding import PartitionSpec as P

    from aoizora_lab.models import t5

    config = config or t5.T5Config.umt5_xxl()
    if config.num_heads % part.tp or config.dim_ffn % part.tp:
        raise AoizoraError(
            f"EncodePart.tp={part.tp} must divide the encoder's {config.num_heads} heads and "
            f"{config.dim_ffn} FFN columns, e.g. 1, 2, 4 or 8 for UMT5-XXL's 64 and 10240."
        )
    weights = {n: NamedSharding(mesh, P(*_t5_spec(n))) for n in t5.param_shapes(config)}
    tokens = NamedSharding(mesh, P("prompts", None))
    return jax.jit(lambda p, i, m: t5.encode(p, i, m, config),
                   in_shardings=(weights, tokens, tokens), out_shardings=tokens)


def _lower_encode(part: EncodePart, mesh: Any) -> Any:
    import jax
    import jax.numpy as jnp

    from aoizora_lab.models import t5

    config = t5.T5Config.umt5_xxl()
    ids = jax.ShapeDtypeStruct((part.prompts, part.text_len), jnp.int32)
    return sharded_encode(part, mesh).lower(
        t5.abstract_encoder_params(config, jnp.dtype(part.dtype)), ids, ids)


_LOWER = {"decode": _lower_vae, "video-encode": _lower_vae, "encode": _lower_encode}


# ----------------------------------------------------------------------------- splits


def vae_splits(latent: Sequence[int], num_devices: int, *, part: type = DecodePart,
               vae: str = "wan2.1", keep: int = 2, chunks: Sequence[int | None] | None = None
               ) -> list[VaePart]:
    """The splits worth compiling for a ``part`` (:class:`DecodePart` or
    :class:`VideoEncodePart`) of ``latent`` on ``num_devices``: rows x cols dividing the
    latent's rows and columns and the devices, those that use the most devices (compute per
    device falls as 1 / devices), the squarest tiles first (a tile's halo is its perimeter), at
    most ``keep`` (module docstring's example), each with every ``chunks``: by default all
    frames at once (no loop; the most memory, which fits on larger slices) and, for a decode,
    5 latent frames at a time (MaxDiffusion's ``vae_decode_chunk`` since its PR #464; the
    official 1 carries the cache through 4x more steps), for an encode 1 (the official
    encode's and MaxDiffusion's 4 video frames a step)."""
    if chunks is None:
        chunks = (None, 1) if part is VideoEncodePart else (None, 5)
    _, _, t, h, w = latent
    splits = [(r, c) for r in _splits(h) for c in _splits(w) if num_devices % (r * c) == 0]
    most = max(r * c for r, c in splits)
    best = sorted((s for s in splits if s[0] * s[1] == most),
                  key=lambda s: (h // s[0] + w // s[1], s))
    # a short video; a single frame has nothing to stream
    frames = dict.fromkeys(None if k is None or t == 1 else min(k, t) for k in chunks)
    return [part(tuple(latent), vae=vae, rows=r, cols=c, chunk=k)
            for r, c in best[:keep] for k in frames]


def encode_splits(num_devices: int, *, prompts: int = 2, text_len: int = 512,
                  max_tp: int = 4) -> list[EncodePart]:
    """The encoder splits worth compiling on ``num_devices``: the prompts apart (each device
    group encodes one prompt: no communication) where the devices allow, else together, times
    tensor parallelism up to ``max_tp`` (each block's two all-reduces of a 512 x 4096
    activation against a share of its 0.2 TFLOP: past 4 ways the split saves less than its
    all-reduces cost on the slowest links; the search prices 1, 2 and 4)."""
    split = prompts if num_devices % prompts == 0 else 1
    return [EncodePart(prompts=prompts, text_len=text_len, prompt_split=split, tp=t)
            for t in (1, 2, 4, 8, 16, 32, 64) if t <= max_tp and num_devices % (split * t) == 0]


def _divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def _splits(size: int) -> list[int]:
    """Even splits of a latent side into tiles of at least :data:`MIN_TILE`."""
    return [d for d in _divisors(size) if d == 1 or size // d >= MIN_TILE]


# ----------------------------------------------------------------------------- compile, price


@dataclass(frozen=True)
class PricedPart:
    """A part compiled for a slice and priced on its best device order, or why not."""

    part: Part
    status: CompileStatus
    """``ok``, or the compile's failure (``oom``, ``error``, ``crash``, ``timeout``)."""
    message: str
    """The failure's text, or ``""``."""
    compile_seconds: float
    hbm_bytes: float
    """Peak HBM per device the compiler reports (argument + output + temp where it gives no
    peak)."""
    predicted: Predicted | None
    """Latency on ``placement`` (``cost.predict``), ``None`` where it did not compile."""
    placement: Placement | None
    """The fastest of the library orders (:func:`~aoizora_lab.placement.library_orders`)."""
    host_peak_bytes: float = math.nan
    """The compiling child's peak host memory (NaN: not measured): how many compile at once."""
    program: CommProgram | None = field(default=None, repr=False, compare=False)
    """The compiled program (for pricing it again, e.g. under an ensemble)."""

    @property
    def ok(self) -> bool:
        return self.predicted is not None

    @property
    def seconds(self) -> float:
        """Its predicted seconds per call (NaN where it did not compile)."""
        return self.predicted.total_s if self.predicted else math.nan


class PricedParts(Records[PricedPart]):
    """Every split of a part that was tried, in the order tried."""

    COLUMNS = ("part", "status", "seconds", "compute_s", "comm_s", "hbm_gib", "order",
               "compile_s", "message")

    def row(self, item: PricedPart) -> dict[str, Any]:
        p = item.predicted
        return {"part": item.part.name, "status": item.status, "seconds": item.seconds,
                "compute_s": p.compute_s if p else math.nan,
                "comm_s": p.comm_s if p else math.nan,
                "hbm_gib": item.hbm_bytes / 2**30,
                "order": item.placement.description if item.placement else "",
                "compile_s": item.compile_seconds, "message": item.message[:200]}

    @property
    def best(self) -> PricedPart | None:
        """The fastest that compiled (``None``: none did)."""
        ok = [p for p in self if p.ok]
        return min(ok, key=lambda p: p.seconds) if ok else None

    @property
    def best_s(self) -> float:
        """The fastest's seconds (NaN: none compiled)."""
        return self.best.seconds if self.best else math.nan


def compile_part(part: Part, topology: Topology, *, cache_dir: str | Path | None = None,
                 timeout_s: float = 1800.0) -> tuple[dict[str, Any], CommProgram | None]:
    """Compile ``part`` for ``topology`` (plain device order) through the compile cache: the
    raw result (status, message, memory, seconds) and the parsed program where it compiled."""
    part.mesh_shape(topology.num_devices)  # a split the slice cannot hold fails before a child
    job = {"worker": "aoizora_lab.part_worker", "part": part_spec(part),
           "topology": topology_spec(topology),
           "versions": code_versions("aoizora_lab.part_worker")}
    cache = Path(cache_dir) if cache_dir is not None else default_cache_dir()
    raw = run_job(job, str(cache), timeout_s)
    hlo_path = Path(raw["hlo_path"]) if raw.get("hlo_path") else None
    if raw["status"] != CompileStatus.OK or hlo_path is None:
        return raw, None
    program = memoized("program", (raw.get("hlo_sha256") or digest(hlo_path.read_bytes()),
                                   topology.num_devices, None, None),
                       lambda: parse_hlo(hlo_path.read_text(), topology.num_devices),
                       code="aoizora_lab.hlo")
    return raw, program


def price_part(part: Part, topology: Topology, *, cache_dir: str | Path | None = None,
               timeout_s: float = 1800.0, options: ModelOptions | None = None) -> PricedPart:
    """:func:`compile_part`, then :func:`~aoizora_lab.cost.predict` in every library order of
    the part's mesh; the fastest is kept. A failed compile is a result, not an error."""
    raw, program = compile_part(part, topology, cache_dir=cache_dir, timeout_s=timeout_s)
    memory = raw.get("memory", {})
    hbm = memory.get("peak") or sum(memory.get(k, 0.0) for k in ("argument", "output", "temp"))
    predicted = placement = None
    if program is not None:
        orders = library_orders(part.mesh_shape(topology.num_devices), part.axes, topology)
        priced = [(predict(program, topology, o, options=options), o) for o in orders]
        predicted, placement = min(priced, key=lambda p: p[0].total_s)
    return PricedPart(part=part, status=CompileStatus(raw["status"]),
                      message=raw.get("message", ""),
                      compile_seconds=float(raw.get("compile_seconds", 0.0)),
                      hbm_bytes=float(hbm or math.nan),
                      host_peak_bytes=float(raw.get("host_peak_bytes", math.nan)),
                      predicted=predicted, placement=placement, program=program)


def plan_part(parts: Sequence[Part], topology: Topology, *, workers: int | None = None,
              **kwargs: Any) -> PricedParts:
    """Every split in ``parts`` priced (:func:`price_part`), in order; ``.best`` is the plan.

    The first compiles alone; the others then side by side, ``workers`` at a time (default: one
    per CPU, as many as fit the free memory at the first's measured host peak,
    :func:`~aoizora_lab.workers.fitting_workers`), each in its own child process.
    """
    parts = list(parts)
    if not parts:
        return PricedParts()
    first = price_part(parts[0], topology, **kwargs)
    width = workers or max(1, fitting_workers(first.host_peak_bytes, available_memory(),
                                              usable_cpus()))
    with cf.ThreadPoolExecutor(width) as pool:  # each thread waits on its compile's child
        rest = list(pool.map(lambda part: price_part(part, topology, **kwargs), parts[1:]))
    return PricedParts([first, *rest])
