"""A case: one workload on one slice, written one way everywhere.

``MODEL@WIDTHxHEIGHT[xFRAMES][-nocfg][-textN][-swap]/SLICE``, e.g.
``wan2.1-t2v-14b@1280x720x81/v5e:4x4``: the workload spec of :meth:`Workload.parse` (a named
size such as ``720p`` is accepted for ``WIDTHxHEIGHT``), a slash, and a slice name of
:meth:`Topology.from_name`. The command line (``aoizora-lab plan CASE``), the benchmark
matrices and the report matrix (``case:`` in ``data/reports.yaml``) all take this form;
:func:`parse_case` is the one parser and :attr:`Case.name` writes it back.
"""

from __future__ import annotations

from dataclasses import dataclass

from aoizora_lab.errors import AoizoraError
from aoizora_lab.topology import Topology, parse_slice_name
from aoizora_lab.workload import Workload

CASE_SPEC = "MODEL@WIDTHxHEIGHT[xFRAMES][-nocfg][-textN][-swap]/SLICE"
"""The grammar of a case spec, for help texts and errors."""


@dataclass(frozen=True)
class Case:
    """A workload and the name of the slice it runs on."""

    workload: Workload
    """What one denoising step computes."""
    slice_name: str
    """The slice, e.g. ``v5e:4x4`` (checked; :meth:`topology` builds it)."""

    @property
    def name(self) -> str:
        """The case spec; ``parse_case(case.name) == case``."""
        return f"{self.workload.name}/{self.slice_name}"

    def topology(self) -> Topology:
        """The slice (libtpu's deviceless devices where offered)."""
        return Topology.from_name(self.slice_name)


def parse_case(spec: str | Case) -> Case:
    """``"wan2.1-t2v-14b@1280x720x81/v5e:4x4"`` -> :class:`Case` (a Case passes through)."""
    if isinstance(spec, Case):
        return spec
    workload, sep, slice_name = str(spec).strip().rpartition("/")
    if not sep or not workload:
        raise AoizoraError(
            f"Case {spec!r} must be WORKLOAD/SLICE, e.g. 'wan2.1-t2v-14b@1280x720x81/v5e:4x4' "
            f"({CASE_SPEC}; SLICE: GENERATION:SHAPE).")
    try:
        generation, shape = parse_slice_name(slice_name)
        return Case(Workload.parse(workload),
                    f"{generation}:{'x'.join(map(str, shape))}")
    except AoizoraError as err:
        raise AoizoraError(f"Case {spec!r}: {err}") from None
