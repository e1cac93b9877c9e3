"""The results a warm plan reads back instead of recomputing (versions.memoized): computed
once per key, recomputed when the key, a damaged entry or the cache root says so, and equal
to what they stand for."""

import numpy as np
import pytest

import aoizora_lab as az
from aoizora_lab import codec, cost, placement, versions
from aoizora_lab.candidates import Candidate
from aoizora_lab.compile import CompileStatus
from aoizora_lab.hardware import device_spec
from aoizora_lab.hlo import CommProgram
from aoizora_lab.placement import rank_placements

CODE = "aoizora_lab.codec"
"""A module whose code the test values stand for."""


def _counting(value):
    calls = []

    def compute():
        calls.append(1)
        return value

    return compute, calls


def test_a_result_is_computed_once_per_key_and_read_back(tmp_path):
    with versions.cache_root_at(tmp_path):
        compute, calls = _counting({"answer": np.arange(3)})
        first = versions.memoized("kind", ("a", 1), compute, code=CODE)
        again = versions.memoized("kind", ("a", 1), compute, code=CODE)
        other = versions.memoized("kind", ("a", 2), compute, code=CODE)
    assert len(calls) == 2  # ("a", 1) once, ("a", 2) once
    assert np.array_equal(again["answer"], first["answer"]) and again is not first
    assert np.array_equal(other["answer"], first["answer"])
    assert len(list((tmp_path / "kind").glob("*.json"))) == 2


def test_a_damaged_entry_is_recomputed_and_replaced(tmp_path):
    with versions.cache_root_at(tmp_path):
        compute, calls = _counting([1, 2, 3])
        versions.memoized("kind", "key", compute, code=CODE)
        (entry,) = (tmp_path / "kind").glob("*.json")
        entry.write_bytes(b"not JSON")
        assert versions.memoized("kind", "key", compute, code=CODE) == [1, 2, 3]
        assert versions.memoized("kind", "key", compute, code=CODE) == [1, 2, 3]
    assert len(calls) == 2


def test_an_unwritable_cache_costs_time_not_the_result(tmp_path):
    blocked = tmp_path / "file"
    blocked.write_text("a file where the cache folder would go")
    with versions.cache_root_at(blocked):
        compute, calls = _counting("value")
        assert versions.memoized("kind", "key", compute, code=CODE) == "value"
        assert versions.memoized("kind", "key", compute, code=CODE) == "value"
    assert len(calls) == 2


def test_cache_root_at_restores_the_previous_root(tmp_path):
    before = versions.cache_root()
    with versions.cache_root_at(tmp_path) as root:
        assert versions.cache_root() == root == tmp_path
    assert versions.cache_root() == before


def test_fingerprint_follows_content_not_identity():
    def program(size):
        return CommProgram((az.Collective("all-gather", [[0, 1], [2, 3]], size, count=3),), 4)

    assert versions.fingerprint(program(8e6)) == versions.fingerprint(program(8e6))
    assert versions.fingerprint(program(8e6)) != versions.fingerprint(program(4e6))


