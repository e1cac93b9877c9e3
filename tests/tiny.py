"""The tiny Wan model and workload that tests share: every code path of the real model, small
enough to trace, compile and run on CPU host devices in seconds."""

import math

import aoizora_lab as az
from aoizora_lab.compile import CompileStatus
from aoizora_lab.cost import Predicted
from aoizora_lab.parts import PricedPart, PricedParts
from aoizora_lab.placement import plain_order
from aoizora_lab.topology import Topology

TINY = az.WanConfig(dim=64, ffn_dim=128, num_heads=8, num_layers=2, text_dim=32, text_len=8,
                    freq_dim=32)
"""2 layers, 8 heads of 8, a 32-wide text embedding."""
WORKLOAD = az.Workload(model=TINY, height=32, width=48, frames=5, text_len=8)
"""12 tokens per pass, guidance on (two passes)."""


def priced_part(part, seconds):
    """A part priced at ``seconds`` on a 2x4 slice's plain order (NaN: out of memory)."""
    ok = not math.isnan(seconds)
    return PricedPart(part=part, status=CompileStatus.OK if ok else CompileStatus.OOM,
                      message="" if ok else "RESOURCE_EXHAUSTED", compile_seconds=1.0,
                      hbm_bytes=2**30, predicted=Predicted(seconds, 0.0, seconds) if ok else None,
                      placement=plain_order(Topology.simulated((2, 4))) if ok else None)


def fake_plan_part(seconds):
    """Price each split asked for at the next of ``seconds`` (NaN: it did not compile), and
    record what was asked."""
    asked = []

    def fake(parts, topology, **kwargs):
        asked.append(list(parts))
        return PricedParts(priced_part(p, s) for p, s in zip(parts, seconds, strict=False))

    return fake, asked
