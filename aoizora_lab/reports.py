"""Regenerate ``reports/``: run the parameterised notebooks headless and publish them as HTML.

A *report* is one parameter set (a case: workload and slice) run through the notebooks. The
matrix of reports lives in ``data/reports.yaml``::

    reports:
      - name: wan-1.3b-480p-v5e-2x4
        parameters: {case: "wan2.1-t2v-1.3b@832x480x81/v5e:2x4"}

``run_reports(load_matrix(), "notebooks", "reports")`` executes every notebook of every report
with papermill and writes, e.g. for ``01_candidates``::

    reports/wan-1.3b-480p-v5e-2x4/01_candidates.ipynb   executed notebook (kept when it fails)
    reports/wan-1.3b-480p-v5e-2x4/01_candidates.html    prose and outputs, no code
    reports/assets/plotly.min.js                        one copy shared by every page

and :func:`write_index` adds ``reports/index.html``: every notebook run with its status, wall
time and the values the notebook recorded. A notebook that fails is a row with its error and a
link to the partial notebook; the other notebooks still run.

What a notebook must do (a ``parameters`` cell, figures through ``show``, headline values
through ``record``) is the contract in :mod:`aoizora_lab.notebook`. How the runner treats it:

- **Kernel and folder**: notebooks run in an ipykernel of the interpreter that calls
  :func:`run_reports` (whatever kernelspec the notebook names), with the notebook's folder as
  the working directory. Pass ``kernel_name`` to use an installed kernelspec instead.
- **Offline pages**: no page loads anything from the network (no require.js, MathJax, mermaid
  or widget manager from a CDN), so they open from ``file://``. Markdown math stays as typed
  (``$...$``) and ipywidgets show their text form: use plain text and static figures.
"""

from __future__ import annotations

import copy
import datetime
import functools
import html
import json
import keyword
import math
import os
import re
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from types import MappingProxyType
from typing import TYPE_CHECKING, Any, Literal

from aoizora_lab.errors import AoizoraError
from aoizora_lab.notebook import RECORD_MIMETYPE, check_library_parameters
from aoizora_lab.progress import MARKER as PROGRESS_MARKER
from aoizora_lab.progress import PROGRESS_ENV, duration
from aoizora_lab.versions import environment_variable

if TYPE_CHECKING:
    import nbformat
    import pandas as pd

DEFAULT_MATRIX = Path("data/reports.yaml")
PLOTLY_ASSET = "assets/plotly.min.js"
"""Where the shared plotly.js goes, relative to the output folder (pages sit one level down)."""
NOTEBOOK_CSS_ASSET = "assets/notebook.css"
"""Where nbconvert's notebook style sheet goes: shared, so each page holds only its content."""

Status = Literal["ok", "failed"]

_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")  # it names a folder or a file
_NUMBERED_NOTEBOOK = re.compile(r"\d\d_.+\.ipynb")
_MATRIX_KEYS = ("notebooks", "reports")
_REPORT_KEYS = ("name", "notebooks", "parameters", "default")
_PAPERMILL_TAGS = frozenset({"parameters", "injected-parameters"})

# The lab template without its network scripts (require.js, MathJax, mermaid, the widget
# manager) and with the shared plotly.js first in <head>, before any figure's inline script.
# Without require.js, plotly.js defines the global ``Plotly`` the figure scripts call.
_PAGE_TEMPLATE = """\
{%- extends 'index.html.j2' -%}
{%- block html_head_js -%}
<script src="{{ resources.plotly_js_url }}"></script>
{%- endblock html_head_js -%}
{%- block jupyter_widgets -%}{%- endblock jupyter_widgets -%}
{%- block html_head_js_mathjax -%}{%- endblock html_head_js_mathjax -%}
{%- block html_head_js_mermaidjs -%}{%- endblock html_head_js_mermaidjs -%}
{%- block notebook_css -%}
<link rel="stylesheet" href="{{ resources.notebook_css_url }}">
{%- endblock notebook_css -%}
"""

# Renders only the lab template's notebook style sheet (the <style> blocks pages link to).
_CSS_TEMPLATE = """\
{%- extends 'index.html.j2' -%}
{%- block header -%}{{ self.notebook_css() }}{%- endblock header -%}
{%- block body_header -%}{%- endblock body_header -%}
{%- block body_footer -%}{%- endblock body_footer -%}
{%- block footer -%}{%- endblock footer -%}
"""