def _mesh_program(topology):
    groups = az.mesh_axis_groups((2, topology.num_devices // 2), [1])
    return CommProgram((az.Collective("all-to-all", groups, 4e6, count=60),
                        az.Collective("all-gather", groups, 8e6, count=30)),
                       topology.num_devices)


def test_a_placement_ranking_is_searched_once_and_read_back_equal(tmp_path, monkeypatch):
    topology = az.Topology.simulated((2, 4), generation="v5e")
    program, candidate = _mesh_program(topology), Candidate.from_name("cfg2-uly4")
    with versions.cache_root_at(tmp_path):
        first = rank_placements(program, candidate, topology, budget=300)

        def no_search(*args, **kwargs):
            raise AssertionError("searched again although the ranking was kept")

        monkeypatch.setattr(placement, "search_placements", no_search)
        again = rank_placements(program, candidate, topology, budget=300)
        with pytest.raises(AssertionError, match="searched again"):
            rank_placements(program, candidate, topology, budget=301)  # another key
    assert [(r.placement.order, r.predicted) for r in again] == \
        [(r.placement.order, r.predicted) for r in first]


def test_a_kept_price_equals_a_fresh_one(tmp_path):
    topology = az.Topology.simulated((2, 4), generation="v5e")
    groups = az.mesh_axis_groups((2, topology.num_devices // 2), [1])
    program = CommProgram((*_mesh_program(topology).collectives,
                           az.Collective("all-reduce", groups, 2e6, count=10)),
                          topology.num_devices)
    order = tuple(int(i) for i in np.random.default_rng(0).permutation(topology.num_devices))
    chip = device_spec(topology)
    with versions.cache_root_at(tmp_path):
        cost.predict(program, topology, order)
        kept = cost._priced(program, topology, order, chip, None, None)  # read back
        assert len(list((tmp_path / "priced").glob("*.json"))) == 1
        # Another ICI model is another price, never the one kept for the default.
        totals = set()
        for model in az.comm_model.ORDER_MODELS:
            options = az.ModelOptions(order=model)
            predicted = cost.predict(program, topology, order, options=options)
            assert predicted == cost.Predicted(*_fresh_parts(program, topology, order, chip,
                                                             options))
            totals.add(predicted.total_s)
        assert len(totals) > 1  # the all-reduce's order matters to some models
        assert len(list((tmp_path / "priced").glob("*.json"))) == len(
            az.comm_model.ORDER_MODELS)  # the default is "compiler": stored once
    fresh = cost._price(program, topology, order, chip, None, az.ModelOptions())
    assert kept[1] == fresh[1] and kept[2] == fresh[2]  # time alone and exposed, each
    assert [p.seconds for p in kept[3]] == [p.seconds for p in fresh[3]]


def _fresh_parts(program, topology, order, chip, options):
    """(compute, comm, total) priced afresh, without the store."""
    compute = cost.compute_seconds(program, chip)
    _, alone, exposed, _ = cost._price(program, topology, order, chip, None, options)
    comm = sum(t * c.count for t, c in zip(alone, program.collectives, strict=True))
    return compute, comm, compute + sum(exposed)


def test_a_stored_value_comes_back_equal_with_its_types(tmp_path):
    program = _mesh_program(az.Topology.simulated((2, 4), generation="v5e"))
    value = {"program": program, ("a", 1): frozenset({(1, 2), (3,)}), "path": tmp_path,
             "source": placement.Source.STRUCTURED, "numbers": [np.float32(1.5), np.int64(3)],
             "status": CompileStatus.OOM,
             "array": np.arange(6, dtype=np.float32).reshape(2, 3), "nan": float("nan")}
    again = codec.loads(codec.dumps(value))
    assert again["program"] == program and isinstance(again["program"].collectives, tuple)
    assert again[("a", 1)] == value[("a", 1)] and again["path"] == tmp_path
    assert again["source"] is placement.Source.STRUCTURED
    assert again["status"] is CompileStatus.OOM  # a str enum stays an enum, not its word
    assert again["numbers"] == [1.5, 3] and np.isnan(again["nan"])
    assert again["array"].dtype == np.float32 and np.array_equal(again["array"], value["array"])
    assert codec.dumps(again) == codec.dumps(value)  # one text per value: fit for a key


def test_reading_a_stored_value_never_runs_code_it_names(tmp_path):
    for planted in ('{"dataclass": ["os:system", {"command": "touch /tmp/x"}]}',
                    '{"enum": ["subprocess:Popen", "ls"]}',
                    '{"ndarray": ["|O", [1], "AA=="]}'):
        with pytest.raises(ValueError):
            codec.loads(planted)
    with pytest.raises(TypeError, match="cannot store"):
        codec.dumps({"callable": print})
    with pytest.raises(TypeError, match="cannot store"):
        codec.dumps(np.array([object()]))
    # A cache entry another process planted is recomputed, never obeyed.
    with versions.cache_root_at(tmp_path):
        compute, calls = _counting("fresh")
        versions.memoized("kind", "key", compute, code=CODE)
        (entry,) = (tmp_path / "kind").glob("*.json")
        entry.write_text('{"dataclass": ["builtins:eval", {"source": "1"}]}')
        assert versions.memoized("kind", "key", compute, code=CODE) == "fresh"
    assert len(calls) == 2


def test_the_code_of_a_value_is_what_its_module_imports():
    cost_code = versions.code_closure("aoizora_lab.cost")
    assert {"aoizora_lab.cost", "aoizora_lab.comm_model", "aoizora_lab.hardware",
            "aoizora_lab.topology"} <= set(cost_code)
    assert "aoizora_lab.placement" not in cost_code  # placement imports cost, not the reverse
    assert set(cost_code) < set(versions.code_closure("aoizora_lab.placement"))
    # The compile's key covers the model code the child runs, not the cost model.
    compile_code = versions.code_closure("aoizora_lab.compile_worker")
    assert "aoizora_lab.models.wan" in compile_code
    assert "aoizora_lab.comm_model" not in compile_code
    # Imports under `if TYPE_CHECKING:` never run: compile.py names pandas there only.
    assert all(name.startswith("aoizora_lab") for name in compile_code)


def test_an_edit_of_an_imported_module_changes_the_key(tmp_path, monkeypatch):
    import shutil

    copy = tmp_path / "aoizora_lab"
    shutil.copytree(versions.PACKAGE_ROOT, copy, ignore=shutil.ignore_patterns("__pycache__"))
    monkeypatch.setattr(versions, "PACKAGE_ROOT", copy)
    versions.code_digest.cache_clear()
    versions.code_closure.cache_clear()
    try:
        before = versions.code_digest("aoizora_lab.cost")
        placement_before = versions.code_digest("aoizora_lab.placement")
        with (copy / "hardware.py").open("a") as source:
            source.write("\n# an edit\n")
        versions.code_digest.cache_clear()
        assert versions.code_digest("aoizora_lab.cost") != before  # cost imports hardware
        assert versions.code_digest("aoizora_lab.placement") != placement_before
        with (copy / "placement.py").open("a") as source:
            source.write("\n# an edit\n")
        after = versions.code_digest("aoizora_lab.cost")
        versions.code_digest.cache_clear()
        assert versions.code_digest("aoizora_lab.cost") == after  # cost does not import it
    finally:
        versions.code_digest.cache_clear()
        versions.code_closure.cache_clear()


def test_importing_and_using_the_package_leaves_the_environment_alone():
    import subprocess
    import sys

    script = (
        # jax's own start-up (cloud_tpu_init) sets TPU_SKIP_MDS_QUERY on a host without
        # chips as jax is imported: what the package does is measured from there.
        "import os, jax\n"
        "before = dict(os.environ)\n"
        "import aoizora_lab as az\n"
        "assert dict(os.environ) == before, set(os.environ.items()) ^ set(before.items())\n"
        "topology = az.Topology.from_name('v5e:2x4')\n"
        "assert dict(os.environ) == before, set(os.environ.items()) ^ set(before.items())\n"
        "print(topology.source)\n")
    env = {k: v for k, v in __import__("os").environ.items()
           if k not in ("TPU_SKIP_MDS_QUERY", "TPU_WORKER_HOSTNAMES",
                        "ALLOW_MULTIPLE_LIBTPU_LOAD")}
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          env=env, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip() in ("libtpu deviceless", "simulated")
