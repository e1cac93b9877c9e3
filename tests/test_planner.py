import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from tiny import TINY, WORKLOAD, fake_plan_part

import aoizora_lab as az
from aoizora_lab.baselines import SYSTEMS, USER, Status
from aoizora_lab.compile import NotRun, NotRunReason
from aoizora_lab.hlo import parse_hlo
from aoizora_lab.jobs import OriginKind
from aoizora_lab.models.parallel import ParallelPlan
from aoizora_lab.models.wan import init_params
from aoizora_lab.options import PlanOptions
from aoizora_lab.placement import Placement, Source, plain_order
from aoizora_lab.planner import plan
from aoizora_lab.realize import Plan


@pytest.fixture(scope="module")
def planned():
    # The session's cache: test_measure plans the same workload and slice and reads these.
    topology = az.Topology.simulated((2, 4), devices=jax.devices()[:8])
    return plan(WORKLOAD, topology, PlanOptions(budget=400))


@pytest.mark.slow  # the planned fixture compiles in child processes
def test_a_quick_plan_compiles_the_best_estimates_only_and_no_system(planned, monkeypatch,
                                                                     capsys):
    quick = plan(WORKLOAD, planned.best.topology,
                 PlanOptions(budget=400, max_compiled=2, systems=False))
    assert quick.pruning.kept == planned.pruning.kept  # a budget of compiles, not of pruning
    assert [r.candidate.name for r in quick.compiled.ran] == [
        c.name for c in quick.pruning.kept[:2]]
    assert {r.candidate.name for r in quick.compiled.not_run} == {
        c.name for c in quick.pruning.kept[2:]}
    assert all(r.reason is NotRunReason.BUDGET and "max_compiled=2" in r.message
               for r in quick.compiled.not_run)
    assert not list(quick.baselines) and not list(quick.baseline_compiles)
    assert quick.headline.best_system == "" and np.isnan(quick.headline.vs_existing)
    # The best of fewer programs, placed by the same (deterministic) search.
    assert quick.best.predicted.total_s >= planned.searched.predicted.total_s - 1e-12
    with pytest.raises(az.AoizoraError, match="max_compiled=0"):
        PlanOptions(max_compiled=0)
    # The command line says why each survivor was left out, with or without a time limit.
    from aoizora_lab import cli, planner

    monkeypatch.setattr(planner, "plan", lambda *args, **kwargs: quick)
    for limit in ([], ["--full"]):
        assert cli.main(["plan", "wan2.1-t2v-1.3b@832x480x81/v5e:2x4", "--quiet", "--draws",
                         "0", "--no-systems", "--max-compiled", "2", *limit]) == 0
        out = capsys.readouterr().out
        assert (f"Not compiled, beyond the compile budget (--max-compiled) "
                f"({len(quick.compiled.not_run)} of {len(quick.compiled)};") in out
        assert "s limit" not in out


