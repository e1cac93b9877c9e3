"""How sure an answer is: ensembles of the cost model, priced draw by draw as one model."""

import dataclasses

import numpy as np
import pytest
from test_cost import CHIP, GROUPS, TOPOLOGY, _gather_done, _gather_start, _matmul, _module

import aoizora_lab as az
from aoizora_lab.comm_model import ModelOptions
from aoizora_lab.cost import Constants, predict
from aoizora_lab.errors import AoizoraError
from aoizora_lab.hardware import GENERATIONS, chip_spec
from aoizora_lab.hlo import parse_hlo
from aoizora_lab.uncertainty import (
    CHOICES,
    DEFAULT_KERNEL,
    KERNELS,
    SPREADS,
    Assessment,
    Ensemble,
    Option,
    Spread,
    odds,
    price,
    sources,
)

A2A = (f"  %a2a = bf16[1024,1024]{{1,0}} all-to-all(%a), channel_id=3, "
       f"replica_groups={GROUPS}, dimensions={{0}}")
ROOFLINE = ("  %plain = bf16[1024,1024]{1,0} fusion(%a, %a), kind=kOutput, calls=%fused_dot")
"""A matmul the compiler gave no estimate for: priced by the roofline in every model."""


def _program(window=2e-4, waits=0):
    """Two gathers in flight over a matmul, a synchronous all-to-all inside their window, a
    roofline matmul, then ``waits`` more synchronous all-to-alls."""
    lines = [_gather_start("ag1", "w", 1), _gather_start("ag2", "v", 2), A2A,
             _matmul("inside", window), ROOFLINE, _gather_done("ag1"), _gather_done("ag2")]
    lines += [A2A.replace("%a2a", f"%wait{i}").replace("channel_id=3", f"channel_id={9 + i}")
              for i in range(waits)]
    lines.append(_matmul("after", 1e-5, root=True))
    return parse_hlo(_module("\n".join(lines)))


def _draw(constants, index):
    return {f.name: float(np.ravel(getattr(constants, f.name))[index]
                          if np.ndim(getattr(constants, f.name)) else getattr(constants, f.name))
            for f in dataclasses.fields(Constants)}


@pytest.mark.parametrize("base", [None, ModelOptions(routing="dimension-order")])
@pytest.mark.parametrize("order", [None, np.random.default_rng(3).permutation(16)])
def test_ensemble_pricing_is_single_draw_pricing_draw_by_draw(order, base):
    program = _program()
    assert {op.op_class for op in program.ops} >= {"matmul"}
    assert any(not op.estimated_cycles for op in program.ops)  # the roofline op is priced
    ensemble = Ensemble(count=24, seed=5)
    steps = price(program, TOPOLOGY, order, ensemble, model=base)
    constants = ensemble.constants(TOPOLOGY)
    _, picks = ensemble.units()
    assert len(set(map(tuple, picks.tolist()))) == 4  # every combination of choices drawn
    for index in range(ensemble.count):
        drawn = _draw(constants, index)
        chip = CHIP.replace(**{k: v for k, v in drawn.items() if k != "overlap"})
        chosen = {c.name: c.values[i] for c, i in zip(CHOICES, picks[index], strict=True)}
        options = dataclasses.replace(base or ModelOptions(), order=chosen["order"],
                                      overlap=drawn["overlap"])  # the base's other options
        alone = predict(program, TOPOLOGY, order, chip=chip,
                        compute_model=chosen["compute_model"], options=options)
        assert steps[index] == pytest.approx(alone.total_s, rel=1e-9), (index, drawn, chosen)
    assert np.ptp(steps) > 0  # the draws really differ
    if base is not None and order is not None:  # scattered groups route differently:
        # the base model's options are kept, not reset
        assert not np.allclose(steps, price(program, TOPOLOGY, order, ensemble))


def test_the_die_to_die_path_is_drawn_on_tpu7x_and_priced_as_one_model():
    topology = az.Topology.simulated((2, 2, 1), generation="tpu7x")
    groups = [list(range(topology.num_devices))]
    program = az.hlo.CommProgram((az.Collective("all-gather", groups, bytes=64e6),),
                                 topology.num_devices)
    ensemble = Ensemble(count=12, seed=1)
    constants = ensemble.constants(topology)
    assert np.ptp(constants.intra_chip_bandwidth) > 0
    steps = price(program, topology, None, ensemble)
    _, picks = ensemble.units()
    for index in range(ensemble.count):
        drawn = _draw(constants, index)
        chip = chip_spec("tpu7x").replace(**{k: v for k, v in drawn.items()
                                             if k != "overlap"})
        order = CHOICES[1].values[picks[index, 1]]
        alone = predict(program, topology, None, chip=chip, options=ModelOptions(order=order))
        assert steps[index] == pytest.approx(alone.total_s, rel=1e-9)


