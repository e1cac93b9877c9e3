"""Child process of :mod:`aoizora_lab.compile`: compile one candidate, write the result.

Run as ``python -m aoizora_lab.compile_worker WORK_DIR [PROGRAMS_DIR]`` with the job as JSON on
stdin. Writes ``WORK_DIR/hlo.txt`` and ``WORK_DIR/result.json``; if the compiler aborts the
process, nothing is written and the parent reads the signal from the exit status.

The lowered program is keyed before it compiles (:func:`program_key`): where ``PROGRAMS_DIR``
already names a compile of the same program, the worker answers ``same-program`` with its key
instead of compiling, so an edit of the code that leaves a program unchanged costs a lowering
(a second or two), not a compile.

``AOIZORA_LAB_ABORT_CANDIDATE=<name>`` makes the worker abort (SIGABRT) on that candidate, the
way some TPU compiles do, and ``AOIZORA_LAB_HANG_CANDIDATE=<name>`` makes it hang: the hooks
the crash-isolation tests use (a real abort and a real hang, whatever the machine's speed).
"""

from __future__ import annotations

import hashlib
import json
import os
import resource
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

SAME_PROGRAM = "same-program"
"""The worker's answer where the index already holds a compile of its program."""


def program_key(lowered_text: str, job: dict[str, Any]) -> str:
    """What the compiler is given, as a key: the lowered program's text (StableHLO without
    source locations, so it names no line of this package), the compiler options, the slice
    and the library versions; two jobs with one key compile to the same result, whichever
    code lowered them."""
    from aoizora_lab.versions import digest

    return digest(json.dumps({
        "lowered": hashlib.sha256(lowered_text.encode()).hexdigest(),
        "compiler_options": job.get("compiler_options") or {},
        "topology": job["topology"],
        "libraries": {k: v for k, v in job["versions"].items() if k != "code"},
    }, sort_keys=True))


def topology_of(spec: dict[str, Any]) -> Any:
    """The :class:`~aoizora_lab.topology.Topology` a job's ``topology`` entry describes
    (``compile.topology_spec``), with this process's devices."""
    import jax

    from aoizora_lab.topology import DeviceSource, Topology

    if spec["source"] == DeviceSource.DEVICELESS:
        return Topology.from_name(spec["name"], deviceless=True)
    if spec["source"] == DeviceSource.HOST:
        return Topology.simulated(spec["shape"], generation=spec["generation"],
                                  wrap=spec["wrap"], devices=jax.devices()[:spec["num_devices"]])
    return Topology.from_devices(jax.devices())


def compile_program(job: dict[str, Any], work: Path, programs: Path | None, name: str,
                    lower: Callable[[], Any]) -> None:
    """Lower (``lower()``, a ``jax.stages.Lowered``) and compile one program, writing
    ``WORK_DIR/result.json`` and ``hlo.txt``: the tail every worker shares. ``name`` is what
    the abort and hang hooks match. An error of the lowering or the compiler is the
    program's result (``error``, or ``oom`` where the compiler ran out of memory)."""
    start = time.perf_counter()
    result: dict = {"status": "ok", "message": ""}
    try:
        lowered = lower()
        result["program_key"] = program_key(lowered.as_text(), job)
        if programs is not None and (programs / result["program_key"]).exists():
            (work / "result.json").write_text(json.dumps(
                {"status": SAME_PROGRAM, "program_key": result["program_key"]}))
            return
        if os.environ.get("AOIZORA_LAB_ABORT_CANDIDATE") == name:
            os.abort()
        while os.environ.get("AOIZORA_LAB_HANG_CANDIDATE") == name:
            time.sleep(60)
        compiled = lowered.compile(compiler_options=job.get("compiler_options") or None)
        memory = compiled.memory_analysis()
        result["memory"] = {
            "argument": float(memory.argument_size_in_bytes),
            "output": float(memory.output_size_in_bytes),
            "temp": float(memory.temp_size_in_bytes),
            "peak": float(getattr(memory, "peak_memory_in_bytes", 0) or 0)}
        (work / "hlo.txt").write_text(compiled.as_text())
    except Exception as err:  # the compiler's verdict on this program, not the sweep's end
        text = f"{type(err).__name__}: {err}"
        result = {**result, "status": "oom" if "RESOURCE_EXHAUSTED" in text else "error",
                  "message": text[-4000:]}
    result["compile_seconds"] = time.perf_counter() - start
    # Peak resident memory of this process (Linux reports KiB): what one compile needs here.
    result["host_peak_bytes"] = float(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss) * 1024
    (work / "result.json").write_text(json.dumps(result))


def main(work: Path, programs: Path | None = None) -> None:
    job = json.loads(sys.stdin.read())
    # Submodules by name: the compile cache's key digests what this module imports.
    from aoizora_lab.candidates import Candidate
    from aoizora_lab.models.wan import WanConfig
    from aoizora_lab.workload import Workload, lower_step

    topology = topology_of(job["topology"])
    workload = Workload(model=WanConfig(**job["model"]), **job["workload"])
    candidate = Candidate.from_name(job["candidate"], attention=job["attention"])
    devices = [topology.devices[i] for i in topology.device_grid().ravel()]
    compile_program(job, work, programs, candidate.name, lambda: lower_step(
        workload, candidate.plan(devices), num_layers=job["num_layers"]))


if __name__ == "__main__":
    main(Path(sys.argv[1]), Path(sys.argv[2]) if len(sys.argv) > 2 else None)
