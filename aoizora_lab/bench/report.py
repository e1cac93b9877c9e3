"""What the benchmarks share: a case's row, the Markdown tables, and the report file.

Every benchmark builds one row per case with :func:`case_row` (a case that fails is a row with
its status, never an exception that ends the run), formats its tables with
:func:`markdown_table` and marks its targets with :func:`met`. :class:`ReportFile` writes
``reports/benchmarks.md``: a header saying how and where it was made (:func:`environment`,
:func:`render_report`) and the sections finished so far. :func:`case_argument` is the
``--cases`` type of the scripts in ``benchmarks/``.
"""

from __future__ import annotations

import argparse
import datetime
import importlib.metadata
import math
import os
import platform
import re
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from aoizora_lab.cases import CASE_SPEC, Case, parse_case
from aoizora_lab.errors import AoizoraError
from aoizora_lab.topology import Topology
from aoizora_lab.versions import code_versions
from aoizora_lab.workload import Workload

# ----------------------------------------------------------------------------- cases


def case_label(case: Case | str) -> tuple[str, str]:
    """(workload, slice) of a case for a row, also when the spec does not parse."""
    if isinstance(case, Case):
        return case.workload.name, case.slice_name
    workload, _, slice_name = str(case).rpartition("/")
    return workload or str(case), slice_name


def error_status(err: BaseException) -> str:
    """The ``status`` of a row whose case failed: the error's type and first line."""
    return f"error: {type(err).__name__}: {str(err).splitlines()[0][:160] if str(err) else ''}"


def case_row(case: Case | str, measure: Callable[[Workload, Topology], dict[str, Any]],
             **fields: Any) -> dict[str, Any]:
    """A benchmark's row for ``case``: ``workload``, ``slice``, ``fields`` and what
    ``measure(workload, topology)`` returns, or ``status`` holding the error where the spec,
    the slice or the measurement failed (a case that fails is a row, not the end of the run).
    """
    workload_label, slice_label = case_label(case)
    row: dict[str, Any] = {"workload": workload_label, "slice": slice_label, **fields}
    try:
        case = parse_case(case)
        workload, topology = case.workload, case.topology()
        row["workload"], row["slice"] = workload.name, topology.name
        row |= measure(workload, topology)
    except Exception as err:
        row["status"] = error_status(err)
    return row


def case_argument(spec: str) -> Case:
    """:func:`~aoizora_lab.cases.parse_case` as an ``argparse`` type: the scripts in
    ``benchmarks/`` refuse a bad ``--cases`` spec with its message (argparse would print only
    "invalid value" for the library's error)."""
    try:
        return parse_case(spec)
    except AoizoraError as err:
        raise argparse.ArgumentTypeError(str(err)) from None


def add_cases_option(parser: argparse.ArgumentParser, default: Sequence[str],
                     about: str | None = None) -> None:
    """The scripts' ``--cases CASE ...`` (parsed by :func:`case_argument`), ``default`` when
    not given; ``about`` describes the default in the help (else it is listed)."""
    parser.add_argument("--cases", nargs="+", metavar="CASE", type=case_argument,
                        default=list(default),
                        help=f"case specs {CASE_SPEC} (default: {about or ', '.join(default)})")


def met(condition: Any) -> str:
    """A target's ``met`` cell: ``met`` or ``missed`` (``n/a`` is the caller's)."""
    return "met" if bool(condition) else "missed"


# ----------------------------------------------------------------------------- Markdown


def markdown_table(frame: pd.DataFrame, *, digits: int = 4) -> str:
    """``frame`` as a GitHub Markdown table: floats to ``digits`` significant digits, numbers
    right-aligned, NaN as ``–``, ``|`` escaped. (``DataFrame.to_markdown`` needs ``tabulate``,
    which is not a dependency.)"""
    if frame.empty and not len(frame.columns):
        return "_(no rows)_"

    def cell(value: Any) -> str:
        if value is None or (isinstance(value, float) and math.isnan(value)):
            return "–"
        if isinstance(value, bool | np.bool_):
            return "yes" if value else "no"
        if isinstance(value, float | np.floating):
            return f"{value:.{digits}g}"
        return str(value).replace("|", "\\|").replace("\n", " ")

    numeric = [pd.api.types.is_numeric_dtype(frame[c]) and not pd.api.types.is_bool_dtype(
        frame[c]) for c in frame.columns]
    lines = ["| " + " | ".join(str(c).replace("|", "\\|") for c in frame.columns) + " |",
             "|" + "|".join("---:" if n else "---" for n in numeric) + "|"]
    lines += ["| " + " | ".join(cell(v) for v in row) + " |"
              for row in frame.itertuples(index=False)]
    return "\n".join(lines)


def config_line(config: dict[str, Any]) -> str:
    """How a benchmark was run, as a sentence for its section (empty for no settings)."""
    return ("Run with " + ", ".join(f"{k} = {v}" for k, v in config.items()) + "."
            if config else "")


# ----------------------------------------------------------------------------- the report


def environment() -> dict[str, str]:
    """The machine (cores, CPU model, memory), the versions that matter (the benchmarks'
    code digest among them: :func:`~aoizora_lab.versions.code_versions`), and the date."""
    cpu = platform.processor() or platform.machine()
    memory = ""
    try:
        text = Path("/proc/cpuinfo").read_text()
        names = [line.split(":", 1)[1].strip() for line in text.splitlines()
                 if line.startswith("model name")]
        cpu = names[0] if names else cpu
        meminfo = Path("/proc/meminfo").read_text().split()
        memory = f"{int(meminfo[meminfo.index('MemTotal:') + 1]) / 2**20:.1f} GiB"
    except (OSError, ValueError, IndexError):
        pass
    info = {"date": datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC"),
            "machine": f"{os.cpu_count()} cores, {cpu}" + (f", {memory} RAM" if memory else ""),
            "python": platform.python_version()}
    for package in ("aoizora-lab", "jax", "jaxlib", "libtpu", "numpy"):
        try:
            info[package] = importlib.metadata.version(package)
        except importlib.metadata.PackageNotFoundError:
            info[package] = "absent"
    info["code"] = code_versions("aoizora_lab.bench")["code"]
    return info