def test_a_known_ranking_comes_out_near_certain():
    fast, slow = _program(), _program(waits=2)  # the same, and two more waits
    probability, (low, median, high) = odds(price(fast, TOPOLOGY, None),
                                            price(slow, TOPOLOGY, None))
    assert probability == 1.0
    assert 1 < low <= median <= high


def test_a_near_tie_comes_out_near_even():
    # One program is all attention (its time follows the drawn kernel efficiency), the other
    # one all-gather (its time follows the drawn links): sized so their medians meet.
    from aoizora_lab.hlo import CommProgram, ComputeOp

    attention = CommProgram((), 16, ops=(ComputeOp(flops=2e13, hbm_bytes=0.0, runs=1,
                                                   outer_trips=0, op_class="attention"),))
    ensemble = Ensemble(count=512, seed=2)
    compute = price(attention, TOPOLOGY, None, ensemble)
    unit = CommProgram((az.Collective("all-gather", [list(range(16))], bytes=1e8),), 16)
    link = price(unit, TOPOLOGY, None, ensemble)
    gather = CommProgram((az.Collective("all-gather", [list(range(16))],
                                        bytes=1e8 * np.median(compute) / np.median(link)),), 16)
    probability, (low, _, high) = odds(price(attention, TOPOLOGY, None, ensemble),
                                       price(gather, TOPOLOGY, None, ensemble))
    assert 0.4 < probability < 0.6
    assert low < 1 < high


def test_the_robust_choice_is_named_where_it_is_not_the_median_winner():
    rng = np.random.default_rng(0)
    wide = 1.0 + 0.3 * rng.standard_normal(256)
    narrow = np.full(256, 1.05) + 0.01 * rng.standard_normal(256)
    steady = Assessment([Option("wide", "search", 1.0, wide),
                         Option("narrow", "search", 1.05, narrow)], plan="wide")
    assert np.median(wide) < np.median(narrow)
    assert np.quantile(wide, 0.9) > np.quantile(narrow, 0.9)
    assert steady.median_winner == "wide" and steady.robust == "narrow" and steady.differs
    regret = steady.regrets()
    assert regret["narrow"] == pytest.approx(float((narrow - np.minimum(wide, narrow)).max()))
    frame = steady.to_frame()
    assert list(frame["label"]) == ["wide", "narrow"]  # fastest median first
    assert frame.set_index("label").loc["narrow", "robust"]
    assert steady.least_regret == min(regret, key=regret.get)
    # A table's top rows keep the marks chosen over every option.
    top = steady[:1].to_frame()
    assert list(top["label"]) == ["wide"] and not top["robust"].any()
    # The summary says what the robust choice trades against the plan, with the signs of the
    # two quantiles' differences; a plan that is the robust choice has no such line.
    [trade] = [line for line in steady.summary(TOPOLOGY) if "robust choice is not" in line]
    median = np.median(narrow) / np.median(wide) - 1
    high = np.quantile(narrow, 0.9) / np.quantile(wide, 0.9) - 1
    assert f"{median:+.1%} at the median" in trade and f"{high:+.1%} at the 90th" in trade
    assert median > 0 > high
    assert "bound the slow end" in trade
    robust_plan = Assessment(list(steady), plan="narrow")
    assert not any("robust choice is not" in line for line in robust_plan.summary(TOPOLOGY))
    # A plan the ensemble puts behind at the median as well: said so, not as a trade.
    behind = Assessment([Option("plan", "search", 1.0, wide + 0.2),
                         Option("narrow", "search", 1.05, narrow)], plan="plan")
    [line] = [line for line in behind.summary(TOPOLOGY) if "robust choice is not" in line]
    assert behind.tradeoff()[0] < 0 and "faster at the median too" in line


