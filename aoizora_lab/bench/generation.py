"""Generation parts: published absolute times of a video's other programs, rebuilt and predicted.

The "Generation" section of ``reports/benchmarks.md`` (``benchmarks/generation.py`` writes it
and keeps the other sections). Each row of :data:`MEASUREMENTS` is a published time of one VAE
decode or one text encoding on a TPU slice, with what its source says about how it ran,
rebuilt as a :class:`~aoizora_lab.parts.DecodePart` or :class:`~aoizora_lab.parts.EncodePart`
(the same split, chunk and dtype where the source gives them), compiled deviceless and priced
by :func:`~aoizora_lab.parts.price_part`. These are absolute seconds, not ratios: nothing
cancels, so a row checks the chip constants and the compiler's cycle estimates of
convolution-heavy programs that no Wan DiT step exercises. Target: within ±15 % of the
published time. A miss stays in the table with its why.

Worked example (MaxDiffusion PR #464, v6e-8, Wan 2.1 720p, 81 frames): the decode of the
latent ``[1, 16, 21, 90, 160]`` with ``vae_spatial = 8`` (the latent's width over the eight
devices), ``vae_decode_chunk = 5`` (five latent frames per step of the scan) and float32
activations took 0.8 s on the TPU. Rebuilt: ``DecodePart((1, 16, 21, 90, 160), rows=1,
cols=8, chunk=5)`` on ``v6e:2x4``.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from aoizora_lab.bench.report import markdown_table, met
from aoizora_lab.parts import DecodePart, EncodePart, Part, PricedPart, price_part
from aoizora_lab.topology import Topology
from aoizora_lab.uncertainty import DEFAULT_ENSEMBLE, QUANTILES, Ensemble, price

SECTION = "## Generation"
TARGET_PCT = 15.0
"""How far a predicted absolute time may be from the published one."""
LATENT_720P = (1, 16, 21, 90, 160)
"""Wan 2.1 at 1280x720, 81 frames: the latent one video's decode takes."""
LATENT_480P = (1, 16, 21, 60, 106)
"""Wan 2.1 at 848x480 (gpu-tpu-pedia's size), 81 frames."""
PR464 = "https://github.com/AI-Hypercomputer/maxdiffusion/pull/464"
PEDIA = ("https://github.com/yangwhale/gpu-tpu-pedia/blob/"
         "3fa9ce174583eba63032ed504a05793fe8bd520b/tpu/Wan2.1/README.md")


@dataclass(frozen=True)
class PartMeasurement:
    """A published time of one part, and how it is rebuilt."""

    name: str
    slice_name: str
    """The slice rebuilt (``v6e-8`` is ``v6e:2x4``; ``v7x-8``, 8 devices, ``tpu7x:2x2x1``)."""
    part: Part
    published_s: float
    """TPU time, host work left out where the source separates it."""
    primary: bool
    """Whether the published setup is known well enough to check the model (MaxDiffusion's
    own configs); a third-party implementation whose split is not published is secondary."""
    source: str
    note: str = ""


MEASUREMENTS: tuple[PartMeasurement, ...] = (
    PartMeasurement(
        "PR #464 v6e-8 VAE decode, after (spatial 8, chunk 5)", "v6e:2x4",
        DecodePart(LATENT_720P, rows=1, cols=8, chunk=5), 0.8, True, PR464,
        "TPU time 0.8 s (host formatting 0.0 s); jnp.repeat upsample as here"),
    PartMeasurement(
        "PR #464 v6e-8 VAE decode, before (MaxDiffusion 7cfb880: spatial -1, chunk 1)",
        "v6e:2x4", DecodePart(LATENT_720P, rows=1, cols=8, chunk=1), 2.8, True, PR464,
        "TPU time 2.8 s of 3.2 s (0.4 s host); upsampled with jax.image.resize, which the "
        "rebuild (jnp.repeat, as after the PR) does not reproduce"),
    PartMeasurement(
        "PR #464 v7x-8 VAE decode, after (spatial 8, chunk 5)", "tpu7x:2x2x1",
        DecodePart(LATENT_720P, rows=1, cols=8, chunk=5), 2.9, True, PR464,
        "TPU time 2.9 s (host 0.0 s)"),
    PartMeasurement(
        "PR #464 v7x-8 VAE decode, before (spatial -1, chunk 1)", "tpu7x:2x2x1",
        DecodePart(LATENT_720P, rows=1, cols=8, chunk=1), 2.9, True, PR464,
        "TPU time 2.9 s of 3.6 s (0.7 s host); jax.image.resize upsample, as above"),
    PartMeasurement(
        "gpu-tpu-pedia v6e-8 VAE decode 720p (torchax)", "v6e:2x4",
        DecodePart(LATENT_720P, rows=1, cols=8, chunk=1), 1.0, False, PEDIA,
        "~1 s warm; diffusers' VAE through torchax, split not published (rebuilt as "
        "MaxDiffusion's width split, frame by frame)"),
    PartMeasurement(
        "gpu-tpu-pedia v6e-8 VAE decode 480p (torchax)", "v6e:2x4",
        DecodePart(LATENT_480P, rows=1, cols=8, chunk=1), 0.5, False, PEDIA,
        "~0.50 s warm at 848x480; split not published (rebuilt as MaxDiffusion's width split: "
        "106 latent columns in 8 padded tiles, so the video comes back whole on every device)"),
    PartMeasurement(
        "gpu-tpu-pedia v6e-8 text encoder (torchax)", "v6e:2x4",
        EncodePart(prompts=2, prompt_split=2, tp=4), 3.0, False, PEDIA,
        "~3 s on the TPU through torchax, prompts and split not published (rebuilt as both "
        "prompts at once, heads over 4)"),
)


