import math

import pytest
from tiny import TINY, WORKLOAD

import aoizora_lab as az
from aoizora_lab.candidates import enumerate_candidates
from aoizora_lab.prune import Pruning, Verdict, estimate_candidates, prune, pruned_as

CASES = [pytest.param(("wan2.1-t2v-14b", "720p", "v5e:4x4"), marks=pytest.mark.slow),  # 76 traces
         ("wan2.1-t2v-1.3b", "480p", "v5e:2x4")]


@pytest.fixture(scope="module", params=CASES, ids=lambda c: f"{c[0]}@{c[1]}-{c[2]}")
def swept(request):
    model, resolution, slice_name = request.param
    workload = az.Workload.preset(model, resolution)
    topology = az.Topology.from_name(slice_name)
    candidates = enumerate_candidates(workload, topology)
    estimates = estimate_candidates(candidates, workload, topology)
    return workload, topology, candidates, estimates


def test_pruning_keeps_a_minority_and_explains_every_row(swept):
    workload, topology, candidates, estimates = swept
    pruning = prune(candidates, workload, topology, estimates=estimates)
    table = pruning.to_frame()
    assert len(pruning) == len(table) == len(candidates)
    budget = max(3, len(candidates) // 4)
    assert 3 <= len(pruning.kept)
    ranked = [d for d in pruning if d.verdict not in (Verdict.OVER_HBM, Verdict.TRACE_FAILED)]
    # past the budget only ties with its last estimate (to 3 significant digits) are kept
    last = float(f"{ranked[min(budget, len(ranked)) - 1].estimate.estimate_seconds:.3g}")
    for d in [d for d in pruning if d.verdict.keep][budget:]:
        assert float(f"{d.estimate.estimate_seconds:.3g}") == last, d.reason
    fitting = [d for d in pruning if d.verdict is not Verdict.OVER_HBM]
    assert [d.verdict for d in fitting[:3]] == [Verdict.KEPT_BEST] * 3
    assert Verdict.KEPT_BEST not in {d.verdict for d in fitting[3:]}
    for decision in pruning:  # the verdict, the keep flag and the reason agree
        assert decision.verdict.keep == decision.reason.startswith("kept")
        assert decision.reason.startswith(decision.verdict.value.split(":")[0])
    assert set(table["verdict"]) <= {v.name.lower() for v in Verdict}
    assert Verdict.TRACE_FAILED not in {d.verdict for d in pruning}
    best = min(estimates, key=lambda n: estimates[n].estimate_seconds)
    def rounded(v):
        return float(f"{v:.3g}")

    # Best estimate first; ties (to 3 significant digits) by less communication.
    assert rounded(table.iloc[0]["estimate_s"]) == rounded(estimates[best].estimate_seconds)
    assert table.iloc[0]["keep"]
    first = table[table["estimate_s"].map(rounded) == rounded(table.iloc[0]["estimate_s"])]
    assert first["comm_estimate_s"].is_monotonic_increasing
    assert (table["lower_bound_s"] <= table["estimate_s"]).all()


def test_survivors_are_the_kept_candidates_best_estimate_first(swept):
    workload, topology, candidates, estimates = swept
    pruning = prune(candidates, workload, topology, estimates=estimates)
    kept = pruning.kept
    assert {c.name for c in kept} == {d.candidate.name for d in pruning if d.verdict.keep}
    keys = [(float(f"{estimates[c.name].estimate_seconds:.3g}"),
             estimates[c.name].comm_estimate_seconds) for c in kept]
    assert keys == sorted(keys)


def test_a_candidate_whose_weights_do_not_fit_is_dropped_for_memory():
    workload = az.Workload.preset("wan2.1-t2v-14b", "720p")
    topology = az.Topology.from_name("v5e:4x4")
    candidates = [az.candidates.Candidate.from_name(n)
                  for n in ("cfg2-uly8-fsdp", "cfg2-uly4-tp2", "cfg2-ctx8-fsdp", "cfg2-tp8")]
    decision = prune(candidates, workload, topology, keep=1).decision("cfg2-uly4-tp2")
    assert decision.verdict is Verdict.OVER_HBM and not decision.verdict.keep
    assert decision.reason.startswith("cannot fit: needs >= 16.")


def test_a_failed_trace_is_recorded_and_the_rest_go_on(swept):
    workload, topology, candidates, estimates = swept
    broken = dict(estimates)
    broken[candidates[0].name] = "RuntimeError: boom"
    pruning = prune(candidates, workload, topology, estimates=broken)
    decision = pruning.decision(candidates[0].name)
    assert decision.verdict is Verdict.TRACE_FAILED and decision.estimate is None
    assert decision.reason == "trace failed: RuntimeError: boom"
    assert pruning[-1] is decision  # failed traces rank last
    assert len(pruning.kept) >= 3


def test_bad_pruning_options_are_named(swept):
    workload, topology, candidates, estimates = swept
    with pytest.raises(az.AoizoraError, match="keep=0"):
        prune(candidates, workload, topology, keep=0, estimates=estimates)


def test_could_win_follows_the_lower_bound_not_the_estimate(swept):
    import dataclasses

    workload, topology, candidates, estimates = swept
    ranked = sorted(estimates, key=lambda n: estimates[n].estimate_seconds)
    best = estimates[ranked[0]].estimate_seconds
    # Three candidates of the middle given a lower bound no placement could beat.
    estimates = dict(estimates)
    for name in ranked[4:7]:
        estimates[name] = dataclasses.replace(estimates[name], lower_bound_seconds=2 * best)
    pruning = prune(candidates, workload, topology, estimates=estimates, keep=1,
                    estimate_margin=0.0)
    verdicts = {d.verdict for d in pruning}
    assert {Verdict.CANNOT_WIN, Verdict.UNLIKELY} <= verdicts  # both sides exercised
    for d in pruning:
        bound = d.estimate.lower_bound_seconds if d.estimate is not None else math.inf
        # Ruled out where it cannot fit, or the bound leaves no chance and it is not among
        # the kept best; an estimate far from the best (unlikely to win) still could.
        hopeless = d.verdict is Verdict.OVER_HBM or (not d.verdict.keep and bound > 1.25 * best)
        assert pruning.could_win(d.candidate) is not hopeless, d
        # A chunked Ulysses setup (never enumerated) is judged as its unchunked twin.
        if d.candidate.degree("ulysses") >= 2:
            chunked = dataclasses.replace(d.candidate, ulysses_chunks=2)
            assert chunked.name != d.candidate.name and pruned_as(chunked) == d.candidate
            assert pruning.decision_of(chunked) is d
            assert pruning.could_win(chunked) is not hopeless
    assert any(d.candidate.degree("ulysses") >= 2 for d in pruning)
    assert Pruning([]).could_win(pruning[0].candidate)  # one pruning never saw may


def test_when_every_trace_fails_the_table_is_whole_and_plan_says_why(monkeypatch):
    import jax

    from aoizora_lab.options import PlanOptions
    from aoizora_lab.planner import plan
    from aoizora_lab.prune import PRUNING_COLUMNS

    def broken(*_, **__):
        raise RuntimeError("boom")

    monkeypatch.setattr("aoizora_lab.prune.estimate_ir", broken)
    workload = WORKLOAD
    host = az.Topology.simulated((2, 4), devices=jax.devices()[:8])
    candidates = enumerate_candidates(workload, host)
    pruning = prune(candidates, workload, host, ir_cache_dir=False)
    table = pruning.to_frame()
    assert tuple(table.columns) == PRUNING_COLUMNS and len(table) == len(candidates)
    assert not pruning.kept and not table["keep"].any()
    assert {d.verdict for d in pruning} == {Verdict.TRACE_FAILED}
    assert (table["reason"] == "trace failed: RuntimeError: boom").all()
    with pytest.raises(az.AoizoraError, match=r"survived pruning: .*trace failed: RuntimeError"):
        plan(workload, host, PlanOptions(ir_cache_dir=False))


# -- each rule at its boundary, with synthetic estimates (no tracing)

def _estimate(name, estimate_s, bound_s=None, memory=0.0, comm_s=0.0):
    from aoizora_lab.ir_estimate import IREstimate

    bound_s = estimate_s / 2 if bound_s is None else bound_s
    return IREstimate(
        candidate=name, flops=0.0, hbm_bytes=0.0, param_bytes=0.0,
        largest_activation_bytes=0.0, memory_lower_bound_bytes=memory, comm_bytes=0.0,
        comm_bytes_by_axes={}, collectives=(), lower_bound_seconds=bound_s,
        compute_lower_bound_seconds=bound_s, comm_lower_bound_seconds=0.0,
        estimate_seconds=estimate_s, compute_estimate_seconds=estimate_s,
        comm_estimate_seconds=comm_s, trace_seconds=0.0, notes=())


@pytest.fixture(scope="module")
def eight():
    import jax

    workload = az.Workload(model=TINY, height=64, width=64, frames=5, text_len=8)
    host = az.Topology.simulated((2, 4), devices=jax.devices()[:8])
    return workload, host, enumerate_candidates(workload, host)


def _verdicts(eight, figures, **options):
    workload, host, candidates = eight
    chosen = candidates[:len(figures)]
    estimates = {c.name: _estimate(c.name, *f) for c, f in zip(chosen, figures, strict=True)}
    pruning = prune(chosen, workload, host, estimates=estimates, **options)
    return [pruning.decision(c.name).verdict for c in chosen]


def test_cannot_win_starts_just_above_the_bound_margin(eight):
    # best estimate 1.0; lower bounds at 1.25 x exactly, and just above
    verdicts = _verdicts(eight, [(1.0,), (1.05, 1.25), (1.05, 1.25 + 1e-9)], keep=1,
                         max_fraction=1.0)
    assert verdicts == [Verdict.KEPT_BEST, Verdict.KEPT, Verdict.CANNOT_WIN]


def test_unlikely_starts_just_above_the_estimate_margin(eight):
    verdicts = _verdicts(eight, [(1.0,), (1.1,), (1.1 + 1e-9,)], keep=1, max_fraction=1.0)
    assert verdicts == [Verdict.KEPT_BEST, Verdict.KEPT, Verdict.UNLIKELY]
    # a wider margin keeps the same candidate
    verdicts = _verdicts(eight, [(1.0,), (1.1,), (1.1 + 1e-9,)], keep=1, max_fraction=1.0,
                         estimate_margin=0.2)
    assert verdicts == [Verdict.KEPT_BEST, Verdict.KEPT, Verdict.KEPT]


def test_the_compile_budget_is_a_fraction_of_the_candidates(eight):
    # 8 candidates within every margin, no two equal to 3 significant digits; a quarter of 8
    # is 2, and keep=1
    figures = [(1.0 + i * 1e-2,) for i in range(8)]
    verdicts = _verdicts(eight, figures, keep=1, max_fraction=0.25)
    assert verdicts == [Verdict.KEPT_BEST, Verdict.KEPT] + [Verdict.OVER_BUDGET] * 6
    # the budget never falls below keep
    verdicts = _verdicts(eight, figures, keep=3, max_fraction=0.125)
    assert verdicts == [Verdict.KEPT_BEST] * 3 + [Verdict.OVER_BUDGET] * 5


def test_the_compile_budget_never_cuts_inside_a_tie(eight):
    # a quarter of 8 is 2; the 2nd to 4th estimates are equal to 3 significant digits (the
    # ranking puts less communication first), so the budget keeps all three
    figures = [(1.0,), (1.0501, 0.5, 0.0, 0.3), (1.0502, 0.5, 0.0, 0.1),
               (1.0499, 0.5, 0.0, 0.2), (1.06,), (1.07,), (1.08,), (1.09,)]
    verdicts = _verdicts(eight, figures, keep=1, max_fraction=0.25)
    assert verdicts == [Verdict.KEPT_BEST] + [Verdict.KEPT] * 3 + [Verdict.OVER_BUDGET] * 4
    workload, host, candidates = eight
    candidates = candidates[:len(figures)]
    estimates = {c.name: _estimate(c.name, *f) for c, f in zip(candidates, figures, strict=True)}
    pruning = prune(candidates, workload, host, estimates=estimates, keep=1, max_fraction=0.25)
    tied = [d for d in pruning if "tied with the last" in d.reason]
    # less communication ranks first: the 3rd, then the 4th and the 2nd past the budget
    assert [d.candidate.name for d in tied] == [candidates[3].name, candidates[1].name]
    # without the tie the same budget keeps two
    figures[1] = (1.04,)
    verdicts = _verdicts(eight, figures, keep=1, max_fraction=0.25)
    assert verdicts[:4] == [Verdict.KEPT_BEST, Verdict.KEPT, Verdict.OVER_BUDGET,
                            Verdict.OVER_BUDGET]


def test_the_best_estimates_are_kept_whatever_the_other_rules_say(eight):
    verdicts = _verdicts(eight, [(1.0,), (5.0, 4.0), (9.0, 8.0), (9.5, 9.0)], keep=3)
    assert verdicts == [Verdict.KEPT_BEST] * 3 + [Verdict.CANNOT_WIN]


def test_over_hbm_starts_one_byte_above_the_usable_memory(eight):
    usable = az.chip_spec("v5e").hbm_usable_bytes
    verdicts = _verdicts(eight, [(1.0, 0.5, usable), (0.5, 0.25, usable + 1)], keep=1,
                         max_fraction=1.0)
    assert verdicts == [Verdict.KEPT_BEST, Verdict.OVER_HBM]


def test_traces_in_worker_processes_are_cached_and_read_as_the_serial_ones(tmp_path,
                                                                           monkeypatch):
    from aoizora_lab import workers
    from aoizora_lab.ir_estimate import is_traced

    topology = az.Topology.from_name("v5e:2x4", deviceless=True)
    candidates = enumerate_candidates(WORKLOAD, topology)[::5]
    started = []
    run = workers.run_in_workers
    monkeypatch.setattr(workers, "usable_cpus", lambda: 2)
    monkeypatch.setattr(workers, "run_in_workers",
                        lambda f, calls, **kw: started.append(len(calls)) or run(f, calls, **kw))
    parallel = estimate_candidates(candidates, WORKLOAD, topology, ir_cache_dir=tmp_path)
    assert started == [len(candidates)]
    assert all(is_traced(c, WORKLOAD, cache_dir=tmp_path) for c in candidates)
    serial = estimate_candidates(candidates, WORKLOAD, topology, ir_cache_dir=False)
    assert started == [len(candidates)]  # no cache, no workers
    fields = ["flops", "comm_bytes", "lower_bound_seconds", "estimate_seconds"]
    assert [[getattr(parallel[c.name], f) for f in fields] for c in candidates] == [
        [getattr(serial[c.name], f) for f in fields] for c in candidates]


def test_the_other_expert_takes_hbm_from_the_step():
    # cfg2-tp4 at 720p on 8 v5e chips: 7 GiB of one expert's weights per device fits with its
    # activations; the other expert's 7 GiB more does not.
    topology = az.Topology.from_name("v5e:2x4")
    candidate = az.candidates.Candidate.from_name("cfg2-tp4")
    one = prune([candidate], az.Workload.parse("wan2.1-t2v-14b@720p"), topology)
    two = prune([candidate], az.Workload.parse("wan2.2-t2v-a14b@720p"), topology)
    one, two = one.decision("cfg2-tp4"), two.decision("cfg2-tp4")
    usable = az.hardware.device_spec(topology).hbm_usable_bytes
    # The same program (an A14B expert is 14B's shape), one more expert's weights resident.
    assert one.estimate.param_bytes == two.estimate.param_bytes
    assert one.estimate.memory_lower_bound_bytes <= usable
    assert one.estimate.memory_lower_bound_bytes + one.estimate.param_bytes > usable
    assert one.verdict is not Verdict.OVER_HBM and two.verdict is Verdict.OVER_HBM
    assert "2 resident experts" in two.reason
    # Swapping one expert through the host gives the step one expert's HBM again.
    swapped = prune([candidate], az.Workload.parse("wan2.2-t2v-a14b@720p-swap"), topology)
    assert swapped.decision("cfg2-tp4").verdict is one.verdict


def test_pruning_estimates_each_candidate_at_the_best_flag_set_the_plan_searches():
    import jax

    from aoizora_lab.options import PlanOptions

    # MaxDiffusion's best recipe on this slice is dp 2 x Ulysses 4; its flags make the
    # all-to-alls asynchronous, which libtpu's defaults do not.
    workload = az.Workload.preset("wan2.1-t2v-1.3b", "480p")
    topology = az.Topology.from_name("v5e:2x4")
    candidates = enumerate_candidates(workload, topology)
    searched = tuple(f.async_kinds for f in PlanOptions().flags_on(topology))
    assert frozenset({"all-to-all"}) in searched
    plain, flagged = (prune(candidates, workload, topology, flag_async=f)
                      for f in ((frozenset(),), searched))
    name = "cfg2-uly4-fsdpseq"
    before, after = plain.decision(name), flagged.decision(name)
    assert after.estimate.estimate_seconds < before.estimate.estimate_seconds
    assert "all-to-all" in after.estimate.async_kinds
    # Hidden under compute, its traffic (the least of any candidate's) ranks it among the
    # first; with the all-to-alls synchronous it was left past the compile budget.
    assert after.verdict.keep and not before.verdict.keep, (before.reason, after.reason)
    host = az.Topology.simulated((2, 4), devices=jax.devices()[:8])
    assert PlanOptions().flags_on(host) == PlanOptions().flags[:1]  # TPU flags mean nothing


def test_a_bad_flag_async_is_refused_before_any_trace(monkeypatch):
    import aoizora_lab.prune as prune_module

    def no_trace(*args, **kwargs):
        raise AssertionError("traced before the check")

    monkeypatch.setattr(prune_module, "warm_in_workers", no_trace)
    monkeypatch.setattr(prune_module, "estimate_ir", no_trace)
    topology = az.Topology.from_name("v5e:2x4")
    candidates = enumerate_candidates(WORKLOAD, topology)
    with pytest.raises(az.AoizoraError, match=r"flag_async=\('all-to-all',\)"):
        prune(candidates, WORKLOAD, topology, flag_async=("all-to-all",))
