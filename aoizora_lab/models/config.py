"""Frozen model configs: their sequence fields coerced once, with one error for a bad one.

A config dataclass takes lists where JSON or a user gives them, but keeps tuples (hashable,
so a config can key a compile or a jitted function's static argument). :func:`freeze_fields`
does that in ``__post_init__`` and names the field, the value and an example of the fix.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from aoizora_lab.errors import AoizoraError


def freeze_fields(config: Any, kinds: Mapping[str, type]) -> None:
    """Replace each field ``name`` of the frozen ``config`` with ``tuple(kind(v) for v in
    value)``; raise naming the field, its value and the class default as an example."""
    for name, kind in kinds.items():
        value = getattr(config, name)
        try:
            object.__setattr__(config, name, tuple(kind(v) for v in value))
        except (TypeError, ValueError):
            owner = type(config)
            raise AoizoraError(
                f"{owner.__name__}.{name}={value!r} must be a sequence of {kind.__name__}s, "
                f"e.g. {getattr(owner, name)!r}."
            ) from None
