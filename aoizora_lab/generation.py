"""A whole video: the text encoder, the denoising steps and the VAE decoder, each with its plan.

What a person waits for is a generation, not a step::

    seconds = encode (+ video encode) + steps x step (+ expert swaps) + decode

- ``encode``: the UMT5 encoder on the prompt and, with CFG, the negative prompt, once
  (:class:`~aoizora_lab.parts.EncodePart`, the fastest of
  :func:`~aoizora_lab.parts.encode_splits` that fits, below);
- ``step``: the DiT plan's predicted step (:func:`aoizora_lab.planner.plan`'s ``best``, both
  CFG passes) times the sampler's steps (the preset's official ``sample_steps``,
  :data:`~aoizora_lab.models.wan.SAMPLING`: 50 for Wan 2.1 T2V, 40 for the A14B models). Wan
  2.2 A14B runs its high-noise expert for the steps above the boundary timestep and the
  low-noise one after (26 and 14 of T2V's 40): the same program on other weights, so the same
  step time, both experts resident unless the workload swaps them
  (:attr:`~aoizora_lab.workload.Workload.resident_experts`, below);
- ``decode``: the VAE decoder on the final latent, once (:class:`~aoizora_lab.parts.DecodePart`,
  the fastest of :func:`~aoizora_lab.parts.vae_splits` that fits);
- ``video encode``, image-to-video only, once (:class:`~aoizora_lab.parts.VideoEncodePart`):
  a model with condition channels (Wan 2.1 I2V-14B, Wan 2.2 I2V-A14B) runs the VAE encoder on
  the condition video, the image then zero frames, all of the video's frames as the official
  pipelines do; TI2V-5B encodes its image alone, one frame through the Wan 2.2 VAE, whose
  latent replaces the first latent frame (``textimage2video.py``; a TI2V-5B video is taken to
  start from an image: run without one, as text-to-video, it skips this encode, a few ms of
  its time). Not modelled: Wan 2.1 I2V's CLIP image encoder (one 224 x 224 image).

Both A14B experts stay resident, as MaxDiffusion keeps them, unless the workload swaps them
(``Workload.swap_experts``, a case name's ``-swap``) through the host as the official code
does with ``offload_model``: each chip moves its shard of the low-noise expert in at the
boundary and of the high-noise one back for the next video, over its PCIe link at
:data:`HOST_TO_HBM_BYTES_PER_S` (:attr:`Generation.expert_swap_s`), while the steps run, and
were planned, with one expert's HBM. A swapping video adds that time as a part (the moves
wait for the step before them: not hidden); a resident one prints it beside, with the HBM
swapping would free.

The parts run one after the other on the same slice, each on its own mesh: a mesh is a Python
object, so changing it between parts costs only moving what one part hands the next (the text
states, 2 x 512 x 4096 values; the latent, 16 x 21 x 90 x 160 at 720p: a few MB each, against
seconds of work), which is not priced. Each split is priced in the library orders of its mesh
(:func:`~aoizora_lab.parts.price_part`) and on the DiT plan's own device order (the mesh not
changing: the same devices in the same order, the part's axes over them; ``dit_order_s``), and
runs on the faster. Whatever runs on the host (tokenising, the scheduler's arithmetic, copying
the video out) is not modelled either: the breakdown is TPU time.

The DiT's weights stay in HBM for the whole video (every resident expert, sharded as the step
plan shards them: :attr:`Generation.resident_bytes`), as MaxDiffusion's pipeline keeps its
transformer while it encodes and decodes. So a part runs the fastest split whose compiled peak
fits beside them (:meth:`Generation.chosen`; a split whose peak the compiler did not report
counts as fitting, ``fits`` unknown); where none does, the fastest is shown with ``fits``
false: that video needs the DiT's weights out of HBM while the part runs (the official code's
``offload_model``), which is not priced. A part's own weights (the encoder's, the VAE's) are
in its compiled peak, taken as in HBM only while it runs; loading them is not priced.

MaxDiffusion's VAE programs (:func:`maxdiffusion_vae_parts`: the latent's width over every
device, a latent frame at a time, float32) are compiled beside the splits as the VAE's
baseline (``maxdiffusion_s``); the text encoder has none on the TPU (MaxDiffusion encodes the
prompts on the host CPU, in PyTorch). The baseline is also a choice, as the DiT plan adopts an
existing system's setup that beats its own candidates: a program people run, of the same
family as the splits (a split of the width, streamed), which the splits' heuristic (the
squarest tiles, two chunk sizes) may leave out. Where it is the fastest that fits, the part
runs it and its row's plan says so; without it (``plan_generation(..., maxdiffusion=False)``)
a part is never faster.

Worked example: Wan 2.1 14B at 720p on ``v6e:2x4`` with 50 steps is the DiT plan's step x 50,
plus the encoder's best split (the two prompts on two groups of devices, heads over up to
four) and the decoder's best (latent tiles over the eight devices, all frames at once or five
at a time). How the parts' predictions compare with published times (MaxDiffusion's VAE
decodes, whole generations): ``reports/benchmarks.md``, "Generation" and "Published
measurements".
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any

import pandas as pd

from aoizora_lab.comm_model import ModelOptions
from aoizora_lab.cost import Predicted, predict
from aoizora_lab.errors import AoizoraError, is_whole
from aoizora_lab.hardware import device_spec
from aoizora_lab.models.wan import SAMPLING, Sampling, expert_steps
from aoizora_lab.parts import (
    MIN_TILE,
    DecodePart,
    PricedPart,
    PricedParts,
    VaePart,
    VideoEncodePart,
    encode_splits,
    plan_part,
    vae_for,
    vae_splits,
)
from aoizora_lab.placement import Placement
from aoizora_lab.realize import Plan
from aoizora_lab.topology import Topology
from aoizora_lab.workload import DEFAULT_TEXT_LEN, Workload

HOST_TO_HBM_BYTES_PER_S = 1.5e10
"""Host DRAM to one chip's HBM over its PCIe link, bytes/s: the scaling book's figure for TPU
v6e ("How to Think About TPUs", https://jax-ml.github.io/scaling-book/tpus/, its problem on
PCIe operational intensity), taken for every chip (it gives no other); the chips of a host
each have their own link, so a sharded swap moves every shard side by side."""


def maxdiffusion_vae_parts(workload: Workload, topology: Topology) -> dict[str, VaePart]:
    """What MaxDiffusion's Wan pipeline (7cfb880, the README's version) runs on its VAE, as
    parts: the decode, the latent's width over every device (``vae_spatial: -1``), a latent
    frame at a time (``vae_decode_chunk: 1``), float32 (``vae_dtype``); for image-to-video
    with condition channels also the encode of the condition video
    (``prepare_latents_i2v_base``: the image then zero frames, through the same VAE module,
    so split as its decode, the official first frame then 4 at a time). Empty where the
    latent's width has too few columns for every device (fewer than
    :data:`~aoizora_lab.parts.MIN_TILE` each: MaxDiffusion would pad; not rebuilt)."""
    latent = (1, *workload.latent_shape)
    if topology.num_devices > latent[4] // MIN_TILE:
        return {}
    decode = DecodePart(latent, vae=vae_for(latent), rows=1, cols=topology.num_devices, chunk=1)
    if not workload.config().condition_channels:
        return {"decode": decode}
    return {"decode": decode, "video_encode": VideoEncodePart(
        decode.latent, vae=decode.vae, rows=decode.rows, cols=decode.cols, chunk=1)}


def official_sampling(workload: Workload) -> Sampling:
    """The workload's preset's official sampler (steps, shift, expert boundary)."""
    if workload.sampling is None:
        raise AoizoraError(
            f"Workload {workload.name!r} has a custom WanConfig and so no official sampler: "
            "give the number of denoising steps (plan_generation(plan, steps=50)).")
    return workload.sampling


@dataclass(frozen=True)
class Generation:
    """The latency of one video, part by part (module docstring)."""

    workload: Workload
    steps: int
    """Denoising steps (each one DiT step of both CFG passes)."""
    expert_steps: tuple[int, int]
    """``(high-noise, low-noise)`` steps of a Wan 2.2 A14B video (the official schedule at
    :attr:`steps`); ``(steps, 0)`` for a single model."""
    step: Plan
    """The DiT's plan; ``step.predicted.total_s`` is one step."""
    encode: PricedParts
    """The encoder splits tried; :meth:`chosen` of them runs."""
    decode: PricedParts
    """The decoder splits tried, with MaxDiffusion's decode where asked for (:attr:`maxdiffusion`);
    :meth:`chosen` of them runs."""
    video_encode: PricedParts = dataclasses.field(default_factory=PricedParts)
    """Image-to-video: the VAE encoder splits tried on the condition (the video, or TI2V-5B's
    image), with MaxDiffusion's encode where it has one; :meth:`chosen` of them runs; empty
    otherwise."""
    maxdiffusion: Mapping[str, PricedPart] = dataclasses.field(default_factory=dict)
    """MaxDiffusion's VAE programs on this slice (:func:`maxdiffusion_vae_parts`, by role:
    ``decode``, ``video_encode``), priced as parts: the VAE plan's baseline, also among its
    role's choices (:attr:`decode`, :attr:`video_encode`); empty where not asked for or not
    rebuilt."""
    options: ModelOptions | None = None
    """The model the parts were priced under (:func:`~aoizora_lab.parts.price_part`'s), which
    also prices them on the DiT plan's order."""

    def __post_init__(self) -> None:
        object.__setattr__(self, "maxdiffusion", MappingProxyType(dict(self.maxdiffusion)))

    @property
    def resident_bytes(self) -> float:
        """DiT weight bytes per device in HBM through the whole video: every resident expert
        (:attr:`~aoizora_lab.workload.Workload.resident_experts`) stored as the step's plan
        shards it, in bfloat16 (module docstring)."""
        return self._weight_bytes * self.workload.resident_experts

    @property
    def _weight_bytes(self) -> float:
        """One expert's (or the single model's) stored weight bytes on one device under the
        step's plan, in bfloat16."""
        return self.step.candidate.weight_bytes_per_device(self.workload.config())

    def fits(self, part: PricedPart) -> bool | None:
        """Whether ``part``'s compiled peak fits in a device's usable HBM beside
        :attr:`resident_bytes`; ``None`` where the compiler reported no peak."""
        if math.isnan(part.hbm_bytes):
            return None
        usable = device_spec(self.step.topology).hbm_usable_bytes
        return part.hbm_bytes + self.resident_bytes <= usable

    @property
    def dit_order(self) -> Placement:
        """The DiT plan's device order, for a part's mesh (the mesh not changing)."""
        return Placement(self.step.placement.order, "the DiT plan's device order")

    def on_dit_order(self, part: PricedPart) -> Predicted | None:
        """``part``'s program priced on :attr:`dit_order` (module docstring); ``None`` where it
        did not compile."""
        if part.program is None:
            return None
        return predict(part.program, self.step.topology, self.dit_order, options=self.options)

    def run_of(self, part: PricedPart) -> tuple[float, Placement | None]:
        """Seconds and device order ``part`` runs with: the faster of its best library order
        and :attr:`dit_order` (NaN, ``None`` where it did not compile)."""
        return self._run(part)[:2]

    def _run(self, part: PricedPart) -> tuple[float, Placement | None, Predicted | None]:
        """:meth:`run_of` with the part's price on the DiT plan's order (for its row)."""
        if not part.ok:
            return math.nan, None, None
        on_dit = self.on_dit_order(part)
        if on_dit is not None and on_dit.total_s < part.seconds:
            return on_dit.total_s, self.dit_order, on_dit
        return part.seconds, part.placement, on_dit

    def chosen(self, parts: PricedParts) -> PricedPart | None:
        """The split a part runs: the fastest (:meth:`run_of`) that compiled and :meth:`fits`
        (or whose peak is unknown), else the fastest that compiled (its row says it does not
        fit); ``None`` where none compiled."""
        ok = [p for p in parts if p.ok]
        fitting = [p for p in ok if self.fits(p) is not False]
        return min(fitting or ok, key=lambda p: self.run_of(p)[0], default=None)

    def runs_maxdiffusions(self, part: PricedPart | None, role: str) -> bool:
        """Whether ``part`` is MaxDiffusion's own program for ``role`` (``decode``,
        ``video_encode``: :attr:`maxdiffusion`), e.g. the one :meth:`chosen` picked."""
        theirs = self.maxdiffusion.get(role)
        return part is not None and theirs is not None and part.part == theirs.part

    def _seconds(self, parts: PricedParts) -> float:
        chosen = self.chosen(parts)
        return self.run_of(chosen)[0] if chosen else math.nan

    @property
    def encode_s(self) -> float:
        return self._seconds(self.encode)

    @property
    def decode_s(self) -> float:
        return self._seconds(self.decode)

    @property
    def video_encode_s(self) -> float:
        """The condition video's encode (0 where the model has none, NaN where none compiled)."""
        return self._seconds(self.video_encode) if len(self.video_encode) else 0.0

    @property
    def expert_bytes_per_device(self) -> float:
        """Stored weight bytes of one expert on one device under the step's plan (bfloat16, as
        the step runs); 0 for a single model, which has nothing to swap."""
        return 0.0 if self.workload.experts == 1 else self._weight_bytes

    @property
    def expert_swap_s(self) -> float:
        """What swapping the experts through the host adds to a video (part of it where the
        workload swaps, what it would add otherwise): two moves of each device's expert shard
        over PCIe (module docstring; the other expert's resident bytes are what it frees, per
        device)."""
        return 2 * self.expert_bytes_per_device / HOST_TO_HBM_BYTES_PER_S

    @property
    def swaps_s(self) -> float:
        """The expert swaps in this video: :attr:`expert_swap_s` where the workload swaps and
        the low-noise expert runs at all, else 0."""
        swaps = self.workload.swap_experts and self.expert_steps[1] > 0
        return self.expert_swap_s if swaps else 0.0

    @property
    def steps_s(self) -> float:
        return self.steps * self.step.predicted.total_s

    @property
    def total_s(self) -> float:
        """The whole video (NaN where a part has no split that compiled)."""
        return (self.encode_s + self.video_encode_s + self.steps_s + self.swaps_s
                + self.decode_s)

    def to_frame(self) -> pd.DataFrame:
        """One row per part: its plan, the device order it runs on, seconds per call, calls,
        seconds and share; for the encoders and the decode also the HBM per device of its
        peak and the DiT's weights together (``hbm_with_dit_gib``), whether that ``fits`` (NA:
        peak unknown), its seconds on the DiT plan's device order (``dit_order_s``) and
        MaxDiffusion's program's (``maxdiffusion_s``; NaN where it has none, or it did not
        compile)."""
        rows: list[dict[str, Any]] = []
        named = [("text encoder", self.encode, ""), ("VAE decode", self.decode, "decode")]
        if len(self.video_encode):
            named.insert(1, ("VAE encode (image condition)", self.video_encode, "video_encode"))
        for name, parts, role in named:
            best = self.chosen(parts)
            seconds, order, dit_order = self._run(best) if best else (math.nan, None, None)
            baseline = self.maxdiffusion.get(role)
            plan = ("none compiled" if best is None else f"{best.part.name} (MaxDiffusion's)"
                    if self.runs_maxdiffusions(best, role) else best.part.name)
            rows.append({"part": name, "plan": plan,
                         "order": order.description if order else "", "per_call_s": seconds,
                         "calls": 1,
                         "hbm_with_dit_gib": ((best.hbm_bytes + self.resident_bytes) / 2**30
                                              if best else math.nan),
                         "fits": self.fits(best) if best else None,
                         "dit_order_s": dit_order.total_s if dit_order else math.nan,
                         "maxdiffusion_s": baseline.seconds if baseline else math.nan})
        step = self.step
        high, low = self.expert_steps
        names = (("DiT steps (high-noise expert)", high), ("DiT steps (low-noise expert)", low)
                 ) if low else (("DiT steps", high),)
        before_decode = len(named) - 1  # the steps run between the encodes and the decode
        rows[before_decode:before_decode] = [
            {"part": name, "plan": f"{step.candidate.name} ({step.flags.label} flags)",
             "order": step.placement.description, "per_call_s": step.predicted.total_s,
             "calls": calls}
            for name, calls in names]
        if self.swaps_s:  # at the boundary and back for the next video
            rows.insert(before_decode + len(names), {
                "part": "expert swaps (host -> HBM)", "plan": "each device its shard over PCIe",
                "order": "", "per_call_s": self.expert_swap_s / 2, "calls": 2})
        frame = pd.DataFrame(rows)
        frame["fits"] = frame["fits"].astype("boolean")  # NA: not a part, or peak unknown
        frame["seconds"] = frame["per_call_s"] * frame["calls"]
        frame["share"] = frame["seconds"] / self.total_s
        return frame


