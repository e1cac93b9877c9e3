"""A whole video's time: the parts add up, each part runs its fastest split that compiled,
the splits asked for follow the workload, and the CLI prints the breakdown."""

import dataclasses
import math

import jax
import pandas as pd
import pytest
from tiny import fake_plan_part, priced_part

from aoizora_lab import cli, generation, viz
from aoizora_lab.candidates import Candidate
from aoizora_lab.cases import parse_case
from aoizora_lab.comm_model import Collective
from aoizora_lab.cost import Predicted, predict
from aoizora_lab.errors import AoizoraError
from aoizora_lab.generation import Generation, plan_generation
from aoizora_lab.hardware import device_spec
from aoizora_lab.hlo import CommProgram
from aoizora_lab.models.wan import SAMPLING, param_leaves, sampling_timesteps
from aoizora_lab.parts import DecodePart, EncodePart, PricedParts, VideoEncodePart
from aoizora_lab.placement import Placement, plain_order
from aoizora_lab.realize import Plan
from aoizora_lab.topology import Topology
from aoizora_lab.workload import Workload

CASE = parse_case("wan2.1-t2v-14b@1280x720x81/v5e:2x4")


def _step(seconds=2.0, workload=CASE.workload):
    topology = Topology.simulated((2, 4), generation="v5e")
    return Plan(workload=workload, topology=topology,
                candidate=Candidate.from_name("cfg2-uly4-fsdp"), placement=plain_order(topology),
                predicted=Predicted(seconds * 0.8, seconds * 0.3, seconds))


def test_the_whole_video_is_encode_plus_steps_times_step_plus_decode(monkeypatch):
    fake, asked = fake_plan_part([0.5, math.nan, 0.2, 3.0, 1.5])
    monkeypatch.setattr(generation, "plan_part", fake)
    video = plan_generation(_step(2.0), steps=40)
    encodes, decodes = asked
    # With CFG both prompts are encoded; the decoder gets the guided latent of one video.
    assert all(isinstance(p, EncodePart) and p.prompts == 2 for p in encodes)
    assert all(isinstance(p, DecodePart) and p.latent == (1, *CASE.workload.latent_shape)
               for p in decodes)
    # Each part runs its fastest split that compiled (an OOM is no plan).
    assert video.encode_s == min(s for s in [0.5, math.nan, 0.2, 3.0, 1.5][:len(encodes)]
                                 if not math.isnan(s))
    assert video.steps_s == 40 * 2.0
    assert video.total_s == pytest.approx(video.encode_s + 80.0 + video.decode_s)
    frame = video.to_frame()
    assert list(frame["part"]) == ["text encoder", "DiT steps", "VAE decode"]
    assert frame["seconds"].sum() == pytest.approx(video.total_s)
    assert frame["share"].sum() == pytest.approx(1.0)
    assert frame.loc[1, "calls"] == 40 and frame.loc[1, "plan"].startswith("cfg2-uly4-fsdp")


def test_a_part_with_no_split_that_compiled_leaves_the_total_unknown():
    nothing = PricedParts([priced_part(EncodePart(), math.nan)])
    video = Generation(workload=CASE.workload, steps=50, expert_steps=(50, 0), step=_step(),
                       encode=nothing, decode=PricedParts([priced_part(DecodePart((1, 16, 21, 90,
                                                                               160)), 1.0)]))
    assert math.isnan(video.total_s)
    assert video.to_frame().loc[0, "plan"] == "none compiled"


@pytest.mark.parametrize("steps", [None, 20])
def test_a14b_runs_each_expert_for_its_share_of_the_steps(monkeypatch, steps):
    fake, _ = fake_plan_part([0.5, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0])
    monkeypatch.setattr(generation, "plan_part", fake)
    workload = Workload.parse("wan2.2-t2v-a14b@1280x720x81")
    video = plan_generation(_step(2.0, workload), steps=steps)
    sampling = SAMPLING["wan2.2-t2v-a14b"]
    assert video.steps == (steps or sampling.steps)
    high, low = video.expert_steps
    timesteps = sampling_timesteps(video.steps, sampling.shift)
    assert high == (timesteps >= sampling.boundary * 1000).sum() and high + low == video.steps
    frame = video.to_frame().set_index("part")
    assert frame.loc["DiT steps (high-noise expert)", "calls"] == high
    assert frame.loc["DiT steps (low-noise expert)", "calls"] == low
    assert video.steps_s == pytest.approx(video.steps * 2.0)
    assert frame["seconds"].sum() == pytest.approx(video.total_s)


