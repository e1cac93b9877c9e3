"""The tiny Wan model and workload that tests share: every code path of the real model, small
enough to trace, compile and run on CPU host devices in seconds."""

import aoizora_lab as az

TINY = az.WanConfig(dim=64, ffn_dim=128, num_heads=8, num_layers=2, text_dim=32, text_len=8,
                    freq_dim=32)
"""2 layers, 8 heads of 8, a 32-wide text embedding."""
WORKLOAD = az.Workload(model=TINY, height=32, width=48, frames=5, text_len=8)
"""12 tokens per pass, guidance on (two passes)."""

