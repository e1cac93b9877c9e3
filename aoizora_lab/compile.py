"""Compile the surviving candidates with the real compiler, isolated, in parallel, cached.

Each compile runs in its own child process (``python -m aoizora_lab.compile_worker``): some
TPU compiles abort the whole process (SIGABRT), and a child that dies, hangs past
``timeout_s`` or runs out of HBM becomes a *status* on its :class:`CompiledCandidate`
(``ok``, ``oom``, ``crash``, ``timeout``, ``error``, with the compiler's message), never an
exception that ends the sweep; a compile a plan decided not to run is a :class:`NotRun` with
its :class:`NotRunReason` (:mod:`aoizora_lab.jobs` decides). The
children are started from an ``Executor``: by default a thread pool with one slot per core
(each slot waits on one child process); pass ``dask.distributed.Client(...).get_executor()``
to fan a sweep out over a cluster, where each worker starts its own children.

Results are cached on disk (``compile/`` under :func:`~aoizora_lab.versions.cache_root`),
one folder per compile keyed by everything that changes the result: the library versions and
the code the compile runs (:func:`~aoizora_lab.versions.code_versions` of the compile
worker), the model config, the workload, the candidate, the slice and the layer count. An entry is
written to a temporary folder and renamed into place, so a reader never sees half of one; its
HLO text carries a checksum that is checked on every read. ``ok`` and ``oom`` results are
cached (the compiler is deterministic), and so is the compiler's refusal of a job
(:func:`kept`: an error with a status code of :data:`REFUSED_CODES`, e.g. v5e's "Async
all-to-all not supported on limited ICI" under MaxDiffusion's flags, which a warm plan would
otherwise compile again each time); crashes, timeouts and other errors (a host out of memory,
a full disk) may be the machine's and are retried next time.
Behind that key, an index of *programs* (``compile/programs/``) names each entry by what the
compiler was given (the lowered program's text, flags, slice, libraries:
:func:`~aoizora_lab.compile_worker.program_key`): after an edit of the package, a job whose
program did not change is lowered again (seconds) and linked to the entry, not compiled.

**Compiler flags** are part of a recipe: each compile takes a :class:`CompilerFlags` (a named
set from :data:`FLAG_SETS`, e.g. MaxDiffusion's recommended ``LIBTPU_INIT_ARGS``, or a user's
own string), passed to the compiler as ``compiler_options`` (the same flags libtpu reads from
``LIBTPU_INIT_ARGS``; the environment's own ``LIBTPU_INIT_ARGS`` is cleared in the child, so
the cache key says every flag a compile saw). On CPU host devices the TPU flags mean nothing
and are not passed.

**Layer folding**: ``num_layers=2`` compiles two layers of the model (same width) and scales the
collectives of the layer loop by ``model layers / 2``; everything outside the loop (embeddings,
head) counts once. Under ``scan`` the per-layer program does not depend on the depth, which
``tests/test_compile.py`` checks against a full-depth compile.
"""

from __future__ import annotations

import concurrent.futures as cf
import contextlib
import dataclasses
import enum
import hashlib
import json
import math
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from aoizora_lab.candidates import Candidate
from aoizora_lab.compile_worker import SAME_PROGRAM
from aoizora_lab.errors import AoizoraError, is_whole
from aoizora_lab.hlo import CommProgram, program_at_depth
from aoizora_lab.progress import duration
from aoizora_lab.progress import note as progress_note
from aoizora_lab.records import Records
from aoizora_lab.topology import DeviceSource, Topology
from aoizora_lab.versions import (
    cache_root,
    code_versions,
    digest,
    memoized,
    write_atomically,
)
from aoizora_lab.workers import (
    available_memory,
    fitting_workers,
    record_peak,
    seen_peak,
    usable_cpus,
)
from aoizora_lab.workload import Workload

if TYPE_CHECKING:
    import pandas as pd

class CompileStatus(enum.StrEnum):
    """How a compile ended. A ``str`` (``status == "ok"`` reads as it did), so a compile's
    JSON record and cache entry hold the plain word."""

    OK = "ok"
    """Compiled: the result has a program."""
    OOM = "oom"
    """The compiler's RESOURCE_EXHAUSTED: this sharding does not fit the chip's HBM."""
    CRASH = "crash"
    """The compiling process was killed by a signal (some TPU compiles abort)."""
    TIMEOUT = "timeout"
    """No result within the compile's time out; the child was killed."""
    ERROR = "error"
    """Any other compiler or tracing error, or a cache that could not be written."""


CACHED_STATUSES = (CompileStatus.OK, CompileStatus.OOM)
"""Deterministic outcomes, kept in the cache; the others are retried next time unless
:func:`kept` finds the compiler's refusal."""
REFUSED_CODES = ("UNIMPLEMENTED", "INVALID_ARGUMENT", "FAILED_PRECONDITION")
"""Status codes of a compiler error that the same job (program, flags, slice, jax and libtpu:
all in its key) always gets back: "Async all-to-all not supported on limited ICI" is
UNIMPLEMENTED, an unknown flag INVALID_ARGUMENT. ``INTERNAL`` and the rest are retried."""
_REFUSAL = re.compile(rf"(?:Jax|Xla)RuntimeError: (?:{'|'.join(REFUSED_CODES)}):")