def test_swapping_the_experts_moves_each_devices_shard_twice_over_pcie(monkeypatch):
    fake, _ = fake_plan_part([1.0] * 8)
    monkeypatch.setattr(generation, "plan_part", fake)
    a14b = plan_generation(_step(2.0, Workload.parse("wan2.2-t2v-a14b@1280x720x81")))
    expert = a14b.workload.config()
    shard = a14b.step.candidate.weight_bytes_per_device(expert)
    # An FSDP plan holds a shard of the expert's bfloat16 weights per device, not all of them.
    total = sum(math.prod(leaf[0]) * 2 for leaf in jax.tree.leaves(
        param_leaves(expert), is_leaf=lambda n: isinstance(n, tuple) and len(n) == 3
        and isinstance(n[0], tuple)))
    assert a14b.expert_bytes_per_device == shard and total / 8 <= shard < total
    assert a14b.expert_swap_s == pytest.approx(2 * shard / generation.HOST_TO_HBM_BYTES_PER_S)
    assert a14b.total_s == pytest.approx(a14b.encode_s + a14b.steps_s + a14b.decode_s)
    single = plan_generation(_step(2.0))  # one model: nothing to swap
    assert single.expert_bytes_per_device == 0 and single.expert_swap_s == 0
    # A swapping workload pays the two moves in its video, as a part between steps and decode.
    swapped = plan_generation(_step(2.0, Workload.parse("wan2.2-t2v-a14b@1280x720x81-swap")))
    assert swapped.swaps_s == swapped.expert_swap_s == a14b.expert_swap_s > 0
    assert swapped.total_s == pytest.approx(a14b.total_s + swapped.expert_swap_s)
    frame = swapped.to_frame()
    assert list(frame["part"])[-2:] == ["expert swaps (host -> HBM)", "VAE decode"]
    assert frame["seconds"].sum() == pytest.approx(swapped.total_s)
    assert frame.set_index("part").loc["expert swaps (host -> HBM)", "calls"] == 2
    # Two steps on T2V-A14B's schedule never reach the low-noise expert: nothing to swap.
    short = plan_generation(_step(2.0, swapped.workload), steps=2)
    assert short.expert_steps[1] == 0 and short.swaps_s == 0
    assert "expert swaps (host -> HBM)" not in set(short.to_frame()["part"])


def test_the_decoder_is_the_models_vae(monkeypatch):
    fake, asked = fake_plan_part([1.0] * 8)
    monkeypatch.setattr(generation, "plan_part", fake)
    workload = Workload.parse("wan2.2-ti2v-5b@1280x704x121")
    video = plan_generation(_step(1.0, workload))
    decodes, encodes = asked[1], asked[2]
    assert {p.vae for p in decodes} == {"wan2.2"}
    assert all(p.latent == (1, *workload.latent_shape) for p in decodes)
    assert video.steps == SAMPLING["wan2.2-ti2v-5b"].steps and video.expert_steps[1] == 0
    # TI2V-5B encodes its image alone through the same VAE: a latent of one frame.
    _, channels, _, h, w = decodes[0].latent
    assert encodes and all(type(p) is VideoEncodePart and p.vae == "wan2.2"
                           and p.latent == (1, channels, 1, h, w) for p in encodes)
    assert video.video_encode_s == 1.0
    assert "VAE encode (image condition)" in set(video.to_frame()["part"])