@pytest.mark.slow  # the planned fixture compiles in child processes
def test_a_time_limited_plan_compiles_its_first_round_and_names_what_it_left(planned,
                                                                              tmp_path):
    import concurrent.futures as cf

    topology = planned.best.topology
    limited = PlanOptions(budget=400, time_limit_s=1e-3, cache_dir=tmp_path,
                          compare="--ulysses_size 2 --ring_size 4")
    # Over before compiling; an empty compile cache, so the first compile takes time; one
    # compile at a time, so the first round is the best estimate alone.
    with cf.ThreadPoolExecutor(1) as one:
        timed = plan(WORKLOAD, topology, limited, executor=one)
    started = [r.candidate for r in timed.compiled.ran]
    left = timed.compiled.not_run
    assert started == timed.pruning.kept[:1]  # a plan needs a program
    assert [r.candidate for r in left] == timed.pruning.kept[1:]
    assert left and all(r.reason is NotRunReason.TIME_LIMIT and "time limit" in r.message
                        for r in left)
    # The systems share the limit: each priced on what compiled, naming the setups left out.
    outcomes = {o.name: o for o in timed.baselines}
    assert list(outcomes) == [*SYSTEMS, USER]
    yours = (outcomes[USER].candidate.name, outcomes[USER].plan.flags.label)
    compiled = {r.key for r in timed.compiled.ok} | {yours}
    for name in SYSTEMS:
        for trial in (t for t in outcomes[name].trials if t.setup is not None):
            if trial.recipe in outcomes[name].unstarted:
                assert "time limit" in trial.reason and np.isnan(trial.total_s)
            elif not trial.reason:  # compiled only as a survivor or as your setup
                assert (trial.setup.candidate.name, trial.setup.flags.label) in compiled
    partial = {n for n in SYSTEMS if outcomes[n].unstarted}
    assert partial and set(timed.headline.partial) == partial
    frame = timed.headline.to_frame()
    assert frame["against"].str.contains("partial: time limit").sum() >= len(partial)
    # A quick answer never claims a win it has not checked: where a setup left out could
    # still win, the headline is not known.
    unchecked = {n for n in partial if any(
        t.not_run is not None and timed.pruning.could_win(t.setup.candidate)
        for t in outcomes[n].trials if t.setup is not None)}
    assert unchecked and set(timed.headline.unchecked) == unchecked
    assert np.isnan(timed.headline.vs_existing)
    assert frame["against"].str.contains("not known within the time limit").any()
    assert all(isinstance(r, NotRun) for r in timed.baseline_compiles if r.key != yours)
    # Yours is compiled whatever the limit.
    assert outcomes[USER].status == Status.OK
    assert timed.best.predicted.total_s <= outcomes[USER].plan.predicted.total_s
    # Again on the cache it filled: what the first run started is read back and nothing
    # else starts, so the same compiles, none of them fresh, and the same answer at once.
    with cf.ThreadPoolExecutor(1) as one:
        again = plan(WORKLOAD, topology, limited, executor=one)
    assert ([(r.key, isinstance(r, NotRun)) for r in again.compiled]
            == [(r.key, isinstance(r, NotRun)) for r in timed.compiled])
    assert all(r.reason is NotRunReason.FIRST_RUN if isinstance(r, NotRun) else r.cached
               for r in [*again.compiled, *again.baseline_compiles])
    assert again.best.predicted.total_s == timed.best.predicted.total_s
    # A full search's compiles (the fixture's, in the default cache) are read past any limit.
    read = plan(WORKLOAD, topology, PlanOptions(budget=400, time_limit_s=1e-3))
    assert [r.key for r in read.compiled] == [r.key for r in planned.compiled]
    assert all(r.cached for r in read.compiled) and not read.headline.partial
    assert read.best.predicted.total_s == pytest.approx(planned.best.predicted.total_s)
    for bad in (0, -5, float("nan"), True):
        with pytest.raises(az.AoizoraError, match="time_limit_s="):
            PlanOptions(time_limit_s=bad)


@pytest.mark.slow  # the planned fixture compiles in child processes
def test_the_plan_is_never_predicted_slower_than_a_baseline(planned):
    outcomes = {b.name: b for b in planned.baselines}
    assert list(outcomes) == list(SYSTEMS)
    scored = planned.baselines.plans
    assert set(scored) == set(SYSTEMS)
    assert {outcomes[n].status for n in scored} == {Status.OK}
    # The systems' own orders came from their own rules, not from our search.
    assert outcomes["maxdiffusion-default"].placement.description.startswith(
        "mesh_utils.create_device_mesh")
    assert outcomes["xdit-usp"].placement.description.startswith("launch (rank) order")
    assert Source.LIBRARY in {r.source for r in planned.ranking}
    best = planned.best.predicted.total_s
    assert all(p.predicted.total_s >= best * (1 - 1e-12) for p in scored.values())
    totals = [r.predicted.total_s for r in planned.ranking]
    assert totals == sorted(totals)
    assert best == min(totals[0], *(p.predicted.total_s for p in scored.values()))
    # The search's own best: the best placement of a survivor's program.
    survivors = {r.key for r in planned.compiled.ok}
    own = next(r for r in planned.ranking if (r.candidate.name, r.flags.label) in survivors)
    assert planned.searched.predicted == own.predicted
    assert (planned.searched.candidate.name, planned.searched.flags.label) in survivors
    frame = planned.baselines.to_frame()
    assert list(frame["baseline"]) == list(SYSTEMS)  # the plan is never a row
    assert frame["speedup_of_plan"].dropna().ge(1 - 1e-12).all()
    assert planned.best.breakdown["seconds"].sum() == pytest.approx(
        az.estimate(planned.best.program, planned.best.topology,
                    planned.best.placement).seconds)


