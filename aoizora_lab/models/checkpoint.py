"""Official checkpoints as parameter dicts: one rule for every model this package rebuilds.

A model module names its parameters as the official state dict does and says their shapes
(``param_shapes(config)``); :func:`load_named` takes exactly those tensors from a mapping (a
``torch.load``-ed state dict, whose bfloat16 tensors pass through float32 one at a time, as
numpy has no bfloat16 of torch's) or a ``.safetensors`` file, and refuses a missing or
misshaped one by name. Other keys (another part of the checkpoint, a fixture's inputs) are
ignored.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from aoizora_lab.errors import AoizoraError
from aoizora_lab.models.safetensors_io import load_safetensors


def load_named(source: Mapping[str, Any] | str | Path, shapes: Mapping[str, tuple[int, ...]],
               *, what: str, config: Any, dtype: Any = jnp.float32) -> dict[str, jax.Array]:
    """The tensors ``shapes`` names, from ``source``, as ``dtype`` arrays; ``what`` (e.g. "a
    Wan VAE checkpoint") and ``config`` word the errors."""
    tensors = source if isinstance(source, Mapping) else load_safetensors(source)
    params = {}
    for name, shape in shapes.items():
        if name not in tensors:
            raise AoizoraError(
                f"The checkpoint has no {name!r}; it holds {len(tensors)} tensors such as "
                f"{sorted(tensors)[:3]}. Is it {what} matching {config}?"
            )
        value = tensors[name]
        if hasattr(value, "numpy"):  # a torch tensor
            value = value.float().numpy() if hasattr(value, "float") else value.numpy()
        value = np.asarray(value)
        if value.shape != tuple(shape):
            raise AoizoraError(
                f"Official parameter {name!r} has shape {value.shape}, but {config} needs "
                f"{tuple(shape)}; is the config right for this checkpoint?"
            )
        params[name] = jnp.asarray(value, dtype)
    return params
