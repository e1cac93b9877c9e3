"""Where cached results live, and what they depend on besides their inputs.

The compile cache (:mod:`aoizora_lab.compile`) and the IR cache
(:mod:`aoizora_lab.ir_estimate`) live under :func:`cache_root` and put
:func:`program_versions` into their keys, so an upgrade of jax, jaxlib or libtpu, or an edit of
the code that builds the program, is a miss, never a stale hit. :func:`memoized` keeps any
other deterministic result the same way (a parsed program beside its compile, a placement
search): a warm plan reads them back instead of recomputing them.
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib.metadata
import os
import pickle
import weakref
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import TypeVar

T = TypeVar("T")

CACHE_ENV = "AOIZORA_LAB_CACHE_DIR"
"""Environment variable naming another cache root (a test session, a shared disk)."""


def cache_root() -> Path:
    """``$AOIZORA_LAB_CACHE_DIR`` if set, else ``data/cache`` of this checkout; compiles go
    to its ``compile/`` folder and IR traces to ``ir/``."""
    chosen = os.environ.get(CACHE_ENV)
    return Path(chosen) if chosen else Path(__file__).resolve().parent.parent / "data" / "cache"


@contextlib.contextmanager
def environment_variable(name: str, value: str) -> Iterator[None]:
    """``$name`` set to ``value`` while inside (child processes inherit it), then restored
    (or removed where it was not set)."""
    before = os.environ.get(name)
    os.environ[name] = value
    try:
        yield
    finally:
        if before is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = before


@contextlib.contextmanager
def cache_root_at(path: str | Path) -> Iterator[Path]:
    """Every cache (compiles, IR traces, memoized results) under ``path`` while inside, e.g.
    an empty folder to time a cold run; the previous root is restored on the way out."""
    with environment_variable(CACHE_ENV, str(path)):
        yield Path(path)


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


def write_atomically(path: Path, data: str | bytes) -> None:
    """Write ``data`` to ``path`` through a temporary file renamed into place (its folder is
    created), so a reader, or another process writing the same file, never sees half of it."""
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_name(f"{path.name}.{os.getpid()}.tmp")
    try:
        if isinstance(data, bytes):
            partial.write_bytes(data)
        else:
            partial.write_text(data)
        partial.replace(path)
    except BaseException:  # a full disk or an interrupt leaves no temporary file behind
        partial.unlink(missing_ok=True)
        raise


def digest(data: bytes | str) -> str:
    """A short content digest, for cache keys."""
    return hashlib.sha256(data.encode() if isinstance(data, str) else data).hexdigest()[:32]


_FINGERPRINTS: dict[int, tuple[weakref.ref, str]] = {}


def fingerprint(value: object) -> str:
    """:func:`digest` of an immutable value's pickle (a compiled program, for cache keys),
    remembered per object: a program is pickled once however often it is priced."""
    known = _FINGERPRINTS.get(id(value))
    if known is not None and known[0]() is value:
        return known[1]
    result = digest(pickle.dumps(value))
    try:
        _FINGERPRINTS[id(value)] = (weakref.ref(value, lambda _: _FINGERPRINTS.pop(
            id(value), None)), result)
    except TypeError:  # no weak references to this type: not remembered
        pass
    return result


def _memo_path(kind: str, key: object, sources: Sequence[str]) -> Path:
    return cache_root() / kind / f"{digest(repr((key, program_versions(sources))))}.pkl"


def is_memoized(kind: str, key: object, *, sources: Sequence[str] = ()) -> bool:
    """Whether :func:`memoized` with these arguments would read a stored value (or try to:
    a damaged entry is still recomputed there). Lets a caller send only the rest to workers."""
    return _memo_path(kind, key, sources).exists()


def memoized(kind: str, key: object, compute: Callable[[], T], *,
             sources: Sequence[str] = ()) -> T:
    """``compute()``, kept on disk under ``cache_root()/kind`` and read back for the same
    ``key`` (whose ``repr`` must name every input), package versions and ``sources`` (paths
    inside the package whose code shapes the result). Only for deterministic results, or a
    record meant to be read back as first written (what a time-limited plan first started).

    Example: ``memoized("program", (hlo_sha256, depth), parse, sources=["hlo.py"])`` parses a
    compile's HLO once; an edit of ``hlo.py`` is a miss. A damaged entry is recomputed.
    """
    path = _memo_path(kind, key, sources)
    try:
        return pickle.loads(path.read_bytes())
    except OSError:  # not there (or no cache folder to read): compute it
        pass
    except Exception:  # damaged, or written by code that no longer unpickles: recompute
        with contextlib.suppress(OSError):
            path.unlink(missing_ok=True)
    value = compute()
    try:
        write_atomically(path, pickle.dumps(value))
    except OSError:  # a read-only or full cache costs the next call time, not this result
        pass
    return value