@pytest.mark.parametrize("model", ["wan2.1-i2v-14b", "wan2.2-i2v-a14b"])
def test_image_to_video_encodes_its_condition_video_once(monkeypatch, model):
    seconds = [0.5, math.nan, 2.0, 0.4, 0.25, 0.3]  # each call prices its splits in order
    fake, asked = fake_plan_part(seconds)
    monkeypatch.setattr(generation, "plan_part", fake)
    workload = Workload.parse(f"{model}@1280x720x81")
    video = plan_generation(_step(2.0, workload))
    _, _, video_encodes = asked
    # The condition video makes a latent of the DiT's shape: encoded in latent tiles.
    assert video_encodes and all(type(p) is VideoEncodePart for p in video_encodes)
    assert all(p.latent == (1, *workload.latent_shape) for p in video_encodes)
    assert video.video_encode_s == min(s for s in seconds[:len(video_encodes)]
                                       if not math.isnan(s))
    assert video.total_s == pytest.approx(video.encode_s + video.video_encode_s
                                          + video.steps_s + video.decode_s)
    frame = video.to_frame()
    assert list(frame["part"])[:2] == ["text encoder", "VAE encode (image condition)"]
    assert list(frame["part"])[-1] == "VAE decode"
    assert frame["seconds"].sum() == pytest.approx(video.total_s)
    # A text-to-video generation has none.
    t2v = plan_generation(_step(2.0))
    assert t2v.video_encode_s == 0 and "VAE encode (image condition)" not in set(
        t2v.to_frame()["part"])


def test_steps_must_be_a_positive_count():
    with pytest.raises(AoizoraError, match=r"steps=0 must be a positive number.*50"):
        plan_generation(_step(), steps=0)


def test_the_cli_wants_whole_for_steps(capsys):
    assert cli.main(["plan", "wan2.1-t2v-14b@1280x720x81/v5e:2x4", "--steps", "40"]) == 2
    assert "add --whole" in capsys.readouterr().err


def test_the_chart_shows_each_part_in_running_order_with_its_share(monkeypatch):
    fake, _ = fake_plan_part([0.5, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0])
    monkeypatch.setattr(generation, "plan_part", fake)
    video = plan_generation(_step(2.0, Workload.parse("wan2.2-t2v-a14b@1280x720x81")))
    frame = video.to_frame()
    fig = viz.generation_chart(frame)
    bar = fig.data[0]
    assert list(bar.y) == list(frame["part"])  # encoder, both experts' steps, decoder
    assert list(fig.layout.yaxis.categoryarray) == list(frame["part"])[::-1]  # first on top
    assert sum(bar.x) == pytest.approx(video.total_s)  # seconds (the largest bar is >= 1 s)
    assert list(bar.text) == [f"{s:.0%}" for s in frame["share"]]
    colors = dict(zip(bar.y, bar.marker.color, strict=True))
    assert colors["DiT steps (high-noise expert)"] == colors["DiT steps (low-noise expert)"]
    assert colors["text encoder"] != colors["VAE decode"]
    with pytest.raises(AoizoraError,
                       match=r"generation_chart needs columns \['share'\].*Generation.to_frame"):
        viz.generation_chart(frame.drop(columns=["share"]))


def _weight_bytes(workload):
    """Every weight of one expert, bfloat16 (what a plan without weight sharding holds)."""
    return sum(math.prod(leaf[0]) * 2 for leaf in jax.tree.leaves(
        param_leaves(workload.config()), is_leaf=lambda n: isinstance(n, tuple) and len(n) == 3
        and isinstance(n[0], tuple)))


def test_the_dits_resident_weights_count_every_resident_expert():
    resident = Workload.parse("wan2.2-t2v-a14b@1280x720x81")
    step = dataclasses.replace(_step(2.0, resident), candidate=Candidate.from_name("cfg2-uly4"))
    video = Generation(workload=resident, steps=40, expert_steps=(26, 14), step=step,
                       encode=PricedParts(), decode=PricedParts())
    assert video.resident_bytes == pytest.approx(2 * _weight_bytes(resident))  # both experts
    swapped = Workload.parse("wan2.2-t2v-a14b@1280x720x81-swap")
    assert dataclasses.replace(video, workload=swapped).resident_bytes == pytest.approx(
        _weight_bytes(swapped))


