"""The shape of the package: modules import only along the pipeline (docs/architecture.md).

Every module of ``aoizora_lab`` sits in one layer of :data:`LAYERS`; a module may import from
its own layer or lower ones, never higher, and the imports (module level, inside functions and
under ``TYPE_CHECKING`` alike) form no cycle. The core pipeline never imports the command
line, the benchmarks, the report runner or the notebook API.
"""

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "aoizora_lab"

LAYERS: tuple[tuple[str, ...], ...] = (
    # foundations: no pipeline knowledge
    ("errors", "records", "codec", "versions", "deviceless", "hardware", "flops", "progress",
     "workers"),
    ("topology",),
    ("comm_model",),
    ("models", "models.attention", "models.safetensors_io", "models.parallel", "models.wan",
     "models.config", "models.checkpoint", "models.vae", "models.vae22", "models.t5"),
    # what is planned
    ("aoizora_lab", "workload", "cases"),
    # the pipeline, stage by stage
    ("candidates",),
    ("hlo",),
    ("cost",),
    ("ir", "ir_estimate"),
    ("prune",),
    ("compile", "compile_worker"),
    ("placement", "flow_kernels"),
    ("parts", "part_worker"),
    ("realize",),
    ("options",),
    ("baselines",),
    ("jobs",),
    ("planner",),
    ("generation",),
    ("uncertainty",),
    # on top of the pipeline
    ("measure", "measure.clock", "measure.timing", "measure.microbench",
     "measure.calibration"),
    ("viz", "viz.units", "viz.display", "viz.loads", "viz.views", "viz.torus", "viz.order",
     "viz.charts", "viz.explorer", "notebook"),
    ("bench", "bench.report", "bench.quality", "bench.search", "bench.quick",
     "bench.throughput", "bench.interactive", "bench.order", "bench.generation", "reports",
     "cli"),
)
"""Lowest first. A new module must be placed here (and in docs/architecture.md)."""

OUTSIDE_THE_CORE = ("cli", "bench", "bench.report", "bench.quality", "bench.search",
                    "bench.quick", "bench.throughput", "bench.interactive", "bench.order",
                    "bench.generation", "reports", "notebook")
"""Front ends: nothing in the pipeline may depend on them."""


def _module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE).with_suffix("").parts
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(parts) or "aoizora_lab"


def _modules() -> dict[str, Path]:
    return {_module_name(p): p for p in sorted(PACKAGE.rglob("*.py"))}


def _layer_of() -> dict[str, int]:
    return {name: i for i, layer in enumerate(LAYERS) for name in layer}


def _resolve(name: str, known: set[str]) -> str | None:
    """``aoizora_lab.prune.Verdict`` -> ``prune``: the longest known module prefix."""
    if name == "aoizora_lab":
        return "aoizora_lab"
    if not name.startswith("aoizora_lab."):
        return None
    parts = name.split(".")[1:]
    for end in range(len(parts), 0, -1):
        if ".".join(parts[:end]) in known:
            return ".".join(parts[:end])
    return None


def imports(path: Path, known: set[str]) -> set[str]:
    """Package modules ``path`` imports anywhere in its body (functions included)."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            # `from aoizora_lab import measure` imports the submodule measure.
            names = [node.module, *(f"{node.module}.{a.name}" for a in node.names)]
        else:
            continue
        for name in names:
            module = _resolve(name, known)
            if module is not None:
                found.add(module)
    return found


def graph() -> dict[str, set[str]]:
    modules = _modules()
    known = set(modules)
    return {name: imports(path, known) - {name} for name, path in modules.items()}


def test_every_module_has_a_layer():
    missing = sorted(set(_modules()) - set(_layer_of()))
    assert not missing, f"place these modules in LAYERS and docs/architecture.md: {missing}"
    stale = sorted(set(_layer_of()) - set(_modules()))
    assert not stale, f"LAYERS names modules that do not exist: {stale}"


def test_imports_run_down_the_pipeline():
    layer = _layer_of()
    upward = [f"{module} (layer {layer[module]}) imports {target} (layer {layer[target]})"
              for module, targets in graph().items() for target in sorted(targets)
              if layer[target] > layer[module]]
    assert not upward, "\n".join(upward)


def test_no_import_cycles():
    edges = graph()
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    cycles: list[list[str]] = []

    def visit(node: str, path: list[str]) -> None:
        state[node] = 1
        for target in sorted(edges[node]):
            if state.get(target) == 1:
                cycles.append([*path[path.index(target):], target])
            elif target not in state:
                visit(target, [*path, target])
        state[node] = 2

    for node in sorted(edges):
        if node not in state:
            visit(node, [node])
    assert not cycles, "\n".join(" -> ".join(c) for c in cycles)


def test_the_core_never_imports_the_front_ends():
    front, edges = set(OUTSIDE_THE_CORE), graph()
    core = [m for m in edges if m not in front and not m.startswith("viz")]
    offending = {m: sorted(edges[m] & front) for m in core if edges[m] & front}
    assert not offending, offending


@pytest.mark.parametrize("source", ["from aoizora_lab.prune import Verdict",
                                    "from aoizora_lab import prune",
                                    "import aoizora_lab.prune"])
def test_the_checker_sees_every_import_form(tmp_path, source):
    path = tmp_path / "module.py"
    path.write_text(f"def late():\n    {source}\n")
    assert imports(path, set(_modules())) >= {"prune"}


SMALL_STEPS = ("planner", "baselines", "jobs", "options")
"""Modules that tie the pipeline together: small functions, each one step."""
LONGEST_STEP = 80
"""Lines a function of :data:`SMALL_STEPS` may span, docstring included."""


def test_the_search_is_made_of_small_steps():
    modules = _modules()
    long = {f"{name}.{node.name}": node.end_lineno - node.lineno + 1
            for name in SMALL_STEPS
            for node in ast.walk(ast.parse(modules[name].read_text()))
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)
            and node.end_lineno - node.lineno + 1 > LONGEST_STEP}
    assert not long, f"split these into steps of at most {LONGEST_STEP} lines: {long}"