@pytest.mark.slow  # the planned fixture compiles in child processes
def test_the_plan_is_assessed_under_an_ensemble_and_printed_with_its_odds(planned, capsys,
                                                                         monkeypatch):
    import dataclasses

    from aoizora_lab import cli, planner
    from aoizora_lab.placement import Placement, library_orders
    from aoizora_lab.uncertainty import Ensemble, assess, price
    from aoizora_lab.uncertainty import odds as both

    ensemble = Ensemble(count=64, seed=3)
    assessment = assess(planned, ensemble)
    plan_label = f"{planned.searched.candidate.name} ({planned.searched.flags.label})"
    assert assessment.plan == plan_label
    mine = assessment.option(plan_label)
    # The plan's draws are its program on its placement under the ensemble.
    assert mine.steps == pytest.approx(price(planned.searched.program, planned.searched.topology,
                                             planned.searched.placement, ensemble))
    assert mine.point_s == pytest.approx(planned.searched.predicted.total_s)
    assert {o.system for o in assessment.odds} == set(planned.baselines.plans)
    # The plan's program in each library order that differs from its placement, as ours:
    # none where every library order is the plan's; one where the plan sits elsewhere.
    def library(searched):
        found = {}
        for order in library_orders(searched.candidate.mesh_shape,
                                    searched.candidate.axis_names, searched.topology):
            found.setdefault(order.order, order)  # the first library to give an order names it
        found.pop(searched.placement.order, None)
        return found

    for result in (planned, dataclasses.replace(planned, searched=dataclasses.replace(
            planned.searched, placement=Placement(tuple(reversed(range(8))), "reversed")))):
        sure = assess(result, ensemble) if result is not planned else assessment
        libraries = library(result.searched)
        in_orders = [o for o in sure if o.role == "order"]
        assert len(in_orders) == len(libraries) and all(o.ours for o in in_orders)
        for option in in_orders:
            [order] = [p for p in libraries.values() if option.label == f"{plan_label} on "
                       f"{p.description}"]
            assert option.steps == pytest.approx(price(result.searched.program,
                                                       result.searched.topology, order,
                                                       ensemble))
    assert in_orders  # the moved plan has plain order beside it
    for odds in assessment.odds:
        system = next(o for o in assessment if o.role == odds.system)
        # Each system's odds are the plan's draws against that system's own, draw by draw.
        assert (odds.probability, odds.speedup) == both(mine.steps, system.steps)
        assert odds.point == pytest.approx(planned.headline.systems[odds.system]
                                           / planned.headline.own_s)
        assert odds.speedup[0] <= odds.speedup[1] <= odds.speedup[2]
    frame = assessment.to_frame()
    assert (frame["low_s"] <= frame["median_s"]).all() and (
        frame["median_s"] <= frame["high_s"]).all()
    assert frame["robust"].sum() == 1 and frame["least_regret"].sum() == 1
    monkeypatch.setattr(planner, "plan", lambda *args, **kwargs: planned)
    assert cli.main(["plan", "wan2.1-t2v-1.3b@832x480x81/v5e:2x4", "--quiet",
                     "--draws", "32"]) == 0
    out = capsys.readouterr().out
    assert "How sure (the step under 32 draws" in out
    assert all(f"against {name}: P(plan faster) = " in out for name in planned.baselines.plans)
    # --whole: the text encoder and the decoder around the plan (their compiles faked here;
    # tests/test_parts.py compiles real ones).
    from aoizora_lab import generation

    monkeypatch.setattr(generation, "plan_part", fake_plan_part([0.25, 0.5])[0])
    assert cli.main(["plan", "wan2.1-t2v-1.3b@832x480x81/v5e:2x4", "--quiet", "--draws", "0",
                     "--whole", "--steps", "40"]) == 0
    out = capsys.readouterr().out
    whole = 0.25 + 40 * planned.best.predicted.total_s + 0.25
    assert "The whole video (40 steps; text encoder and VAE decoder" in out
    assert f"{whole:.4g} s" in out
    assert "The DiT's weights stay in HBM" in out and "no split fits" not in out


