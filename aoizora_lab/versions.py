"""Where cached results live, and the one rule for what their keys hold.

Every cache (compiles, IR traces, memoized results) lives under :func:`cache_root`: the user's
cache folder (``platformdirs``), whatever the checkout or install, unless
``$AOIZORA_LAB_CACHE_DIR`` names another (a test session, a team's shared disk). Nothing is
written inside the installed package.

A stored value's key holds its inputs and :func:`code_versions` of the module that computes
it: the versions of the libraries in :data:`LIBRARIES` and a digest of that module's source
and of every module of the package it imports, found by reading the imports
(:func:`code_closure`), not from a hand-kept list. An upgrade or an edit of any code that
shapes the value is a miss, never a stale hit. Values are stored as JSON
(:mod:`aoizora_lab.codec`), so reading a shared cache runs no code; a damaged entry is
recomputed.

Example: ``memoized("priced", key, compute, code="aoizora_lab.cost")`` keys the price by
``key``, the library versions and the source of ``cost.py``, ``comm_model.py``,
``hardware.py``, ``topology.py``, ``hlo.py``... (what ``cost`` imports, transitively).
"""

from __future__ import annotations

import ast
import contextlib
import functools
import hashlib
import importlib.metadata
import os
import threading
import weakref
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TypeVar

from aoizora_lab.codec import dumps, loads

T = TypeVar("T")

CACHE_ENV = "AOIZORA_LAB_CACHE_DIR"
"""Environment variable naming another cache root (a test session, a shared disk)."""
APP_NAME = "aoizora-lab"
"""The folder name under the user's cache and data folders."""
LIBRARIES = ("jax", "jaxlib", "libtpu", "numpy")
"""The libraries whose versions are part of every stored value's key: the compiler and the
arithmetic under every program, price and placement."""
PACKAGE_ROOT = Path(__file__).resolve().parent
"""The package's source folder, read for :func:`code_digest`."""


def cache_root() -> Path:
    """``$AOIZORA_LAB_CACHE_DIR`` if set, else the user's cache folder for ``aoizora-lab``
    (``~/.cache/aoizora-lab`` on Linux); compiles go to its ``compile/`` folder, IR traces to
    ``ir/``, memoized results to a folder per kind."""
    chosen = os.environ.get(CACHE_ENV)
    return Path(chosen) if chosen else user_cache_dir()


def user_cache_dir() -> Path:
    """The user's own cache folder for ``aoizora-lab`` (``~/.cache/aoizora-lab`` on Linux),
    whatever ``$AOIZORA_LAB_CACHE_DIR`` says: the default :func:`cache_root`, and where what
    only this user should write lives (numba's kernels, :mod:`aoizora_lab.flow_kernels`)."""
    import platformdirs

    return Path(platformdirs.user_cache_dir(APP_NAME, appauthor=False))


def user_data_dir() -> Path:
    """The user's data folder for ``aoizora-lab`` (``~/.local/share/aoizora-lab`` on Linux):
    files a user keeps, such as calibrations, outside any checkout or install."""
    import platformdirs

    return Path(platformdirs.user_data_dir(APP_NAME, appauthor=False))


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


@functools.cache
def library_versions() -> dict[str, str]:
    """The installed version of each of :data:`LIBRARIES` (``absent`` where not installed)."""
    versions = {}
    for package in LIBRARIES:
        try:
            versions[package] = importlib.metadata.version(package)
        except importlib.metadata.PackageNotFoundError:
            versions[package] = "absent"
    return versions


def code_versions(module: str) -> dict[str, str]:
    """What a value computed by ``module`` (``"aoizora_lab.cost"``) depends on besides its
    inputs: :func:`library_versions` and :func:`code_digest` of the module."""
    return {**library_versions(), "code": f"{module}@{code_digest(module)}"}


_READING = threading.Lock()
"""One reader of the sources at a time: CPython's ``ast.parse`` is not safe from several
threads at once (compiles report from several, each keying its parsed program)."""


@functools.cache
def code_digest(module: str) -> str:
    """A digest of the source of ``module`` and of every package module it imports, directly
    or not (:func:`code_closure`)."""
    hashed = hashlib.sha256()
    for name in code_closure(module):
        hashed.update(name.encode())
        hashed.update(_source_file(name).read_bytes())
    return hashed.hexdigest()[:16]


