"""Reliability: bad input gets a clear error; crashes, hangs, OOM and interrupted
sweeps lose nothing; the caches never hand back a damaged or stale entry.

Covered elsewhere and not repeated here: a single SIGABRT crash with a rerun that hits the cache,
a truncated ``hlo.txt``, a tiny-timeout compile and a real OOM, each on its own
(``test_compile.py``); a truncated IR cache entry (``test_ir.py``); the fixed bad slice names,
workloads and candidate names (``test_topology.py``, ``test_workload.py``,
``test_candidates.py``); a plan file with another version, another slice or a repeated
coordinate (``test_planner.py``); bad report matrices, a notebook that raises (partial notebook
kept, error row in ``index.html``, the others still run) and the ``reports`` command's exit
status = number of failures (``test_reports.py``).
"""

from __future__ import annotations

import concurrent.futures as cf
import dataclasses
import importlib.metadata
import json
import math
import os
import shutil
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import jax
import nbformat
import pytest
import yaml
from hypothesis import HealthCheck, assume, example, given, settings
from hypothesis import strategies as st
from nbformat.v4 import new_code_cell, new_notebook
from tiny import TINY, WORKLOAD

import aoizora_lab as az
from aoizora_lab.candidates import ABBREVIATIONS, Candidate
from aoizora_lab.cli import main
from aoizora_lab.compile import (
    HOST_MEMORY_FILE,
    PROGRAMS,
    STALE_STAGING_S,
    compile_candidates,
    read_entry,
    write_entry,
)
from aoizora_lab.cost import Predicted
from aoizora_lab.hardware import GENERATIONS
from aoizora_lab.ir_estimate import estimate_ir
from aoizora_lab.models.parallel import ROLES
from aoizora_lab.models.wan import PRESETS
from aoizora_lab.notebook import notebook_inputs
from aoizora_lab.placement import Placement
from aoizora_lab.realize import Plan
from aoizora_lab.reports import ReportSpec, load_matrix, run_reports, write_index
from aoizora_lab.topology import is_offered_shape

AoizoraError = az.AoizoraError
DATA = Path(__file__).parent / "data"
FUZZ = settings(max_examples=40, deadline=None,
                suppress_health_check=[HealthCheck.function_scoped_fixture])



def clear_error(call, bad_values, accepted):
    """Run ``call``; it must raise :class:`AoizoraError` (nothing else) whose message names one of
    ``bad_values`` (its repr, or its text for non-strings) and holds an ``accepted`` fragment."""
    try:
        call()
    except AoizoraError as err:
        message = str(err)
    except Exception as err:  # a bare KeyError / TypeError / jax error is what this file forbids
        raise AssertionError(f"{type(err).__name__} instead of AoizoraError: {err}") from err
    else:
        raise AssertionError(f"no error for {bad_values!r}")
    assert any(named(v, message) for v in bad_values), (bad_values, message)
    fragments = [accepted] if isinstance(accepted, str) else accepted
    assert any(f in message for f in fragments), (fragments, message)
    return message


def named(value, message: str) -> bool:
    """Whether ``message`` quotes ``value``."""
    return repr(value) in message or (not isinstance(value, str) and str(value) in message)


# ---- 1. bad input: clear errors ------------------------------------------------------------------

GENERATION_LIST = str(list(GENERATIONS))
non_ints = st.one_of(st.floats(allow_nan=False), st.text(max_size=5), st.none(), st.booleans(),
                     st.lists(st.integers(1, 4), max_size=2))


@FUZZ
@given(st.text(max_size=20))
def test_any_slice_name_is_a_slice_or_a_clear_error(name):
    try:
        topology = az.Topology.from_name(name, deviceless=False)
    except AoizoraError as err:
        assert repr(name) in str(err)
        assert "GENERATION:SHAPE" in str(err) or GENERATION_LIST in str(err) or (
            "do not come in shape" in str(err))
    else:
        assert is_offered_shape(topology.generation, topology.shape)


shape_text = st.lists(st.integers(0, 40), min_size=1, max_size=4).map(
    lambda dims: "x".join(map(str, dims)))


@FUZZ
@given(st.from_regex(r"[vV][0-9]{1,2}[a-z]?", fullmatch=True), shape_text)
def test_wrong_generations_name_the_slice_and_list_the_known_ones(generation, shape):
    assume(generation.lower() not in GENERATIONS)
    name = f"{generation}:{shape}"
    clear_error(lambda: az.Topology.from_name(name, deviceless=False), [name], GENERATION_LIST)
    clear_error(lambda: az.Topology.simulated((2, 2), generation=generation), [generation],
                GENERATION_LIST)


@FUZZ
@given(st.sampled_from(GENERATIONS), st.lists(st.integers(-2, 40), min_size=1, max_size=4))
def test_shapes_a_generation_is_not_offered_in_are_refused_with_the_offered_ones(generation,
                                                                                 dims):
    assume(not is_offered_shape(generation, tuple(dims)))
    name = f"{generation}:{'x'.join(map(str, dims))}"
    # Negative numbers do not even parse; zero and unoffered shapes parse but are not offered.
    clear_error(lambda: az.Topology.from_name(name, deviceless=False), [name],
                ["1x1, 2x2, 2x4", "2x2x1, 2x2x2", "GENERATION:SHAPE"])


bad_shapes = st.one_of(
    st.lists(st.integers(-5, 0), min_size=1, max_size=3),  # zero / negative chip counts
    st.lists(st.integers(1, 4), min_size=0, max_size=2).flatmap(  # one bad dim among good ones
        lambda good: st.tuples(st.sampled_from([0, -1, 2.5, True, "4", None])).map(
            lambda bad: [*good, *bad])),
    st.text(max_size=6),  # "4x4": a name, not a shape
    st.integers(), st.none(), st.just(()), st.floats(allow_nan=False),
)


@FUZZ
@given(bad_shapes)
def test_bad_simulated_shapes_name_the_shape(shape):
    clear_error(lambda: az.Topology.simulated(shape), [shape], "positive whole chip counts")


@FUZZ
@given(st.lists(st.integers(1, 4), min_size=1, max_size=3))
def test_good_simulated_shapes_build(dims):
    topology = az.Topology.simulated(dims, generation="v5p")
    assert topology.shape == tuple(dims) and topology.num_chips == math.prod(dims)