@dataclass(frozen=True)
class ReportSpec:
    """One report: ``parameters`` run through ``notebooks``, published under ``<out>/<name>/``.

    ``ReportSpec("wan-14b-720p-v5e-4x4", parameters={"case":
    "wan2.1-t2v-14b@1280x720x81/v5e:4x4"})`` runs every numbered notebook (``01_candidates``
    …) for the 14B model at 720p on a 4x4 v5e slice.
    """

    name: str
    """Folder of the report's pages, e.g. ``wan-14b-720p-v5e-4x4`` (letters, digits, ``._-``)."""
    notebooks: tuple[str, ...] = ()
    """Notebook names (``01_candidates``, ``.ipynb`` optional) run in this order; empty: every
    ``NN_*.ipynb`` of the notebooks folder, in name order."""
    parameters: Mapping[str, Any] = field(default_factory=dict, hash=False)
    """Values injected after each notebook's ``parameters`` cell. JSON-like: tuples become
    lists; ``case`` (a case spec, :func:`aoizora_lab.cases.parse_case`) is checked as the
    library would check it."""
    default: bool = True
    """Run by a plain ``aoizora-lab reports`` (the main job); ``False``: only with ``--all`` or
    ``--only <name>`` (a large slice or a 14B model, whose cold compiles take many minutes)."""

    def __post_init__(self) -> None:
        if isinstance(self.notebooks, str):
            raise AoizoraError(
                f"ReportSpec.notebooks={self.notebooks!r} must be a list of notebook names, "
                f"e.g. [{self.notebooks!r}].")
        if not isinstance(self.notebooks, list | tuple):
            raise AoizoraError(
                f"ReportSpec.notebooks={self.notebooks!r} must be a list of notebook names, "
                "e.g. ['01_candidates'] (empty: every numbered notebook).")
        if not isinstance(self.default, bool):
            raise AoizoraError(
                f"ReportSpec.default={self.default!r} must be true or false (false: run only "
                "with --all or --only).")
        object.__setattr__(self, "notebooks", tuple(
            n.removesuffix(".ipynb") if isinstance(n, str) else n for n in self.notebooks))
        if not isinstance(self.parameters, Mapping):
            raise AoizoraError(
                f"ReportSpec.parameters={self.parameters!r} must be a mapping of name -> value, "
                "e.g. {'case': 'wan2.1-t2v-1.3b@832x480x81/v5e:2x4', 'layers': 2}.")
        plain = {key: _plain(value, f"parameter {key!r}")
                 for key, value in self.parameters.items()}
        object.__setattr__(self, "parameters", MappingProxyType(plain))
        self.validate()

    def validate(self) -> None:
        """Raise :class:`AoizoraError` naming the report and any name or value it cannot take."""
        if not isinstance(self.name, str) or not _NAME.fullmatch(self.name):
            raise AoizoraError(
                f"Report name {self.name!r} must be letters, digits, '.', '_' or '-' (it names "
                "a folder), e.g. 'wan-14b-720p-v5e-4x4'.")
        for notebook in self.notebooks:
            if not isinstance(notebook, str) or not _NAME.fullmatch(notebook):
                raise AoizoraError(
                    f"report {self.name!r}: notebook {notebook!r} must be a file name in the "
                    "notebooks folder, e.g. '01_candidates'.")
        if len(set(self.notebooks)) < len(self.notebooks):
            raise AoizoraError(
                f"report {self.name!r}: notebooks {list(self.notebooks)} name one twice; each "
                "notebook's page is reports/<report>/<notebook>.html, so list it once.")
        for key in self.parameters:
            if not isinstance(key, str) or not key.isidentifier() or keyword.iskeyword(key):
                raise AoizoraError(
                    f"report {self.name!r}: parameter name {key!r} is not a Python variable "
                    "name; papermill assigns each parameter to a variable, e.g. 'case'.")
        try:
            check_library_parameters(self.parameters)
        except AoizoraError as err:
            raise AoizoraError(f"report {self.name!r}: {err}") from None


def _plain(value: Any, where: str) -> Any:
    """``value`` as papermill can inject it: JSON-like, tuples turned into lists."""
    if isinstance(value, float) and not math.isfinite(value):
        raise AoizoraError(
            f"{where}: {value!r} cannot be injected into a notebook (papermill writes it as a "
            "bare name); use a finite number, or None for a missing one.")
    if value is None or isinstance(value, str | bool | int | float):
        return value
    if isinstance(value, list | tuple):
        return [_plain(v, where) for v in value]
    if isinstance(value, Mapping) and all(isinstance(k, str) for k in value):
        return {k: _plain(v, where) for k, v in value.items()}
    raise AoizoraError(
        f"{where}: {value!r} ({type(value).__name__}) cannot be injected into a notebook; use "
        "strings, numbers, booleans, None, lists and mappings with string keys.")


