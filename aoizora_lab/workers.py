"""Independent calls run side by side in child processes, one per usable CPU.

:func:`run_in_workers` is ``[function(*args) for args in calls]`` with the calls dealt out
round-robin to up to :func:`usable_cpus` children (``python -m aoizora_lab.workers``; the
function, its arguments and its results travel pickled over the pipes). The planner uses it
for what is independent and costly once its compiles are done: placement searches, one per
compiled program. Example, 33 programs of 1.3B@480p on ``v5e:2x4`` on two CPUs: two children
place 17 and 16, each paying ~1.5 s to start (Python, jax and the package imported).

Children started with ``python -m`` rather than :mod:`multiprocessing`: ``spawn`` imports the
caller's main script again in every child (a user's script without an
``if __name__ == "__main__"`` guard would plan again there) and ``fork`` copies JAX's threads,
which JAX warns can deadlock. A call that raises raises here, as the serial loop would; a child
that dies (killed, out of memory) raises :class:`AoizoraError` naming its exit status.
"""

from __future__ import annotations

import os
import pickle
import subprocess
import sys
import threading
from collections.abc import Callable, Sequence
from typing import Any

from aoizora_lab.errors import AoizoraError


def usable_cpus() -> int:
    """CPUs this process may run on (``taskset`` / a container's CPU set), not the machine's."""
    try:
        return len(os.sched_getaffinity(0)) or 1
    except AttributeError:  # no affinity call on this platform
        return os.cpu_count() or 1


def run_in_workers(function: Callable[..., Any], calls: Sequence[tuple[Any, ...]], *,
                   workers: int | None = None) -> list[Any]:
    """``[function(*args) for args in calls]``, in up to ``workers`` (default
    :func:`usable_cpus`) child processes; in this process when one worker or one call would do.

    ``function`` must be importable by name (a module-level function of the package) and its
    arguments and results picklable.
    """
    workers = min(workers or usable_cpus(), len(calls))
    if workers <= 1:
        return [function(*args) for args in calls]
    shares = [list(range(i, len(calls), workers)) for i in range(workers)]
    outcomes: list[Any] = [None] * workers

    def run(share: int) -> None:
        payload = pickle.dumps((function, [calls[i] for i in shares[share]]))
        done = subprocess.run([sys.executable, "-m", "aoizora_lab.workers"], input=payload,
                              capture_output=True, check=False)
        outcomes[share] = (done.returncode, done.stdout, done.stderr)

    threads = [threading.Thread(target=run, args=(i,)) for i in range(workers)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    results: list[Any] = [None] * len(calls)
    for share, (returncode, stdout, stderr) in zip(shares, outcomes, strict=True):
        if returncode != 0:
            raise AoizoraError(
                f"A worker process running {function.__qualname__} on {len(share)} calls ended "
                f"with exit status {returncode}: {stderr.decode(errors='replace')[-600:]}. "
                "A negative status is the signal that killed it (-9: out of memory).")
        for i, (ok, value) in zip(share, pickle.loads(stdout), strict=True):
            if not ok:
                raise value
            results[i] = value
    return results


def _main() -> None:
    """In a child: run the pickled calls from stdin, write ``(ok, result or exception)``
    pairs to stdout. Progress lines go to stderr, which the parent passes on."""
    function, calls = pickle.loads(sys.stdin.buffer.read())
    out = []
    for args in calls:
        try:
            out.append((True, function(*args)))
        except Exception as err:  # raised again in the parent, in call order
            out.append((False, err))
    sys.stdout.buffer.write(pickle.dumps(out))


if __name__ == "__main__":
    _main()