@pytest.mark.slow  # the planned fixture compiles in child processes
def test_a_search_whose_own_candidates_lose_says_so_and_recommends_the_system(planned,
                                                                            monkeypatch):
    import dataclasses

    import aoizora_lab.planner as planner
    from aoizora_lab.prune import Pruning, Verdict

    # The IR's worst candidate that fits, kept alone: a search that only has it.
    fits = [d for d in planned.pruning if d.estimate is not None
            and d.verdict is not Verdict.OVER_HBM]
    loser = fits[-1].candidate.name

    def only_the_loser(*args, **kwargs):
        decided = real_prune(*args, **kwargs)
        return Pruning(dataclasses.replace(d, verdict=Verdict.KEPT_BEST if d.candidate.name
                                           == loser else Verdict.UNLIKELY)
                       if d.verdict.keep or d.candidate.name == loser else d for d in decided)

    real_prune = planner.prune
    monkeypatch.setattr(planner, "prune", only_the_loser)
    alone = plan(WORKLOAD, planned.best.topology, PlanOptions(budget=400))
    head = alone.headline
    steps = {r.candidate.name: r.predicted.total_s for r in reversed(alone.ranking)}
    # Known from its compile: a system's setup beats it.
    assert steps[loser] > head.best_system_s * 1.001, (steps[loser], head.systems)
    assert [c.name for c in alone.pruning.kept] == [loser]
    assert alone.searched.candidate.name == loser
    assert alone.searched.predicted.total_s == pytest.approx(steps[loser])
    # The headline is the search against the systems: below 1, a system wins ...
    assert head.vs_existing == pytest.approx(head.best_system_s / steps[loser])
    assert head.vs_existing < 1
    # ... and the plan recommended is the faster setup, never the search's loser.
    assert alone.best.predicted.total_s <= head.best_system_s * (1 + 1e-12)
    assert alone.best.candidate.name != loser
    assert "recommended plan" in set(head.to_frame()["measures"])


@pytest.mark.slow
def test_realised_plans_compute_the_unsharded_step(planned):
    params = init_params(TINY, jax.random.key(0), std=0.2)
    inputs = WORKLOAD.random_inputs(jax.random.key(1))
    reference = jax.jit(lambda p, i: az.denoise_step(
        p, TINY, plan=ParallelPlan(attention="dense"), **i))(params, inputs)
    best = planned.best
    others = [r.placement for r in planned.ranking if r.candidate == best.candidate][:3]
    rng = np.random.default_rng(0)
    others.append(Placement(tuple(int(i) for i in rng.permutation(8)), "random"))
    for placement in [best.placement, *others]:
        realised = Plan(best.workload, best.topology, best.candidate, placement, best.predicted)
        out = realised.run(params, inputs)
        scale = float(jnp.abs(reference).max())
        assert float(jnp.abs(out - reference).max()) <= 2e-5 * scale, placement.description


@pytest.mark.slow
def test_plan_files_round_trip_and_reject_bad_edits(planned, tmp_path):
    path = tmp_path / "plan.json"
    planned.best.to_json(path)
    loaded = Plan.from_json(path, planned.best.topology)
    assert loaded.candidate.name == planned.best.candidate.name
    assert loaded.placement.order == planned.best.placement.order
    assert loaded.predicted == planned.best.predicted
    payload = json.loads(path.read_text())
    (tmp_path / "v2.json").write_text(json.dumps({**payload, "version": 2}))
    with pytest.raises(az.AoizoraError, match="schema version 2"):
        Plan.from_json(tmp_path / "v2.json", planned.best.topology)
    (tmp_path / "slice.json").write_text(json.dumps({**payload, "slice": "v5e:4x4"}))
    with pytest.raises(az.AoizoraError, match="'v5e:4x4', not 'v5e:2x4'"):
        Plan.from_json(tmp_path / "slice.json", planned.best.topology)
    edited = {**payload, "coords": [payload["coords"][0]] * len(payload["coords"])}
    (tmp_path / "edited.json").write_text(json.dumps(edited))
    with pytest.raises(az.AoizoraError, match="not a permutation"):
        Plan.from_json(tmp_path / "edited.json", planned.best.topology)


@pytest.mark.slow
def test_the_returned_plan_compiles_to_the_collectives_it_was_scored_with(planned):
    # The planner's wiring (candidate, placement, flags, program into one Plan); the realised
    # mesh in other device orders and on deviceless TPU slices: test_realised, the notebooks.
    best = planned.best
    compiled = best.compile()
    program = parse_hlo(compiled.as_text(), num_devices=best.candidate.num_devices)
    assert program.signature() == best.program.signature()
    key = ["kind", "bytes", "count", "group_size", "num_groups"]  # the same, through the frame
    assert sorted(map(tuple, program.to_frame()[key].to_numpy())) == sorted(
        map(tuple, best.program.to_frame()[key].to_numpy()))