@dataclass(frozen=True)
class GenerationCheck:
    """The rows, priced, and the targets."""

    rows: pd.DataFrame
    targets: pd.DataFrame

    def markdown(self) -> str:
        """The "Generation" section."""
        return "\n\n".join([
            SECTION,
            "Published absolute times of a video's other programs (the VAE decode, the text "
            "encoder), rebuilt as parts (`aoizora_lab.parts`: the same split, chunk and dtype "
            "where the source gives them), compiled deviceless by libtpu and priced by the "
            "cost model (`python benchmarks/generation.py` rewrites this section and keeps "
            "the others; nothing ran on a TPU). Absolute seconds: nothing cancels, so each row "
            "checks the chip constants and the compiler's estimates of convolution-heavy "
            f"programs. Target: within ±{TARGET_PCT:g} % of the published TPU time. "
            "`p10_s` .. `p90_s`: the 80 % interval under the model's uncertain constants and "
            "choices (`aoizora_lab.uncertainty`, the plans' ensemble), `inside_80` whether the "
            "published time lies in it. `primary`: "
            "MaxDiffusion's own configuration, known from its code; the third-party rows "
            "(torchax) do not publish their split and check less.",
            markdown_table(self.rows),
            markdown_table(self.targets),
        ])


def interval(m: PartMeasurement, priced: PricedPart, topology: Topology | None,
             ensemble: Ensemble = DEFAULT_ENSEMBLE) -> dict[str, Any]:
    """The part under every draw of ``ensemble`` (:func:`aoizora_lab.uncertainty.price`) on
    the ``topology`` it was priced on: its 80 % interval and whether the published time lies
    inside (none where it did not compile)."""
    if priced.program is None or topology is None:
        return {"p10_s": math.nan, "p50_s": math.nan, "p90_s": math.nan, "inside_80": "–"}
    low, mid, high = np.quantile(price(priced.program, topology, priced.placement, ensemble),
                                 QUANTILES)
    return {"p10_s": low, "p50_s": mid, "p90_s": high,
            "inside_80": "yes" if low <= m.published_s <= high else "no"}


def measurement_row(m: PartMeasurement, priced: PricedPart, topology: Topology | None,
                    ensemble: Ensemble | None = DEFAULT_ENSEMBLE) -> dict[str, Any]:
    """A measurement's row: ``priced`` (on ``topology``) against the published time."""
    p = priced.predicted
    error = (p.total_s / m.published_s - 1) * 100 if p else math.nan
    return {"measurement": m.name, "slice": m.slice_name, "rebuilt": m.part.name,
            "primary": "yes" if m.primary else "no", "status": priced.status,
            "published_s": m.published_s, "predicted_s": p.total_s if p else math.nan,
            "compute_s": p.compute_s if p else math.nan,
            "exposed_comm_s": p.exposed_s if p else math.nan,
            "hbm_gib": priced.hbm_bytes / 2**30, "error_pct": error,
            "within_target": ("–" if not p else "yes" if abs(error) <= TARGET_PCT else "no"),
            **(interval(m, priced, topology, ensemble) if ensemble is not None else {}),
            "note": m.note + (f"; {priced.message[:160]}" if priced.message else ""),
            "source": m.source}


def targets(rows: pd.DataFrame) -> pd.DataFrame:
    out = []
    for label, chosen in (("primary (MaxDiffusion's configs)", rows["primary"] == "yes"),
                          ("all", rows["primary"].notna())):
        sub = rows[chosen]
        priced = sub[sub["within_target"] != "–"]
        inside = int((priced["within_target"] == "yes").sum())
        out.append({"rows": label, "priced": f"{len(priced)} of {len(sub)}",
                    f"within ±{TARGET_PCT:g} %": f"{inside} of {len(priced)}",
                    "met": met(len(priced) == len(sub) and inside == len(priced))})
    return pd.DataFrame(out)


def generation_check(measurements: Sequence[PartMeasurement] = MEASUREMENTS, *,
                     cache_dir: str | Path | None = None,
                     progress: Callable[[str], None] | None = None) -> GenerationCheck:
    """Every measurement rebuilt, compiled (through the compile cache) and priced."""
    rows = []
    for m in measurements:
        topology = Topology.from_name(m.slice_name, deviceless=True)
        priced = price_part(m.part, topology, cache_dir=cache_dir)
        rows.append(measurement_row(m, priced, topology))
        if progress:
            progress(f"{m.name}: {priced.status}, {rows[-1]['predicted_s']:.3g} s predicted, "
                     f"{m.published_s:g} s published")
    frame = pd.DataFrame(rows)
    return GenerationCheck(frame, targets(frame))
