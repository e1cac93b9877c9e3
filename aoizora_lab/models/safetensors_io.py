"""Read ``.safetensors`` files into numpy arrays (bf16 included, via ml_dtypes).

The format is an 8-byte little-endian header length, a JSON header mapping each tensor name to
``{"dtype", "shape", "data_offsets": [begin, end]}`` (offsets into the data that follows), and
the raw little-endian data. Official Wan 2.1 checkpoints store bf16, which numpy lacks; jax's
``ml_dtypes`` supplies it, so no torch is needed to load a checkpoint.
"""

from __future__ import annotations

import json
import struct
from pathlib import Path

import ml_dtypes
import numpy as np

from aoizora_lab.errors import AoizoraError

_DTYPES = {
    "F64": np.float64, "F32": np.float32, "F16": np.float16, "BF16": ml_dtypes.bfloat16,
    "I64": np.int64, "I32": np.int32, "I16": np.int16, "I8": np.int8, "U8": np.uint8,
    "BOOL": np.bool_,
}


def load_safetensors(path: str | Path) -> dict[str, np.ndarray]:
    """All tensors of one ``.safetensors`` file, memory-mapped, by name."""
    path = Path(path)
    try:
        data = np.memmap(path, dtype=np.uint8, mode="r")
        (header_len,) = struct.unpack("<Q", bytes(data[:8]))
        header = json.loads(bytes(data[8:8 + header_len]))
    except (OSError, ValueError, struct.error) as err:
        raise AoizoraError(f"{path} is not a readable .safetensors file: {err}") from err
    body = data[8 + header_len:]
    tensors = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        if info["dtype"] not in _DTYPES:
            raise AoizoraError(
                f"{path}: tensor {name!r} has dtype {info['dtype']!r}; supported dtypes are "
                f"{sorted(_DTYPES)}."
            )
        begin, end = info["data_offsets"]
        tensors[name] = body[begin:end].view(_DTYPES[info["dtype"]]).reshape(info["shape"])
    return tensors
