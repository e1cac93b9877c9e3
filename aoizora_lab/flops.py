"""The FLOP rules that both program readers share (the jaxpr in :mod:`aoizora_lab.ir`, the
compiled HLO in :mod:`aoizora_lab.hlo`), so an attention kernel counts the same in both.

Attention kernels are custom calls (Pallas on TPU) that carry no FLOP count; they are known by
name and counted from their query and key shapes.
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence

ATTENTION_KERNEL = re.compile(r"splash|flash|attention|mha", re.IGNORECASE)
"""Kernel names (a Pallas call's name, a custom call's name and target) that are attention."""


def attention_flops(q_shape: Sequence[int], k_shape: Sequence[int]) -> float:
    """FLOPs of ``softmax(Q K^T) V`` for queries ``[..., Sq, D]`` and keys ``[..., Sk, D]``:
    ``4 * prod(q[:-1]) * Sk * D``, the two matmuls (``Q K^T`` and ``P V``, each
    ``prod(q[:-1]) * Sk * D`` multiply-adds) at 2 FLOPs per multiply-add; the softmax is left
    out, as it is for the matmuls of a compiled program."""
    return 4.0 * math.prod(q_shape[:-1]) * k_shape[-2] * q_shape[-1]