def kept(result: dict[str, Any]) -> bool:
    """Whether a compile's result is deterministic, so kept in the cache: ``ok``, ``oom``, or
    an ``error`` whose message is the compiler's refusal (it starts with an XLA error of a
    :data:`REFUSED_CODES` code; a message cut at its start is retried, never kept)."""
    status = result.get("status")
    return status in CACHED_STATUSES or (
        status == CompileStatus.ERROR and bool(_REFUSAL.match(str(result.get("message", "")))))


@dataclass(frozen=True)
class CompilerFlags:
    """A named set of libtpu / XLA flags, written as ``LIBTPU_INIT_ARGS`` is written."""

    name: str
    """Short name shown in tables (``default``, ``maxdiffusion-wan``, ...)."""
    args: str = ""
    """``--flag=value`` words separated by spaces (empty: the compiler's defaults)."""
    source: str = ""
    """Where the set comes from."""

    def __post_init__(self) -> None:
        for word in self.args.split():
            if not (word.startswith("--") and "=" in word and len(word.split("=")[0]) > 2):
                raise AoizoraError(
                    f"Compiler flag {word!r} in {self.args!r} is not '--name=value'; write the "
                    "flags as LIBTPU_INIT_ARGS takes them, e.g. "
                    "'--xla_tpu_enable_async_all_to_all=true'.")

    @property
    def options(self) -> dict[str, str]:
        """The flags as ``compiler_options`` for ``Lowered.compile``."""
        return dict(word[2:].split("=", 1) for word in self.args.split())

    @property
    def label(self) -> str:
        """The name, or ``default`` for no flags."""
        return self.name if self.args else "default"

    @property
    def words(self) -> tuple[str, ...]:
        """The ``--flag=value`` words, in order."""
        return tuple(self.args.split())

    @property
    def async_kinds(self) -> frozenset[str]:
        """The collective kinds these flags make asynchronous beyond libtpu's defaults
        (:data:`ASYNC_FLAGS`; a flag set twice counts as its last value, as in
        ``LIBTPU_INIT_ARGS``): what the IR estimate lets hide behind compute."""
        return frozenset(kind for flag, kind in ASYNC_FLAGS.items()
                         if self.options.get(flag, "").lower() in ("true", "1"))

    def without(self, word: str) -> CompilerFlags:
        """This set less the flag ``word``: a set of :data:`FLAG_SETS` where what is left is
        one (MaxDiffusion's Ulysses set less asynchronous all-to-all is its Wan set), else
        this set's name with ``-flag`` appended (``maxdiffusion-wan -enable_async_all_reduce``).
        """
        if word not in self.words:
            raise AoizoraError(f"Flag {word!r} is not in the {self.label} set {self.args!r}.")
        rest = " ".join(w for w in self.words if w != word)
        known = [f for f in FLAG_SETS.values() if f.args == rest]
        if known:
            return known[0]
        short = word[2:].split("=")[0].removeprefix("xla_tpu_").removeprefix("xla_")
        return CompilerFlags(f"{self.name} -{short}", rest, f"{self.source}, without {word}")


ASYNC_FLAGS: dict[str, str] = {"xla_tpu_enable_async_all_to_all": "all-to-all"}
"""Flags that, set true, make a collective kind asynchronous which libtpu otherwise runs
synchronously (the kind, by flag name). Compiled evidence, Wan 2.1 1.3B at 480p on
``v5e:2x4``: the 3 all-to-alls of ``cfg2-ctx4-fsdpseq`` are synchronous under libtpu's
defaults and MaxDiffusion's Wan flags, and start / done pairs under its Ulysses set (these
flags plus this one), as are all 7 of ``cfg2-uly4-fsdpseq``'s. libtpu refuses the flag in
some programs on some slices ("not supported on limited ICI", or an abort: MaxDiffusion's
Ulysses recipes in the plan-quality records of ``v5e:4x8`` and ``v5e:8x8``, none on
``v5e:2x4`` or ``v5e:4x4``), while a lone all-to-all with it compiles on all four: only the
program's own compile tells."""

_MAXDIFFUSION_WAN = ("--xla_tpu_enable_async_collective_fusion=true "
                     "--xla_tpu_enable_async_collective_fusion_fuse_all_reduce=true "
                     "--xla_tpu_enable_async_collective_fusion_multiple_steps=true "
                     "--xla_tpu_overlap_compute_collective_tc=true "
                     "--xla_enable_async_all_reduce=true")
FLAG_SETS: dict[str, CompilerFlags] = {f.name: f for f in (
    CompilerFlags("default", "", "libtpu's defaults (no LIBTPU_INIT_ARGS)"),
    CompilerFlags("maxdiffusion-wan", _MAXDIFFUSION_WAN,
                  "MaxDiffusion README, Wan 2.1 inference: LIBTPU_INIT_ARGS (HEAD 7cfb880)"),
    CompilerFlags("maxdiffusion-ulysses",
                  _MAXDIFFUSION_WAN + " --xla_tpu_enable_async_all_to_all=true",
                  "MaxDiffusion README, Wan inference flags plus its Ulysses section's "
                  "--xla_tpu_enable_async_all_to_all=true (HEAD 7cfb880)"),
)}
"""Named flag sets; a recipe (baseline) names one, the planner searches several."""
DEFAULT_FLAGS = FLAG_SETS["default"]


