"""The realised plan is what was scored: a plan compiled on its own mesh, in a device order
that is not the row-major one the compile sweep used, has the collectives (kind, logical
groups, bytes, runs, algorithm) and the predicted step the search priced (``Plan.verify``);
a program that differs is reported with each difference named (``compare_realised``)."""

import dataclasses
from types import SimpleNamespace

import numpy as np
import pytest
from tiny import WORKLOAD

import aoizora_lab as az
from aoizora_lab import planner
from aoizora_lab.baselines import Baselines, Headline
from aoizora_lab.candidates import Candidate
from aoizora_lab.cli import main
from aoizora_lab.comm_model import ModelOptions
from aoizora_lab.compile import Compiles, compile_candidates
from aoizora_lab.cost import Predicted, breakdown, predict
from aoizora_lab.hlo import CollectiveSite, CommProgram
from aoizora_lab.placement import Placement, RankedPlacement, Ranking, Source, rank_placements
from aoizora_lab.realize import Plan, compare_realised

CFG_ULY = Candidate.from_name("cfg2-uly4")


@pytest.fixture(scope="module")
def slice_():
    return az.Topology.from_name("v5e:2x4", deviceless=True)


@pytest.fixture(scope="module")
def swept(slice_, tmp_path_factory):
    """The compile sweep's programs (child processes, row-major device order), by name."""
    compiles = compile_candidates([CFG_ULY, Candidate.from_name("cfg2-uly4-fsdp")], WORKLOAD,
                                  slice_, cache_dir=tmp_path_factory.mktemp("compile"))
    assert [r.status for r in compiles] == ["ok", "ok"], compiles.to_frame().to_string()
    return {r.candidate.name: r.program for r in compiles}


def row_major(topology):
    return tuple(int(i) for i in topology.device_grid().ravel())


def scored_plan(topology, program, placement):
    """The plan as the planner builds it: priced by the ranking's own rule."""
    return Plan(WORKLOAD, topology, CFG_ULY, placement, predict(program, topology, placement),
                program)


@pytest.fixture(scope="module")
def snake(slice_, swept):
    """cfg2-uly4 on a snake: ulysses group 0 along physical row 0, group 1 back along row 1."""
    grid = slice_.device_grid()[..., 0]
    order = Placement(tuple(int(i) for i in np.concatenate([grid[0], grid[1][::-1]])), "snake")
    assert order.order not in (row_major(slice_), tuple(range(8)))
    plan = scored_plan(slice_, swept[CFG_ULY.name], order)
    return plan, plan.verify()


@pytest.mark.slow  # compiles in child processes and in-process
def test_a_snake_ordered_plan_compiles_to_what_was_scored(snake):
    plan, check = snake
    assert check.equal, check.to_frame().to_string()
    assert check.to_frame().empty and "is what was scored" in check.summary()
    assert check.scored is plan.program
    assert check.scored_predicted == check.realised_predicted == plan.predicted
    kinds = {c.kind for c in check.realised.collectives}
    assert {"all-to-all", "all-gather", "all-reduce", "collective-permute"} <= kinds


@pytest.mark.slow
def test_the_searchs_own_non_row_major_placements_compile_to_what_was_scored(slice_, swept):
    program = swept[CFG_ULY.name]
    ranking = rank_placements(program, CFG_ULY, slice_, budget=400)
    picks = [e for e in ranking if e.placement.order not in (row_major(slice_), tuple(range(8)))]
    assert picks, ranking.to_frame().to_string()
    for entry in picks:
        plan = Plan(WORKLOAD, slice_, CFG_ULY, entry.placement, entry.predicted, program)
        check = plan.verify()
        assert check.equal, (entry.placement, check.to_frame().to_string())
        assert check.realised_predicted == entry.predicted  # the ranking's own number


@pytest.mark.slow
def test_another_candidates_program_is_reported_with_the_differences_named(snake, swept):
    plan, check = snake
    other = compare_realised(plan, check.realised, scored=swept["cfg2-uly4-fsdp"])
    assert not other.equal and "DIFFERS" in other.summary()
    frame = other.to_frame()
    whats = set(frame["what"])
    assert {"missing", "time"} <= whats
    # FSDP gathers the weights over all 8 devices: the scored gathers the realised lacks.
    missing = [d for d in other.differences if d.what == "missing"]
    assert any(d.kind == "all-gather" and d.groups == (tuple(range(8)),) for d in missing)
    [time] = [d for d in other.differences if d.what == "time"]
    assert "total_s" in time.detail
    assert other.realised_predicted == check.realised_predicted
    assert other.scored_predicted.total_s > other.realised_predicted.total_s


