"""What a notebook calls: its parameters checked, figures shown, headline values recorded.

``aoizora-lab reports`` (:mod:`aoizora_lab.reports`) runs the numbered notebooks with
papermill, one parameter set per report, and publishes them as HTML. A notebook keeps this
contract::

    from aoizora_lab.notebook import notebook_inputs, record, show

- **Parameters**: a code cell tagged ``parameters`` holds the defaults, one ``name = value``
  per line; papermill injects the report's values of those names in a cell right after it (a
  notebook gets only the parameters it declares). Every parameter of a report must be declared
  by at least one of its notebooks, so a typo in the matrix fails before anything runs instead
  of silently leaving a default in place. Values are JSON-like. The workload and the slice
  are one parameter, ``case = "wan2.1-t2v-1.3b@832x480x81/v5e:2x4"`` (the case spec of
  :func:`aoizora_lab.cases.parse_case`:
  ``MODEL@WIDTHxHEIGHT[xFRAMES][-nocfg][-textN][-swap]/SLICE``); notebooks that compile add
  ``layers`` and ``budget``. :func:`notebook_inputs` checks them and builds the library
  values (case, workload, topology, layers, budget).
- **Figures**: display plotly figures as HTML divs without plotly.js,
  ``display(HTML(fig.to_html(full_html=False, include_plotlyjs=False)))`` (what :func:`show`,
  i.e. ``aoizora_lab.viz.show(fig)``, does). Every page loads the shared plotly.js in its
  ``<head>``; ``fig.show()`` would inline 4 MB of plotly.js per figure or render nothing in
  the page.
- **Headline values**: ``record("best_latency_s", 0.0123)`` stores a JSON-able value in the
  cell's output under :data:`RECORD_MIMETYPE`; :func:`~aoizora_lab.reports.read_records` reads
  them back and the report index lists them. Pages hide these outputs. A number the run
  could not give is recorded as None (``record("total_s", known(video.total_s))``).
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from aoizora_lab.errors import AoizoraError, is_whole
from aoizora_lab.options import FULL_SEARCH, PlanOptions, check_time_limit
from aoizora_lab.viz.display import show

__all__ = [
    "CASE_EXAMPLE",
    "RECORD_MIMETYPE",
    "NotebookInputs",
    "check_library_parameters",
    "known",
    "notebook_inputs",
    "record",
    "show",
]

RECORD_MIMETYPE = "application/vnd.aoizora.record+json"
"""Output mimetype of :func:`record`: ``{name: value}`` stored as JSON in the notebook."""


CASE_EXAMPLE = "wan2.1-t2v-1.3b@832x480x81/v5e:2x4"
"""The default ``case`` of the notebooks: Wan 2.1 1.3B at 480p, 81 frames, on a v5e 2x4 slice."""


def check_library_parameters(parameters: Mapping[str, Any]) -> None:
    """Check the parameters every notebook shares the way the library will use them: ``case``
    (a case spec, :func:`aoizora_lab.cases.parse_case`)."""
    if "case" in parameters:
        _parse_case(parameters["case"])


def _parse_case(case: Any) -> Any:
    from aoizora_lab.cases import CASE_SPEC, parse_case

    if not isinstance(case, str):
        raise AoizoraError(
            f"case={case!r} must be a case spec string {CASE_SPEC}, e.g. "
            f"{CASE_EXAMPLE!r}.")
    return parse_case(case)  # its errors quote the spec and name the bad part


@dataclass(frozen=True, eq=False)
class NotebookInputs:
    """What a notebook's parameters mean to the library."""

    case: Any
    """The :class:`~aoizora_lab.cases.Case` (workload and slice name) the notebook studies."""
    workload: Any
    """The :class:`~aoizora_lab.Workload` (model, video size, frames): ``case.workload``."""
    topology: Any
    """The :class:`~aoizora_lab.Topology` of the slice (deviceless TPU devices off a TPU VM):
    ``case.topology()``."""
    layers: int | None
    """Layers each candidate is compiled with (the layer loop is scaled to the full depth);
    ``None`` compiles the full depth."""
    budget: int
    """Placement evaluations per compiled candidate."""
    time_limit: float | None = None
    """Seconds the plan may take (:class:`~aoizora_lab.jobs.TimeLimited`); ``None``: the full
    search."""

    @property
    def options(self) -> PlanOptions:
        """The search these parameters ask for, at this depth and budget: the full search, or
        the command line's time-limited one."""
        return FULL_SEARCH.replace(num_layers=self.layers, budget=self.budget,
                                   time_limit_s=self.time_limit)

    @property
    def search(self) -> str:
        """Which search, in words, for the report's records."""
        return ("full search" if self.time_limit is None
                else f"time limit {self.time_limit:g} s")