def load_matrix(path: str | Path = DEFAULT_MATRIX) -> list[ReportSpec]:
    """The reports of the YAML matrix at ``path``, validated.

    The file holds ``reports``, a list of ``{name, parameters, notebooks}`` (``notebooks``
    optional), and optionally a top-level ``notebooks`` list used by reports without their own;
    with neither, a report runs every ``NN_*.ipynb`` of the notebooks folder. Unknown keys,
    duplicate names and bad values raise :class:`AoizoraError` naming the file and the entry.
    """
    import yaml

    path = Path(path)
    try:
        document = yaml.safe_load(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise AoizoraError(
            f"Report matrix {str(path)!r} does not exist; point to a YAML file like "
            f"{str(DEFAULT_MATRIX)!r}.") from None
    except (OSError, UnicodeDecodeError) as err:
        raise AoizoraError(
            f"Report matrix {str(path)!r} is not a readable UTF-8 text file ({err}); point to "
            f"a YAML file like {str(DEFAULT_MATRIX)!r}.") from None
    except yaml.YAMLError as err:
        raise AoizoraError(f"{path}: not valid YAML: {err}") from None
    if not isinstance(document, dict):
        raise AoizoraError(f"{path}: must be a mapping with a 'reports' list, got {document!r}.")
    _check_keys(document, _MATRIX_KEYS, str(path))
    reports = document.get("reports")
    if not isinstance(reports, list) or not reports:
        raise AoizoraError(
            f"{path}: 'reports' must be a non-empty list of {{name, parameters}} entries, got "
            f"{reports!r}.")
    default_notebooks = document.get("notebooks", [])
    specs: list[ReportSpec] = []
    for i, entry in enumerate(reports):
        where = f"{path}: reports[{i}]"
        if not isinstance(entry, dict) or "name" not in entry:
            raise AoizoraError(
                f"{where} must be a mapping with a 'name' and 'parameters', got {entry!r}.")
        _check_keys(entry, _REPORT_KEYS, where)
        notebooks = entry.get("notebooks", default_notebooks)
        if not isinstance(notebooks, list):
            raise AoizoraError(f"{where}: notebooks={notebooks!r} must be a list of names.")
        try:
            parameters = entry.get("parameters")
            specs.append(ReportSpec(name=entry["name"], notebooks=tuple(notebooks),
                                    parameters={} if parameters is None else parameters,
                                    default=entry.get("default", True)))
        except AoizoraError as err:
            raise AoizoraError(f"{where}: {err}") from None
    names = [spec.name for spec in specs]
    duplicates = sorted({name for name in names if names.count(name) > 1})
    if duplicates:
        raise AoizoraError(f"{path}: report names must be unique; repeated: {duplicates}.")
    return specs


def _check_keys(mapping: Mapping[str, Any], accepted: Sequence[str], where: str) -> None:
    unknown = sorted(map(str, set(mapping) - set(accepted)))
    if unknown:
        raise AoizoraError(
            f"{where}: unknown key(s) {unknown}; accepted keys are {list(accepted)}.")


def select_reports(specs: Sequence[ReportSpec], names: Sequence[str] | None, *,
                   everything: bool = False) -> list[ReportSpec]:
    """The reports named in ``names`` (in matrix order, default or not); without names the
    default ones (:attr:`ReportSpec.default`), or all of them with ``everything``."""
    if not names:
        return [spec for spec in specs if spec.default or everything]
    known = [spec.name for spec in specs]
    unknown = [name for name in names if name not in known]
    if unknown:
        raise AoizoraError(f"Unknown report(s) {unknown}; the matrix has {known}.")
    return [spec for spec in specs if spec.name in names]


@dataclass(frozen=True)
class NotebookRun:
    """One notebook of one report, executed: where it went, how it ended, what it recorded."""

    report: str
    """The report's name (its folder under the output folder)."""
    notebook: str
    """The notebook's name, e.g. ``01_candidates``."""
    parameters: Mapping[str, Any] = field(hash=False)
    """The parameters papermill injected."""
    status: Status
    """``ok``, or ``failed`` when the notebook raised, its kernel died or its page failed."""
    seconds: float
    """Wall time of the execution (kernel start included, HTML export not)."""
    executed: Path | None
    """The executed notebook, partial when it failed; None when papermill wrote nothing."""
    page: Path | None
    """The HTML page; None when it could not be written."""
    records: Mapping[str, Any] = field(hash=False)
    """The values the notebook :func:`~aoizora_lab.notebook.record`-ed, by name (also from a
    partial run)."""
    error: str | None = None
    """``ExceptionType: message`` of the failure, None when ok."""
    cold_cache: bool | None = None
    """Whether the compile cache held no compile when it started (its time is then a cold
    run's); ``None`` for runs recorded before this was."""


@dataclass(frozen=True)
class ReportsResult:
    """Every notebook run of :func:`run_reports`, in execution order."""

    runs: tuple[NotebookRun, ...]

    @property
    def failed(self) -> int:
        """How many notebook runs failed (the CLI's exit status, capped at 125)."""
        return sum(run.status == "failed" for run in self.runs)

    def to_frame(self) -> pd.DataFrame:
        """One row per run: report, notebook, status, seconds, the error's first line."""
        import pandas as pd

        return pd.DataFrame(
            [{"report": run.report, "notebook": run.notebook, "status": run.status,
              "seconds": round(run.seconds, 1), "error": _first_line(run.error)}
             for run in self.runs],
            columns=["report", "notebook", "status", "seconds", "error"])


def run_reports(specs: Sequence[ReportSpec], notebooks_dir: str | Path, out_dir: str | Path, *,
                kernel_name: str | None = None, progress: bool = True) -> ReportsResult:
    """Execute every notebook of every report into ``out_dir`` and publish it as HTML.

    Missing notebooks and parameters no notebook declares raise :class:`AoizoraError` before
    anything runs. A notebook that raises is recorded as ``failed`` with its error; its partial
    notebook and page (traceback included) are kept, and the remaining notebooks still run.

    ``kernel_name=None`` runs ipykernel in this interpreter, so a fresh virtual environment
    works even when the notebook's or the system's ``python3`` kernelspec points elsewhere;
    a name selects an installed kernelspec (``jupyter kernelspec list``). ``progress`` writes
    a line per notebook to ``stderr`` (which, how long it took last time, time left) and the
    kernels' progress lines (each compile, each plan stage) as they come.
    """
    # Absolute: papermill changes into the notebook's folder (``cwd``) while the kernel runs.
    notebooks_dir, out_dir = Path(notebooks_dir).absolute(), Path(out_dir).absolute()
    plan = []
    for spec in specs:
        declared = {path: _declared_parameters(path)
                    for path in _resolve_notebooks(spec, notebooks_dir)}
        unknown = sorted(set(spec.parameters).difference(*declared.values()))
        if unknown:
            raise AoizoraError(
                f"report {spec.name!r}: parameter(s) {unknown} appear in no 'parameters' cell "
                f"of {[p.stem for p in declared]} (declared there: "
                f"{sorted(set().union(*declared.values()))}); fix the name in the matrix or "
                "give the parameter a default in a notebook's parameters cell.")
        plan.append((spec, declared))
    _write_assets(out_dir)
    jobs = [(spec, path, names) for spec, declared in plan for path, names in declared.items()]
    earlier = _earlier_seconds(out_dir)
    say = _Progress(len(jobs), earlier, enabled=progress)
    cold = compile_cache_is_cold()
    runs: list[NotebookRun] = []
    # The kernels inherit this setting: their compiles and plan stages write progress lines,
    # which the runner forwards to this terminal and leaves out of the pages.
    with environment_variable(PROGRESS_ENV, "1" if progress else "0"):
        for i, (spec, path, names) in enumerate(jobs):
            folder = out_dir / spec.name
            folder.mkdir(parents=True, exist_ok=True)
            parameters = {k: v for k, v in spec.parameters.items() if k in names}
            say.start(i, spec.name, path.stem, [(s.name, p.stem) for s, p, _ in jobs[i:]],
                      cold=cold)
            run = _run_notebook(spec.name, path, parameters, folder, kernel_name=kernel_name,
                                stderr=say if progress else None, cold_cache=cold)
            cold = cold and compile_cache_is_cold()
            say.finish(run)
            runs.append(run)
    return ReportsResult(runs=tuple(runs))


def compile_cache_is_cold() -> bool:
    """Whether the default compile cache holds no compile yet (a fresh machine's first run)."""
    from aoizora_lab.compile import default_cache_dir

    try:
        return not any(not p.name.startswith(".") for p in default_cache_dir().iterdir())
    except OSError:  # no cache folder yet
        return True


class _Progress:
    """The runner's progress lines: which notebook of which report, how long it took last
    time, roughly how long is left (from the runs recorded in ``index.json`` with a cache as
    cold or warm as this one: a warm run's minutes say nothing of a cold one's), and the
    kernels' own progress lines (:mod:`aoizora_lab.progress`) as they come."""

    def __init__(self, total: int, earlier: Mapping[tuple[str, str], tuple[float, bool | None]],
                 *, enabled: bool) -> None:
        self.total, self.earlier, self.enabled = total, earlier, enabled
        self.began = time.perf_counter()

    def _line(self, text: str) -> None:
        if self.enabled:
            print(text, file=sys.stderr, flush=True)

    def start(self, index: int, report: str, notebook: str,
              remaining: Sequence[tuple[str, str]], *, cold: bool) -> None:
        """``remaining``: this notebook and those after it; ``cold``: the compile cache is
        empty now."""
        state = "cold" if cold else "warm"
        alike = {k: s for k, (s, was_cold) in self.earlier.items() if was_cold is cold}
        facts = []
        if (report, notebook) in alike:
            facts.append(f"last time {duration(alike[report, notebook])}")
        elif (report, notebook) in self.earlier:
            facts.append(f"no time recorded with a {state} cache")
        known = [alike[r] for r in remaining if r in alike]
        if known:
            unknown = len(remaining) - len(known)
            facts.append(f"about {duration(sum(known))} left" if not unknown else
                         f"over {duration(sum(known))} left ({unknown} never run here with a "
                         f"{state} cache)")
        self._line(f"[{index + 1}/{self.total}] {report} / {notebook}: running"
                   + (f" ({'; '.join(facts)})" if facts else ""))

    def finish(self, run: NotebookRun) -> None:
        self._line(f"    {run.status} in {duration(run.seconds)} "
                   f"({duration(time.perf_counter() - self.began)} so far)"
                   + (f": {_first_line(run.error)}" if run.error else ""))

    # papermill writes the kernel's stderr here (``stderr_file``): forward progress lines only.
    def write(self, text: str) -> None:
        for line in text.splitlines():
            if line.startswith(PROGRESS_MARKER):
                self._line("    " + line.removeprefix(PROGRESS_MARKER))

    def flush(self) -> None:
        sys.stderr.flush()


def _earlier_seconds(out_dir: Path) -> dict[tuple[str, str], tuple[float, bool | None]]:
    """Wall time of each (report, notebook) the last time it ran into ``out_dir``, and whether
    its compile cache was cold then (``None``: not recorded)."""
    try:
        return {(str(e["report"]), str(e["notebook"])): (float(e["seconds"]),
                                                         e.get("cold_cache"))
                for e in _recorded(out_dir)}
    except (ValueError, TypeError, KeyError):
        return {}


def _resolve_notebooks(spec: ReportSpec, notebooks_dir: Path) -> list[Path]:
    available = sorted(p.name for p in notebooks_dir.glob("*.ipynb"))
    if not spec.notebooks:
        numbered = [notebooks_dir / name for name in available
                    if _NUMBERED_NOTEBOOK.fullmatch(name)]
        if not numbered:
            raise AoizoraError(
                f"report {spec.name!r}: no numbered notebooks (NN_name.ipynb) in "
                f"{str(notebooks_dir)!r}; name the notebooks in the matrix or pass the folder "
                "that holds them.")
        return numbered
    missing = [n for n in spec.notebooks if f"{n}.ipynb" not in available]
    if missing:
        raise AoizoraError(
            f"report {spec.name!r}: notebook(s) {missing} not found in {str(notebooks_dir)!r}; "
            f"it has {available}.")
    return [notebooks_dir / f"{name}.ipynb" for name in spec.notebooks]


def _declared_parameters(path: Path) -> set[str]:
    """The variables the first ``parameters``-tagged cell of the notebook assigns."""
    import nbformat
    from papermill.translators import PythonTranslator

    for cell in nbformat.read(path, as_version=4).cells:
        if "parameters" in cell.metadata.get("tags", []):
            return {parameter.name for parameter in PythonTranslator.inspect(cell)}
    return set()


def _write_assets(out_dir: Path) -> None:
    """The files every page shares: the installed plotly's ``plotly.min.js`` and nbconvert's
    notebook style sheet, under ``out_dir/assets/`` (rewritten only when they change)."""
    plotly_js = (resources.files("plotly") / "package_data" / "plotly.min.js").read_bytes()
    for asset, content in ((PLOTLY_ASSET, plotly_js),
                           (NOTEBOOK_CSS_ASSET, _notebook_css().encode())):
        target = out_dir / asset
        if not target.exists() or target.read_bytes() != content:
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(content)


@functools.cache
def _notebook_css() -> str:
    """The CSS the lab template would inline in every page."""
    import nbformat
    from jinja2 import DictLoader
    from nbconvert import HTMLExporter

    exporter = HTMLExporter(template_name="lab",
                            extra_loaders=[DictLoader({"aoizora_css.j2": _CSS_TEMPLATE})],
                            template_file="aoizora_css.j2")
    text, _ = exporter.from_notebook_node(nbformat.v4.new_notebook())
    return "\n".join(re.findall(r"<style[^>]*>(.*?)</style>", text, re.S))


def _run_notebook(report: str, source: Path, parameters: dict[str, Any], folder: Path, *,
                  kernel_name: str | None, stderr: Any = None,
                  cold_cache: bool | None = None) -> NotebookRun:
    import papermill
    from papermill.exceptions import PapermillExecutionError

    executed, page = folder / f"{source.stem}.ipynb", folder / f"{source.stem}.html"
    for stale in (executed, page):  # never publish a previous run's output as this one's
        stale.unlink(missing_ok=True)
    if kernel_name is None:
        kernel = {"kernel_name": "python3", "language": "python",
                  "kernel_manager_class": _this_interpreter_kernel_manager()}
    else:
        kernel = {"kernel_name": kernel_name}
    error = None
    start = time.perf_counter()
    try:
        papermill.execute_notebook(source, executed, parameters=parameters,
                                   cwd=source.parent, progress_bar=False, stderr_file=stderr,
                                   **kernel)
    except PapermillExecutionError as err:
        error = f"{err.ename}: {err.evalue}"
    except Exception as err:  # a dead kernel or an unreadable notebook: report it, go on
        error = f"{type(err).__name__}: {err}"
    seconds = time.perf_counter() - start
    records: dict[str, Any] = {}
    written = None
    if executed.exists():
        records = read_records(executed)
        try:
            written = export_html(executed, page)
        except Exception as err:  # the run's outcome stands; only its page is missing
            error = error or f"HTML export failed: {type(err).__name__}: {err}"
    return NotebookRun(
        report=report, notebook=source.stem, parameters=parameters,
        status="failed" if error else "ok", seconds=seconds,
        executed=executed if executed.exists() else None, page=written, records=records,
        error=error, cold_cache=cold_cache)


@functools.cache
def _this_interpreter_kernel_manager() -> type:
    """A kernel manager that starts ipykernel in this interpreter, ignoring kernelspecs.

    ipykernel's own spec runs ``sys.executable -m ipykernel_launcher``; an installed ``python3``
    kernelspec may name another interpreter, one without ``aoizora_lab``. The connection is
    CurveZMQ-encrypted where zmq supports it (ipykernel warns about plain TCP otherwise).
    """
    import zmq
    from ipykernel.kernelspec import RESOURCES, get_kernel_dict
    from jupyter_client.kernelspec import KernelSpec
    from jupyter_client.manager import AsyncKernelManager
    from traitlets import default

    class ThisInterpreterKernelManager(AsyncKernelManager):
        @default("transport_encryption")
        def _encrypt_when_possible(self) -> str:
            return "auto" if zmq.has("curve") else "disabled"

        @property
        def kernel_spec(self) -> KernelSpec:
            if self._kernel_spec is None:
                self._kernel_spec = KernelSpec(resource_dir=RESOURCES,
                                               **get_kernel_dict())
            return self._kernel_spec

    return ThisInterpreterKernelManager


def read_records(notebook: str | Path | nbformat.NotebookNode) -> dict[str, Any]:
    """The values a notebook :func:`~aoizora_lab.notebook.record`-ed, by name; a later record
    of a name wins."""
    import nbformat

    nb = notebook if isinstance(notebook, dict) else nbformat.read(notebook, as_version=4)
    values: dict[str, Any] = {}
    for cell in nb.cells:
        for output in cell.get("outputs", []):
            values.update(output.get("data", {}).get(RECORD_MIMETYPE, {}))
    return values


def export_html(notebook: str | Path, page: str | Path, *,
                plotly_js: str = f"../{PLOTLY_ASSET}",
                notebook_css: str = f"../{NOTEBOOK_CSS_ASSET}") -> Path:
    """Write an executed ``notebook`` as an offline HTML ``page``: prose and outputs, no code.

    Code cells show only their outputs (no input, no prompts). Papermill's ``parameters`` and
    ``injected-parameters`` cells become one line listing the parameters used; record outputs
    are hidden. The page loads plotly.js from ``plotly_js`` and its style sheet from
    ``notebook_css`` (both relative to the page) and nothing from the network.
    """
    import nbformat
    from jinja2 import DictLoader
    from nbconvert import HTMLExporter

    notebook, page = Path(notebook), Path(page)
    exporter = HTMLExporter(
        template_name="lab", exclude_input=True, exclude_input_prompt=True,
        exclude_output_prompt=True,
        extra_loaders=[DictLoader({"aoizora_report.html.j2": _PAGE_TEMPLATE})],
        template_file="aoizora_report.html.j2")
    nb = _for_readers(nbformat.read(notebook, as_version=4))
    body, _ = exporter.from_notebook_node(nb, resources={
        "plotly_js_url": plotly_js, "notebook_css_url": notebook_css,
        "metadata": {"name": f"{notebook.stem} · {notebook.parent.name}"}})
    page.write_text(body, encoding="utf-8")
    return page


def _for_readers(nb: nbformat.NotebookNode) -> nbformat.NotebookNode:
    """A copy of ``nb`` without papermill's parameter cells (one line instead) or records."""
    from nbformat.v4 import new_markdown_cell

    nb = copy.deepcopy(nb)
    parameters = nb.metadata.get("papermill", {}).get("parameters") or {}
    summary = new_markdown_cell("**Parameters:** " + ", ".join(
        f"`{key} = {json.dumps(value)}`" for key, value in parameters.items()))
    cells = []
    for cell in nb.cells:
        outputs = cell.get("outputs", [])
        papermill_cell = _PAPERMILL_TAGS & set(cell.metadata.get("tags", []))
        if papermill_cell and not any(o.output_type == "error" for o in outputs):
            if parameters and not any(c is summary for c in cells):
                cells.append(summary)
            continue
        if cell.cell_type == "code":
            cell.outputs = [_without_progress(o) for o in outputs
                            if RECORD_MIMETYPE not in o.get("data", {})]
            cell.outputs = [o for o in cell.outputs if o is not None]
        cells.append(cell)
    nb.cells = cells
    return nb


def _without_progress(output: nbformat.NotebookNode) -> nbformat.NotebookNode | None:
    """A stream output without its progress lines (None when nothing else is left)."""
    if output.get("output_type") != "stream":
        return output
    lines = "".join(output.get("text", "")).splitlines(keepends=True)
    kept = [line for line in lines if not line.startswith(PROGRESS_MARKER)]
    if len(kept) == len(lines):
        return output
    if not kept:
        return None
    output.text = "".join(kept)
    return output


def write_index(result: ReportsResult, out_dir: str | Path) -> Path:
    """Write ``out_dir/index.html``: every run, linked, with status, wall time and records;
    the runs of reports not in ``result`` that an earlier call recorded (``index.json``) stay.

    One section per report (its parameters under the name), one row per notebook: a link to
    its page, ``ok`` or ``failed`` with the error's first line and a link to the partial
    notebook, the wall time, and every recorded value as ``name: value``. The page is
    self-contained (inline CSS, no scripts).
    """
    out_dir = Path(out_dir)
    shown = _with_earlier_runs(result.runs, out_dir)
    earlier = len({run.report for run in shown} - {run.report for run in result.runs})
    reports: dict[str, list[NotebookRun]] = {}
    for run in shown:
        reports.setdefault(run.report, []).append(run)
    sections = []
    for name, runs in reports.items():
        merged = {key: value for run in runs for key, value in run.parameters.items()}
        parameters = ", ".join(f"{key} = {_format_value(value)}"
                               for key, value in merged.items())
        rows = "\n".join(_index_row(run, out_dir) for run in runs)
        sections.append(
            f'<section id="{_esc(name)}">\n<h2>{_esc(name)}</h2>\n'
            f'<p class="parameters">{_esc(parameters)}</p>\n'
            "<table>\n<thead><tr><th>Notebook</th><th>Status</th><th>Wall time</th>"
            f"<th>Recorded values</th></tr></thead>\n<tbody>\n{rows}\n</tbody>\n</table>\n"
            "</section>")
    failed = sum(run.status == "failed" for run in shown)
    generated = datetime.datetime.now().astimezone().strftime("%Y-%m-%d %H:%M %Z")
    kept = (f" {earlier} report{'s' if earlier != 1 else ''} kept from earlier runs."
            if earlier else "")
    index = out_dir / "index.html"
    out_dir.mkdir(parents=True, exist_ok=True)
    index.write_text(_INDEX_PAGE.format(
        summary=_esc(f"{len(shown)} notebook runs in {len(reports)} report"
                     f"{'s' if len(reports) != 1 else ''}: {len(shown) - failed} ok, {failed} "
                     f"failed. Generated {generated} by aoizora-lab reports.{kept}"),
        sections="\n".join(sections)), encoding="utf-8")
    (out_dir / INDEX_RECORD).write_text(json.dumps(
        [_run_record(run, out_dir) for run in shown], indent=1, default=str), encoding="utf-8")
    return index


INDEX_RECORD = "index.json"
"""Beside ``index.html``: its runs, so that regenerating some reports (``--only``) keeps the
rows of the others."""


def _recorded(out_dir: Path) -> list[Any]:
    """The entries of ``out_dir``'s :data:`INDEX_RECORD` (none when it is missing or not a
    JSON list)."""
    try:
        recorded = json.loads((out_dir / INDEX_RECORD).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return []
    return recorded if isinstance(recorded, list) else []


def _with_earlier_runs(runs: Sequence[NotebookRun], out_dir: Path) -> list[NotebookRun]:
    """``runs`` with the recorded runs of the reports they do not cover (whose pages are
    still there), in the earlier order, new reports last."""
    fresh = {run.report for run in runs}
    merged: list[NotebookRun] = []
    placed: set[str] = set()
    for entry in _recorded(out_dir):
        try:
            report = entry["report"]
            if report in fresh:
                if report not in placed:
                    merged.extend(run for run in runs if run.report == report)
                    placed.add(report)
                continue
            earlier = _recorded_run(entry, out_dir)
        except (KeyError, TypeError, ValueError):
            continue
        if earlier.page is not None and earlier.page.exists():
            merged.append(earlier)
    merged.extend(run for run in runs if run.report not in placed)
    return merged


def _run_record(run: NotebookRun, out_dir: Path) -> dict[str, Any]:
    def relative(path: Path | None) -> str | None:
        return None if path is None else Path(os.path.relpath(path, out_dir)).as_posix()

    return {"report": run.report, "notebook": run.notebook, "parameters": dict(run.parameters),
            "status": run.status, "seconds": run.seconds, "executed": relative(run.executed),
            "page": relative(run.page), "records": dict(run.records), "error": run.error,
            "cold_cache": run.cold_cache}


def _recorded_run(entry: dict[str, Any], out_dir: Path) -> NotebookRun:
    def absolute(path: str | None) -> Path | None:
        return None if path is None else out_dir / path

    return NotebookRun(report=str(entry["report"]), notebook=str(entry["notebook"]),
                       parameters=dict(entry["parameters"]), status=entry["status"],
                       seconds=float(entry["seconds"]), executed=absolute(entry["executed"]),
                       page=absolute(entry["page"]), records=dict(entry["records"]),
                       error=entry.get("error"), cold_cache=entry.get("cold_cache"))


def _index_row(run: NotebookRun, out_dir: Path) -> str:
    def link(path: Path | None, text: str) -> str:
        if path is None:
            return _esc(text)
        return f'<a href="{_esc(Path(os.path.relpath(path, out_dir)).as_posix())}">{_esc(text)}</a>'

    if run.status == "ok":
        status = '<td class="ok">ok</td>'
    else:
        partial = f" ({link(run.executed, 'partial notebook')})" if run.executed else ""
        status = (f'<td class="failed">failed: <code>{_esc(_first_line(run.error))}</code>'
                  f"{partial}</td>")
    records = "<br>".join(f"<b>{_esc(key)}</b>: {_esc(_format_value(value))}"
                          for key, value in run.records.items())
    return (f"<tr>\n<td>{link(run.page, run.notebook)}</td>\n{status}\n"
            f'<td class="number">{run.seconds:.1f} s</td>\n<td>{records}</td>\n</tr>')


def _format_value(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.4g}"
    if isinstance(value, int) and not isinstance(value, bool):
        return f"{value:,}"
    return value if isinstance(value, str) else json.dumps(value)


def _first_line(text: str | None) -> str:
    return text.strip().splitlines()[0] if text and text.strip() else ""


def _esc(text: str) -> str:
    return html.escape(text, quote=True)


_INDEX_PAGE = """\
<!DOCTYPE html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1.0">
<title>AoiZora Lab reports</title>
<style>
body {{ font-family: system-ui, sans-serif; margin: 2em auto; max-width: 70em; color: #222; }}
h2 {{ margin-bottom: 0.2em; }}
.parameters {{ margin-top: 0; color: #555; font-family: monospace; }}
table {{ border-collapse: collapse; width: 100%; margin-bottom: 1.5em; }}
th, td {{ border: 1px solid #ccc; padding: 0.3em 0.6em; text-align: left; vertical-align: top; }}
th {{ background: #f2f2f2; }}
td.ok {{ color: #1a7f37; }}
td.failed {{ color: #b42318; }}
td.number {{ text-align: right; white-space: nowrap; }}
</style>
</head>
<body>
<h1>AoiZora Lab reports</h1>
<p>{summary}</p>
{sections}
</body>
</html>
"""