good_frames = st.integers(0, 30).map(lambda n: 4 * n + 1)
good_pixels = st.integers(1, 80).map(lambda n: 16 * n)
bad_frames = st.one_of(st.integers(-20, 200).filter(lambda f: f < 1 or (f - 1) % 4), non_ints)
bad_pixels = st.one_of(st.integers(-100, 2000).filter(lambda p: p < 1 or p % 16), non_ints)


@FUZZ
@given(st.data())
def test_bad_workload_sizes_name_the_value_and_the_rule(data):
    sizes = {"frames": data.draw(good_frames), "height": data.draw(good_pixels),
             "width": data.draw(good_pixels)}
    broken = data.draw(st.lists(st.sampled_from(list(sizes)), min_size=1, unique=True))
    for name in broken:
        sizes[name] = data.draw(bad_frames if name == "frames" else bad_pixels)
    clear_error(lambda: az.Workload(model="wan2.1-t2v-1.3b", **sizes),
                [sizes[name] for name in broken],
                ["positive integer", "multiples of 16", "4n + 1"])


@FUZZ
@given(st.one_of(st.text(max_size=20), st.integers(), st.none()))
def test_unknown_model_names_list_the_presets(model):
    assume(str(model).strip().lower() not in PRESETS)
    clear_error(lambda: az.Workload(model=model, height=480, width=832), [model],
                str(sorted(PRESETS)))


def test_bad_model_configs_and_flags_are_clear():
    clear_error(lambda: az.WanConfig(num_heads=0), [0], "positive integer")
    clear_error(lambda: az.WanConfig(dim="wide"), ["wide"], "positive integer")
    clear_error(lambda: az.Workload(model=TINY, height=32, width=48, frames=5, text_len=8,
                                    cfg="no"), ["no"], "True")
    # A bool is an int to Python, not a frame count: True must not pass as 1 frame.
    clear_error(lambda: az.Workload(model=TINY, height=32, width=48, frames=True, text_len=8),
                [True], "positive integer")
    clear_error(lambda: notebook_inputs(case=GOOD_CASE, layers=True), [True],
                "or None for the full depth")


role_parts = st.tuples(st.sampled_from([*ABBREVIATIONS.values(), "foo", "fsdp", "", "x"]),
                       st.one_of(st.integers(-2, 9).map(str), st.sampled_from(["", "a", "2.5"])))
candidate_names = st.one_of(
    st.text(max_size=16),
    st.lists(role_parts.map("".join), max_size=4).map("-".join),
    st.lists(role_parts.map("".join), max_size=4).map(lambda p: "-".join([*p, "fsdp"])),
)


@FUZZ
@given(candidate_names)
def test_any_candidate_name_is_a_candidate_or_names_itself(name):
    try:
        candidate = Candidate.from_name(name)
    except AoizoraError as err:
        assert f"Candidate name {name!r}" in str(err)
        assert any(f in str(err) for f in ("e.g. 'cfg2-uly4-ring2-fsdp'", "at least 1",
                                            "besides tp", "needs a cfg axis")), str(err)
    else:  # what it parsed is what it prints (degree-1 roles dropped)
        assert Candidate.from_name(candidate.name) == candidate


@FUZZ
@given(st.one_of(
    st.dictionaries(st.sampled_from([*ROLES, "pipeline", "expert"]),
                    st.one_of(st.integers(-3, 0), st.floats(allow_nan=False), st.text(max_size=3),
                              st.none(), st.booleans()),
                    min_size=1),
    st.lists(st.sampled_from(ROLES), max_size=3), st.text(max_size=5), st.none(), st.integers()))
def test_bad_role_degrees_name_the_roles_and_the_rule(degrees):
    if isinstance(degrees, dict):
        clear_error(lambda: Candidate.from_degrees(degrees), [*degrees, *degrees.values()],
                    ["at least 1", str(list(ROLES))])
    else:
        clear_error(lambda: Candidate.from_degrees(degrees), [degrees], "mapping of role")


@FUZZ
@given(degrees=st.dictionaries(st.sampled_from(ROLES), st.integers(1, 4)))
def test_degrees_that_do_not_multiply_to_the_device_count_are_refused_before_compiling(
        degrees, tmp_path):
    candidate = Candidate.from_degrees(degrees, attention="blockwise")
    assume(candidate.num_devices != 8)
    host = az.Topology.simulated((2, 4), devices=jax.devices()[:8])
    cache = tmp_path / "cache"
    clear_error(lambda: compile_candidates([candidate], WORKLOAD, host, cache_dir=cache),
                [candidate.name], f"must multiply to {host.num_devices}")
    assert not cache.exists()  # nothing compiled, nothing cached
    clear_error(lambda: candidate.plan(jax.devices()[:8]), [candidate.name], "needs")


def test_other_bad_compile_arguments_are_refused_before_compiling(tmp_path):
    tmp_path = tmp_path / "cache"
    host = az.Topology.simulated((2, 4), devices=jax.devices()[:8])
    good = [Candidate.from_name("cfg2-uly4", attention="blockwise")]
    clear_error(lambda: compile_candidates(["cfg2-uly4"], WORKLOAD, host, cache_dir=tmp_path),
                ["cfg2-uly4"], "Candidate.from_name")
    for timeout in (0, -1.0, "60", None):
        clear_error(lambda t=timeout: compile_candidates(good, WORKLOAD, host, cache_dir=tmp_path,
                                                         timeout_s=t), [timeout], "positive number")
    for layers in (0, 3, 1.5, True):
        clear_error(lambda n=layers: compile_candidates(good, WORKLOAD, host, cache_dir=tmp_path,
                                                        num_layers=n), [layers], "between 1 and")
    assert not tmp_path.exists()


# -- plan files


@pytest.fixture(scope="module")
def plan_file(tmp_path_factory):
    """A plan file for cfg2-uly2 on a simulated v5e:2x2 (hand-built: nothing is compiled)."""
    topology = az.Topology.simulated((2, 2))
    plan = Plan(WORKLOAD, topology, Candidate.from_name("cfg2-uly2"), Placement((2, 0, 3, 1)),
                Predicted(1.0, 0.5, 1.25))
    path = tmp_path_factory.mktemp("plan") / "plan.json"
    plan.to_json(path)
    return path, topology


def _load(tmp_path, topology, payload=None, raw=None):
    path = tmp_path / "edited.json"
    path.write_text(raw if raw is not None else json.dumps(payload))
    return lambda: Plan.from_json(path, topology)


