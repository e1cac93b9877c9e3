"""Child process of :mod:`aoizora_lab.parts`: compile one of a generation's other programs
(the text encoder, the VAE decoder), write the result.

Run as ``python -m aoizora_lab.part_worker WORK_DIR [PROGRAMS_DIR]`` with the job as JSON on
stdin, through :func:`aoizora_lab.compile.run_job` (the job names this module as its
``worker``); what it writes, the program index and the hooks are
:mod:`aoizora_lab.compile_worker`'s, whose tail it shares. A separate module so that the DiT
step's compiles are not keyed by the other programs' code.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path


def main(work: Path, programs: Path | None = None) -> None:
    job = json.loads(sys.stdin.read())
    from aoizora_lab.compile_worker import compile_program, topology_of
    from aoizora_lab.parts import lower_part, part_from_spec

    topology = topology_of(job["topology"])
    part = part_from_spec(job["part"])
    devices = [topology.devices[i] for i in topology.device_grid().ravel()]
    compile_program(job, work, programs, part.name, lambda: lower_part(part, devices))


if __name__ == "__main__":
    main(Path(sys.argv[1]), Path(sys.argv[2]) if len(sys.argv) > 2 else None)