def compiler_flags(flags: str | CompilerFlags | None) -> CompilerFlags:
    """A :class:`CompilerFlags` from a name in :data:`FLAG_SETS`, a ``LIBTPU_INIT_ARGS``-style
    string (``"--xla_tpu_enable_async_all_to_all=true"``: named ``custom``) or ``None``
    (the defaults)."""
    if flags is None:
        return DEFAULT_FLAGS
    if isinstance(flags, CompilerFlags):
        return flags
    if isinstance(flags, str) and flags in FLAG_SETS:
        return FLAG_SETS[flags]
    if isinstance(flags, str) and flags.strip().startswith("--"):
        args = " ".join(flags.split())
        known = [f for f in FLAG_SETS.values() if f.args == args]
        return known[0] if known else CompilerFlags("custom", args, "given by the user")
    raise AoizoraError(
        f"Compiler flags {flags!r}: give a flag set name from {sorted(FLAG_SETS)} or flags as "
        "LIBTPU_INIT_ARGS takes them, e.g. '--xla_tpu_enable_async_all_to_all=true'.")


@dataclass(frozen=True)
class CompiledCandidate:
    """The outcome of compiling one candidate: status, time, memory, the HLO and its collectives."""

    candidate: Candidate
    status: CompileStatus
    """How it ended (a plain word is read as its :class:`CompileStatus`)."""
    message: str
    """The compiler's message (or the crash's signal and stderr) when not ``ok``."""
    compile_seconds: float
    """Wall time of the compile in the child (0 when it never ran)."""
    memory: dict[str, float] = field(default_factory=dict)
    """``argument``, ``output``, ``temp`` and ``peak`` bytes per device (``ok`` only)."""
    program: CommProgram | None = None
    """The collectives per step, folded to the model's depth (``ok`` only)."""
    hlo_path: Path | None = None
    """Where the compiled HLO text is stored."""
    compiled_layers: int | None = None
    """Layers actually compiled (fewer than the model's when folded)."""
    cached: bool = False
    """Whether the result came from the cache."""
    flags: CompilerFlags = DEFAULT_FLAGS
    """The compiler flags it was compiled with."""
    host_peak_bytes: float = math.nan
    """Peak resident memory of the compiling process on the machine that compiled it (NaN
    for results cached before it was recorded)."""
    child_seconds: float = math.nan
    """Wall time of the compiling child process, start to result (Python, JAX and libtpu
    starting included; NaN for results cached before it was recorded): what the compile
    cost when it ran, which a time-limited plan charges for reading it back."""

    def __post_init__(self) -> None:
        object.__setattr__(self, "status", CompileStatus(self.status))

    @property
    def key(self) -> tuple[str, str]:
        """``(candidate name, flags label)``: one compile's identity in a sweep."""
        return self.candidate.name, self.flags.label

    @property
    def hlo_text(self) -> str:
        """The compiled HLO, read from disk on first use."""
        if self.hlo_path is None:
            raise AoizoraError(f"{self.candidate.name} has no HLO ({self.status}).")
        return self.hlo_path.read_text()


class NotRunReason(enum.Enum):
    """Why a plan did not run a compile."""

    TIME_LIMIT = "time limit"
    """It would have ended after the plan's time limit."""
    FIRST_RUN = "first run"
    """The same time-limited plan's first run did not start it (so this run does not)."""
    CANNOT_WIN = "cannot win"
    """A further flag set of a survivor whose compute alone under its first flag set is no
    faster than a step already priced: flags cannot make it the plan."""
    BUDGET = "compile budget"
    """A survivor beyond the plan's compile budget (``PlanOptions.max_compiled``)."""


@dataclass(frozen=True)
class NotRun:
    """A compile a plan decided not to run, and why."""

    candidate: Candidate
    """The candidate it would have compiled."""
    flags: CompilerFlags
    """With these flags."""
    reason: NotRunReason
    """Why not."""
    message: str
    """Why not, for people (the limit and the time it would have taken, the compute and the
    step it could not beat)."""
    compute_s: float = math.nan
    """``CANNOT_WIN``: its compute per step under the first flag set, a floor for its step."""
    best_s: float = math.nan
    """``CANNOT_WIN``: the fastest step priced before (plain device order)."""

    @property
    def key(self) -> tuple[str, str]:
        """``(candidate name, flags label)``, as :attr:`CompiledCandidate.key`."""
        return self.candidate.name, self.flags.label


Outcome = CompiledCandidate | NotRun
"""What became of one compile of a plan: it ran (``ok`` or failed, with its status) or not."""


