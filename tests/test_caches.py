"""The results a warm plan reads back instead of recomputing (versions.memoized): computed
once per key, recomputed when the key, a damaged entry or the cache root says so, and equal
to what they stand for."""

import numpy as np
import pytest

import aoizora_lab as az
from aoizora_lab import cost, placement, versions
from aoizora_lab.candidates import Candidate
from aoizora_lab.hardware import device_spec
from aoizora_lab.hlo import CommProgram
from aoizora_lab.placement import rank_placements


def _counting(value):
    calls = []

    def compute():
        calls.append(1)
        return value

    return compute, calls


def test_a_result_is_computed_once_per_key_and_read_back(tmp_path):
    with versions.cache_root_at(tmp_path):
        compute, calls = _counting({"answer": np.arange(3)})
        first = versions.memoized("kind", ("a", 1), compute)
        again = versions.memoized("kind", ("a", 1), compute)
        other = versions.memoized("kind", ("a", 2), compute)
    assert len(calls) == 2  # ("a", 1) once, ("a", 2) once
    assert np.array_equal(again["answer"], first["answer"]) and again is not first
    assert np.array_equal(other["answer"], first["answer"])
    assert len(list((tmp_path / "kind").glob("*.pkl"))) == 2


def test_a_damaged_entry_is_recomputed_and_replaced(tmp_path):
    with versions.cache_root_at(tmp_path):
        compute, calls = _counting([1, 2, 3])
        versions.memoized("kind", "key", compute)
        (entry,) = (tmp_path / "kind").glob("*.pkl")
        entry.write_bytes(b"not a pickle")
        assert versions.memoized("kind", "key", compute) == [1, 2, 3]
        assert versions.memoized("kind", "key", compute) == [1, 2, 3]
    assert len(calls) == 2


def test_an_unwritable_cache_costs_time_not_the_result(tmp_path):
    blocked = tmp_path / "file"
    blocked.write_text("a file where the cache folder would go")
    with versions.cache_root_at(blocked):
        compute, calls = _counting("value")
        assert versions.memoized("kind", "key", compute) == "value"
        assert versions.memoized("kind", "key", compute) == "value"
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
        assert len(list((tmp_path / "priced").glob("*.pkl"))) == 1
        # Another ICI model is another price, never the one kept for the default.
        totals = set()
        for model in az.comm_model.ORDER_MODELS:
            options = az.ModelOptions(order=model)
            predicted = cost.predict(program, topology, order, options=options)
            assert predicted == cost.Predicted(*_fresh_parts(program, topology, order, chip,
                                                             options))
            totals.add(predicted.total_s)
        assert len(totals) > 1  # the all-reduce's order matters to some models
        assert len(list((tmp_path / "priced").glob("*.pkl"))) == len(
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
