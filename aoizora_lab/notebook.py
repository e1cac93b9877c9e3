"""What a notebook calls: its parameters checked, figures shown, headline values recorded.

``aoizora-lab reports`` (:mod:`aoizora_lab.reports`) runs the numbered notebooks with
papermill, one parameter set per report, and publishes them as HTML. A notebook keeps this
contract::

    from aoizora_lab.notebook import notebook_inputs, record, show

- **Parameters**: a code cell tagged ``parameters`` holds the defaults, one ``name = value``
  per line; papermill injects the report's values of those names in a cell right after it (a
  notebook gets only the parameters it declares). Every parameter of a report must be declared
  by at least one of its notebooks, so a typo in the matrix fails before anything runs instead
  of silently leaving a default in place. Values are JSON-like (``size`` is the list
  ``[832, 480]``: papermill would turn a tuple into a string). :func:`notebook_inputs` checks
  them and builds the library values (workload, topology, layers, budget).
- **Figures**: display plotly figures as HTML divs without plotly.js,
  ``display(HTML(fig.to_html(full_html=False, include_plotlyjs=False)))`` (what :func:`show`,
  i.e. ``aoizora_lab.viz.show(fig)``, does). Every page loads the shared plotly.js in its
  ``<head>``; ``fig.show()`` would inline 4 MB of plotly.js per figure or render nothing in
  the page.
- **Headline values**: ``record("best_latency_s", 0.0123)`` stores a JSON-able value in the
  cell's output under :data:`RECORD_MIMETYPE`; :func:`~aoizora_lab.reports.read_records` reads
  them back and the report index lists them. Pages hide these outputs.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from aoizora_lab.errors import AoizoraError, is_whole
from aoizora_lab.viz.display import show

__all__ = [
    "RECORD_MIMETYPE",
    "NotebookInputs",
    "check_library_parameters",
    "notebook_inputs",
    "record",
    "show",
]

RECORD_MIMETYPE = "application/vnd.aoizora.record+json"
"""Output mimetype of :func:`record`: ``{name: value}`` stored as JSON in the notebook."""


def check_library_parameters(parameters: Mapping[str, Any]) -> None:
    """Check the parameters every notebook shares the way the library will use them."""
    from aoizora_lab.topology import parse_slice_name
    from aoizora_lab.workload import RESOLUTIONS, Workload

    if "topology" in parameters:
        if not isinstance(parameters["topology"], str):
            raise AoizoraError(
                f"topology={parameters['topology']!r} must be a slice name, e.g. 'v5e:2x4'.")
        parse_slice_name(parameters["topology"])
    size = parameters.get("size")
    if "size" in parameters and not (
            isinstance(size, list) and len(size) == 2
            and all(is_whole(v) for v in size)):
        raise AoizoraError(
            f"size={size!r} must be [width, height] in pixels, e.g. [832, 480] (480p) or "
            "[1280, 720] (720p).")
    if "model" in parameters:
        if not isinstance(parameters["model"], str):
            raise AoizoraError(
                f"model={parameters['model']!r} must be a Wan preset name, e.g. "
                "'wan2.1-t2v-1.3b'.")
        # The model decides which sizes and frame counts work (patch and VAE strides).
        width, height = size or RESOLUTIONS["480p"]
        Workload(model=parameters["model"], width=width, height=height,
                 frames=parameters.get("frames", 81))


@dataclass(frozen=True, eq=False)
class NotebookInputs:
    """What a notebook's parameters mean to the library."""

    workload: Any
    """The :class:`~aoizora_lab.Workload` (model, video size, frames)."""
    topology: Any
    """The :class:`~aoizora_lab.Topology` of the slice (deviceless TPU devices off a TPU VM)."""
    layers: int | None
    """Layers each candidate is compiled with (the layer loop is scaled to the full depth);
    ``None`` compiles the full depth."""
    budget: int
    """Placement evaluations per compiled candidate."""


def notebook_inputs(*, model: Any, size: Any, frames: Any, topology: Any, layers: Any = None,
                    budget: Any = 20_000) -> NotebookInputs:
    """Check a notebook's parameters as papermill injected them and build the library values.

    Example: ``notebook_inputs(model="wan2.1-t2v-14b", size=[1280, 720], frames=81,
    topology="v5e:4x4", layers=2)``. A bad value raises :class:`AoizoraError` naming it and
    what is accepted (papermill itself only warns, and turns a tuple ``size`` into a string).
    """
    from aoizora_lab.topology import Topology
    from aoizora_lab.workload import Workload

    check_library_parameters({"model": model, "size": size, "frames": frames,
                              "topology": topology})
    workload = Workload(model=model, width=size[0], height=size[1], frames=frames)
    depth = workload.config().num_layers
    if layers is not None and not is_whole(layers, 2, depth):
        raise AoizoraError(
            f"layers={layers!r}: compile 2..{depth} layers of {model} (the layer loop is scaled "
            "to the full depth), or None for the full depth.")
    if not is_whole(budget, 0):
        raise AoizoraError(f"budget={budget!r} must be a whole number of placement "
                           "evaluations >= 0, e.g. 20000.")
    return NotebookInputs(workload, Topology.from_name(topology), layers, budget)


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


def _numpy_to_python(value: Any) -> Any:
    if hasattr(value, "tolist"):  # numpy scalars and arrays, jax arrays
        return value.tolist()
    raise TypeError(f"{type(value).__name__} is not JSON serializable")