class Compiles(Records[Outcome]):
    """The outcome of every compile, in the order they were given (a plan's include those it
    did not run, as :class:`NotRun`)."""

    COLUMNS = ("candidate", "flags", "status", "cached", "compile_s", "peak_gib", "host_gib",
               "comm_gb", "message")

    @property
    def ok(self) -> list[CompiledCandidate]:
        """The compiles that produced a program."""
        return [r for r in self if isinstance(r, CompiledCandidate)
                and r.status is CompileStatus.OK]

    @property
    def ran(self) -> list[CompiledCandidate]:
        """The compiles that ran (whatever their status)."""
        return [r for r in self if isinstance(r, CompiledCandidate)]

    @property
    def not_run(self) -> list[NotRun]:
        """The compiles the plan did not run."""
        return [r for r in self if isinstance(r, NotRun)]

    def traffic(self) -> pd.DataFrame:
        """Collective bytes per device per step of every ``ok`` compile, by kind and schedule.

        One row per (compile, kind, schedule) present: ``candidate``, ``flags`` (its flags
        label), ``program`` (the candidate's name, with `` · flags`` where these compiles hold
        several flag sets), ``kind``, ``schedule`` (``async``: the compiler scheduled it
        asynchronously, so it may hide behind compute; ``sync``: it adds to the step),
        ``collective`` (``"all-gather (async)"``) and ``gb`` (bytes x runs per step / 1e9, over
        that kind's collectives). Compiles keep their order; those that are not ``ok`` have no
        program and no rows.
        """
        import pandas as pd

        rows = []
        several = len({r.flags.label for r in self.ok}) > 1
        for result in self.ok:
            frame = result.program.to_frame()
            frame["schedule"] = frame["asynchronous"].map({True: "async", False: "sync"})
            frame["gb"] = frame["bytes"] * frame["count"] / 1e9
            name, flags = result.candidate.name, result.flags.label
            for (kind, schedule), gb in frame.groupby(["kind", "schedule"])["gb"].sum().items():
                rows.append({"candidate": name, "flags": flags,
                             "program": f"{name} · {flags}" if several else name, "kind": kind,
                             "schedule": schedule, "collective": f"{kind} ({schedule})",
                             "gb": float(gb)})
        return pd.DataFrame(rows, columns=["candidate", "flags", "program", "kind", "schedule",
                                           "collective", "gb"])

    def row(self, item: Outcome) -> dict[str, Any]:
        if isinstance(item, NotRun):
            return {"candidate": item.candidate.name, "flags": item.flags.label,
                    "status": f"not run ({item.reason.value})", "cached": False,
                    "compile_s": 0.0, "peak_gib": math.nan, "host_gib": math.nan,
                    "comm_gb": math.nan, "message": item.message[:200]}
        return {"candidate": item.candidate.name, "flags": item.flags.label,
                "status": item.status, "cached": item.cached,
                "compile_s": item.compile_seconds,
                "peak_gib": item.memory.get("peak", math.nan) / 2**30,
                "host_gib": item.host_peak_bytes / 2**30,
                "comm_gb": item.program.total_bytes / 1e9 if item.program else math.nan,
                "message": item.message[:200]}


def compile_candidates(candidates: Sequence[Candidate], workload: Workload, topology: Topology,
                       *, executor: cf.Executor | None = None,
                       cache_dir: str | Path | None = None, timeout_s: float = 900.0,
                       num_layers: int | None = None,
                       flags: str | CompilerFlags | None = None,
                       describe: Callable[[CompiledCandidate], str] | None = None) -> Compiles:
    """Compile ``candidates`` for ``topology``'s devices with ``flags`` (see
    :func:`compiler_flags`); one result per candidate, in order. ``describe``: called on each
    result as it arrives; its text ends that compile's progress line (the planner's best
    step so far)."""
    flags = compiler_flags(flags)
    for candidate in candidates:  # every one checked before anything compiles
        check_candidate(candidate, topology)
    with CompileQueue(workload, topology, executor=executor, cache_dir=cache_dir,
                      timeout_s=timeout_s, num_layers=num_layers, describe=describe,
                      expected=len(candidates)) as queue:
        futures = {queue.submit(c, flags): i for i, c in enumerate(candidates)}
        results = {futures[f]: queue.finish(candidates[futures[f]], flags, f.result())
                   for f in cf.as_completed(futures)}
    return Compiles(results[i] for i in range(len(candidates)))


def check_candidate(candidate: Any, topology: Topology) -> None:
    """Raise :class:`AoizoraError` unless ``candidate`` is a Candidate spanning ``topology``."""
    if not isinstance(candidate, Candidate):
        raise AoizoraError(
            f"compile_candidates needs Candidate objects, got {candidate!r}; build one with "
            "Candidate.from_name('cfg2-uly4') or enumerate_candidates(workload, topology)."
        )
    if candidate.num_devices != topology.num_devices:
        raise AoizoraError(
            f"Candidate {candidate.name!r} spans {candidate.num_devices} devices but "
            f"{topology.name} has {topology.num_devices}; its role degrees must multiply to "
            f"{topology.num_devices} (enumerate_candidates(workload, topology) lists those)."
        )


def check_timeout(timeout_s: Any) -> None:
    """Raise :class:`AoizoraError` unless ``timeout_s`` is a positive number of seconds."""
    if isinstance(timeout_s, bool) or not isinstance(timeout_s, int | float) or not timeout_s > 0:
        raise AoizoraError(f"timeout_s={timeout_s!r} must be a positive number of seconds.")