def test_plan_file_round_trips(plan_file):
    path, topology = plan_file
    loaded = Plan.from_json(path, topology)
    assert loaded.placement.order == (2, 0, 3, 1) and loaded.candidate.name == "cfg2-uly2"
    assert loaded.workload == WORKLOAD and loaded.predicted == Predicted(1.0, 0.5, 1.25)


json_values = st.recursive(
    st.one_of(st.none(), st.booleans(), st.integers(), st.floats(allow_nan=False),
              st.text(max_size=8)),
    lambda inner: st.one_of(st.lists(inner, max_size=3),
                            st.dictionaries(st.text(max_size=5), inner, max_size=3)),
    max_leaves=6)


@FUZZ
@given(key=st.sampled_from(["version", "workload", "slice", "candidate", "attention", "coords",
                            "cores", "predicted"]), value=json_values)
@example(key="workload", value={"model": {"dim": "x"}})
@example(key="candidate", value="CFG2")
@example(key="coords", value=[[0, 0]] * 4)
@example(key="cores", value=[float("inf")])  # found by Hypothesis: int(inf) overflows
def test_plan_file_with_a_missing_or_wrong_value_names_the_key(plan_file, tmp_path, key, value):
    path, topology = plan_file
    good = json.loads(path.read_text())
    assume(value != good[key])
    without = {k: v for k, v in good.items() if k != key}
    message = clear_error(_load(tmp_path, topology, without), [tmp_path / "edited.json"],
                          ["lacks key", "schema version None"])
    assert key in message, message
    try:
        loaded = _load(tmp_path, topology, {**good, key: value})()
    except AoizoraError as err:
        message = str(err)
        assert str(tmp_path / "edited.json") in message, message
        assert key in message or repr(value)[:20] in message, message
    except Exception as err:
        raise AssertionError(f"{type(err).__name__} instead of AoizoraError: {err}") from err
    else:  # an edit the format allows (an equal value of another JSON type, e.g. 1.0 for 1)
        assert loaded.candidate.num_devices == topology.num_devices


@pytest.mark.parametrize(("edit", "bad", "accepted"), [
    (lambda p: {**p, "coords": [p["coords"][0]] * 4}, "not a permutation", "exactly one"),
    (lambda p: {**p, "coords": p["coords"][:3], "cores": p["cores"][:3]}, "3 devices", "has 4"),
    (lambda p: {**p, "coords": [[0, 0], [1, 0], [0, 1], [5, 5]]}, "(5, 5)", "coords must list"),
    (lambda p: {**p, "coords": [[0, 0], [1, 0], [0, 1], [1, "y"]]}, "'y'", "coords must list"),
    (lambda p: {**p, "cores": [0, 0, 0, 1]}, "1)", "coords must list"),
    (lambda p: {**p, "candidate": "cfg2-uly4"}, "'cfg2-uly4'", "spans 8 devices"),
    (lambda p: {**p, "candidate": "cfg2-bogus2"}, "'cfg2-bogus2'", "ROLE+DEGREE"),
    (lambda p: {**p, "attention": "flash"}, "'flash'", "backends are"),
    (lambda p: {**p, "slice": "v5e:2x4"}, "'v5e:2x4'", "not 'v5e:2x2'"),
    (lambda p: {**p, "version": 2}, "version 2", "reads version 1"),
    (lambda p: {**p, "predicted": {"compute_s": "fast", "comm_s": 0, "total_s": 1}}, "'fast'",
     "numbers"),
    (lambda p: {**p, "workload": {**p["workload"], "frames": 8}}, "frames=8", "4n + 1"),
    (lambda p: {**p, "workload": {**p["workload"], "fps": 16}}, "['fps']", "must have the keys"),
    (lambda p: {**p, "workload": {**p["workload"], "model": "wan3"}}, "'wan3'", "presets are"),
    (lambda p: {**p, "workload": {**p["workload"], "model": {**p["workload"]["model"],
                                                              "dim": "wide"}}},
     "'wide'", "positive integer"),
    (lambda p: {**p, "workload": {**p["workload"], "model": {"depth": 3}}}, "['depth']",
     "WanConfig fields"),
])
def test_edited_plan_files_name_the_bad_value(plan_file, tmp_path, edit, bad, accepted):
    path, topology = plan_file
    message = clear_error(_load(tmp_path, topology, edit(json.loads(path.read_text()))),
                          [tmp_path / "edited.json"], accepted)
    assert bad in message, message


@FUZZ
@given(st.one_of(st.binary(max_size=40).map(lambda b: b.decode("latin-1")),
                 json_values.filter(lambda v: not isinstance(v, dict)).map(json.dumps)))
def test_a_plan_file_that_is_not_a_plan_object_is_refused(plan_file, tmp_path, raw):
    _, topology = plan_file
    try:
        json.loads(raw)
    except ValueError:
        accepted = "not readable JSON"
    else:
        accepted = "not a plan: a JSON object with keys"
    clear_error(_load(tmp_path, topology, raw=raw), [tmp_path / "edited.json"], accepted)
    clear_error(lambda: Plan.from_json(tmp_path / "absent.json", topology),
                [tmp_path / "absent.json"], "not readable")


# -- report parameters


GOOD_CASE = "wan2.1-t2v-1.3b@832x480x81/v5e:2x4"
bad_case_parts = {  # a good case with one part broken (see cases.parse_case for the grammar)
    "model": st.text(max_size=12).filter(
        lambda m: m.strip().lower() not in PRESETS and m.strip() != "custom"),
    "width": st.integers(-100, 2000).filter(lambda p: p < 1 or p % 16),
    "height": st.integers(-100, 2000).filter(lambda p: p < 1 or p % 16),
    "frames": st.integers(-20, 200).filter(lambda f: f < 1 or (f - 1) % 4),
    "slice_name": st.one_of(st.text(max_size=9).filter(lambda t: ":" not in t),
                       st.just("v5e:3x3"), st.just("v9:2x2")),
}


def _case(model="wan2.1-t2v-1.3b", width=832, height=480, frames=81, slice_name="v5e:2x4"):
    return f"{model}@{width}x{height}x{frames}/{slice_name}"


