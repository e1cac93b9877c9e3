"""Stored values as JSON: what a cache writes, and what it may read back.

A cache folder can be shared (a team's disk, Dask workers), so reading an entry must never run
code the entry chose. Entries are JSON text that rebuilds only plain data and the project's own
value types: a dataclass, a named tuple, an enum or a :class:`~aoizora_lab.records.Records`
defined in an ``aoizora_lab`` module, each rebuilt through its constructor (so its own checks
run), and numpy arrays of numbers. Anything else is refused when written
(:class:`TypeError`) and when read (:class:`ValueError`: the caller recomputes the entry).

Every value but a list, a string, a number, a bool or ``None`` is one tagged object, so the
text keeps the types that hashing and equality need. Worked example::

    dumps((1, {"a": np.arange(2)}))
    -> '{"tuple":[1,{"dict":[["a",{"ndarray":["<i8",[2],"AAAAAAAAAAABAAAAAAAAAA=="]}]]}]}'

The same value always gives the same text (fields in declaration order, sets sorted), so
:func:`dumps` also serves as the content of a cache key.
"""

from __future__ import annotations

import base64
import dataclasses
import enum
import importlib
import json
from pathlib import Path
from typing import Any

import numpy as np

from aoizora_lab.records import Records

PACKAGE = "aoizora_lab"
"""Only types defined in this package's modules are rebuilt."""


def dumps(value: Any) -> str:
    """``value`` as JSON text (see the module docstring); :class:`TypeError` names a part
    that cannot be stored."""
    return json.dumps(_encode(value), separators=(",", ":"))


def loads(text: str | bytes) -> Any:
    """The value :func:`dumps` wrote; :class:`ValueError` for text it did not write (a damaged
    entry, or a type outside the package)."""
    try:
        return _decode(json.loads(text))
    except (KeyError, TypeError, IndexError, AttributeError, ImportError) as err:
        raise ValueError(f"not a stored value: {type(err).__name__}: {err}") from err


def _type_name(kind: type) -> str:
    return f"{kind.__module__}:{kind.__qualname__}"


def _ours(module: str) -> bool:
    """Whether ``module`` is this package or one of its modules."""
    return module == PACKAGE or module.startswith(f"{PACKAGE}.")


def _own_name(kind: type) -> str:
    """``module:qualname`` of a type of this package; :class:`TypeError` for any other."""
    if not _ours(kind.__module__):
        raise TypeError(f"cannot store a {_type_name(kind)}: only plain data, numpy arrays "
                        f"and {PACKAGE}'s own value types")
    return _type_name(kind)


def _encode(value: Any) -> Any:
    if isinstance(value, enum.Enum):  # before str and int: a StrEnum keeps its type
        return {"enum": [_own_name(type(value)), _encode(value.value)]}
    if value is None or isinstance(value, bool | str):
        return value
    if isinstance(value, int | float):
        return int(value) if isinstance(value, int) else float(value)
    if isinstance(value, np.generic):
        return _encode(value.item())
    if isinstance(value, list):
        return [_encode(v) for v in value]
    if type(value) is tuple:
        return {"tuple": [_encode(v) for v in value]}
    if isinstance(value, dict):
        return {"dict": [[_encode(k), _encode(v)] for k, v in value.items()]}
    if isinstance(value, frozenset | set):
        items = sorted((_encode(v) for v in value), key=lambda v: json.dumps(v))
        return {"frozenset" if isinstance(value, frozenset) else "set": items}
    if isinstance(value, np.ndarray):
        if value.dtype.kind not in "biuf":
            raise TypeError(f"cannot store a {value.dtype} array (numbers only)")
        data = np.ascontiguousarray(value)
        return {"ndarray": [data.dtype.str, list(data.shape),
                            base64.b64encode(data.tobytes()).decode()]}
    if isinstance(value, Path):
        return {"path": str(value)}
    kind = type(value)
    name = _own_name(kind)
    if dataclasses.is_dataclass(value):
        fields = {f.name: _encode(getattr(value, f.name)) for f in dataclasses.fields(value)}
        return {"dataclass": [name, fields]}
    if isinstance(value, tuple) and hasattr(kind, "_fields"):
        return {"namedtuple": [name, [_encode(v) for v in value]]}
    if isinstance(value, Records) and set(vars(value)) == {"_items"}:
        return {"records": [name, [_encode(v) for v in value]]}
    raise TypeError(f"cannot store a {_type_name(kind)}: not a dataclass, enum or Records")


_PLAIN = (int, float, str, bool, type(None))


def _decode(data: Any) -> Any:
    if isinstance(data, list):
        return [_decode(v) for v in data]
    if not isinstance(data, dict):
        return data
    ((tag, body),) = data.items()
    if tag == "tuple":  # most tuples hold numbers only (replica groups): no call per number
        if all(type(v) in _PLAIN for v in body):
            return tuple(body)
        return tuple(_decode(v) for v in body)
    if tag == "dict":
        return {_decode(k): _decode(v) for k, v in body}
    if tag in ("frozenset", "set"):
        return (frozenset if tag == "frozenset" else set)(_decode(v) for v in body)
    if tag == "ndarray":
        dtype, shape, text = body
        if np.dtype(dtype).kind not in "biuf":
            raise ValueError(f"a stored {dtype} array: numbers only")
        return np.frombuffer(base64.b64decode(text), dtype=dtype).reshape(shape).copy()
    if tag == "path":
        return Path(body)
    name, fields = body
    kind = _own_type(name)
    if tag == "enum" and issubclass(kind, enum.Enum):
        return kind(_decode(fields))
    if tag == "namedtuple" and issubclass(kind, tuple) and hasattr(kind, "_fields"):
        return kind(*(_decode(v) for v in fields))
    if tag == "records" and issubclass(kind, Records):
        return kind(_decode(v) for v in fields)
    if tag == "dataclass" and dataclasses.is_dataclass(kind):
        values = {k: _decode(v) for k, v in fields.items()}
        init = {f.name for f in dataclasses.fields(kind) if f.init}
        made = kind(**{k: v for k, v in values.items() if k in init})
        for key in values.keys() - init:
            object.__setattr__(made, key, values[key])
        return made
    raise ValueError(f"a stored {tag} of {name}: not a type that kind may be rebuilt as")


def _own_type(name: str) -> type:
    """The class ``module:qualname`` names, only from this package's modules."""
    module, _, qualname = name.partition(":")
    if not _ours(module):
        raise ValueError(f"a stored {name}: only {PACKAGE}'s own types are rebuilt")
    found: Any = importlib.import_module(module)
    for part in qualname.split("."):
        found = getattr(found, part)
    if not isinstance(found, type):
        raise ValueError(f"a stored {name}: not a class")
    return found