def test_library_device_orders_that_refuse_a_mesh_are_skipped():
    from aoizora_lab.placement import library_orders

    # jax.make_mesh refuses a (2, 8) mesh on v6e:4x4; create_device_mesh splits axes instead.
    topology = az.Topology.from_name("v6e:4x4", deviceless=True)
    with pytest.raises(NotImplementedError):
        jax.make_mesh((2, 8), ("cfg", "ulysses"), devices=list(topology.devices))
    orders = library_orders((2, 8), ("cfg", "ulysses"), topology)
    assert [p.description for p in orders] == [
        "plain device order", "mesh_utils.create_device_mesh(allow_split_physical_axes=True)"]
    assert all(sorted(p.order) == list(range(16)) for p in orders)


def _replay(kept, by_key, topology, further, interleaved):
    """The compiles the flag rule asks for, in order, and the ones it spares with the best
    step priced before each decision: compiled again with the further flags exactly when
    the compute alone could still beat it."""
    from aoizora_lab.cost import predict

    def step(key):
        r = by_key[key]
        return predict(r.program, topology, plain_order(topology)) if r.status == "ok" else None

    best_s, expected, spared = np.inf, [], []
    firsts = [(c, 0) for c in kept]
    agains = [(c, 1) for c in kept]
    order = ([x for pair in zip(firsts, agains, strict=True) for x in pair] if interleaved
             else firsts + agains)
    for c, j in order:
        first = step((c.name, "default"))
        if j and first is not None and first.compute_s >= best_s:
            spared.append((c.name, best_s))
            continue
        expected.append((c.name, further.label if j else "default"))
        price = step(expected[-1])
        best_s = min(best_s, price.total_s if price else np.inf)
    return expected, spared


def test_a_time_limited_plan_runs_the_setups_that_could_win_before_further_survivors():
    from aoizora_lab.baselines import Setup, SystemSetups
    from aoizora_lab.candidates import explain_candidates
    from aoizora_lab.compile import CompiledCandidate, compiler_flags
    from aoizora_lab.jobs import Outcomes, Prices, TimeLimited, build_jobs, run_jobs

    topology = az.Topology.simulated((2, 4), devices=jax.devices()[:8])
    valid = list(explain_candidates(WORKLOAD, topology).valid)
    kept, others = valid[:4], valid[4:8]
    default, further = compiler_flags("default"), compiler_flags("maxdiffusion-ulysses")

    class Queue:  # the schedule alone: every compile "fails", so no flag set is spared
        width = 1

        def compile(self, candidate, flags):
            calls.append((candidate.name, flags.label))
            return CompiledCandidate(candidate, "error", "not compiled here", 0.0, flags=flags)

        def skip(self):
            skips.append(1)

        def cached(self, candidate, flags):
            return False

    def setup(candidate, system="a-system", flags=default):
        return Setup(system, candidate.name, candidate, Placement(tuple(range(8)), "plain"),
                     flags)

    def run(limit_s, setups, max_survivors=None):
        jobs = build_jobs(kept, [default, further], setups, lambda c, f: estimates[c.name],
                          lambda c: c != others[3])
        policy = TimeLimited(limit_s, topology, budget=10, top=1, max_survivors=max_survivors)
        outcomes = Outcomes()
        run_jobs(policy.rounds(jobs), policy, Queue(), Prices(topology), outcomes)
        assert {j.key for j in jobs} == set(outcomes.snapshot())  # every job has an outcome
        return jobs, outcomes.snapshot()

    estimates = {c.name: 1.0 + i for i, c in enumerate(kept)}  # kept[i]: 1, 2, 3, 4
    estimates.update({others[0].name: 0.5, others[1].name: 2.5, others[2].name: 9.0,
                      others[3].name: 2.7})
    setups = [SystemSetups("a-system", (), (setup(others[0]), setup(others[3]),
                                            setup(others[1]), setup(kept[3]))),
              SystemSetups(USER, (), (setup(others[2], USER),))]
    calls, skips = [], []
    jobs, outcomes = run(1e6, setups)

    def both(c):
        return [(c.name, default.label), (c.name, further.label)]

    # The first survivor, yours, the system's best estimate, then its other setups that could
    # win (the one that is also a survivor compiled once) before further survivors, the one
    # that cannot win where its estimate falls among them.
    assert calls == [*both(kept[0]), (others[2].name, "default"), (others[0].name, "default"),
                     (others[1].name, "default"), (kept[3].name, "default"),
                     *both(kept[1]), (others[3].name, "default"), *both(kept[2]),
                     (kept[3].name, further.label)]
    assert not skips  # built once each: nothing to skip
    shared = next(j for j in jobs if j.key == (kept[3].name, "default"))
    assert {o.kind for o in shared.origins} == {OriginKind.SURVIVOR, OriginKind.SYSTEM}
    # Past the limit after the first compile: yours still compiles, and a survivor whose
    # compile it is has it, though its own first compile was left out.
    yours = setup(kept[2], USER, further)
    calls, skips = [], []
    _, outcomes = run(1e-9, [SystemSetups(USER, (), (yours,))])
    assert calls == [(kept[0].name, "default"), (kept[2].name, further.label)]
    ran = {k: o for k, o in outcomes.items() if isinstance(o, CompiledCandidate)}
    assert set(ran) == {(kept[0].name, "default"), (kept[2].name, further.label)}
    assert {o.reason for k, o in outcomes.items() if k not in ran} == {
        NotRunReason.TIME_LIMIT}
    # A compile budget of two survivors: the others' compiles are not run, whatever the
    # limit, but a system's setup that is also a survivor is (the system runs it).
    calls, skips = [], []
    _, outcomes = run(1e6, setups, max_survivors=2)
    budget = {k for k, o in outcomes.items()
              if isinstance(o, NotRun) and o.reason is NotRunReason.BUDGET}
    assert budget == {*both(kept[2]), (kept[3].name, further.label)}
    assert not budget & set(calls) and (kept[3].name, "default") in calls


