"""What each existing system builds (candidate, device order, flags), checked against the
system's own rules and the libraries it calls; a user's setup read from its own words; the
headline's parts checked against the prices they are made of."""

import math

import jax
import numpy as np
import pytest
from jax.experimental import mesh_utils
from tiny import TINY

import aoizora_lab as az
from aoizora_lab import baselines
from aoizora_lab.baselines import (
    SYSTEMS,
    USER,
    Setup,
    Status,
    baseline_setups,
    maxdiffusion_recipes,
    maxdiffusion_setup,
    score_baselines,
    system_setups,
    user_setup,
    with_fallbacks,
    xdit_recipes,
    xdit_setup,
)
from aoizora_lab.compile import CompiledCandidate, CompileStatus, compile_candidates
from aoizora_lab.cost import predict
from aoizora_lab.options import PlanOptions
from aoizora_lab.placement import (
    LibraryRefuses,
    create_device_mesh_order,
    make_mesh_order,
    plain_order,
)
from aoizora_lab.planner import plan
from aoizora_lab.prune import pruned_as

# 32 tokens: every Ulysses x ring split of 8 devices divides them.
WORKLOAD = az.Workload(model=TINY, height=64, width=64, frames=5, text_len=8)
WAN14 = az.Workload.preset("wan2.1-t2v-14b", "720p")


@pytest.fixture(scope="module")
def host():
    return az.Topology.simulated((2, 4), devices=jax.devices()[:8])


@pytest.fixture(scope="module")
def v5e16():
    return az.Topology.from_name("v5e:4x4")  # libtpu's deviceless devices, no compile here


def _library_order(devices, topology):
    ids = [d.id for d in topology.devices]
    return np.array([ids.index(d.id) for d in np.asarray(devices).ravel()]).reshape(
        np.asarray(devices).shape)


# ----------------------------------------------------------------------------- MaxDiffusion


def test_maxdiffusion_default_is_its_shipped_config(v5e16):
    setup = maxdiffusion_setup(WAN14, v5e16)
    # ici (data, fsdp, context, tensor) = (1, 1, -1, 1): every chip on context, flash
    # attention (queries sharded, K/V gathered), weights over context.
    assert setup.candidate.name == "ctx16-fsdp"
    library = mesh_utils.create_device_mesh((1, 1, 16, 1), list(v5e16.devices))
    assert setup.placement.order == tuple(_library_order(library, v5e16).ravel())
    assert setup.flags.name == "maxdiffusion-wan"
    assert "--xla_tpu_enable_async_collective_fusion=true" in setup.flags.args
    assert setup.note == ""  # create_device_mesh accepts (1, 1, 16, 1)


def test_maxdiffusion_data_axis_batches_cfg_and_never_shards_weights(v5e16):
    setup = maxdiffusion_setup(WAN14, v5e16, ici_data_parallelism=2)
    assert setup.candidate.name == "cfg2-ctx8-fsdpseq"
    assert setup.candidate.fsdp_axes == ("context",)
    # create_device_mesh refuses (2, 1, 8, 1) on a 4x4 by default; a user allows the split.
    with pytest.raises((ValueError, NotImplementedError)):
        mesh_utils.create_device_mesh((2, 1, 8, 1), list(v5e16.devices))
    assert "allow_split_physical_axes=True" in setup.note
    library = mesh_utils.create_device_mesh((2, 1, 8, 1), list(v5e16.devices),
                                            allow_split_physical_axes=True)
    assert setup.placement.order == tuple(_library_order(library, v5e16).ravel())
    with pytest.raises(LibraryRefuses):  # the library itself, asked not to split
        create_device_mesh_order((2, 1, 8, 1), v5e16, allow_split=False)


def test_maxdiffusion_ulysses_ring_puts_ulysses_innermost_in_the_context_axis(v5e16):
    setup = maxdiffusion_setup(WAN14, v5e16, ici_data_parallelism=2,
                               attention="ulysses_ring", ulysses_shards=2)
    assert setup.candidate.name == "cfg2-uly2-ring4-fsdpseq"
    assert setup.flags.name == "maxdiffusion-ulysses"
    assert "--xla_tpu_enable_async_all_to_all=true" in setup.flags.args
    library = _library_order(mesh_utils.create_device_mesh(
        (2, 1, 8, 1), list(v5e16.devices), allow_split_physical_axes=True), v5e16)
    context = library[:, 0, :, 0]  # (data, context)
    ours = np.array(setup.placement.order).reshape(2, 2, 4)  # (cfg, ulysses, ring)
    for d in range(2):
        for r in range(4):  # a Ulysses group: consecutive context positions (row-major)
            assert list(ours[d, :, r]) == list(context[d, 2 * r:2 * r + 2])