def test_a_part_runs_its_fastest_split_that_fits_beside_the_dits_weights():
    step = _step(2.0)
    latent = (1, *CASE.workload.latent_shape)
    fast, slow = (DecodePart(latent, rows=2, cols=4), DecodePart(latent, rows=1, cols=8))
    video = Generation(workload=CASE.workload, steps=50, expert_steps=(50, 0), step=step,
                       encode=PricedParts(), decode=PricedParts())
    usable = device_spec(step.topology).hbm_usable_bytes
    room = usable - video.resident_bytes
    assert room > 0
    too_big = dataclasses.replace(priced_part(fast, 1.0), hbm_bytes=room + 2**20)
    fitting = dataclasses.replace(priced_part(slow, 1.5), hbm_bytes=room - 2**20)
    video = dataclasses.replace(video, decode=PricedParts([too_big, fitting]))
    assert not video.fits(too_big) and video.fits(fitting)
    assert video.decode.best is too_big  # the fastest that compiled ...
    assert video.chosen(video.decode) is fitting and video.decode_s == 1.5  # ... does not run
    row = video.to_frame().set_index("part").loc["VAE decode"]
    assert row["plan"] == slow.name and bool(row["fits"])
    assert row["hbm_with_dit_gib"] == pytest.approx(
        (fitting.hbm_bytes + video.resident_bytes) / 2**30)
    # Where no split fits, the fastest is shown, marked as not fitting.
    alone = dataclasses.replace(video, decode=PricedParts([too_big]))
    assert alone.chosen(alone.decode) is too_big and alone.decode_s == 1.0
    assert alone.to_frame().set_index("part").loc["VAE decode", "fits"] == False  # noqa: E712
    # A peak the compiler did not report is unknown, not too big: it may run.
    unknown = dataclasses.replace(too_big, hbm_bytes=math.nan)
    blind = dataclasses.replace(video, decode=PricedParts([unknown, fitting]))
    assert blind.fits(unknown) is None and blind.chosen(blind.decode) is unknown
    assert blind.to_frame().set_index("part").loc["VAE decode", "fits"] is pd.NA


@pytest.mark.parametrize("theirs_s", [0.1, 0.5])
def test_maxdiffusions_vae_compiles_beside_the_splits_and_runs_where_it_is_fastest(
        monkeypatch, theirs_s):
    # Each call prices its parts in turn: the decoder's four splits, then MaxDiffusion's.
    fake, asked = fake_plan_part([0.3, 0.2, 0.25, 0.4, theirs_s])
    monkeypatch.setattr(generation, "plan_part", fake)
    video = plan_generation(_step(2.0), steps=40)
    decodes = asked[1]
    maxdiffusion = generation.maxdiffusion_vae_parts(CASE.workload, _step().topology)["decode"]
    assert (maxdiffusion.rows, maxdiffusion.cols, maxdiffusion.chunk) == (1, 8, 1)
    assert decodes.count(maxdiffusion) == 1 and decodes[:-1] == generation.vae_splits(
        maxdiffusion.latent, 8)
    assert video.maxdiffusion["decode"].part == maxdiffusion
    assert video.maxdiffusion["decode"] in list(video.decode)  # one of the choices
    ours = min(p.seconds for p in video.decode if p.part != maxdiffusion)
    assert video.decode_s == min(ours, theirs_s)
    row = video.to_frame().set_index("part")
    assert row.loc["VAE decode", "maxdiffusion_s"] == theirs_s
    assert row.loc["VAE decode", "plan"].endswith("(MaxDiffusion's)") == (theirs_s < ours)
    runs = video.chosen(video.decode)
    assert video.runs_maxdiffusions(runs, "decode") == (theirs_s < ours)
    assert not video.runs_maxdiffusions(runs, "video_encode")  # a text-to-video has none
    assert not video.runs_maxdiffusions(None, "decode")
    assert math.isnan(row.loc["text encoder", "maxdiffusion_s"])  # MaxDiffusion's is on the host
    # Asked not to, nothing more compiles, and no part is faster for it.
    asked.clear()
    bare = plan_generation(_step(2.0), steps=40, maxdiffusion=False)
    assert maxdiffusion not in asked[1] and dict(bare.maxdiffusion) == {}
    assert bare.decode_s == ours >= video.decode_s and bare.total_s >= video.total_s
    assert "(MaxDiffusion's)" not in bare.to_frame().set_index("part").loc["VAE decode", "plan"]
    assert not bare.runs_maxdiffusions(bare.chosen(bare.decode), "decode")
    with pytest.raises(TypeError):  # a frozen value
        video.maxdiffusion["decode"] = None