def notebook_inputs(*, case: Any, layers: Any = None, budget: Any = 20_000,
                    time_limit: Any = None) -> NotebookInputs:
    """Check a notebook's parameters as papermill injected them and build the library values.

    ``case`` is one case spec, ``MODEL@WIDTHxHEIGHT[xFRAMES][-nocfg][-textN][-swap]/SLICE`` (see
    :mod:`aoizora_lab.cases`); ``time_limit``: seconds the plan may take, or ``None`` for the
    full search. Example: ``notebook_inputs(case="wan2.1-t2v-14b@1280x720x81/v5e:4x4",
    layers=2)``. A bad value raises :class:`AoizoraError` naming it and what is accepted
    (papermill itself only warns).
    """
    parsed = _parse_case(case)
    workload = parsed.workload
    depth = workload.config().num_layers
    if layers is not None and not is_whole(layers, 2, depth):
        raise AoizoraError(
            f"layers={layers!r}: compile 2..{depth} layers of {workload.model} (the layer loop "
            "is scaled to the full depth), or None for the full depth.")
    if not is_whole(budget, 0):
        raise AoizoraError(f"budget={budget!r} must be a whole number of placement "
                           "evaluations >= 0, e.g. 20000.")
    if time_limit is not None:
        check_time_limit(time_limit, "time_limit")
    return NotebookInputs(parsed, workload, parsed.topology(), layers, budget,
                          None if time_limit is None else float(time_limit))


def record(name: str, value: Any) -> None:
    """Save a headline ``value`` under ``name`` in the running notebook, for the report index.

    Call it in a notebook: ``record("best_latency_s", 0.0123)``. The value must be JSON-able
    (numbers, strings, booleans, None, lists, dicts; numpy scalars and arrays are converted;
    NaN and infinity are not: record None). It is displayed as an output of mimetype
    :data:`RECORD_MIMETYPE` (with a one-line text form for Jupyter), which
    :func:`~aoizora_lab.reports.read_records` reads back; report pages hide it. Recording a
    name again replaces it. Outside IPython it only prints that text.
    """
    from IPython import get_ipython
    from IPython.display import display

    if not isinstance(name, str) or not name:
        raise AoizoraError(f"record name {name!r} must be a non-empty string.")
    try:
        text = json.dumps(value, allow_nan=False, default=_numpy_to_python)
    except (TypeError, ValueError) as err:
        raise AoizoraError(
            f"record({name!r}, {value!r}): not JSON-able ({err}); record numbers, strings, "
            "booleans, None, lists or dicts (None for a missing number).") from None
    if get_ipython() is None:  # plain Python: no notebook to store it in, just say it
        print(f"recorded {name} = {text}")
        return
    display({RECORD_MIMETYPE: {name: json.loads(text)},
             "text/plain": f"recorded {name} = {text}"}, raw=True)


def known(value: float) -> float | None:
    """``value``, or None where it is NaN (a number the run could not give, e.g. the whole
    video's seconds when a part has no split that compiled): what :func:`record` takes for a
    missing number, which refuses NaN so that a number is never lost unseen."""
    return None if math.isnan(value) else value


def _numpy_to_python(value: Any) -> Any:
    if hasattr(value, "tolist"):  # numpy scalars and arrays, jax arrays
        return value.tolist()
    raise TypeError(f"{type(value).__name__} is not JSON serializable")