def test_a_placement_that_wins_under_one_order_model_is_not_the_robust_choice():
    # One all-gather over the 16 chips: under "compiler" its emitter maps any group order
    # onto its own ring, under "logical" it runs along the order, so a scrambled order pays
    # long hops in half the draws. The plan's program in plain order is ours to run.
    from aoizora_lab.hlo import CommProgram
    from aoizora_lab.placement import Placement, plain_order

    program = CommProgram((az.Collective("all-gather", [list(range(16))], bytes=6e7),), 16)
    scrambled = Placement(tuple(np.random.default_rng(5).permutation(16)), "scrambled")
    compiler, logical = (ModelOptions(order=o) for o in ("compiler", "logical"))
    assert predict(program, TOPOLOGY, scrambled, options=compiler).total_s == pytest.approx(
        predict(program, TOPOLOGY, plain_order(TOPOLOGY), options=compiler).total_s)
    assert predict(program, TOPOLOGY, scrambled, options=logical).total_s > 1.5 * predict(
        program, TOPOLOGY, plain_order(TOPOLOGY), options=logical).total_s
    ensemble = Ensemble(count=64, seed=1)
    plan = Option("plan (default)", "search", 1.0, price(program, TOPOLOGY, scrambled, ensemble))
    plain = Option("plan (default) on plain device order", "order", 1.0,
                   price(program, TOPOLOGY, plain_order(TOPOLOGY), ensemble))
    # A system faster still in every draw is compared with, never one of our choices.
    system = Option("maxdiffusion-best: x (default)", "maxdiffusion-best", 0.5,
                    plain.steps * 0.5)
    sure = Assessment([plan, plain, system], plan=plan.label, ensemble=ensemble)
    assert plain.ours and plan.ours and not system.ours
    assert plain.high_s < plan.high_s
    assert sure.robust == sure.least_regret == plain.label
    assert set(sure.regrets()) == {plan.label, plain.label}
    [trade] = [line for line in sure.summary(TOPOLOGY) if "robust choice is not" in line]
    assert plain.label in trade


def test_the_same_program_twice_is_an_even_tie():
    steps = price(_program(), TOPOLOGY, None, Ensemble(count=16))
    probability, speedup = odds(steps, steps.copy())
    assert probability == 0.5 and speedup == (1.0, 1.0, 1.0)


def test_the_drivers_name_what_moves_the_speedup_with_its_direction():
    from aoizora_lab.hlo import CommProgram, ComputeOp

    # The plan is all attention, the system all gather: the plan's speedup rises with the
    # kernel's efficiency and falls as the links get faster; memory-bound ops play no part.
    attention = CommProgram((), 16, ops=(ComputeOp(flops=2e13, hbm_bytes=0.0, runs=1,
                                                   outer_trips=0, op_class="attention"),))
    gather = CommProgram((az.Collective("all-gather", [list(range(16))], bytes=1e9),), 16)
    ensemble = Ensemble(count=256, seed=4)
    plan = price(attention, TOPOLOGY, None, ensemble)
    system = price(gather, TOPOLOGY, None, ensemble)
    sure = Assessment([Option("plan", "search", 1.0, plan),
                       Option("system: gather", "system", 1.0, system)], plan="plan",
                      ensemble=ensemble)
    drivers = sure.drivers(TOPOLOGY).set_index("name")
    assert drivers.loc["attention_efficiency", "effect"] > 0.5
    assert drivers.loc["ici_efficiency", "effect"] < 0
    assert drivers.loc["hbm_efficiency", "effect"] == pytest.approx(0.0, abs=0.2)
    assert drivers.loc["intra_chip_bandwidth", "effect"] == 0.0  # not drawn on v5e
    kinds = list(sure.drivers(TOPOLOGY)["kind"])
    assert kinds == sorted(kinds, key=lambda k: k != "constant")  # constants, then choices


def test_every_default_lies_in_its_spread_and_every_spread_names_a_source():
    for spread in SPREADS:
        assert len(spread.source) > 40, spread.name
        if spread.kernel not in ("", DEFAULT_KERNEL):  # the default is the splash kernel's
            continue
        for generation in spread.generations or GENERATIONS:
            default = chip_spec(generation, calibrated=False)
            value = getattr(default, spread.name, getattr(ModelOptions(), spread.name, None))
            scale = value if spread.relative else 1.0
            assert spread.low * scale <= value <= spread.high * scale, (spread.name, generation)
    frame = sources()
    assert set(frame["name"]) == {s.label for s in SPREADS} | {c.name for c in CHOICES}
    assert {s.kernel for s in SPREADS if s.name == "attention_efficiency"} == set(KERNELS)