@functools.cache
def code_closure(module: str) -> tuple[str, ...]:
    """``module`` and the package modules it imports, transitively, sorted: every import
    statement counts (inside functions too) except those under ``if TYPE_CHECKING:``, which
    never run. A package's ``__init__`` counts only where something imports from it by name.
    """
    seen: set[str] = set()
    todo = [module]
    with _READING:
        while todo:
            name = todo.pop()
            if name not in seen:
                seen.add(name)
                todo.extend(_imports(name))
    return tuple(sorted(seen))


def _source_file(module: str) -> Path:
    """The source of a package module; :class:`ValueError` for a name outside the package."""
    head, *parts = module.split(".")
    found = PACKAGE_ROOT.joinpath(*parts)
    if head == PACKAGE_ROOT.name:
        if found.with_suffix(".py").is_file():
            return found.with_suffix(".py")
        if (found / "__init__.py").is_file():
            return found / "__init__.py"
    raise ValueError(f"{module!r} is not a module of {PACKAGE_ROOT.name}")


def _imports(module: str) -> set[str]:
    """The package modules ``module``'s import statements name (see :func:`code_closure`)."""
    path = _source_file(module)
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    found: set[str] = set()
    for node in _run_time_nodes(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parent = package.split(".")[:len(package.split(".")) - node.level + 1]
                base = ".".join([*parent, *([base] if base else [])])
            for alias in node.names:  # "from pkg import module" names the module
                found.add(f"{base}.{alias.name}" if _is_module(f"{base}.{alias.name}")
                          else base)
    return {name for name in found if _is_module(name)}


def _is_module(name: str) -> bool:
    try:
        _source_file(name)
    except ValueError:
        return False
    return True


def _run_time_nodes(tree: ast.AST) -> Iterator[ast.AST]:
    """Every node of ``tree`` except the bodies of ``if TYPE_CHECKING:`` blocks."""
    todo = [tree]
    while todo:
        node = todo.pop()
        yield node
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.If) and ast.unparse(child.test).endswith("TYPE_CHECKING"):
                todo.extend(child.orelse)
            else:
                todo.append(child)


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
    """:func:`digest` of an immutable value's stored form (:func:`~aoizora_lab.codec.dumps`;
    a compiled program, for cache keys), remembered per object: a program is encoded once
    however often it is priced."""
    known = _FINGERPRINTS.get(id(value))
    if known is not None and known[0]() is value:
        return known[1]
    result = digest(dumps(value))
    try:
        _FINGERPRINTS[id(value)] = (weakref.ref(value, lambda _: _FINGERPRINTS.pop(
            id(value), None)), result)
    except TypeError:  # no weak references to this type: not remembered
        pass
    return result


def _memo_path(kind: str, key: object, code: str) -> Path:
    return cache_root() / kind / f"{digest(dumps((key, code_versions(code))))}.json"


def is_memoized(kind: str, key: object, *, code: str) -> bool:
    """Whether :func:`memoized` with these arguments would read a stored value (or try to:
    a damaged entry is still recomputed there). Lets a caller send only the rest to workers."""
    return _memo_path(kind, key, code).exists()


def memoized(kind: str, key: object, compute: Callable[[], T], *, code: str) -> T:
    """``compute()``, kept on disk under ``cache_root()/kind`` and read back for the same
    ``key`` (every input, as values :mod:`aoizora_lab.codec` stores) and the same
    :func:`code_versions` of ``code``, the module whose code computes it. Only for
    deterministic results, or a record meant to be read back as first written (what a
    time-limited plan first started).

    Example: ``memoized("program", (hlo_sha256, depth), parse, code="aoizora_lab.hlo")``
    parses a compile's HLO once; an edit of ``hlo.py`` or of what it imports is a miss. A
    damaged entry is recomputed; a cache that cannot be written costs time, not the value.
    """
    path = _memo_path(kind, key, code)
    try:
        return loads(path.read_bytes())
    except OSError:  # not there (or no cache folder to read): compute it
        pass
    except ValueError:  # damaged, or written by code whose types changed: recompute
        with contextlib.suppress(OSError):
            path.unlink(missing_ok=True)
    value = compute()
    with contextlib.suppress(OSError):  # a read-only or full cache: the next call recomputes
        write_atomically(path, dumps(value))
    return value