class CompileQueue:
    """The compiles of one workload on one slice at one depth, through one pool, from any
    thread: one count on the progress lines, one host-memory record (:func:`compile_executor`).
    :func:`compile_candidates` compiles a list through one; the planner compiles each
    survivor's flag sets from its own threads (:meth:`compile`).

    ``expected``: how many compiles the progress lines count to; ``at_most``: that is a bound
    (the planner's further flag sets), lowered by each one the caller decides against
    (:meth:`skip`). ``time_left``: seconds until the caller stops starting compiles (a time
    limit; ``None``: none), the most the lines' estimate of the time left can say.
    """

    def __init__(self, workload: Workload, topology: Topology, *,
                 executor: cf.Executor | None = None, cache_dir: str | Path | None = None,
                 timeout_s: float = 900.0, num_layers: int | None = None,
                 describe: Callable[[CompiledCandidate], str] | None = None,
                 expected: int = 0, at_most: bool = False,
                 time_left: Callable[[], float] | None = None) -> None:
        check_compilable(topology)
        self._model_layers = workload.config().num_layers
        check_num_layers(num_layers, self._model_layers)
        check_timeout(timeout_s)
        self._workload, self._topology, self._num_layers = workload, topology, num_layers
        self._timeout_s, self._describe = timeout_s, describe
        self._expected, self._at_most, self._time_left = expected, at_most, time_left
        self._cache = Path(cache_dir) if cache_dir is not None else default_cache_dir()
        self._own = executor is None
        self._pool = executor or compile_executor(workload, topology, cache_dir=self._cache,
                                                  num_layers=num_layers)
        self._lock = threading.Lock()
        self._start = time.monotonic()
        self._submitted = self._done = self._fresh = 0
        self._host_peaks: list[float] = []

    @property
    def width(self) -> int:
        """Compiles the pool runs at a time: what a thread or process pool says, else one
        per usable CPU (an executor such as dask's does not say)."""
        return getattr(self._pool, "_max_workers", None) or usable_cpus()

    def submit(self, candidate: Candidate, flags: CompilerFlags) -> cf.Future:
        """Start compiling ``candidate`` with ``flags``: a future of the raw result, for
        :meth:`finish`."""
        check_candidate(candidate, self._topology)
        with self._lock:
            self._submitted += 1
        job = _job(candidate, self._workload, self._topology, self._num_layers, flags)
        return self._pool.submit(run_job, job, str(self._cache), self._timeout_s)

    def finish(self, candidate: Candidate, flags: CompilerFlags,
               raw: dict[str, Any]) -> CompiledCandidate:
        """The result of a compile :meth:`submit` started, with its progress line."""
        result = _result(candidate, raw, self._model_layers, self._num_layers, flags)
        try:
            extra = self._describe(result) if self._describe else ""
        except Exception:  # a progress line never ends a sweep
            extra = ""
        with self._lock:
            self._done += 1
            self._host_peaks.append(raw.get("host_peak_bytes", math.nan))
            if not raw.get("cached"):  # a cached one takes no time worth a line
                self._fresh += 1
                self._note(f"{candidate.name} ({flags.label} flags) {raw['status']} in "
                           f"{result.compile_seconds:.0f} s", extra)
        return result

    def cached(self, candidate: Candidate, flags: CompilerFlags) -> bool:
        """Whether the cache holds this compile (then :meth:`compile` only reads it back)."""
        job = _job(candidate, self._workload, self._topology, self._num_layers, flags)
        return (self._cache / cache_key(job) / "meta.json").exists()

    def compile(self, candidate: Candidate, flags: CompilerFlags) -> CompiledCandidate:
        """Compile ``candidate`` with ``flags`` and wait for it."""
        return self.finish(candidate, flags, self.submit(candidate, flags).result())

    def skip(self) -> None:
        """One compile of ``expected`` the caller decided not to start."""
        with self._lock:
            self._expected -= 1

    def expect(self, more: int) -> None:
        """``more`` compiles to count than ``expected`` said (a plan's second round)."""
        with self._lock:
            self._expected += more

    def _note(self, what: str, extra: str) -> None:
        """The progress line of the compile just done (under the lock: lines in order)."""
        done, total = self._done, max(self._expected, self._submitted)
        # Time per compile so far (parallel workers included) x compiles to go;
        # an overestimate when some still to come are cached or spared. A time limit
        # caps it: what would start after it does not start.
        left = (time.monotonic() - self._start) / max(self._fresh, 1) * (total - done)
        limit = max(0.0, self._time_left()) if self._time_left is not None else math.inf
        progress_note(f"compile {done} of {'at most ' if self._at_most else ''}{total} "
                      f"({self._workload.name} on {self._topology.name}): {what}"
                      + (f"; about {duration(min(left, limit))} left"
                         + (" (time limit)" if limit < left else "") if done < total else "")
                      + (f"; {extra}" if extra else ""))

    def close(self) -> None:
        """Record the compiles' host memory; shut the pool down if this queue made it."""
        _record_host_peak(self._cache, _sweep_key(_sweep(self._workload, self._topology,
                                                          self._num_layers)), self._host_peaks)
        if self._own:
            self._pool.shutdown()

    def __enter__(self) -> CompileQueue:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def compile_executor(workload: Workload, topology: Topology, *,
                     cache_dir: str | Path | None = None,
                     num_layers: int | None = None) -> cf.ThreadPoolExecutor:
    """A pool for the compiles of ``workload`` on ``topology``, as many at a time as
    :func:`compile_workers` allows. Share one between sweeps that may run side by side (the
    planner's compiles with several flag sets) so no worker idles while another sweep waits;
    the caller shuts it down."""
    cache = Path(cache_dir) if cache_dir is not None else default_cache_dir()
    sweep = _sweep_key(_sweep(workload, topology, num_layers))
    layers = num_layers or workload.config().num_layers
    return cf.ThreadPoolExecutor(max_workers=compile_workers(
        _seen_host_peak(cache, sweep), available_memory(), usable_cpus(),
        what=f"{workload.name} on {topology.name} at {layers} layers"))