@pytest.mark.slow
def test_plan_verify_prints_the_check_and_fails_on_a_difference(snake, swept, monkeypatch,
                                                                 capsys):
    plan, _ = snake

    def planned(scored):  # what plan() returns, as far as the command reads it
        best = dataclasses.replace(plan, program=scored, breakdown=breakdown(
            scored, plan.topology, plan.placement))
        ranking = Ranking([RankedPlacement(CFG_ULY, plan.placement, plan.predicted,
                                           Source.STRUCTURED)])
        return lambda *args, **kwargs: SimpleNamespace(ranking=ranking, best=best,
                                                       searched=best, baselines=Baselines(),
                                                       compiled=Compiles(),
                                                       headline=Headline(1.0),
                                                       model=ModelOptions())

    command = ["plan", "wan2.1-t2v-1.3b@832x480x81/v5e:2x4", "--quiet", "--verify",
               "--draws", "0"]
    monkeypatch.setattr(planner, "plan", planned(plan.program))
    assert main(command) == 0
    assert "compiled on its own mesh: The realised plan is what was scored" in (
        capsys.readouterr().out)
    monkeypatch.setattr(planner, "plan", planned(swept["cfg2-uly4-fsdp"]))
    assert main(command) == 1
    out = capsys.readouterr().out
    assert "DIFFERS" in out and "missing" in out and "all-gather" in out and "total_s" in out


def program(*collectives, sites=None):
    """A hand-made program over 8 logical devices: no compile needed."""
    return CommProgram(tuple(collectives), 8,
                       sites=sites or tuple(CollectiveSite((), "ring") for _ in collectives))


GATHER = az.Collective("all-gather", [[0, 1, 2, 3], [4, 5, 6, 7]], 4096.0, count=30)
SWAP = az.Collective("collective-permute", [(4, 0), (5, 1), (6, 2), (7, 3)], 2048.0)
SIMULATED = az.Topology.simulated((2, 4))


def plan_on(topology, scored, order=None):
    placement = Placement(order or tuple(range(8)), "test")
    return Plan(WORKLOAD, topology, CFG_ULY, placement, predict(scored, topology, placement),
                scored)


def test_the_same_collectives_in_any_order_of_groups_and_members_match():
    scored = program(GATHER, SWAP)
    reordered = program(
        dataclasses.replace(SWAP, groups=((7, 3), (4, 0), (6, 2), (5, 1))),
        dataclasses.replace(GATHER, groups=((7, 6, 5, 4), (3, 2, 1, 0)), name="renamed"))
    check = compare_realised(plan_on(SIMULATED, scored), reordered)
    assert check.equal, check.to_frame().to_string()


def test_changed_groups_bytes_runs_and_algorithm_are_each_named():
    scored = program(GATHER, SWAP)
    by_rows = dataclasses.replace(GATHER, groups=((0, 4), (1, 5), (2, 6), (3, 7)),
                                  bytes=2048.0)
    check = compare_realised(plan_on(SIMULATED, scored), program(
        by_rows, dataclasses.replace(SWAP, count=2)))
    rows = check.to_frame()
    assert rows[["what", "kind", "group_size", "num_groups", "count"]].values.tolist() == [
        ["missing", "all-gather", 4, 2, 30], ["extra", "all-gather", 2, 4, 30],
        ["missing", "collective-permute", 2, 4, 1], ["extra", "collective-permute", 2, 4, 2],
        ["time", "", 0, 0, 0]]
    assert set(rows["copies"]) == {1, 0}

    asynchronous = program(GATHER, SWAP, sites=(CollectiveSite((), "ring"),
                                               CollectiveSite((), "ring", asynchronous=True)))
    check = compare_realised(plan_on(SIMULATED, scored), asynchronous)
    [changed] = [d for d in check.differences if d.what != "time"]  # the schedule may move it
    assert (changed.what, changed.kind, changed.copies) == ("algorithm", "collective-permute", 1)
    assert changed.detail == "scored ring (sync); realised ring (async)"
    assert "1 algorithm" in check.summary()


def test_a_plan_without_a_scored_program_needs_one():
    placement = Placement(tuple(range(8)))
    loaded = Plan(WORKLOAD, SIMULATED, CFG_ULY, placement, Predicted(1.0, 0.1, 1.0))
    with pytest.raises(az.AoizoraError, match=r"scored=.*cfg2-uly4"):
        compare_realised(loaded, program(GATHER))
    assert compare_realised(loaded, program(GATHER), scored=program(GATHER)).equal
