"""One options object for a plan: everything the search takes besides the workload and slice.

:class:`PlanOptions` is frozen and checked when built, so a typo fails before anything is
traced or compiled. The command line, the notebooks and the benchmarks each build one (often
from a preset) and hand it to :func:`aoizora_lab.planner.plan`; what shapes the answer
(:attr:`PlanOptions.key`) is part of the key of any result stored for it.

Two presets: :data:`FULL_SEARCH` (every survivor and every system's setup compiled, however
long it takes) and :data:`INTERACTIVE` (``aoizora-lab plan``'s default: the search stops
starting compiles so that it answers within :data:`INTERACTIVE_TIME_LIMIT_S`). Worked
example::

    options = INTERACTIVE.replace(num_layers=2)     # the CLI's default, 2 layers deep
    options.time_limit_s                            # 300.0
    PlanOptions(budget=-1)                          # AoizoraError naming budget and the fix
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from aoizora_lab.comm_model import ModelOptions
from aoizora_lab.compile import CompilerFlags, check_timeout, compiler_flags
from aoizora_lab.errors import AoizoraError, is_whole
from aoizora_lab.ir_estimate import LIBTPU_DEFAULTS, FlagAsync, IRCacheDir
from aoizora_lab.placement import TOP_PLACEMENTS
from aoizora_lab.topology import DeviceSource, Topology

SEARCHED_FLAGS: tuple[str, ...] = ("default", "maxdiffusion-ulysses", "maxdiffusion-wan")
"""The flag sets the planner compiles each kept candidate with: libtpu's defaults and
MaxDiffusion's two recommended sets, its Ulysses section's (asynchronous collective fusion
and all-to-all) and its Wan one (the same less asynchronous all-to-all, which libtpu refuses
on some slices: "not supported on limited ICI" on ``v5e:4x8`` and ``v5e:8x8``)."""

INTERACTIVE_TIME_LIMIT_S = 300.0
""":data:`INTERACTIVE`'s time limit: a cold plan should answer while its user still waits,
5 minutes (the quick-plans target in ``reports/benchmarks.md``)."""


@dataclass(frozen=True)
class PlanOptions:
    """How to search: depth, budgets, flag sets, limits, your setup, where caches live."""

    num_layers: int | None = None
    """Layers to compile (``None``: the model's depth). ``2`` folds the rest exactly
    (:mod:`aoizora_lab.compile`), the usual choice: a 14B compile then takes a minute."""
    keep: int = 3
    """Pruning keeps candidates whose IR estimate is within this factor of the best one's
    lower bound (:func:`aoizora_lab.prune.prune`)."""
    budget: int = 20_000
    """Placements the search scores per compiled program (:func:`~aoizora_lab.placement.
    rank_placements`)."""
    top_placements: int = TOP_PLACEMENTS
    """Placements per program priced in full and ranked."""
    model: ModelOptions = field(default_factory=ModelOptions)
    """How the ICI model prices (:class:`~aoizora_lab.comm_model.ModelOptions`: which order
    model a collective's group follows, how much asynchronous work overlaps): the placement
    search, the systems' setups, the headline and the ensemble's draws all price under it
    (pruning's IR estimates, which only order and cap what compiles, use the default). The
    default is the one the published order-only measurements chose
    (``reports/benchmarks.md``, "Device order"); another answers "what if the TPU behaved
    so" (``aoizora-lab plan --order-model``)."""
    flags: tuple[CompilerFlags, ...] = field(
        default_factory=lambda: tuple(map(compiler_flags, SEARCHED_FLAGS)))
    """The flag sets every kept candidate is compiled with, as names of
    :data:`aoizora_lab.compile.FLAG_SETS`, ``LIBTPU_INIT_ARGS`` strings or
    :class:`CompilerFlags` (normalised and deduplicated; CPU host devices compile once)."""
    compare: Any = None
    """A setup of yours to compare and advise on: MaxDiffusion config keys, Wan / xDiT flags
    or a mesh (:func:`aoizora_lab.baselines.user_setup`); compiled whatever the limit."""
    max_compiled: int | None = None
    """Compile at most this many survivors, the IR's best (``None``: every one)."""
    time_limit_s: float | None = None
    """Answer within this many seconds (``None``: the full search); see
    :class:`aoizora_lab.jobs.TimeLimited`."""
    systems: bool = True
    """Compile and price the existing systems' setups (``False``: the headline has no system
    to compare with)."""
    timeout_s: float = 900.0
    """A compile running longer is stopped and recorded as ``timeout``."""
    cache_dir: str | Path | None = None
    """Where compiles are kept (``None``: ``compile/`` under
    :func:`~aoizora_lab.versions.cache_root`)."""
    ir_cache_dir: IRCacheDir = None
    """Where IR traces are kept (``None``: ``ir/`` under the cache root; ``False``: trace
    afresh)."""
    quiet: bool = True
    """No progress bar (the progress lines of :mod:`aoizora_lab.progress` are separate)."""

    def __post_init__(self) -> None:
        for name, least in (("keep", 1), ("budget", 0), ("top_placements", 1)):
            if not is_whole(getattr(self, name), least):
                raise AoizoraError(f"PlanOptions({name}={getattr(self, name)!r}): must be a "
                                   f"whole number >= {least}.")
        if self.num_layers is not None and not is_whole(self.num_layers, 1):
            raise AoizoraError(f"PlanOptions(num_layers={self.num_layers!r}): a whole number "
                               ">= 1 (2 folds the rest exactly), or None for the full depth.")
        if self.max_compiled is not None and not is_whole(self.max_compiled, 1):
            raise AoizoraError(f"PlanOptions(max_compiled={self.max_compiled!r}): must be a "
                               "whole number >= 1 (survivors to compile at most), or None to "
                               "compile every one.")
        if not isinstance(self.model, ModelOptions):
            raise AoizoraError(f"PlanOptions(model={self.model!r}): give a ModelOptions, e.g. "
                               "ModelOptions(order='logical').")
        if self.time_limit_s is not None:
            check_time_limit(self.time_limit_s)
        check_timeout(self.timeout_s)
        object.__setattr__(self, "flags", _flag_sets(self.flags))

    def replace(self, **changes: Any) -> PlanOptions:
        """A copy with ``changes`` (checked like a new one)."""
        return dataclasses.replace(self, **changes)

    def flags_on(self, topology: Topology) -> tuple[CompilerFlags, ...]:
        """The flag sets compiled on ``topology``: :attr:`flags`, only the first on CPU host
        devices (TPU flags mean nothing there)."""
        return self.flags[:1] if topology.source is DeviceSource.HOST else self.flags

    def flag_async(self, topology: Topology) -> FlagAsync:
        """What each flag set compiled on ``topology`` makes asynchronous (``prune``'s
        ``flag_async``): libtpu's defaults only on CPU host devices, which compile no TPU
        flags."""
        if topology.source is DeviceSource.HOST:
            return LIBTPU_DEFAULTS
        return tuple(f.async_kinds for f in self.flags_on(topology))

    @property
    def key(self) -> tuple[Any, ...]:
        """What shapes the answer, for the keys of stored results: every field but where the
        caches live and whether a bar is shown."""
        return tuple(getattr(self, f.name) for f in dataclasses.fields(self)
                     if f.name not in ("cache_dir", "ir_cache_dir", "quiet"))


def check_time_limit(seconds: Any, name: str = "PlanOptions(time_limit_s") -> None:
    """Raise :class:`AoizoraError` unless ``seconds`` is a usable time limit; ``name`` is how
    the caller's user wrote it (``time_limit`` for a notebook)."""
    if isinstance(seconds, bool) or not isinstance(seconds, int | float) or not (
            0 < seconds < math.inf):
        close = ")" if "(" in name else ""
        raise AoizoraError(f"{name}={seconds!r}{close}: give a positive number of seconds "
                           "(e.g. 300, as `aoizora-lab plan` answers), or None for the full "
                           "search.")


def _flag_sets(flags: Any) -> tuple[CompilerFlags, ...]:
    if isinstance(flags, str | CompilerFlags) or not isinstance(flags, Sequence) or not flags:
        raise AoizoraError(f"PlanOptions(flags={flags!r}): give a list of flag sets, e.g. "
                           f"{list(SEARCHED_FLAGS)}.")
    return tuple({f.label: f for f in map(compiler_flags, flags)}.values())


FULL_SEARCH = PlanOptions()
"""Every survivor with every flag set, and every system's setup: the answer the benchmarks
record, however long it takes."""

INTERACTIVE = PlanOptions(time_limit_s=INTERACTIVE_TIME_LIMIT_S)
"""``aoizora-lab plan``'s default (``--full`` is :data:`FULL_SEARCH`): the full search's
rules, but no compile starts that would end after :data:`INTERACTIVE_TIME_LIMIT_S`."""