@FUZZ
@given(st.data())
def test_bad_notebook_parameters_name_the_value(data):
    parameters = {"case": GOOD_CASE, "layers": 2, "budget": 100}
    bad_values = {
        "case": st.one_of(
            st.sampled_from(list(bad_case_parts)).flatmap(
                lambda part: bad_case_parts[part].map(lambda bad: _case(**{part: bad}))),
            st.text(max_size=20).filter(lambda t: "@" not in t),  # no workload at all
            st.integers(), st.none(), st.booleans(), st.lists(st.integers(1, 900), max_size=2)),
        "layers": st.one_of(st.integers(-3, 1), st.integers(31, 99), st.floats(allow_nan=False),
                            st.text(max_size=3), st.just(True)),
        "budget": st.one_of(st.integers(max_value=-1), st.floats(allow_nan=False),
                            st.text(max_size=3), st.none()),
    }
    broken = data.draw(st.sampled_from(list(bad_values)))
    parameters[broken] = data.draw(bad_values[broken])
    accepted = ["e.g.", "presets are", "multiples of 16", "4n + 1", "positive integer",
                "or None for the full depth", "shapes are", "generations are"]
    clear_error(lambda: notebook_inputs(**parameters), [parameters[broken]], accepted)
    if broken == "case":  # the same check guards the report matrix
        clear_error(lambda: ReportSpec("r", parameters={"case": parameters["case"]}),
                    [parameters["case"]], [*accepted, "finite number"])


def test_a_good_case_gives_the_workload_and_slice_it_names():
    inputs = notebook_inputs(case=_case("wan2.1-t2v-14b", 1280, 720, 81, "v5e:4x4"), layers=2)
    assert inputs.case.name == "wan2.1-t2v-14b@1280x720x81/v5e:4x4"
    assert (inputs.workload.model, inputs.workload.width, inputs.workload.height,
            inputs.workload.frames) == ("wan2.1-t2v-14b", 1280, 720, 81)
    assert (inputs.topology.name, inputs.topology.num_devices) == ("v5e:4x4", 16)
    assert (inputs.layers, inputs.budget) == (2, 20_000)


@FUZZ
@given(name=st.one_of(st.text(max_size=10), st.integers(), st.none()),
       notebooks=st.one_of(st.just(()), st.lists(st.text(max_size=6), max_size=2),
                           st.integers(), st.none()),
       value=st.one_of(json_values, st.sets(st.integers(), max_size=2),
                       st.sampled_from([float("nan"), float("inf"), object()])))
def test_any_report_spec_is_valid_or_a_clear_error(name, notebooks, value):
    try:
        spec = ReportSpec(name, notebooks, {"value": value})
    except AoizoraError as err:
        assert any(named(v, str(err)) for v in (name, notebooks, value)) or (
            "notebook" in str(err) or "parameter 'value'" in str(err)), str(err)
    else:
        assert spec.name == name and json.loads(json.dumps(dict(spec.parameters))) == dict(
            spec.parameters)


@FUZZ
@given(st.one_of(
    json_values.map(lambda doc: yaml.safe_dump(doc)),
    st.fixed_dictionaries({"reports": st.lists(st.fixed_dictionaries(
        {"name": st.one_of(st.text(max_size=6), st.integers())},
        optional={"parameters": json_values, "notebooks": json_values}), max_size=3)}).map(
        yaml.safe_dump),
    st.binary(max_size=30).map(lambda b: b.decode("latin-1")),
))
def test_any_report_matrix_file_is_reports_or_a_clear_error(tmp_path, text):
    path = tmp_path / "matrix.yaml"
    path.write_text(text, encoding="utf-8")
    try:
        specs = load_matrix(path)
    except AoizoraError as err:
        assert str(path) in str(err), str(err)
    else:
        assert specs and all(isinstance(s, ReportSpec) for s in specs)


def test_unreadable_or_odd_matrices_are_clear(tmp_path):
    clear_error(lambda: load_matrix(tmp_path), [str(tmp_path)], "readable UTF-8")
    binary = tmp_path / "binary.yaml"
    binary.write_bytes(b"\xff\xfe\x00reports")
    clear_error(lambda: load_matrix(binary), [str(binary)], "readable UTF-8")
    odd = tmp_path / "odd.yaml"
    odd.write_text("reports: [{name: a, parameters: 0}]")
    clear_error(lambda: load_matrix(odd), [0], "must be a mapping")
    odd.write_text("reports: [{name: a, parameters: {frames: .nan}}]")
    clear_error(lambda: load_matrix(odd), [float("nan")], "finite number")


# -- the command line


def test_cli_bad_plan_arguments_exit_2_with_one_line(capsys, tmp_path):
    case = "wan2.1-t2v-1.3b@832x480x81/v5e:2x4"

    def one_line(argv, *fragments):
        assert main(argv) == 2
        captured = capsys.readouterr()
        err = captured.err.strip()
        assert err.startswith("aoizora-lab: error:") and "\n" not in err, err
        assert "Traceback" not in err and captured.out == ""
        for fragment in fragments:
            assert fragment in err, (fragment, err)

    one_line(["plan", "wan2.1-t2v-1.3b@832x480x81/v9:2x2"], "'v9:2x2'", GENERATION_LIST)
    one_line(["plan", "wan2.1-t2v-1.3b@832x480x81/v5e:3x3"], "'3x3'", "1x1, 2x2")
    one_line(["plan", "wan2.1-t2v-1.3b@100x100/v5e:2x4"], "100x100", "multiples of 16")
    one_line(["plan", "wan2.1-t2v-1.3b@832-480/v5e:2x4"], "'wan2.1-t2v-1.3b@832-480'",
             "WIDTHxHEIGHT")
    one_line(["plan", "wan2.1-t2v-1.3b@832x480x3x3/v5e:2x4"], "832x480x3x3", "WIDTHxHEIGHT")
    one_line(["plan", "wan2.1-t2v-1.3b@832x480"], "WORKLOAD/SLICE")
    one_line(["plan", "wan3@832x480/v5e:2x4"], "'wan3'", "presets are")
    # A setup of yours or a flag set with a typo is refused before anything compiles.
    one_line(["plan", "wan2.1-t2v-1.3b@832x480x81/v5e:2x4", "--compare", "ici_bogus=2"],
             "ici_bogus", "MaxDiffusion config keys")
    one_line(["plan", "wan2.1-t2v-1.3b@832x480x81/v5e:2x4", "--compare=--ulysses_size 3"],
             "ulysses_size", "world size")
    one_line(["plan", "wan2.1-t2v-1.3b@832x480x81/v5e:2x4", "--flags", "fast"], "'fast'",
             "maxdiffusion-ulysses")
    one_line(["plan", "wan2.1-t2v-1.3b@832x480x80/v5e:2x4"], "frames=80", "4n + 1")
    # Refused before any candidate is traced or compiled:
    one_line(["plan", case, "--layers", "0"], "num_layers=0", "between 1 and the model's 30")
    one_line(["plan", case, "--layers", "31"], "num_layers=31", "between 1 and the model's 30")
    one_line(["plan", case, "--budget", "-1"], "budget=-1", ">= 0")
    one_line(["plan", case, "--max-compiled", "0"], "max_compiled=0", "whole number >= 1")
    one_line(["plan", case, "--time-limit", "0"], "time_limit_s=0", "positive number of seconds")
    one_line(["plan", case, "--time-limit", "inf"], "time_limit_s=inf", "e.g. 300")
    one_line(["plan", case, "--full", "--time-limit", "60"], "--full with --time-limit 60",
             "give one of the two")
    one_line(["plan", case, "--json", str(tmp_path / "no" / "plan.json")], "does not exist")
    with pytest.raises(SystemExit) as exit_:
        main(["plan", case, "--draws", "1"])
    assert exit_.value.code == 2
    assert "'1': give 0 (no intervals) or a number of draws of at least 2" in (
        capsys.readouterr().err)
    # argparse's own refusals: usage plus one error line, status 2, no traceback.
    with pytest.raises(SystemExit) as exit_:
        main(["plan", case, "--layers", "two"])
    assert exit_.value.code == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err and err.strip().splitlines()[-1].startswith(
        "aoizora-lab plan: error: argument --layers: invalid int value: 'two'")