def test_each_attention_kernel_draws_its_own_efficiency():
    ensemble = Ensemble(count=64)
    by_kernel = {k: ensemble.constants(TOPOLOGY, kernel=k) for k in KERNELS}
    spreads = {s.kernel: s for s in SPREADS if s.name == "attention_efficiency"}
    for kernel, constants in by_kernel.items():
        drawn = constants.attention_efficiency
        assert spreads[kernel].low <= drawn.min() and drawn.max() <= spreads[kernel].high
        # the other constants are the same draws whatever the kernel
        assert np.array_equal(constants.hbm_efficiency, by_kernel["splash"].hbm_efficiency)
    # independent draws: the kernels' efficiencies do not move together
    ranks = [np.argsort(np.argsort(by_kernel[k].attention_efficiency)) for k in KERNELS]
    assert abs(np.corrcoef(ranks[0], ranks[1])[0, 1]) < 0.5
    frame = ensemble.draws_frame(TOPOLOGY, kernel="tokamax")
    assert np.array_equal(frame["attention_efficiency"], by_kernel["tokamax"].attention_efficiency)
    with pytest.raises(AoizoraError, match=r"kernel='flash'.*splash"):
        ensemble.constants(TOPOLOGY, kernel="flash")
    with pytest.raises(AoizoraError, match="names its kernel"):
        Spread("attention_efficiency", 0.3, 0.4, source="x")
    with pytest.raises(AoizoraError, match="names its kernel"):
        Spread("hbm_efficiency", 0.3, 0.4, source="x", kernel="splash")


def test_a_calibrated_constant_is_known_and_not_drawn_even_at_its_default(
        _no_user_calibration):
    default = chip_spec("v5e", calibrated=False)
    # What measure.calibrate writes: the fitted efficiency beside the nominal bandwidth, and a
    # compute fit that came out at the default (clipped at 1).
    az.hardware.save_calibration("v5e", {"attention_efficiency": 0.61, "ici_efficiency": 0.889,
                                         "ici_link_bandwidth": default.ici_link_bandwidth,
                                         "matmul_efficiency": 1.0}, _no_user_calibration)
    constants = Ensemble(count=8).constants(TOPOLOGY)
    assert float(constants.attention_efficiency) == 0.61
    # It measured the programs' own kernel: a published run's other kernel is still drawn.
    assert np.ptp(Ensemble(count=8).constants(TOPOLOGY, kernel="tokamax")
                  .attention_efficiency) > 0
    assert float(constants.matmul_efficiency) == 1.0
    assert float(constants.link_rate) == pytest.approx(default.ici_link_bandwidth * 0.889)
    assert np.ptp(constants.ici_hop_latency) > 0 and np.ptp(constants.hbm_efficiency) > 0
    # An override beyond the file is known too; the rest is drawn.
    overridden = Ensemble(count=8).constants(TOPOLOGY, chip_spec("v5e", ici_hop_latency=2e-6))
    assert float(overridden.ici_hop_latency) == 2e-6 and np.ptp(overridden.hbm_efficiency) > 0


@pytest.mark.parametrize(("kwargs", "words"), [
    ({"count": 1}, "at least 2"),
    ({"spreads": (SPREADS[0], SPREADS[0])}, "spread twice"),
])
def test_bad_ensembles_are_refused_with_the_fix(kwargs, words):
    with pytest.raises(AoizoraError, match=words):
        Ensemble(**kwargs)


def test_a_system_a_time_limit_left_unchecked_is_not_known_in_the_summary():
    from aoizora_lab.uncertainty import Odds

    rng = np.random.default_rng(1)
    plan, system = 1.0 + 0.01 * rng.random(64), 2.0 + 0.01 * rng.random(64)
    sure = Assessment([Option("plan", "search", 1.0, plan), Option("s: x", "s", 2.0, system)],
                      plan="plan", odds=[Odds("s", 1.0, (1.9, 2.0, 2.1), 2.0, known=False)],
                      ensemble=Ensemble(count=64))
    [line] = [line for line in sure.summary(TOPOLOGY) if line.startswith("against s")]
    assert "not known within the time limit" in line and "faster in every draw" not in line
    assert not sure.odds_frame()["known"].iloc[0]
