"""Independent calls run side by side in child processes, one per usable CPU that memory allows.

:func:`run_in_workers` is ``[function(*args) for args in calls]`` with the calls dealt out
round-robin to up to :func:`default_workers` children (``python -m aoizora_lab.workers``; the
function, its arguments and its results travel pickled over the pipes).

:func:`warm_in_workers` runs calls for what they store in a cache, so that a serial pass
after it only reads: the planner uses it for the IR traces not cached yet and for the
placement searches of its compiled programs. Example, 33 programs of 1.3B@480p on
``v5e:2x4`` on two CPUs: two children place 17 and 16, each paying ~1.5 s to start (Python,
jax and the package imported).

**Memory**: each child reports its peak resident memory, and the largest seen for a function
is kept in ``.worker_memory.json`` of the cache root; the next pool for that function has only
as many children as that peak fits into the free memory (:func:`fitting_workers`, the policy
the compiles share). Example: 8 CPUs, 6 GiB free, placement searches that peaked at 2.5 GiB
a child: two children, not eight. Never measured: one per CPU.

Children started with ``python -m`` rather than :mod:`multiprocessing`: ``spawn`` imports the
caller's main script again in every child (a user's script without an
``if __name__ == "__main__"`` guard would plan again there) and ``fork`` copies JAX's threads,
which JAX warns can deadlock. A call that raises raises here, as the serial loop would; a child
that dies (killed, out of memory) raises :class:`AoizoraError` naming its exit status.
"""

from __future__ import annotations

import json
import math
import os
import pickle
import resource
import subprocess
import sys
import threading
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from aoizora_lab.errors import AoizoraError
from aoizora_lab.progress import note
from aoizora_lab.versions import cache_root, write_atomically

MEMORY_FILE = ".worker_memory.json"
"""In the cache root (a dot file): the largest resident memory one worker child of each
function (``module.qualname``) has taken on this machine, which sizes the next pool."""


def usable_cpus() -> int:
    """CPUs this process may run on (``taskset`` / a container's CPU set), not the machine's."""
    try:
        return len(os.sched_getaffinity(0)) or 1
    except AttributeError:  # no affinity call on this platform
        return os.cpu_count() or 1


def available_memory() -> float:
    """Free memory (``MemAvailable``), NaN where the system does not say."""
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return float(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return math.nan


def fitting_workers(peak_bytes: float, available_bytes: float, cpus: int) -> int:
    """Processes of up to ``peak_bytes`` each (NaN: never measured) that run side by side in
    ``available_bytes`` (NaN: unknown): one per CPU, fewer where their memory would not fit,
    0 when not even one fits (the caller says what then).

    Example: 2 CPUs, 20 GiB free, 12 GiB each: 1.
    """
    if not peak_bytes > 0 or not available_bytes > 0:
        return cpus
    return min(cpus, int(available_bytes // peak_bytes))


def default_workers(function: Callable[..., Any]) -> int:
    """Worker processes for ``function``: :func:`fitting_workers` with the largest peak its
    children have taken here (see the module's note), at least one."""
    return max(1, fitting_workers(seen_peak(cache_root() / MEMORY_FILE, _name(function)),
                                  available_memory(),
                                  usable_cpus()))


def run_in_workers(function: Callable[..., Any], calls: Sequence[tuple[Any, ...]], *,
                   workers: int | None = None) -> list[Any]:
    """``[function(*args) for args in calls]``, in up to ``workers`` (default
    :func:`default_workers`) child processes; in this process when one worker or one call
    would do.

    ``function`` must be importable by name (a module-level function of the package) and its
    arguments and results picklable. An interrupt here kills the children.
    """
    workers = min(workers or default_workers(function), len(calls))
    if workers <= 1:
        return [function(*args) for args in calls]
    shares = [list(range(i, len(calls), workers)) for i in range(workers)]
    payloads = [pickle.dumps((function, [calls[i] for i in share])) for share in shares]
    children = [subprocess.Popen([sys.executable, "-m", "aoizora_lab.workers"],
                                 stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                 stderr=subprocess.PIPE) for _ in shares]
    outputs: list[tuple[bytes, bytes]] = [(b"", b"")] * workers

    def talk(i: int) -> None:  # one thread per child, so no pipe fills while another waits
        outputs[i] = children[i].communicate(payloads[i])

    try:
        threads = [threading.Thread(target=talk, args=(i,)) for i in range(workers)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
    finally:
        for child in children:
            if child.poll() is None:
                child.kill()
    results: list[Any] = [None] * len(calls)
    peaks = []
    for share, child, (stdout, stderr) in zip(shares, children, outputs, strict=True):
        if child.wait() != 0:
            raise AoizoraError(
                f"A worker process running {function.__qualname__} on {len(share)} calls ended "
                f"with exit status {child.returncode}: {stderr.decode(errors='replace')[-600:]}"
                " (a negative status is the signal that killed it: -9, out of memory).")
        out, peak = pickle.loads(stdout)
        peaks.append(peak)
        for i, (ok, value) in zip(share, out, strict=True):
            if not ok:
                raise value
            results[i] = value
    record_peak(cache_root() / MEMORY_FILE, _name(function), max(peaks))
    return results


def warm_in_workers(function: Callable[..., Any], calls: Sequence[tuple[Any, ...]], *,
                    what: str) -> None:
    """Run ``calls`` in worker processes for what ``function`` stores (a cache), when more
    than one call and one CPU make that worth it. Whatever fails there is said in a progress
    line and left to the caller's own pass, which redoes it and reports it as it always has."""
    workers = min(default_workers(function), len(calls))
    if workers <= 1:
        return
    note(f"{what}: {len(calls)} in {workers} processes")
    try:
        run_in_workers(function, calls, workers=workers)
    except Exception as err:  # the caller's serial pass redoes it, with its own errors
        note(f"{what}: the worker processes failed ({type(err).__name__}: "
             f"{str(err)[:300]}); finishing in this process")


def _name(function: Callable[..., Any]) -> str:
    return f"{function.__module__}.{function.__qualname__}"


def seen_peak(path: Path, key: str) -> float:
    """The largest peak memory recorded for ``key`` in the JSON record ``path`` (NaN: none)."""
    try:
        return float(json.loads(path.read_text()).get(key, math.nan))
    except (OSError, ValueError, TypeError, AttributeError):
        return math.nan


def record_peak(path: Path, key: str, peak_bytes: float) -> None:
    """Keep ``peak_bytes`` for ``key`` in the JSON record ``path`` when it is the largest yet
    (this pool's children and the compiles' sweeps use one format)."""
    try:
        record = json.loads(path.read_text()) if path.exists() else {}
        record[key] = max(float(record.get(key, 0.0)), float(peak_bytes))
        path.parent.mkdir(parents=True, exist_ok=True)
        write_atomically(path, json.dumps(record, indent=1, sort_keys=True))
    except (OSError, ValueError, TypeError, AttributeError):
        pass  # a record that cannot be kept only means the next pool is not sized by it


def _main() -> None:
    """In a child: run the pickled calls from stdin, write their ``(ok, result or exception)``
    pairs and this process's peak resident memory to stdout. Whatever the calls print goes to
    stderr, so the results stay whole."""
    results = os.fdopen(os.dup(1), "wb")
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    function, calls = pickle.loads(sys.stdin.buffer.read())
    out = []
    for args in calls:
        try:
            out.append((True, function(*args)))
        except Exception as err:  # raised again in the parent, in call order
            out.append((False, err))
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # Linux: KiB
    results.write(pickle.dumps((out, peak)))
    results.close()


if __name__ == "__main__":
    _main()