def check_steps(steps: Any) -> None:
    if not is_whole(steps):
        raise AoizoraError(
            f"steps={steps!r} must be a positive number of denoising steps, e.g. "
            f"{SAMPLING['wan2.1-t2v-14b'].steps} (Wan 2.1 T2V's official sample_steps)."
        )


def plan_generation(step: Plan, steps: int | None = None, *, maxdiffusion: bool = True,
                    **kwargs: Any) -> Generation:
    """The whole video around a DiT plan ``step`` (``planner.plan(...).best``): the encoder's
    and the decoder's splits compiled and priced on the same slice (``kwargs`` go to
    :func:`~aoizora_lab.parts.price_part`: ``cache_dir``, ``timeout_s``, ``options``).
    ``steps``: the preset's official ``sample_steps`` unless given; an A14B video's experts
    split them as the official schedule at that many steps does. ``maxdiffusion``: compile
    MaxDiffusion's VAE programs beside the splits, as the baseline and one more choice (one
    more compile per VAE part, minutes on 2 cores)."""
    workload, topology = step.workload, step.topology
    # The official sampler sets the default steps and, for A14B, where the experts switch.
    sampling = (official_sampling(workload) if steps is None or workload.experts > 1
                else None)
    steps = sampling.steps if steps is None else steps
    check_steps(steps)
    split = (expert_steps(dataclasses.replace(sampling, steps=steps)) if sampling
             else (steps, 0))
    n = topology.num_devices
    encode = plan_part(encode_splits(n, prompts=2 if workload.cfg else 1,
                                     text_len=DEFAULT_TEXT_LEN), topology, **kwargs)
    latent = (1, *workload.latent_shape)
    baselines = maxdiffusion_vae_parts(workload, topology) if maxdiffusion else {}
    priced: dict[str, PricedPart] = {}

    def vae(splits: list[VaePart], role: str) -> PricedParts:
        # MaxDiffusion's program compiles beside the splits (it may be one of them): one more
        # choice, also kept by name as the baseline.
        baseline = baselines.get(role)
        extra = [baseline] if baseline is not None and baseline not in splits else []
        every = plan_part([*splits, *extra], topology, **kwargs)
        priced.update((role, p) for p in every if p.part == baseline)
        return every

    decode = vae(vae_splits(latent, n, vae=vae_for(latent)), "decode")
    model = workload.config()
    condition = (latent if model.condition_channels  # the image then zero frames
                 else (*latent[:2], 1, *latent[3:]) if model.model_type == "ti2v"  # the image
                 else None)
    video_encode = (PricedParts() if condition is None else vae(
        vae_splits(condition, n, part=VideoEncodePart, vae=vae_for(condition)), "video_encode"))
    return Generation(workload=workload, steps=steps, expert_steps=split, step=step,
                      encode=encode, decode=decode, video_encode=video_encode,
                      maxdiffusion=priced, options=kwargs.get("options"))