def test_a_baseline_that_is_one_of_the_splits_compiles_once_and_stays_a_choice(monkeypatch):
    fake, asked = fake_plan_part([1.0] * 8)
    monkeypatch.setattr(generation, "plan_part", fake)
    workload = Workload.parse("wan2.2-i2v-a14b@1280x720x81")
    video = plan_generation(_step(2.0, workload))
    theirs = generation.maxdiffusion_vae_parts(workload, _step().topology)["video_encode"]
    video_encodes = asked[2]
    assert video_encodes.count(theirs) == 1  # one of the splits: not compiled twice
    assert video.maxdiffusion["video_encode"].part == theirs
    assert theirs in [p.part for p in video.video_encode]


def test_maxdiffusions_vae_is_not_rebuilt_where_the_latent_is_too_narrow():
    # 480p's latent is 104 wide: 256 devices would hold less than MIN_TILE columns each.
    narrow = parse_case("wan2.1-t2v-1.3b@832x480x81/v5e:16x16")
    assert generation.maxdiffusion_vae_parts(narrow.workload, narrow.topology()) == {}


def test_a_part_runs_on_the_dits_device_order_where_that_is_faster():
    step = _step(2.0)
    program = CommProgram((Collective("collective-permute", [(0, 1), (1, 0)], 64e6),), 8)
    plain = predict(program, step.topology, plain_order(step.topology))
    part = dataclasses.replace(
        priced_part(DecodePart((1, *CASE.workload.latent_shape)), plain.total_s),
        program=program)
    ran_on_dit = []
    for order in ((0, 4, 1, 5, 2, 6, 3, 7), (0, 7, 1, 6, 2, 5, 3, 4)):
        dit = dataclasses.replace(step, placement=Placement(order, "the DiT's"))
        video = Generation(workload=CASE.workload, steps=50, expert_steps=(50, 0), step=dit,
                           encode=PricedParts(), decode=PricedParts([part]))
        on_dit = video.on_dit_order(part).total_s
        seconds, placement = video.run_of(part)
        assert seconds == min(on_dit, plain.total_s) == video.decode_s
        ran_on_dit.append(placement.order == order)
        assert ran_on_dit[-1] == (on_dit < plain.total_s)
    assert sorted(ran_on_dit) == [False, True]  # each way taken once


def test_a_part_is_priced_on_the_dits_device_order_too():
    step = _step(2.0)
    # Logical neighbours 0-1 and 2-3 on chips across the slice.
    spread = Placement((0, 7, 1, 6, 2, 5, 3, 4), "spread")
    step = dataclasses.replace(step, placement=spread)
    program = CommProgram((Collective("collective-permute", [(0, 1), (1, 0), (2, 3), (3, 2)],
                                      64e6),), 8)
    part = dataclasses.replace(priced_part(DecodePart((1, *CASE.workload.latent_shape)), 1.0),
                               program=program)
    video = Generation(workload=CASE.workload, steps=50, expert_steps=(50, 0), step=step,
                       encode=PricedParts(), decode=PricedParts([part]))
    on_dit = video.on_dit_order(part)
    assert on_dit.total_s == predict(program, step.topology, Placement(spread.order)).total_s
    assert on_dit.total_s > predict(program, step.topology, plain_order(step.topology)).total_s
    assert video.to_frame().set_index("part").loc["VAE decode", "dit_order_s"] == on_dit.total_s
    assert video.on_dit_order(priced_part(part.part, 1.0)) is None  # no program, no price
