"""Where cached results live, and what they depend on besides their inputs.

The compile cache (:mod:`aoizora_lab.compile`) and the IR cache
(:mod:`aoizora_lab.ir_estimate`) live under :func:`cache_root` and put
:func:`program_versions` into their keys, so an upgrade of jax, jaxlib or libtpu, or an edit of
the code that builds the program, is a miss, never a stale hit.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import os
from collections.abc import Sequence
from pathlib import Path

CACHE_ENV = "AOIZORA_LAB_CACHE_DIR"
"""Environment variable naming another cache root (a test session, a shared disk)."""


def cache_root() -> Path:
    """``$AOIZORA_LAB_CACHE_DIR`` if set, else ``data/cache`` of this checkout; compiles go
    to its ``compile/`` folder and IR traces to ``ir/``."""
    chosen = os.environ.get(CACHE_ENV)
    return Path(chosen) if chosen else Path(__file__).resolve().parent.parent / "data" / "cache"

_PROGRAM_SOURCES = ("models/wan.py", "models/attention.py", "models/parallel.py",
                    "workload.py", "candidates.py")


def program_versions(extra_sources: Sequence[str] = ()) -> dict[str, str]:
    """jax / jaxlib / libtpu versions and a digest of the sources that shape the program
    (plus ``extra_sources``, paths inside the package): what a cached result depends on."""
    versions = {}
    for package in ("jax", "jaxlib", "libtpu"):
        try:
            versions[package] = importlib.metadata.version(package)
        except importlib.metadata.PackageNotFoundError:
            versions[package] = "absent"
    root = Path(__file__).resolve().parent
    digest = hashlib.sha256()
    for source in (*_PROGRAM_SOURCES, *extra_sources):
        digest.update((root / source).read_bytes())
    versions["program_source"] = digest.hexdigest()[:16]
    return versions


def write_atomically(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` through a temporary file renamed into place (its folder is
    created), so a reader, or another process writing the same file, never sees half of it."""
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_name(f"{path.name}.{os.getpid()}.tmp")
    partial.write_text(text)
    partial.replace(path)