def test_cli_plans_within_the_default_time_limit_unless_told(monkeypatch):
    from aoizora_lab import planner
    from aoizora_lab.options import INTERACTIVE, INTERACTIVE_TIME_LIMIT_S

    asked = []

    from aoizora_lab.progress import enabled

    def stop(workload, topology, options):  # what the command asks plan() for, then out
        asked.append((options, enabled()))
        raise AoizoraError("stub")

    monkeypatch.setattr(planner, "plan", stop)
    case = "wan2.1-t2v-1.3b@832x480x81/v5e:2x4"
    for argv in ([], ["--full"], ["--time-limit", "60"], ["--no-systems"], ["--quiet"]):
        assert main(["plan", case, *argv]) == 2
    assert [(a.time_limit_s, a.systems) for a, _ in asked] == [
        (INTERACTIVE.time_limit_s, True), (None, True), (60, True),
        (INTERACTIVE.time_limit_s, False), (INTERACTIVE.time_limit_s, True)]
    # Each compile's line as it finishes, unless --quiet; the environment is left as it was.
    assert [lines for _, lines in asked] == [True, True, True, True, False]
    assert not enabled()
    assert INTERACTIVE.time_limit_s == INTERACTIVE_TIME_LIMIT_S > 0


@pytest.mark.parametrize(("case", "fragments"), [
    ("wan2.1-t2v-1.3b@832x480x81/v9:2x2", ["'v9:2x2'", GENERATION_LIST]),
    ("wan2.1-t2v-1.3b@100x100x81/v5e:2x4", ["100x100", "multiples of 16"]),
])
def test_cli_console_script_bad_arguments_exit_2_without_traceback(case, fragments):
    done = subprocess.run([sys.executable, "-m", "aoizora_lab.cli", "plan", case],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 2
    lines = [line for line in done.stderr.splitlines() if line.startswith("aoizora-lab")]
    assert len(lines) == 1 and lines[0].startswith("aoizora-lab: error:"), done.stderr
    assert all(f in lines[0] for f in fragments), lines[0]
    assert "Traceback" not in done.stderr and done.stdout == ""


# ---- 2. crash isolation: one sweep, every kind of failure ----------------------------------------

# A 1-layer model whose FFN is so wide that its weights (16 GiB in bf16) do not fit a 15.75 GiB
# v5e chip unless tensor parallelism splits them: a real deviceless OOM in a few seconds.
WIDE = az.WanConfig(dim=1024, ffn_dim=4 * 2**20, num_heads=8, num_layers=1, text_dim=64,
                    text_len=8, freq_dim=32)
WIDE_WORKLOAD = az.Workload(model=WIDE, height=32, width=32, frames=1, text_len=8)


class ShortTimeoutFor(cf.ThreadPoolExecutor):
    """A thread pool that gives one candidate's compile child ``seconds`` to finish and the
    others the sweep's ``timeout_s``, so a hung child is given up on quickly while the others
    compile at their own pace."""

    def __init__(self, candidate: str, seconds: float):
        super().__init__(max_workers=2)
        self.candidate, self.seconds = candidate, seconds

    def submit(self, fn, /, *args, **kwargs):
        job, cache_dir, timeout_s = args
        if job["candidate"] == self.candidate:
            timeout_s = self.seconds
        return super().submit(fn, job, cache_dir, timeout_s, **kwargs)


@pytest.mark.slow
def test_one_sweep_records_a_crash_a_hang_and_an_oom_and_finishes_the_rest(tmp_path,
                                                                           monkeypatch):
    topology = az.Topology.from_name("v5e:2x2", deviceless=True)
    names = ["cfg2-uly2", "uly2-tp2", "tp4", "cfg2-tp2"]
    candidates = [Candidate.from_name(n) for n in names]
    assert candidates[0].weight_bytes_per_device(WIDE) > 15.75 * 2**30  # replicated: too big
    monkeypatch.setenv("AOIZORA_LAB_ABORT_CANDIDATE", "uly2-tp2")
    monkeypatch.setenv("AOIZORA_LAB_HANG_CANDIDATE", "tp4")  # a real hang, whatever the speed
    with ShortTimeoutFor("tp4", 3) as pool:
        results = compile_candidates(candidates, WIDE_WORKLOAD, topology,
                                     cache_dir=tmp_path / "cache", executor=pool, timeout_s=300)
    by_name = {r.candidate.name: r for r in results}
    assert [r.candidate.name for r in results] == names  # one result per candidate, in order
    assert {n: r.status for n, r in by_name.items()} == {
        "cfg2-uly2": "oom", "uly2-tp2": "crash", "tp4": "timeout", "cfg2-tp2": "ok"}
    assert "RESOURCE_EXHAUSTED" in by_name["cfg2-uly2"].message
    assert "SIGABRT" in by_name["uly2-tp2"].message
    assert "3 s" in by_name["tp4"].message
    done = by_name["cfg2-tp2"]
    assert done.program is not None and done.program.total_bytes > 0
    assert 0 < done.memory["peak"] < 15.75 * 2**30 and "HloModule" in done.hlo_text
    for failed in ("cfg2-uly2", "uly2-tp2", "tp4"):
        assert by_name[failed].program is None and by_name[failed].hlo_path is None
    # The compiler's verdicts (ok, oom) are cached; the crash and the timeout are not, so the
    # next sweep retries them.
    entries = [read_entry(e) for e in (tmp_path / "cache").iterdir()
               if not e.name.startswith(".") and e.name != PROGRAMS]
    assert sorted(e["status"] for e in entries) == ["ok", "oom"]


# ---- 3. an interrupted sweep resumes -------------------------------------------------------------

PLAN_SCRIPT = textwrap.dedent("""
    import json, sys
    from pathlib import Path
    import aoizora_lab as az
    import aoizora_lab.planner as planner
    from aoizora_lab.options import PlanOptions

    cache, out = Path(sys.argv[1]), Path(sys.argv[2])
    model = az.WanConfig(dim=128, ffn_dim=256, num_heads=2, num_layers=2, text_dim=32,
                         text_len=8, freq_dim=32)
    workload = az.Workload(model=model, height=32, width=32, frames=5, text_len=8)
    topology = az.Topology.from_name("v5e:2x2", deviceless=True)
    # One flag set: a second would only repeat each compile (the kill needs some compiles).
    result = planner.plan(workload, topology, PlanOptions(
        keep=2, budget=200, flags=["default"], cache_dir=cache / "compile",
        ir_cache_dir=cache / "ir"))
    best = result.best
    out.write_text(json.dumps({
        "candidate": best.candidate.name, "order": list(best.placement.order),
        "description": best.placement.description, "total_s": best.predicted.total_s,
        "ranking": [[r.candidate.name, r.predicted.total_s] for r in result.ranking],
        "compiles": [{"candidate": r.candidate.name, "status": r.status, "cached": r.cached,
                      "entry": r.hlo_path.parent.name if r.hlo_path else None}
                     for r in [*result.compiled, *result.baseline_compiles]]}))
""")


def _entries(cache: Path) -> dict[str, int]:
    """Finished compile cache entries: name -> mtime of its meta.json (ns)."""
    folder = cache / "compile"
    if not folder.is_dir():
        return {}
    return {e.name: (e / "meta.json").stat().st_mtime_ns for e in folder.iterdir()
            if not e.name.startswith(".") and (e / "meta.json").exists()}


def _run_plan(cache: Path, out: Path, tmp: Path) -> subprocess.Popen:
    """Start PLAN_SCRIPT in its own process group; its stderr goes to ``<out>.log``."""
    tmp.mkdir(exist_ok=True)
    with open(out.with_suffix(".log"), "w") as log:
        return subprocess.Popen([sys.executable, "-c", PLAN_SCRIPT, str(cache), str(out)],
                                env={**os.environ, "TMPDIR": str(tmp)}, start_new_session=True,
                                stdout=subprocess.DEVNULL, stderr=log)


def _log(out: Path) -> str:
    return out.with_suffix(".log").read_text()[-3000:]


@pytest.mark.slow
def test_a_sweep_killed_midway_resumes_from_the_cache_with_the_same_result(tmp_path):
    fresh = _run_plan(tmp_path / "fresh", tmp_path / "fresh.json", tmp_path / "tmp")
    assert fresh.wait(timeout=600) == 0, _log(tmp_path / "fresh.json")
    reference = json.loads((tmp_path / "fresh.json").read_text())
    total = _entries(tmp_path / "fresh")
    assert len(total) >= 3 and all(not c["cached"] for c in reference["compiles"])

    cache = tmp_path / "resumed"
    run = _run_plan(cache, tmp_path / "killed.json", tmp_path / "tmp")
    deadline = time.monotonic() + 600
    while not _entries(cache) and run.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    os.killpg(run.pid, signal.SIGKILL)  # the sweep and its compile children, mid-compilation
    run.wait()
    finished = _entries(cache)
    assert 1 <= len(finished) < len(total), "killed too late to interrupt anything"
    assert not (tmp_path / "killed.json").exists()

    resumed = _run_plan(cache, tmp_path / "resumed.json", tmp_path / "tmp")
    assert resumed.wait(timeout=600) == 0, _log(tmp_path / "resumed.json")
    result = json.loads((tmp_path / "resumed.json").read_text())
    reused = {c["entry"] for c in result["compiles"] if c["cached"]}
    assert reused == set(finished)  # every finished compile was reused, and only those
    after = _entries(cache)
    assert {name: after[name] for name in finished} == finished  # untouched, not rewritten
    assert set(after) == set(total)  # the same compiles (same cache keys) as the fresh run
    for key in ("candidate", "order", "description", "ranking"):
        assert result[key] == reference[key], key
    assert result["total_s"] == pytest.approx(reference["total_s"], rel=1e-12)


# ---- 4. cache integrity -----------------------------------------------------------------------

HOST_CANDIDATE = "cfg2-uly4"


@pytest.fixture(scope="module")
def pristine(tmp_path_factory):
    """One compiled cache entry (TINY on 8 CPU host devices) to copy and damage."""
    cache = tmp_path_factory.mktemp("pristine")
    host = az.Topology.simulated((2, 4), devices=jax.devices()[:8])
    [result] = compile_candidates([Candidate.from_name(HOST_CANDIDATE, attention="blockwise")],
                                  WORKLOAD, host, cache_dir=cache)
    assert result.status == "ok" and not result.cached
    return result.hlo_path.parent, result


def _damage_meta(text):
    return lambda entry: (entry / "meta.json").write_text(text)


def _edit_meta(**changes):
    def edit(entry):
        meta = json.loads((entry / "meta.json").read_text())
        meta.update(changes)
        for key in [k for k, v in changes.items() if v is None]:
            del meta[key]
        (entry / "meta.json").write_text(json.dumps(meta))
    return edit


def _flip_hlo_byte(entry):
    data = bytearray((entry / "hlo.txt").read_bytes())
    data[len(data) // 2] ^= 1  # same length, one bit different
    (entry / "hlo.txt").write_bytes(bytes(data))


@pytest.mark.parametrize("damage", [
    _damage_meta(""), _damage_meta("{\"status\": \"ok\", "), _damage_meta("garbage"),
    _damage_meta("[1, 2]"), _damage_meta("\"ok\""), _damage_meta("null"),
    _edit_meta(status="crash"), _edit_meta(status=None), _edit_meta(hlo_sha256=None),
    _edit_meta(hlo_sha256=12), _edit_meta(memory="lots"), _edit_meta(compile_seconds="slow"),
    lambda entry: (entry / "hlo.txt").unlink(),
    lambda entry: (entry / "hlo.txt").write_text(""),
    _flip_hlo_byte,
], ids=["meta-empty", "meta-truncated", "meta-garbage", "meta-list", "meta-string",
        "meta-null", "status-crash", "status-missing", "checksum-missing", "checksum-number",
        "memory-garbage", "seconds-garbage", "hlo-missing", "hlo-empty", "hlo-bit-flip"])
def test_a_damaged_compile_entry_is_detected_and_discarded(pristine, tmp_path, damage):
    source, _ = pristine
    entry = tmp_path / source.name
    shutil.copytree(source, entry)
    assert read_entry(entry) is not None  # the copy itself is fine
    damage(entry)
    assert read_entry(entry) is None
    assert not entry.exists()  # discarded, so the next sweep recompiles it


def test_a_garbage_meta_file_is_recompiled_never_returned(pristine, tmp_path):
    source, first = pristine
    shutil.copytree(source, tmp_path / source.name)
    (tmp_path / source.name / "meta.json").write_text("{\"status\": \"ok\"}")  # no checksum
    host = az.Topology.simulated((2, 4), devices=jax.devices()[:8])
    [again] = compile_candidates([Candidate.from_name(HOST_CANDIDATE, attention="blockwise")],
                                 WORKLOAD, host, cache_dir=tmp_path)
    assert again.status == "ok" and not again.cached and again.program == first.program
    assert read_entry(tmp_path / source.name) is not None  # rewritten whole


def test_a_half_removed_entry_is_cleared_and_written_afresh(pristine, tmp_path):
    # Another process removing a damaged entry deletes meta.json first: the folder stays a while.
    source, first = pristine
    shutil.copytree(source, tmp_path / source.name)
    (tmp_path / source.name / "meta.json").unlink()
    host = az.Topology.simulated((2, 4), devices=jax.devices()[:8])
    [again] = compile_candidates([Candidate.from_name(HOST_CANDIDATE, attention="blockwise")],
                                 WORKLOAD, host, cache_dir=tmp_path)
    assert again.status == "ok" and not again.cached and again.program == first.program
    assert read_entry(tmp_path / source.name)["status"] == "ok"


def test_a_cache_that_cannot_be_written_is_a_status_not_a_crash(tmp_path, monkeypatch):
    def disk_full(*_):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr("aoizora_lab.compile.write_entry", disk_full)
    host = az.Topology.simulated((2, 4), devices=jax.devices()[:8])
    names = [HOST_CANDIDATE, "cfg2-ring4"]
    results = compile_candidates([Candidate.from_name(n, attention="blockwise") for n in names],
                                 WORKLOAD, host, cache_dir=tmp_path)
    assert [r.candidate.name for r in results] == names  # the sweep finished
    assert all(r.status == "error" and "No space left on device" in r.message for r in results)


def test_staging_left_by_a_killed_writer_is_swept_later(tmp_path):
    entry = tmp_path / "abc123"
    stale, live = tmp_path / ".abc123-killed", tmp_path / ".abc123-writing"
    for folder in (stale, live):
        folder.mkdir()
        (folder / "hlo.txt").write_text("partial")
    old = time.time() - STALE_STAGING_S - 60
    os.utime(stale, (old, old))
    write_entry(entry, {"status": "oom", "message": "RESOURCE_EXHAUSTED"}, tmp_path / "absent")
    assert not stale.exists()  # the killed writer's leftovers are gone
    assert live.exists()  # a young one may be another process mid-write
    assert read_entry(entry)["status"] == "oom"


CONCURRENT_SCRIPT = textwrap.dedent("""
    import json, sys
    import jax
    import aoizora_lab as az
    from aoizora_lab.candidates import Candidate
    from aoizora_lab.compile import compile_candidates

    model = az.WanConfig(dim=64, ffn_dim=128, num_heads=8, num_layers=2, text_dim=32,
                         text_len=8, freq_dim=32)
    workload = az.Workload(model=model, height=32, width=48, frames=5, text_len=8)
    host = az.Topology.simulated((2, 4), devices=jax.devices()[:8])
    names = ["cfg2-uly4", "uly2-ring2-tp2"]
    results = compile_candidates([Candidate.from_name(n, attention="blockwise") for n in names],
                                 workload, host, cache_dir=sys.argv[1])
    print(json.dumps([{"name": r.candidate.name, "status": r.status, "cached": r.cached,
                       "bytes": r.program.total_bytes if r.program else None,
                       "message": r.message[-500:]} for r in results]))
""")


@pytest.mark.slow
def test_two_processes_sharing_one_cache_both_finish_and_leave_it_whole(tmp_path):
    # Started together, both usually compile both candidates and race to rename their entries
    # into place (the loser keeps the winner's); whichever way it goes, nothing breaks.
    cache = tmp_path / "shared"
    runs = [subprocess.Popen([sys.executable, "-c", CONCURRENT_SCRIPT, str(cache)],
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
            for _ in range(2)]
    outputs = []
    for run in runs:
        out, err = run.communicate(timeout=600)
        assert run.returncode == 0, err[-3000:]
        outputs.append(json.loads(out.strip().splitlines()[-1]))
    for results in outputs:
        assert [r["status"] for r in results] == ["ok", "ok"], results
    assert [r["bytes"] for r in outputs[0]] == [r["bytes"] for r in outputs[1]]
    names = sorted(p.name for p in cache.iterdir() if p.name not in (HOST_MEMORY_FILE, PROGRAMS))
    assert len(names) == 2 and not any(n.startswith(".") for n in names)  # no staging left
    indexed = sorted(p.read_text() for p in (cache / PROGRAMS).iterdir()
                     if not p.name.endswith(".tmp"))
    assert indexed == names  # each program indexed once, to its entry
    assert (cache / HOST_MEMORY_FILE).is_file()  # the sweeps' memory, one record for both
    assert all(read_entry(cache / n)["status"] == "ok" for n in names)  # whole, reusable


@pytest.fixture()
def other_versions(monkeypatch):
    """Make ``importlib.metadata`` report other versions of the named packages (as a new
    process would see them after an upgrade: the versions read before are forgotten)."""
    from aoizora_lab.versions import library_versions

    real = importlib.metadata.version

    def pretend(**versions):
        monkeypatch.setattr(importlib.metadata, "version",
                            lambda package: versions.get(package) or real(package))
        library_versions.cache_clear()
    yield pretend
    library_versions.cache_clear()


def test_a_libtpu_or_jax_upgrade_never_reuses_old_compiles(pristine, tmp_path, other_versions):
    from aoizora_lab.compile import _job, cache_key

    source, _ = pristine
    shutil.copytree(source, tmp_path / source.name)
    host = az.Topology.simulated((2, 4), devices=jax.devices()[:8])
    candidate = Candidate.from_name(HOST_CANDIDATE, attention="blockwise")
    [same] = compile_candidates([candidate], WORKLOAD, host, cache_dir=tmp_path)
    assert same.cached  # the copied entry is valid for these versions
    keys = {}
    for package in ("libtpu", "jax", "jaxlib"):
        other_versions(**{package: "0.0.1+elsewhere"})
        keys[package] = cache_key(_job(candidate, WORKLOAD, host, None))
    assert len({*keys.values(), source.name}) == 4  # each upgrade is a different entry
    other_versions(libtpu="0.0.1+elsewhere")
    [upgraded] = compile_candidates([candidate], WORKLOAD, host, cache_dir=tmp_path)
    assert upgraded.status == "ok" and not upgraded.cached  # a miss: compiled afresh
    assert upgraded.hlo_path.parent.name == keys["libtpu"] != source.name
    other_versions()  # back to the installed versions: the old entry still serves them
    [back] = compile_candidates([candidate], WORKLOAD, host, cache_dir=tmp_path)
    assert back.cached and back.hlo_path.parent.name == source.name


def test_a_libtpu_or_jax_upgrade_never_reuses_old_ir_traces(tmp_path, other_versions):
    topology = az.Topology.simulated((2, 4))
    candidate = Candidate.from_name("cfg2-uly4")
    first = estimate_ir(candidate, WORKLOAD, topology, cache_dir=tmp_path)
    assert len(list(tmp_path.glob("*.json"))) == 1
    estimate_ir(candidate, WORKLOAD, topology, cache_dir=tmp_path)
    assert len(list(tmp_path.glob("*.json"))) == 1  # a hit
    for count, package in enumerate(("libtpu", "jax"), start=2):
        other_versions(**{package: "0.0.1+elsewhere"})
        again = estimate_ir(candidate, WORKLOAD, topology, cache_dir=tmp_path)
        assert len(list(tmp_path.glob("*.json"))) == count  # a miss: traced afresh
        assert again.collectives == first.collectives


@pytest.mark.parametrize("damage", [
    "[1, 2]", "\"counts\"", "17", "{}",
    lambda p: {**p, "flops": "many"},
    lambda p: {**p, "collectives": [{"kind": "all-gather"}]},
    lambda p: {**p, "collectives": [1]},
    lambda p: {**p, "trace_seconds": None},
], ids=["list", "string", "number", "empty", "flops-text", "collective-partial",
        "collective-number", "seconds-null"])
def test_a_damaged_ir_entry_is_retraced_never_returned(tmp_path, damage):
    topology = az.Topology.simulated((2, 4))
    candidate = Candidate.from_name("cfg2-uly4")
    fresh = estimate_ir(candidate, WORKLOAD, topology, cache_dir=tmp_path)
    [entry] = tmp_path.glob("*.json")
    payload = json.loads(entry.read_text())
    entry.write_text(damage if isinstance(damage, str) else json.dumps(damage(payload)))
    repaired = estimate_ir(candidate, WORKLOAD, topology, cache_dir=tmp_path)
    assert dataclasses.replace(repaired, trace_seconds=0) == dataclasses.replace(
        fresh, trace_seconds=0)
    assert json.loads(entry.read_text())["flops"] == payload["flops"]  # rewritten whole


# ---- 5. report runs ------------------------------------------------------------------------------


@pytest.mark.slow
def test_a_notebook_whose_kernel_dies_is_a_failed_row_and_the_rest_still_run(tmp_path):
    # A raising notebook is covered by test_reports.py; here the kernel process itself dies
    # (what a TPU compile that aborts inside a notebook does), after leaving stale pages behind.
    notebooks = tmp_path / "notebooks"
    notebooks.mkdir()
    shutil.copy(DATA / "heatmap.ipynb", notebooks / "heatmap.ipynb")
    nbformat.write(new_notebook(cells=[
        new_code_cell("from aoizora_lab.notebook import record\nrecord('before_death', 1)"),
        new_code_cell("import os, signal\nos.kill(os.getpid(), signal.SIGKILL)"),
        new_code_cell("print('never reached')"),
    ]), notebooks / "dies.ipynb")
    out = tmp_path / "reports"
    (out / "r").mkdir(parents=True)
    for stale in ("dies.html", "dies.ipynb"):
        (out / "r" / stale).write_text("STALE page of an earlier, successful run")
    result = run_reports([ReportSpec("r", ("dies", "heatmap"))], notebooks, out,
                         progress=False)
    index = write_index(result, out).read_text()
    dies, heatmap = result.runs
    assert (dies.status, heatmap.status) == ("failed", "ok") and result.failed == 1
    assert dies.error == "DeadKernelError: Kernel died"
    assert dies.records == {"before_death": 1}  # recorded before the kernel died
    partial = nbformat.read(dies.executed, as_version=4)
    assert partial.cells[-1].outputs == []  # never reached
    assert heatmap.page.exists() and heatmap.records["cells"] == 6  # the next one still ran
    for path in (dies.executed, dies.page):
        assert "STALE" not in path.read_text()  # never the old run's output
    assert "1 ok, 1 failed" in index
    assert "failed: <code>DeadKernelError: Kernel died</code>" in index
    assert 'href="r/dies.ipynb">partial notebook</a>' in index


@given(st.one_of(st.booleans(), st.floats(), st.text(max_size=3), st.integers(max_value=0),
                 st.none()))
def test_counts_that_are_not_positive_whole_numbers_are_refused(value):
    import numpy as np

    from aoizora_lab.errors import is_whole

    assert not is_whole(value)
    assert is_whole(np.int64(3)) and is_whole(0, minimum=0) and not is_whole(5, maximum=4)