def test_maxdiffusion_refuses_what_its_code_refuses(v5e16):
    with pytest.raises(az.AoizoraError, match="40 heads do not divide by the Ulysses shards 16"):
        maxdiffusion_setup(WAN14, v5e16, attention="ulysses")
    with pytest.raises(az.AoizoraError, match="at most one -1"):
        maxdiffusion_setup(WAN14, v5e16, ici_data_parallelism=-1)
    with pytest.raises(az.AoizoraError, match="multiplies to 32"):
        maxdiffusion_setup(WAN14, v5e16, ici_data_parallelism=2, ici_context_parallelism=16)
    with pytest.raises(az.AoizoraError, match="attention='ring'"):
        maxdiffusion_setup(WAN14, v5e16, attention="ring")  # not a registered kernel
    with pytest.raises(az.AoizoraError, match="ulysses_shards=3"):
        maxdiffusion_setup(WAN14, v5e16, attention="ulysses_ring", ulysses_shards=3)


def test_maxdiffusion_best_tries_every_kernel_and_recipe(v5e16):
    recipes = maxdiffusion_recipes(WAN14, v5e16)
    kernels = {(r["ici_data_parallelism"], r.get("ici_tensor_parallelism", 1), r["attention"],
                r.get("ulysses_shards")) for r in recipes}
    chunks = [r for r in recipes if r.get("ulysses_attention_chunks", 1) > 1]
    assert len(kernels) == len(recipes) - len(chunks)
    assert {(r["ici_data_parallelism"], r.get("ici_tensor_parallelism", 1), r["attention"],
             r["ulysses_attention_chunks"]) for r in chunks} == {
        (1, 1, "ulysses", 2), (2, 1, "ulysses", 2)}
    for data in (1, 2):
        for tensor in (1, 2):
            context = 16 // (data * tensor)
            assert {(data, tensor, k, None) for k in ("flash", "ulysses", "tokamax_ring")
                    } <= kernels
            shards = {s for d, t, k, s in kernels
                      if (d, t) == (data, tensor) and k == "ulysses_ring"}
            assert shards == {s for s in range(2, context) if context % s == 0}
    assert {t for _, t, _, _ in kernels} == {1, 2}
    built = system_setups("maxdiffusion-best", WAN14, v5e16)
    refused = [s for s in built if not isinstance(s, Setup)]
    # 40 heads: Ulysses 16 deep, or 8 deep x tensor 2, is refused; 8 deep (data 2) is built.
    assert [r for r, _ in refused if r.startswith("ici_")] == [
        "ici_data_parallelism=1 attention=ulysses",
        "ici_data_parallelism=1 attention=ulysses ulysses_attention_chunks=2",
        "ici_data_parallelism=1 ici_tensor_parallelism=2 attention=ulysses"]
    assert [r for r, _ in refused if not r.startswith("ici_")] == [
        r for r, _ in baselines.MAXDIFFUSION_UNBUILT]  # a row each, with why
    setups = [s for s in built if isinstance(s, Setup)]
    assert len(setups) + len(refused) - len(baselines.MAXDIFFUSION_UNBUILT) == len(recipes)
    checked = 0
    for keys in recipes:  # allow_split_physical_axes=True is no other setup where the
        try:              # unsplit mesh exists
            plain = maxdiffusion_setup(WAN14, v5e16, **keys)
        except baselines.SystemRefuses:
            continue
        if not plain.note.startswith("create_device_mesh"):
            split = maxdiffusion_setup(WAN14, v5e16, **keys, allow_split_physical_axes=True)
            assert split.placement == plain.placement
            checked += 1
    assert checked > 0
    chunked = [s for s in setups if s.candidate.ulysses_chunks > 1]
    assert [(s.candidate.name, s.recipe) for s in chunked] == [(
        "cfg2-uly8-chunks2-fsdpseq", "ici_data_parallelism=2 ici_context_parallelism=8 "
        "attention=ulysses ulysses_attention_chunks=2")]  # 40 heads: 5 groups of 8, 2 chunks
    capped = maxdiffusion_setup(WAN14, v5e16, ici_data_parallelism=2, attention="ulysses",
                                ulysses_attention_chunks=9)
    assert capped.candidate.ulysses_chunks == 5  # MaxDiffusion caps at a chunk per group
    for s in setups:
        tp = s.candidate.degree("tp")
        assert tp == (2 if "ici_tensor_parallelism=2" in s.recipe else 1)
        assert ("its attention ignores the tensor axis" in s.note) == (tp > 1)