HOST_MEMORY_FILE = ".host_memory.json"
"""In the compile cache (a dot file, so nothing takes it for an entry): the largest resident
memory one compile of each sweep (workload, slice, depth; any candidate) has taken on this
machine, which sizes the next sweep."""


def compile_workers(peak_bytes: float, available_bytes: float, cpus: int, *,
                    what: str = "this sweep") -> int:
    """Parallel compiles for a sweep whose compiles have taken up to ``peak_bytes`` each
    (NaN: never measured), with ``available_bytes`` free (:func:`workers.fitting_workers`).
    Raises before anything starts when not even one fits.

    Example: 2 CPUs, 20 GiB free, compiles of 12 GiB: one at a time.
    """
    fits = fitting_workers(peak_bytes, available_bytes, cpus)
    if fits < 1:
        raise AoizoraError(
            f"One compile of {what} took {peak_bytes / 2**30:.1f} GiB of memory here, but "
            f"{available_bytes / 2**30:.1f} GiB is free: it would not fit. Compile fewer "
            "layers (num_layers=2 folds the rest exactly), close what holds the memory, or "
            "use a machine with more.")
    return fits


def _sweep_key(job: dict[str, Any]) -> str:
    """A sweep's identity for its memory record: the job without candidate and flags."""
    sweep = {k: v for k, v in job.items()
             if k not in ("candidate", "attention", "compiler_options")}
    return hashlib.sha256(json.dumps(sweep, sort_keys=True).encode()).hexdigest()[:16]


def _sweep(workload: Workload, topology: Topology, num_layers: int | None) -> dict[str, Any]:
    """What every compile job of a sweep shares (:func:`_job` adds candidate and flags)."""
    model = workload.config()
    return {
        "model": dataclasses.asdict(model),
        "workload": workload.program_fields(),
        "topology": topology_spec(topology),
        "num_layers": num_layers or model.num_layers,
        "versions": code_versions("aoizora_lab.compile_worker"),
    }


def topology_spec(topology: Topology) -> dict[str, Any]:
    """What a compile child needs to rebuild ``topology`` (``compile_worker.topology_of``)."""
    return {"name": topology.name, "shape": list(topology.shape), "wrap": list(topology.wrap),
            "generation": topology.generation, "source": topology.source,
            "num_devices": topology.num_devices}


def _seen_host_peak(cache: Path, sweep: str) -> float:
    return seen_peak(cache / HOST_MEMORY_FILE, sweep)


def _record_host_peak(cache: Path, sweep: str, peaks: Sequence[float]) -> None:
    measured = [p for p in peaks if isinstance(p, int | float) and p > 0]
    if measured and sweep:
        record_peak(cache / HOST_MEMORY_FILE, sweep, max(measured))


def check_compilable(topology: Topology) -> None:
    """Raise :class:`AoizoraError` unless ``topology`` has devices a compiler can target."""
    if topology.source is DeviceSource.SIMULATED:
        raise AoizoraError(
            f"{topology.name} is {topology.source}: nothing compiles for it. Use a slice that "
            "libtpu describes (Topology.from_name) or CPU host devices "
            "(Topology.simulated(shape, devices=jax.devices()))."
        )


def check_num_layers(num_layers: Any, model_layers: int) -> None:
    """Raise :class:`AoizoraError` unless ``num_layers`` is None or 1..``model_layers``."""
    if num_layers is not None and not is_whole(num_layers, 1, model_layers):
        raise AoizoraError(
            f"num_layers={num_layers!r} must be between 1 and the model's {model_layers} "
            "(or None for the full depth)."
        )


def _job(candidate: Candidate, workload: Workload, topology: Topology,
         num_layers: int | None, flags: CompilerFlags = DEFAULT_FLAGS) -> dict[str, Any]:
    """Everything a child needs, as JSON-able data (and the cache key's ingredients)."""
    options = {} if topology.source is DeviceSource.HOST else flags.options
    return {
        "candidate": candidate.name,
        "attention": candidate.attention,
        **_sweep(workload, topology, num_layers),
        **({"compiler_options": options} if options else {}),
    }


def default_cache_dir() -> Path:
    """Where compiles are kept unless a caller names a folder: ``compile/`` of the cache root."""
    return cache_root() / "compile"


def cache_key(job: dict[str, Any]) -> str:
    """The cache folder name of a compile job: a hash of everything that changes its result."""
    return digest(json.dumps(job, sort_keys=True))