@pytest.mark.slow  # compiles in child processes
def test_further_flag_sets_compile_only_while_they_could_still_win(tmp_path):
    import concurrent.futures as cf

    from aoizora_lab.candidates import explain_candidates
    from aoizora_lab.compile import CompiledCandidate, CompileQueue, compiler_flags
    from aoizora_lab.cost import predict
    from aoizora_lab.jobs import FullSearch, Outcomes, Prices, TimeLimited, build_jobs, run_jobs
    from aoizora_lab.placement import plain_order

    topology = az.Topology.from_name("v5e:2x4")  # flags change TPU programs only
    kept = list(explain_candidates(WORKLOAD, topology).valid)[::4]  # every kind of split
    default, further = compiler_flags("default"), compiler_flags("maxdiffusion-ulysses")
    plain = plain_order(topology)

    class Recording(CompileQueue):
        def compile(self, candidate, flags):
            calls.append((candidate.name, flags.label))
            return super().compile(candidate, flags)

    # The full search compiles every first flag set before any further one; a time-limited
    # plan (a limit that never comes) each survivor's further flags after its own first.
    for policy in (FullSearch(), TimeLimited(1e6, topology, budget=10, top=1)):
        calls, prices, outcomes = [], Prices(topology), Outcomes()
        jobs = build_jobs(kept, [default, further], [], lambda c, f: np.nan)
        with cf.ThreadPoolExecutor(1) as one, Recording(  # one at a time: a fixed order
                WORKLOAD, topology, executor=one, cache_dir=tmp_path, describe=prices) as queue:
            run_jobs(policy.rounds(jobs), policy, queue, prices, outcomes)
        every = outcomes.snapshot()
        by_key = {k: o for k, o in every.items() if isinstance(o, CompiledCandidate)}
        skipped = [o for o in every.values() if isinstance(o, NotRun)]
        expected, spared = _replay(kept, by_key, topology, further,
                                   isinstance(policy, TimeLimited))
        assert calls == expected
        assert spared and len(spared) < len(kept)  # both sides of the rule are exercised
        assert [(s.candidate.name, s.best_s) for s in skipped] == spared
        assert all(s.reason is NotRunReason.CANNOT_WIN and s.compute_s >= s.best_s
                   and s.candidate.name in s.message and further.label in s.message
                   for s in skipped)
    # The progress lines' best step so far: the fastest of the results seen, in plain order.
    best_so_far, seen = Prices(topology), []
    for key in calls:
        r = by_key[key]
        text = best_so_far(r)
        if r.status == "ok":
            seen.append((predict(r.program, topology, plain).total_s, r))
        total, fastest = min(seen, key=lambda pair: pair[0])
        assert f"{fastest.candidate.name} ({fastest.flags.label} flags), {total:.4g} s" in text