def render_report(sections: Sequence[str], env: dict[str, str] | None = None, *,
                  command: str = "aoizora-lab bench") -> str:
    """The whole report: title, how it was made (command, machine, versions, date), sections."""
    env = env or environment()
    header = "\n".join([
        "# AoiZora Lab benchmarks",
        "",
        f"Generated by `{command}` on {env['date']}. Regenerate it with the same command; "
        "never edit by hand. A section regenerated on its own (`--only`, or its script in "
        "`benchmarks/`) says when.",
        "",
        *[f"- **{key}**: {value}" for key, value in env.items() if key != "date"],
    ])
    return "\n\n".join([header, *sections]) + "\n"


def section_title(section: str) -> str:
    """The ``## `` heading a section starts with."""
    first = section.lstrip().splitlines()[0] if section.strip() else ""
    if not first.startswith("## "):
        raise AoizoraError(f"A report section starts with a '## ' heading, not {first!r}.")
    return first


def _sections(text: str) -> list[str]:
    """The ``## `` sections of a report's text (its header dropped)."""
    parts = ("\n" + text).split("\n## ")[1:]
    return ["## " + part.strip("\n") for part in parts]


_STAMP = re.compile(r"^_Regenerated on (?P<date>[^_]+?) by `(?P<command>[^`]+)`"
                    r"(?: \(code `(?P<code>[\w.]+@\w+)`)?", re.M)
_STALE = "**Stale:** "


def stale_note(section: str) -> str | None:
    """Why a section regenerated on its own is stale: the code that made it (its stamp's
    ``module@digest``) is not today's (:func:`~aoizora_lab.versions.code_versions` of that
    module), or its stamp predates recording it; ``None`` where it is current or has no
    stamp."""
    stamp = _STAMP.search(section)
    if stamp is None:
        return None
    again = f"Regenerate it with `{stamp['command']}`."
    if stamp["code"] is None:
        return (f"{_STALE}made on {stamp['date']}, before sections recorded the code that "
                f"made them: its numbers may be other code's. {again}")
    module = stamp["code"].partition("@")[0]
    try:
        today = code_versions(module)["code"]
    except ValueError:  # a module no longer in the package
        today = "none"
    if today == stamp["code"]:
        return None
    return (f"{_STALE}made on {stamp['date']} by code `{stamp['code']}`, and today's is "
            f"`{today}`: its numbers may have changed. {again}")


class ReportFile:
    """The report at ``path``, rewritten after every section it is given, so that an
    interrupted run keeps the benchmarks that finished.

    With ``keep=True`` the sections already in the file stay, each replaced in place when a
    section of the same heading is added, so one benchmark can be regenerated on its own; a
    section added beside kept ones carries the date it was generated and the code that made
    it (the header's date is the last write's), and a kept section made by other code says
    so (:func:`stale_note`). The file is read again before each write, so two runs writing
    different sections of one report at the same time keep each other's.
    """

    def __init__(self, path: str | Path, *, command: str = "aoizora-lab bench",
                 keep: bool = False) -> None:
        self.path = Path(path)
        """Where the report is written (its folder is created)."""
        self.command = command
        """The command the header says regenerates it."""
        self.keep = keep
        """Whether sections found in the file stay (see the class docstring)."""
        self.sections: list[str] = (_sections(self.path.read_text())
                                    if keep and self.path.exists() else [])
        """The sections written so far, in order."""
        self._kept = bool(self.sections)
        self.path.parent.mkdir(parents=True, exist_ok=True)

    def add(self, section: str, *, module: str = "aoizora_lab.bench") -> None:
        """Add ``section`` (replacing one of the same heading) and write the report.
        ``module``: what made it, whose code key (:func:`~aoizora_lab.versions.code_versions`)
        stamps it; default the benchmarks package, every module they import. The key
        follows imports only: what a section runs otherwise (notebooks, scripts outside the
        package) does not stale it."""
        title = section_title(section)
        if self._kept:  # the header's date is not all of the report's: date the section
            env = environment()
            heading, _, body = section.strip("\n").partition("\n")
            section = (f"{heading}\n\n_Regenerated on {env['date']} by `{self.command}` "
                       f"(code `{code_versions(module)['code']}`, jax {env['jax']}, libtpu "
                       f"{env['libtpu']})._\n{body}")
        if self.keep and self.path.exists():
            self.sections = _sections(self.path.read_text())
        titles = [section_title(s) for s in self.sections]
        if title in titles:
            self.sections[titles.index(title)] = section
        else:
            self.sections.append(section)
        self.sections = [_marked(s) for s in self.sections]
        self.path.write_text(render_report(self.sections, command=self.command))


def _marked(section: str) -> str:
    """``section`` with its stale note now (:func:`stale_note`): added, mended or dropped."""
    lines = section.split("\n")
    for i in reversed([i for i, line in enumerate(lines) if line.startswith(_STALE)]):
        del lines[i - (lines[i - 1] == ""):i + 1]  # the note and the blank line it came with
    note = stale_note(section)
    if note is not None:
        stamp = next(i for i, line in enumerate(lines) if _STAMP.match(line))
        after = [""] if stamp + 1 < len(lines) and lines[stamp + 1] != "" else []
        lines[stamp + 1:stamp + 1] = ["", note, *after]
    return "\n".join(lines)