def run_job(job: dict[str, Any], cache_dir: str, timeout_s: float) -> dict[str, Any]:
    """Compile one job in a child process, through the cache. Runs on any executor's worker.

    Whatever goes wrong (a full disk under the cache, a child killed by an unnamed signal)
    comes back as an ``error`` result, so one job never ends the sweep.
    """
    try:
        return _run_job(job, cache_dir, timeout_s)
    except Exception as err:  # recorded as the candidate's status
        return {"status": "error", "compile_seconds": 0.0,
                "message": f"{type(err).__name__}: {err}"}


def _run_job(job: dict[str, Any], cache_dir: str, timeout_s: float) -> dict[str, Any]:
    entry = Path(cache_dir) / cache_key(job)
    cached = read_entry(entry)
    if cached is not None:
        return cached | {"cached": True}
    programs = Path(cache_dir) / PROGRAMS
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="aoizora-compile-") as work:
        result = _in_child(job, Path(work), timeout_s, programs)
        if result["status"] == SAME_PROGRAM:
            same = _indexed(Path(cache_dir), result["program_key"])
            if same is not None:  # the same program compiled for another key: link it
                write_entry(entry, same, Path(same.get("hlo_path", "")))
                stored = read_entry(entry)
                if stored is not None:
                    return stored | {"cached": True}
            result = _in_child(job, Path(work), timeout_s, None)
        result["child_seconds"] = time.monotonic() - started
        if not kept(result):
            return result
        for _ in range(2):  # a second try after read_entry cleared a half-removed entry
            write_entry(entry, result, Path(work) / "hlo.txt")
            stored = read_entry(entry)
            if stored is not None:
                if stored.get("program_key"):
                    write_atomically(programs / stored["program_key"], entry.name)
                return stored | {"cached": False}
        return {"status": "error", "compile_seconds": result.get("compile_seconds", 0.0),
                "message": f"compiled ({result['status']}), but the cache entry {entry} could "
                           "not be written and read back: check the cache folder is writable "
                           "and has space, or pass another cache_dir."}


PROGRAMS = "programs"
"""The compile cache's index of programs: ``programs/<program key>`` holds the name of an
entry compiled from that program (:func:`~aoizora_lab.compile_worker.program_key`), so a job
whose code key is new but whose program is not reuses the compile."""


def _indexed(cache_dir: Path, key: str) -> dict[str, Any] | None:
    """The entry the index gives for program ``key`` (``None``: none, or not readable)."""
    name = _indexed_name(cache_dir / PROGRAMS / key)
    return read_entry(cache_dir / name) if name else None


def _indexed_name(index_file: Path) -> str:
    """The entry name an index file holds (``""``: unreadable, or not an entry's name)."""
    try:
        name = index_file.read_text().strip()
    except OSError:
        return ""
    return name if name and Path(name).name == name and name != PROGRAMS else ""


def _in_child(job: dict[str, Any], work: Path, timeout_s: float, programs: Path | None
              ) -> dict[str, Any]:
    """Run the compile worker on ``job`` in ``work``: its result, or the crash, timeout or
    exit that ended it. With ``programs``, a program the index holds is not compiled. The
    worker is ``job["worker"]`` (a module run with ``-m``; the DiT step's
    ``aoizora_lab.compile_worker`` when the job names none)."""
    env = {k: v for k, v in os.environ.items() if k != "LIBTPU_INIT_ARGS"}
    if job["topology"]["source"] == DeviceSource.HOST:
        env["JAX_PLATFORMS"] = "cpu"
        env["XLA_FLAGS"] = (env.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count="
                            f"{job['topology']['num_devices']}").strip()
    try:
        done = subprocess.run(
            [sys.executable, "-m", job.get("worker", "aoizora_lab.compile_worker"), str(work),
             *([str(programs)] if programs is not None and programs.is_dir() else [])],
            input=json.dumps(job), capture_output=True, text=True, timeout=timeout_s, env=env)
    except subprocess.TimeoutExpired:
        return {"status": "timeout", "message": f"no result after {timeout_s:g} s",
                "compile_seconds": timeout_s}
    result_file = work / "result.json"
    if done.returncode < 0:
        number = -done.returncode
        name = (signal.Signals(number).name if number in signal.valid_signals()
                else f"signal {number}")
        return {"status": "crash", "compile_seconds": 0.0,
                "message": f"compiler process killed by {name}: {done.stderr[-2000:]}"}
    if not result_file.exists():
        return {"status": "error", "compile_seconds": 0.0,
                "message": f"worker exited {done.returncode}: {done.stderr[-2000:]}"}
    return json.loads(result_file.read_text())


STALE_STAGING_S = 600.0
"""A staging folder this old belongs to a writer that was killed (a write takes seconds)."""


