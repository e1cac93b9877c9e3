"""Every parallel strategy, alone and combined, computes the unsharded denoise step."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import Mesh

from aoizora_lab.errors import AoizoraError
from aoizora_lab.models.parallel import ParallelPlan, ulysses_head_chunks
from aoizora_lab.models.wan import WanConfig, init_params, param_shardings
from aoizora_lab.workload import denoise_step

# 8 heads so every tp x ulysses split of 8 devices divides them; 27 tokens (3 x 3 x 3) so
# every sequence degree above 1 needs padding that self-attention must mask.
TINY = WanConfig(dim=64, ffn_dim=128, num_heads=8, num_layers=2, text_dim=32, text_len=8,
                 freq_dim=32)
TOLERANCE = 2e-5  # float32; observed differences are ~5e-7 of the output's largest value


@pytest.fixture(scope="module")
def problem():
    params = init_params(TINY, jax.random.key(0), std=0.2)
    keys = jax.random.split(jax.random.key(1), 3)
    inputs = {"latents": jax.random.normal(keys[0], (1, 16, 3, 6, 6)),
              "t": jnp.array([700.0]),
              "context": jax.random.normal(keys[1], (1, 5, 32)),
              "negative_context": jax.random.normal(keys[2], (1, 5, 32))}
    reference = jax.jit(lambda p, i: denoise_step(p, TINY, plan=ParallelPlan(attention="dense"),
                                                  **i))(params, inputs)
    return params, inputs, reference


STRATEGIES = [
    ((2,), {"c": "cfg"}, ()),
    ((8,), {"u": "ulysses"}, ()),
    ((8,), {"r": "ring"}, ()),
    ((8,), {"x": "context"}, ()),
    ((8,), {"t": "tp"}, ()),
    ((4,), {"u": "ulysses"}, ("u",)),  # fsdp with a sequence strategy
    ((2, 4), {"c": "cfg", "u": "ulysses"}, ("c", "u")),
    ((2, 4), {"c": "cfg", "r": "ring"}, ()),
    ((2, 4), {"u": "ulysses", "r": "ring"}, ()),  # USP
    ((2, 2, 2), {"c": "cfg", "u": "ulysses", "r": "ring"}, ("u", "r")),
    ((2, 4), {"c": "cfg", "t": "tp"}, ("c",)),
    ((2, 4), {"c": "cfg", "x": "context"}, ("c", "x")),
    ((2, 4), {"c": "cfg", "x": "context"}, ("x",)),  # MaxDiffusion: weights not over data
    ((2, 2, 2), {"c": "cfg", "t": "tp", "u": "ulysses"}, ("c", "u")),
    ((2, 2, 2), {"x": "context", "r": "ring", "u": "ulysses"}, ()),
    ((2, 2, 2), {"r": "ring", "c": "cfg", "t": "tp"}, ("r",)),
]


@pytest.mark.parametrize(("shape", "roles", "fsdp"), STRATEGIES,
                         ids=lambda v: str(v).replace(" ", ""))
def test_strategy_matches_the_unsharded_step(problem, shape, roles, fsdp):
    params, inputs, reference = problem
    devices = np.array(jax.devices()[:int(np.prod(shape))]).reshape(shape)
    plan = ParallelPlan(Mesh(devices, tuple(roles)), roles, fsdp_axes=fsdp, attention_block=8)
    sharded = jax.device_put(params, param_shardings(TINY, plan))
    if fsdp:  # weights really are stored split over the FSDP axes
        q = sharded["blocks"]["self_attn"]["q"]["w"]
        assert q.addressable_shards[0].data.size < q.size
    out = jax.jit(lambda p, i: denoise_step(p, TINY, plan=plan, **i))(sharded, inputs)
    scale = float(jnp.abs(reference).max())
    assert float(jnp.abs(out - reference).max()) <= TOLERANCE * scale


# Wan 2.2 TI2V: 48 latent channels and one timestep per token (the first latent frame at 0, as
# an image-conditioned video runs), so the per-token modulation is split with the tokens.
TINY_TI2V = WanConfig(model_type="ti2v", in_dim=48, out_dim=48, dim=64, ffn_dim=128,
                      num_heads=8, num_layers=2, text_dim=32, text_len=8, freq_dim=32)


@pytest.fixture(scope="module")
def per_token_problem():
    params = init_params(TINY_TI2V, jax.random.key(2), std=0.2)
    keys = jax.random.split(jax.random.key(3), 3)
    t = jnp.full((3, 3, 3), 700.0).at[0].set(0.0).reshape(1, 27)
    inputs = {"latents": jax.random.normal(keys[0], (1, 48, 3, 6, 6)), "t": t,
              "context": jax.random.normal(keys[1], (1, 5, 32)),
              "negative_context": jax.random.normal(keys[2], (1, 5, 32))}
    reference = jax.jit(lambda p, i: denoise_step(
        p, TINY_TI2V, plan=ParallelPlan(attention="dense"), **i))(params, inputs)
    return params, inputs, reference


@pytest.mark.parametrize(("shape", "roles", "fsdp"), [STRATEGIES[i] for i in (1, 2, 4, 9, 14)],
                         ids=lambda v: str(v).replace(" ", ""))
def test_per_token_timesteps_shard_with_the_tokens(per_token_problem, shape, roles, fsdp):
    params, inputs, reference = per_token_problem
    devices = np.array(jax.devices()[:int(np.prod(shape))]).reshape(shape)
    plan = ParallelPlan(Mesh(devices, tuple(roles)), roles, fsdp_axes=fsdp, attention_block=8)
    sharded = jax.device_put(params, param_shardings(TINY_TI2V, plan))
    out = jax.jit(lambda p, i: denoise_step(p, TINY_TI2V, plan=plan, **i))(sharded, inputs)
    scale = float(jnp.abs(reference).max())
    assert float(jnp.abs(out - reference).max()) <= TOLERANCE * scale


def test_guidance_combines_the_two_passes(problem):
    params, inputs, reference = problem
    plain = ParallelPlan(attention="dense")
    cond = denoise_step(params, TINY, inputs["latents"], inputs["t"], inputs["context"],
                        plan=plain)
    uncond = denoise_step(params, TINY, inputs["latents"], inputs["t"],
                          inputs["negative_context"], plan=plain)
    np.testing.assert_allclose(reference, uncond + 5.0 * (cond - uncond), rtol=1e-4, atol=1e-4)


def test_plan_errors_name_the_problem():
    mesh = Mesh(np.array(jax.devices()[:4]).reshape(2, 2), ("a", "b"))
    with pytest.raises(AoizoraError, match=r"\['a'\].*\['a', 'b'\]"):
        ParallelPlan(mesh, {"a": "cfg"})
    with pytest.raises(AoizoraError, match="'pipeline'"):
        ParallelPlan(mesh, {"a": "cfg", "b": "pipeline"})
    with pytest.raises(AoizoraError, match="several mesh axes"):
        ParallelPlan(mesh, {"a": "ring", "b": "ring"})
    with pytest.raises(AoizoraError, match="tp axis"):
        ParallelPlan(mesh, {"a": "cfg", "b": "tp"}, fsdp_axes=("b",))
    plan = ParallelPlan(Mesh(np.array(jax.devices()[:6]).reshape(2, 3), ("t", "u")),
                        {"t": "tp", "u": "ulysses"})
    with pytest.raises(AoizoraError, match=r"8 attention heads.*2 x 3"):
        plan.check_model(num_heads=8, batch=2)


CHUNKED = [
    ((4,), {"u": "ulysses"}, (), 2),  # 8 heads, 2 groups of 4: [0, 4), [4, 8)
    ((2,), {"u": "ulysses"}, (), 3),  # 4 groups of 2: [0, 2), [2, 4), [4, 8)
    ((2, 2, 2), {"c": "cfg", "u": "ulysses", "r": "ring"}, ("u", "r"), 2),
    ((2, 2, 2), {"c": "cfg", "t": "tp", "u": "ulysses"}, ("c", "u"), 2),
]


@pytest.mark.parametrize(("shape", "roles", "fsdp", "chunks"), CHUNKED,
                         ids=lambda v: str(v).replace(" ", ""))
def test_chunked_ulysses_matches_the_unsharded_step_with_an_all_to_all_set_per_chunk(
        problem, shape, roles, fsdp, chunks):
    params, inputs, reference = problem
    devices = np.array(jax.devices()[:int(np.prod(shape))]).reshape(shape)
    mesh = Mesh(devices, tuple(roles))
    counts = {}
    for n in (1, chunks):
        plan = ParallelPlan(mesh, roles, fsdp_axes=fsdp, attention_block=8, ulysses_chunks=n)
        plan.check_model(num_heads=TINY.num_heads, batch=2)
        sharded = jax.device_put(params, param_shardings(TINY, plan))
        step = jax.jit(lambda p, i, plan=plan: denoise_step(p, TINY, plan=plan, **i))
        out = step(sharded, inputs)
        assert float(jnp.abs(out - reference).max()) <= TOLERANCE * float(
            jnp.abs(reference).max())
        counts[n] = step.lower(sharded, inputs).as_text().count("all_to_all")
    local_heads = TINY.num_heads // plan.size("tp")
    expected = len(ulysses_head_chunks(local_heads, plan.size("ulysses"), chunks))
    assert counts[chunks] == expected * counts[1] > 0


def test_chunks_need_ulysses_and_at_most_a_chunk_per_head_group():
    mesh = Mesh(np.array(jax.devices()[:4]).reshape(4), ("a",))
    with pytest.raises(AoizoraError, match=r"ulysses_chunks=2.*ulysses axis"):
        ParallelPlan(mesh, {"a": "ring"}, ulysses_chunks=2)
    plan = ParallelPlan(mesh, {"a": "ulysses"}, ulysses_chunks=3)
    with pytest.raises(AoizoraError, match="exceeds the 2 groups of 4 heads"):
        plan.check_model(num_heads=8, batch=2)
    assert ulysses_head_chunks(40, 8, 2) == [(0, 16), (16, 40)]  # MaxDiffusion's own cases
    assert ulysses_head_chunks(40, 8, 3) == [(0, 8), (8, 16), (16, 40)]