@pytest.mark.slow  # compiles in child processes
def test_placement_searches_in_worker_processes_store_the_serial_rankings(tmp_path,
                                                                          monkeypatch):
    from aoizora_lab import planner, workers
    from aoizora_lab.candidates import explain_candidates
    from aoizora_lab.compile import compile_candidates
    from aoizora_lab.placement import is_ranked, rank_placements
    from aoizora_lab.versions import cache_root_at

    topology = az.Topology.from_name("v5e:2x4", deviceless=True)
    kept = list(explain_candidates(WORKLOAD, topology).valid)[::6]
    programs = compile_candidates(kept, WORKLOAD, topology, cache_dir=tmp_path / "compile").ok
    assert len(programs) > 2
    started = []
    run = workers.run_in_workers
    monkeypatch.setattr(workers, "usable_cpus", lambda: 2)
    monkeypatch.setattr(workers, "run_in_workers",
                        lambda f, calls, **kw: started.append(len(calls)) or run(f, calls, **kw))
    default = az.ModelOptions()  # the plan's model (PlanOptions.model)
    with cache_root_at(tmp_path / "parallel"):
        rankings = planner._rank_programs(programs, topology, 300, 3, WORKLOAD.name, default)
        assert started == [len(programs)]  # every search went to the workers ...
        assert all(is_ranked(r.program, r.candidate, topology, budget=300, top=3,
                             flags=r.flags) for r in programs)  # ... which stored them
        planner._rank_programs(programs, topology, 300, 3, WORKLOAD.name, default)
        assert started == [len(programs)]  # warm: no process started
    with cache_root_at(tmp_path / "serial"):
        serial = [rank_placements(r.program, r.candidate, topology, budget=300, top=3,
                                  flags=r.flags) for r in programs]
    assert [list(r) for r in rankings] == [list(r) for r in serial]


def test_the_planner_prunes_under_the_flag_sets_it_searches(monkeypatch):
    import aoizora_lab.planner as planner

    class Pruned(Exception):
        pass

    seen = {}

    def spy(*args, **kwargs):  # stop the plan once pruning is asked for: no compile
        seen.update(kwargs)
        raise Pruned

    monkeypatch.setattr(planner, "prune", spy)
    topology = az.Topology.from_name("v5e:2x4")
    options = PlanOptions(flags=("default", "maxdiffusion-ulysses"), ir_cache_dir=False)
    with pytest.raises(Pruned):
        plan(WORKLOAD, topology, options)
    assert seen["flag_async"] == options.flag_async(topology) == (
        frozenset(), frozenset({"all-to-all"}))


@pytest.mark.slow  # plans again on the compiles the planned fixture cached
def test_the_plans_model_options_price_everything_it_answers(planned):
    from aoizora_lab.comm_model import ModelOptions
    from aoizora_lab.cost import predict

    topology = planned.best.topology
    logical = ModelOptions(order="logical")  # every group's ring in its logical order
    result = plan(WORKLOAD, topology, PlanOptions(budget=400, model=logical))
    assert result.model == logical and planned.model == ModelOptions()

    def priced(p, options):
        return predict(p.program, topology, p.placement, options=options).total_s

    systems = list(result.baseline_plans.values())
    plans = [result.best, result.searched, *systems]
    assert all(p.predicted.total_s == priced(p, logical) for p in plans)
    # The option changes a system's price here, so one priced under the default would show.
    assert any(priced(p, logical) != priced(p, ModelOptions()) for p in systems)
    programs = result.programs
    assert all(e.predicted.total_s == predict(programs[e.candidate.name, e.flags.label],
                                              topology, e.placement, options=logical).total_s
               for e in result.ranking)
    assert result.headline.plain_s == predict(result.best.program, topology,
                                              plain_order(topology),
                                              options=logical).total_s
    in_plain = [predict(r.program, topology, plain_order(topology), options=logical).total_s
                for r in result.compiled.ok]
    assert result.headline.strategy_s == min(in_plain)
    with pytest.raises(az.AoizoraError, match=r"PlanOptions\(model='logical'\)"):
        PlanOptions(model="logical")