# ----------------------------------------------------------------------------- Wan / xDiT


def test_xdit_ranks_put_ulysses_inner_and_pad_like_the_official_code(v5e16):
    setup = xdit_setup(WAN14, v5e16, ulysses_size=2, ring_size=8, dit_fsdp=True)
    assert setup.candidate.name == "uly2-ring8-fsdp"
    assert setup.flags.label == "default"
    ours = np.array(setup.placement.order).reshape(2, 8)  # (ulysses, ring)
    # yunchang use_ulysses_low: Ulysses groups {0,1},{2,3},...; ring groups strided by 2.
    assert [sorted(ours[:, r]) for r in range(8)] == [[2 * r, 2 * r + 1] for r in range(8)]
    assert sorted(ours[0]) == list(range(0, 16, 2))
    assert setup.note == ""  # 75,600 tokens split 16 ways unpadded
    small = az.Workload.preset("wan2.1-t2v-1.3b", "480p")
    padded = xdit_setup(small, v5e16, ulysses_size=4, ring_size=4)
    # text2video.py: seq_len = ceil(tokens / sp_size) * sp_size
    seq_len = math.ceil(small.tokens / 16) * 16
    assert seq_len > small.tokens
    assert padded.note == (f"{small.tokens:,} tokens padded by {seq_len - small.tokens} to "
                           f"{seq_len:,}")
    assert padded.candidate.plan().padded_tokens(small.tokens) == seq_len
    with pytest.raises(az.AoizoraError, match="num_heads % ulysses_size"):
        xdit_setup(WAN14, v5e16, ulysses_size=16, ring_size=1)
    with pytest.raises(az.AoizoraError, match="world size"):
        xdit_setup(WAN14, v5e16, ulysses_size=2, ring_size=4)