def write_entry(entry: Path, result: dict[str, Any], hlo: Path) -> None:
    """Write a cache entry atomically: build it beside the target, then rename it into place.

    Staging folders (``.<entry>-<random>``) that writers killed mid-write left anywhere in the
    cache are removed once they are :data:`STALE_STAGING_S` old; a younger one may be another
    process's live write.
    """
    entry.parent.mkdir(parents=True, exist_ok=True)
    for stale in entry.parent.glob(".*-*"):
        try:
            if time.time() - stale.stat().st_mtime > STALE_STAGING_S:
                shutil.rmtree(stale, ignore_errors=True)
        except OSError:  # removed by another process meanwhile
            pass
    staging = Path(tempfile.mkdtemp(prefix=f".{entry.name}-", dir=entry.parent))
    meta = {k: v for k, v in result.items() if k not in ("hlo_path", "hlo_sha256", "cached")}
    if hlo.is_file():
        try:  # another entry's text (the same program): shared, not copied
            os.link(hlo, staging / "hlo.txt")
        except OSError:
            shutil.copyfile(hlo, staging / "hlo.txt")
        meta["hlo_sha256"] = hashlib.sha256((staging / "hlo.txt").read_bytes()).hexdigest()
    (staging / "meta.json").write_text(json.dumps(meta))
    try:
        os.replace(staging, entry)
    except OSError:  # another process wrote the same entry first: keep theirs
        shutil.rmtree(staging, ignore_errors=True)


def read_entry(entry: Path) -> dict[str, Any] | None:
    """A cache entry's result, or ``None`` when absent or damaged (then it is removed).

    Entries are renamed into place whole, so a folder without ``meta.json`` is one another
    process is removing (or left half-removed): it is cleared so the entry can be written.
    """
    meta_file = entry / "meta.json"
    if not meta_file.exists():
        shutil.rmtree(entry, ignore_errors=True)
        return None
    try:
        meta = json.loads(meta_file.read_text())
        if not isinstance(meta, dict) or not kept(meta):
            raise ValueError(f"not a cached result: {str(meta)[:80]!r}")
        if meta["status"] == "ok" and not isinstance(meta.get("hlo_sha256"), str):
            raise ValueError("an ok result without its HLO checksum")
        meta["compile_seconds"] = float(meta.get("compile_seconds", 0.0))
        meta["memory"] = {str(k): float(v) for k, v in dict(meta.get("memory", {})).items()}
        if "hlo_sha256" in meta:
            text = (entry / "hlo.txt").read_bytes()
            if hashlib.sha256(text).hexdigest() != meta["hlo_sha256"]:
                raise ValueError("HLO checksum mismatch")
            meta["hlo_path"] = str(entry / "hlo.txt")
        return meta
    except (OSError, ValueError, KeyError, TypeError):
        shutil.rmtree(entry, ignore_errors=True)
        return None


def merge_cache(source: str | Path, target: str | Path) -> int:
    """Copy into the compile cache folder ``target`` the entries of ``source`` it lacks
    (whole, through :func:`write_entry`), its index of programs and its sweeps' memory
    records; returns how many entries. Entries are keyed by the whole job, so any cache's
    entry is valid in any other: a cold run's compiles in a temporary folder can be kept."""
    copied = 0
    for entry in Path(source).iterdir():
        if not (entry / "meta.json").exists() or (Path(target) / entry.name).exists():
            continue
        meta = read_entry(entry)
        if meta is not None:
            hlo = Path(meta.pop("hlo_path", entry / "hlo.txt"))
            meta.pop("hlo_sha256", None)
            write_entry(Path(target) / entry.name, meta, hlo)
            copied += 1
    with contextlib.suppress(OSError):  # no index: nothing to add
        for key in (Path(source) / PROGRAMS).iterdir():
            name = _indexed_name(key)  # the entry itself was checked or copied above
            if name and read_entry(Path(target) / name) is not None:
                write_atomically(Path(target) / PROGRAMS / key.name, name)
    with contextlib.suppress(OSError, ValueError, AttributeError):  # no record: nothing to add
        for sweep, peak in json.loads((Path(source) / HOST_MEMORY_FILE).read_text()).items():
            _record_host_peak(Path(target), sweep, [peak])
    return copied


def _result(candidate: Candidate, raw: dict[str, Any], model_layers: int,
            num_layers: int | None, flags: CompilerFlags) -> CompiledCandidate:
    program = None
    status, message = raw["status"], raw.get("message", "")
    hlo_path = Path(raw["hlo_path"]) if raw.get("hlo_path") else None
    if status == CompileStatus.OK and hlo_path is not None:
        # Parsing a 14B program takes ~0.2 s; a warm plan reads ~50 of them back instead.
        try:
            program = memoized(
                "program", (raw.get("hlo_sha256") or digest(hlo_path.read_bytes()),
                            candidate.num_devices, num_layers, model_layers),
                lambda: program_at_depth(hlo_path.read_text(), candidate.num_devices,
                                         num_layers, model_layers), code="aoizora_lab.hlo")
        except AoizoraError as err:  # e.g. a layer loop the compiler unrolled cannot fold
            status, message = "error", f"{candidate.name}: {err}"
    return CompiledCandidate(
        candidate=candidate, status=status, message=message,
        compile_seconds=float(raw.get("compile_seconds", 0.0)),
        memory=raw.get("memory", {}), program=program, hlo_path=hlo_path,
        compiled_layers=num_layers or model_layers, cached=bool(raw.get("cached", False)),
        flags=flags, host_peak_bytes=float(raw.get("host_peak_bytes", math.nan)),
        child_seconds=float(raw.get("child_seconds", math.nan)))