def test_xdit_splits_cover_every_ulysses_ring_product_without_cfg(v5e16):
    recipes = xdit_recipes(WAN14, v5e16)
    assert {(r["ulysses_size"], r["ring_size"]) for r in recipes} == {
        (u, 16 // u) for u in (1, 2, 4, 8, 16)}
    for setup in system_setups("xdit-usp", WAN14, v5e16):
        if isinstance(setup, Setup):
            assert setup.candidate.degree("cfg") == 1  # no CFG parallelism for T2V
            assert setup.candidate.degree("context") == setup.candidate.degree("tp") == 1


# ----------------------------------------------------------------------------- a user's setup


def test_a_user_setup_is_read_in_its_systems_own_words(v5e16):
    keys = user_setup("ici_data_parallelism=2 ici_context_parallelism=8 attention=ulysses",
                      WAN14, v5e16)
    assert keys.system == "user"
    assert keys.candidate == maxdiffusion_setup(WAN14, v5e16, ici_data_parallelism=2,
                                                attention="ulysses").candidate
    flags = user_setup("--ulysses_size 4 --ring_size 4 --dit_fsdp", WAN14, v5e16)
    assert flags.candidate.name == "uly4-ring4-fsdp"
    assert user_setup({"ulysses_size": 4, "ring_size": 4, "dit_fsdp": True}, WAN14,
                      v5e16).placement == flags.placement
    order = list(range(16))[::-1]
    mesh = user_setup({"candidate": "cfg2-uly8-fsdp", "order": order,
                       "flags": "--xla_tpu_enable_async_all_to_all=true"}, WAN14, v5e16)
    assert mesh.placement.order == tuple(order) and mesh.flags.name == "custom"
    with pytest.raises(az.AoizoraError, match="ici_bogus"):
        user_setup("ici_bogus=2", WAN14, v5e16)
    with pytest.raises(az.AoizoraError, match="not a permutation"):
        user_setup({"candidate": "cfg2-uly8-fsdp", "order": [0] * 16}, WAN14, v5e16)
    with pytest.raises(az.AoizoraError, match="'--xla_bad'"):
        user_setup({"candidate": "cfg2-uly8-fsdp", "flags": "--xla_bad"}, WAN14, v5e16)


# ----------------------------------------------------------------------------- scored


@pytest.fixture(scope="module")
def host_compiles(tmp_path_factory):
    """One compile cache for this module's plans on the host: they compile the same setups."""
    return tmp_path_factory.mktemp("host-compiles")


@pytest.fixture(scope="module")
def planned(host, host_compiles):
    return plan(WORKLOAD, host, PlanOptions(
        budget=300, cache_dir=host_compiles, ir_cache_dir=False,
        compare="--ulysses_size 2 --ring_size 4"))


@pytest.mark.slow
def test_each_system_is_the_best_of_every_setup_it_builds(planned, host):
    assert [b.name for b in planned.baselines] == [*SYSTEMS, USER]
    trials = planned.baselines.trials()
    valid = {c.name for c in az.candidates.enumerate_candidates(WORKLOAD, host)}
    for outcome in planned.baselines:
        tried = trials[trials["baseline"] == outcome.name]
        priced = tried.dropna(subset=["total_s"])
        assert outcome.status is Status.OK
        assert outcome.plan.predicted.total_s == priced["total_s"].min()
        assert tried["chosen"].sum() == 1
        if outcome.name != USER:  # every built setup in the space compiled, not only the
            built = [s for s in system_setups(outcome.name, WORKLOAD, host)  # best estimates
                     if isinstance(s, Setup) and pruned_as(s.candidate).name in valid]
            assert sorted(priced["recipe"]) == sorted(s.recipe for s in built)
            if outcome.name == "maxdiffusion-best":  # chunked Ulysses compiled and priced too
                assert any(s.candidate.ulysses_chunks > 1 for s in built)
    # The plan is never slower than a setup it priced, yours included.
    assert all(planned.best.predicted.total_s <= p.predicted.total_s * (1 + 1e-12)
               for p in planned.baselines.plans.values())
    user = planned.baselines[USER]
    assert user.setup.recipe == "xdit-usp: --ulysses_size 2 --ring_size 4"
    assert user.plan.predicted == predict(planned.programs[(user.candidate.name, "default")],
                                          user.plan.topology, user.placement)


@pytest.mark.slow
def test_the_headline_is_made_of_the_prices_it_names(planned, host):
    head, best, own = planned.headline, planned.best, planned.searched
    systems = {o.name: o.plan.predicted.total_s for o in planned.baselines
               if o.name in SYSTEMS}
    assert head.systems == systems and USER not in head.systems
    assert head.best_system == min(systems, key=systems.get)
    # The headline is the search's own best against the systems, not the plan recommended
    # (which may be a system's setup).
    assert head.vs_existing == pytest.approx(min(systems.values()) / own.predicted.total_s)
    assert head.plan_s == best.predicted.total_s <= own.predicted.total_s
    plain = predict(best.program, host, plain_order(host)).total_s
    assert head.placement_gain["plain"] == pytest.approx(plain / best.predicted.total_s)
    library = make_mesh_order(best.candidate.mesh_shape, best.candidate.axis_names, host)
    assert head.make_mesh_s == predict(best.program, host, library).total_s
    in_plain = [predict(r.program, host, plain_order(host)).total_s
                for r in planned.compiled.ok]
    assert head.strategy_s == min(in_plain)
    assert head.strategy_gain == pytest.approx(min(systems.values()) / min(in_plain))
    frame = head.to_frame()
    assert set(frame["measures"]) - {"recommended plan"} == {
        "vs existing systems", "placement gain", "strategy gain"}
    assert ("recommended plan" in set(frame["measures"])) == (
        best.predicted.total_s < own.predicted.total_s)


ASYNC_ALL_TO_ALL = "--xla_tpu_enable_async_all_to_all=true"
ASYNC_ALL_REDUCE = "--xla_enable_async_all_reduce=true"


@pytest.mark.slow
@pytest.mark.parametrize("breaking", [ASYNC_ALL_TO_ALL, ASYNC_ALL_REDUCE, "every flag",
                                      "the program"])
def test_a_recipe_whose_flags_fail_keeps_every_flag_but_the_one_that_breaks(
        planned, host, host_compiles, breaking):
    # As libtpu answers MaxDiffusion's asynchronous all-to-all on a v5e:8x8 ("limited ICI");
    # "every flag": a compile that fails with any flag set; "the program": Ulysses programs
    # fail whatever the flags.
    refusal = f"UNIMPLEMENTED: {breaking} not supported on limited ICI"

    def fails(setup):
        if breaking == "the program":
            return setup.candidate.degree("ulysses") > 1
        return bool(setup.flags.args) if breaking == "every flag" else (
            breaking in setup.flags.words)

    def compile_refusing(setups, known):
        return {**known, **{(s.candidate.name, s.flags.label): (
            CompiledCandidate(s.candidate, "error", f"JaxRuntimeError: {refusal}\nmore", 0.0,
                              flags=s.flags) if fails(s) else
            compile_candidates([s.candidate], WORKLOAD, host, cache_dir=host_compiles)[0])
            for group in setups for s in group.setups
            if (s.candidate.name, s.flags.label) not in known}}

    setups = baseline_setups(WORKLOAD, host, planned.pruning)
    known = compile_refusing(setups, {})
    while len(known) < len(known := compile_refusing(with_fallbacks(setups, known), known)):
        pass  # one round per try, as the planner runs them
    tried = with_fallbacks(setups, known)
    outcomes = score_baselines(WORKLOAD, host, planned.pruning, tried, known)
    best = outcomes["maxdiffusion-best"]
    assert best.status is Status.OK and not fails(best.setup)
    mine = [s for g in tried if g.name == "maxdiffusion-best" for s in g.setups]
    refused = [s for s in mine if not s.dropped and fails(s)]
    assert refused  # the case under test happens
    for recipe in refused:
        words = recipe.flags.words
        tries = [s for s in mine if s.dropped and s.candidate == recipe.candidate
                 and s.recipe.startswith(recipe.recipe)]
        good = [s for s in tries if not fails(s)]
        assert all(refusal in d.message and "more" not in d.message
                   for s in tries for d in s.dropped)
        assert {d.status for s in tries for d in s.dropped} == {"error"}
        if breaking == "the program":  # no flags fails too: no further try
            assert not good and [len(s.dropped) for s in tries] == [1, len(words)]
            continue
        if breaking == "every flag":  # no single flag mends it: without flags it compiles
            assert [len(s.dropped) for s in good] == [len(words)]
            assert len(tries) == len(words) + 1
            assert "(without its LIBTPU_INIT_ARGS)" in good[0].recipe
            continue
        assert tries[-1] in good  # tries stop at the first single flag that mends it
        [dropped] = [d.flag for d in tries[-1].dropped]
        assert dropped == breaking
        # every other flag of the recipe is kept
        assert set(tries[-1].flags.words) == set(words) - {dropped}
        assert f"less {dropped}" in tries[-1].recipe
        if breaking == ASYNC_ALL_TO_ALL:  # the README's Ulysses set less it is its Wan set
            assert tries[-1].flags.label == "maxdiffusion-wan" and len(tries) == 1
    trials = outcomes.trials()
    dropping = trials.loc[trials["dropped_flags"] != "", "dropped_flags"]
    assert len(dropping) and dropping.str.contains(f"(error: JaxRuntimeError: {refusal})",
                                                   regex=False).all()
    priced = trials[trials["baseline"] == "maxdiffusion-best"]["total_s"]
    assert best.plan.predicted.total_s == priced.min()


class _NoEstimates:
    def decision_of(self, candidate):
        raise KeyError(candidate.name)


@pytest.mark.parametrize("partial_compiles", [True, False])
def test_a_recipe_runs_without_its_flags_only_where_no_try_keeping_some_compiled(
        v5e16, partial_compiles):
    from aoizora_lab.hlo import CommProgram, ComputeOp

    chip = az.chip_spec("v5e")
    recipe = maxdiffusion_setup(WORKLOAD, v5e16, ici_data_parallelism=2, attention="ulysses")
    assert len(recipe.flags.words) > 1
    refusal = (CompileStatus.CRASH, "SIGABRT")
    flagless = baselines._less(recipe, recipe.flags.words, *refusal)
    partial = baselines._less(recipe, recipe.flags.words[:1], *refusal)
    assert flagless.flagless and not partial.flagless and not recipe.flagless

    def compiled(setup, seconds):  # a program of one matmul of ``seconds`` at peak
        ops = (ComputeOp(chip.peak_bf16_flops * seconds, 0.0, 1, 0, "matmul", 0.0),)
        return CompiledCandidate(setup.candidate, "ok", "", 1.0, flags=setup.flags,
                                 program=CommProgram((), v5e16.num_devices, ops=ops))

    outcomes = {(recipe.candidate.name, recipe.flags.label): CompiledCandidate(
                    recipe.candidate, "crash", "SIGABRT", 1.0, flags=recipe.flags),
                (flagless.candidate.name, flagless.flags.label): compiled(flagless, 1.0),
                (partial.candidate.name, partial.flags.label): (
                    compiled(partial, 2.0) if partial_compiles else CompiledCandidate(
                        partial.candidate, "error", "refused", 1.0, flags=partial.flags))}
    group = baselines.SystemSetups("maxdiffusion-best", (), (recipe, flagless, partial))
    scored = score_baselines(WORKLOAD, v5e16, _NoEstimates(), [group], outcomes)
    best = scored["maxdiffusion-best"]
    # The faster flagless try is the system's run only where nothing keeping a flag compiled.
    assert best.setup == (partial if partial_compiles else flagless)
    # Each try's row names the flags it leaves out and the failure that left them out.
    dropped = scored.trials().set_index("recipe")["dropped_flags"]
    assert dropped[recipe.recipe] == ""
    for tried in (flagless, partial):
        left_out = [w for w in recipe.flags.words if w not in tried.flags.words]
        assert dropped[tried.recipe] == " ".join(left_out) + " (crash: SIGABRT)"


@pytest.mark.slow
def test_a_builder_that_breaks_fails_the_plan_and_a_refusal_is_a_row(host, host_compiles,
                                                                     monkeypatch):
    for bug in (RuntimeError, ValueError, AssertionError, az.AoizoraError):
        def broken(*_, bug=bug, **__):  # a bug, even of a type a library refuses with
            raise bug("a bug in a builder")

        monkeypatch.setattr(baselines, "xdit_setup", broken)
        with pytest.raises(bug, match="a bug in a builder"):
            plan(WORKLOAD, host, PlanOptions(budget=100, cache_dir=host_compiles,
                                             ir_cache_dir=False))

    def refuses(*_, **__):
        raise baselines.SystemRefuses("no such layout here")

    monkeypatch.setattr(baselines, "xdit_setup", refuses)
    result = plan(WORKLOAD, host, PlanOptions(budget=100, cache_dir=host_compiles,
                                              ir_cache_dir=False))
    outcome = result.baselines["xdit-usp"]
    assert outcome.status is Status.NOT_BUILT and outcome.plan is None
    assert "no such layout here" in outcome.reason
    assert "xdit-usp" not in result.baselines.plans
    assert math.isnan(result.headline.systems["xdit-usp"])


def test_library_orders_of_the_headline_match_the_libraries(v5e16):
    shape, names = (2, 8), ("cfg", "ulysses")
    with pytest.raises(LibraryRefuses):
        create_device_mesh_order(shape, v5e16, allow_split=False)
    split = create_device_mesh_order(shape, v5e16)  # retried with the split allowed
    library = mesh_utils.create_device_mesh(shape, list(v5e16.devices),
                                            allow_split_physical_axes=True)
    assert split.order == tuple(_library_order(library, v5e16).ravel())
    try:
        mesh = jax.make_mesh(shape, names, devices=list(v5e16.devices))
    except ValueError:
        with pytest.raises(LibraryRefuses):
            make_mesh_order(shape, names, v5e16)
    else:
        assert make_mesh_order(shape, names, v5e16).order == tuple(
            _library_order(mesh.devices, v5e16).ravel())
