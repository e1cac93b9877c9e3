import json
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from aoizora_lab.errors import AoizoraError
from aoizora_lab.models.safetensors_io import load_safetensors
from aoizora_lab.models.wan import (
    CLIP_DIM,
    CLIP_TOKENS,
    PRESETS,
    SAMPLING,
    WanConfig,
    abstract_params,
    expert_steps,
    forward,
    init_params,
    load_official_weights,
    param_count,
    sampling_timesteps,
    time_sinusoid,
)

FIXTURES = Path(__file__).resolve().parent / "data"
FIXTURE = FIXTURES / "wan21_tiny_t2v_a.safetensors"


@pytest.fixture(scope="module")
def official():
    meta = json.loads(FIXTURE.with_suffix(".json").read_text())
    return meta, load_safetensors(FIXTURE)


def test_official_weights_in_official_outputs_out(official):
    meta, tensors = official
    cfg = WanConfig(**meta["config"])  # the official config keys construct the config
    params = load_official_weights(FIXTURE, cfg)
    x = jnp.stack([tensors["input.x.0"], tensors["input.x.1"]])
    context = jnp.stack([tensors["input.context.0"], tensors["input.context.1"]])
    t = jnp.asarray(tensors["input.t"])
    out = jax.jit(lambda p, x, t, c: forward(p, cfg, x, t, c))(params, x, t, context)
    expected = np.stack([tensors["output.0"], tensors["output.1"]])
    rel = np.linalg.norm(np.asarray(out) - expected) / np.linalg.norm(expected)
    assert out.shape == expected.shape and out.dtype == jnp.float32
    assert rel < 1e-5  # float32 end to end; tolerance is a tenth of the 1e-4 bar


def test_loader_accepts_a_state_dict_and_names_what_is_missing(official):
    meta, tensors = official
    cfg = WanConfig(**meta["config"])
    from_dict = load_official_weights(dict(tensors), cfg)
    from_file = load_official_weights(FIXTURE, cfg)
    assert jax.tree.all(jax.tree.map(lambda a, b: bool((a == b).all()), from_dict, from_file))
    broken = {k: v for k, v in tensors.items() if k != "blocks.1.ffn.2.bias"}
    with pytest.raises(AoizoraError, match=r"blocks\.1\.ffn\.2\.bias"):
        load_official_weights(broken, cfg)
    wider = WanConfig(**{**meta["config"], "ffn_dim": 512})
    with pytest.raises(AoizoraError, match=r"blocks\.0\.ffn\.0\.weight|shape"):
        load_official_weights(tensors, wider)


def test_time_sinusoid_matches_float64():
    t = np.array([999.0, 250.0, 0.0, 1000.0, 512.37], np.float32)
    half = 128
    angles = np.outer(t.astype(np.float64), np.power(10000.0, -np.arange(half) / half))
    expected = np.concatenate([np.cos(angles), np.sin(angles)], axis=1)
    np.testing.assert_allclose(np.asarray(time_sinusoid(jnp.asarray(t), 256)), expected,
                               atol=1e-6)


def test_presets_have_the_official_sizes():
    small = WanConfig.preset("wan2.1-t2v-1.3b")
    big = WanConfig.preset("wan2.1-t2v-14b")
    i2v = WanConfig.preset("wan2.1-i2v-14b")
    assert (small.dim, small.num_heads, small.num_layers, small.ffn_dim) == (1536, 12, 30, 8960)
    assert (big.dim, big.num_heads, big.num_layers, big.ffn_dim) == (5120, 40, 40, 13824)
    assert i2v.model_type == "i2v" and i2v.in_dim == 36
    assert big.rope_dims == (44, 42, 42) and big.head_dim == 128
    # 14B in bf16 is about 28.6 GB (the official 14B config, 2 bytes per parameter): too big
    # for one 16 GB v5e chip.
    assert 28e9 < 2 * param_count(big) < 29e9
    leaves = jax.tree.leaves(abstract_params(big))
    assert all(isinstance(leaf, jax.ShapeDtypeStruct) for leaf in leaves)
    assert sum(np.prod(leaf.shape) for leaf in leaves) == param_count(big)
    assert {name for name in PRESETS if name.startswith("wan2.1")} == {
        "wan2.1-t2v-1.3b", "wan2.1-t2v-14b", "wan2.1-i2v-14b"}


def test_wan22_presets_have_the_official_sizes():
    # Each A14B expert is Wan 2.1 14B's shape ("A14B": 27B in all, 14B active per step).
    t2v, i2v = WanConfig.preset("wan2.2-t2v-a14b"), WanConfig.preset("wan2.2-i2v-a14b")
    assert param_count(t2v) == param_count(WanConfig.preset("wan2.1-t2v-14b"))
    # Wan 2.2's i2v drops Wan 2.1's CLIP projection and image cross-attention.
    assert not i2v.uses_clip and i2v.condition_channels == 20
    assert param_count(i2v) < param_count(WanConfig.preset("wan2.1-i2v-14b"))
    ti2v = WanConfig.preset("wan2.2-ti2v-5b")
    assert ti2v.head_dim == 128 and ti2v.vae_stride == (4, 16, 16)
    assert 4.5e9 < param_count(ti2v) < 5.5e9  # "5B"
    assert set(SAMPLING) == set(PRESETS)


SCHEDULES = json.loads((FIXTURES / "wan22_schedules.json").read_text())["schedules"]


@pytest.mark.parametrize("official", SCHEDULES, ids=lambda s: f"{s['steps']}@{s['shift']}")
def test_sampling_timesteps_are_the_official_schedulers(official):
    ours = sampling_timesteps(official["steps"], official["shift"])
    assert ours.tolist() == official["timesteps"]


@pytest.mark.parametrize("name", ["wan2.2-t2v-a14b", "wan2.2-i2v-a14b", "wan2.1-t2v-14b"])
def test_expert_steps_split_at_the_boundary(name):
    sampling = SAMPLING[name]
    high, low = expert_steps(sampling)
    assert high + low == sampling.steps
    if sampling.boundary is None:
        assert low == 0
        return
    official = next(s["timesteps"] for s in SCHEDULES
                    if (s["steps"], s["shift"]) == (sampling.steps, sampling.shift))
    # The official pipelines' test, step by step: t >= boundary * num_train_timesteps.
    assert high == sum(t >= sampling.boundary * 1000 for t in official)
    assert 0 < low < sampling.steps


@pytest.mark.parametrize("name", ["ti2v", "i2v", "t2v"])
def test_wan22_official_weights_in_official_outputs_out(name):
    path = FIXTURES / f"wan22_tiny_{name}.safetensors"
    meta = json.loads(path.with_suffix(".json").read_text())
    tensors = load_safetensors(path)
    cfg = WanConfig(**meta["config"], clip=False)
    params = load_official_weights(path, cfg)
    run = jax.jit(lambda p, x, t, c, y: forward(p, cfg, x, t, c, y=y))
    for i in range(2):  # one video a call, as the fixture was made
        y = tensors.get(f"input.y.{i}")
        t = jnp.asarray(tensors["input.t"][i:i + 1])
        out = run(params, tensors[f"input.x.{i}"][None], t, tensors[f"input.context.{i}"][None],
                  None if y is None else y[None])
        expected = tensors[f"output.{i}"][None]
        rel = np.linalg.norm(np.asarray(out) - expected) / np.linalg.norm(expected)
        assert out.shape == expected.shape and rel < 1e-5
    if meta["per_token_timesteps"]:
        # The image-conditioned sample's first latent frame really is at t = 0.
        first = meta["tokens"] // tensors["input.x.0"].shape[1]
        assert float(np.abs(tensors["input.t"][0, :first]).max()) == 0.0
        assert float(tensors["input.t"][1].min()) > 0.0


def test_wan21_i2v_official_weights_in_official_outputs_out():
    """Wan 2.1 I2V: 36 channels in, and CLIP's 257 image tokens through ``img_emb`` into the
    image cross-attention (the fixture stores two rank-r factors for the 1280-wide weight and
    tokens; multiplied back here)."""
    path = FIXTURES / "wan21_tiny_i2v.safetensors"
    meta = json.loads(path.with_suffix(".json").read_text())
    tensors = dict(load_safetensors(path))
    for name in meta["factored"]:
        tensors[name] = tensors[f"{name}.a"] @ tensors[f"{name}.b"]
    cfg = WanConfig(**meta["config"])
    assert cfg.uses_clip and cfg.condition_channels == 20
    params = load_official_weights(tensors, cfg)
    run = jax.jit(lambda p, x, t, c, clip, y: forward(p, cfg, x, t, c, clip_fea=clip, y=y))
    for i in range(2):
        clip = tensors[f"input.clip_fea.{i}.a"] @ tensors[f"input.clip_fea.{i}.b"]
        out = run(params, tensors[f"input.x.{i}"][None], jnp.asarray(tensors["input.t"][i:i + 1]),
                  tensors[f"input.context.{i}"][None], clip, tensors[f"input.y.{i}"][None])
        expected = tensors[f"output.{i}"][None]
        rel = np.linalg.norm(np.asarray(out) - expected) / np.linalg.norm(expected)
        assert out.shape == expected.shape and rel < 1e-5


def test_per_token_timesteps_move_only_where_they_differ():
    cfg = WanConfig(model_type="ti2v", in_dim=48, out_dim=48, dim=64, ffn_dim=96, num_heads=4,
                    num_layers=2, text_dim=32, text_len=8, freq_dim=32)
    params = init_params(cfg, jax.random.key(0), std=0.2)
    keys = jax.random.split(jax.random.key(1), 2)
    x = jax.random.normal(keys[0], (1, 48, 2, 4, 4))
    ctx = jax.random.normal(keys[1], (1, 6, 32))
    run = jax.jit(lambda t: forward(params, cfg, x, t, ctx))
    same = run(jnp.full((1, 8), 600.0))
    np.testing.assert_allclose(same, run(jnp.array([600.0])), rtol=1e-5, atol=1e-5)
    assert not np.allclose(same, run(jnp.array([600.0] * 4 + [0.0] * 4)[None]), atol=1e-4)
    with pytest.raises(AoizoraError, match=r"t has shape \(1, 7\).*\[1, 8\]"):
        forward(params, cfg, x, jnp.ones((1, 7)), ctx)


@pytest.mark.parametrize(("kwargs", "pattern"), [
    ({"model_type": "flf2v"}, r"'flf2v'"),
    ({"dim": 100, "num_heads": 3}, r"dim=100.*num_heads=3"),
    ({"window_size": (4, 4)}, r"window_size=\(4, 4\)"),
    ({"num_layers": 0}, r"num_layers=0"),
    ({"patch_size": "ab"}, r"patch_size='ab'.*\(1, 2, 2\)"),
    ({"window_size": None}, r"window_size=None"),
    ({"vae_stride": (4, 16)}, r"vae_stride=\(4, 16\).*\(4, 16, 16\)"),
    ({"clip": "yes"}, r"clip='yes'"),
])
def test_bad_configs_name_the_value(kwargs, pattern):
    with pytest.raises(AoizoraError, match=pattern):
        WanConfig(**kwargs)
    with pytest.raises(AoizoraError, match=r"'wan9'.*wan2\.1-t2v-1\.3b"):
        WanConfig.preset("wan9")


TINY_I2V = WanConfig(model_type="i2v", in_dim=36, dim=64, ffn_dim=96, num_heads=4,
                     num_layers=2, text_dim=32, text_len=8, freq_dim=32)


def test_i2v_uses_the_image_and_the_condition_latents():
    params = init_params(TINY_I2V, jax.random.key(0), std=0.2)
    keys = jax.random.split(jax.random.key(1), 5)
    x = jax.random.normal(keys[0], (1, 16, 2, 4, 4))
    y = jax.random.normal(keys[1], (1, 20, 2, 4, 4))
    clip = jax.random.normal(keys[2], (1, CLIP_TOKENS, CLIP_DIM))
    ctx = jax.random.normal(keys[3], (1, 6, 32))
    t = jnp.array([500.0])
    run = jax.jit(lambda c, yy: forward(params, TINY_I2V, x, t, ctx, clip_fea=c, y=yy))
    base = run(clip, y)
    assert base.shape == (1, 16, 2, 4, 4)
    other_clip = jax.random.normal(keys[4], clip.shape)  # (scaling would not do: LayerNorm)
    assert not np.allclose(base, run(other_clip, y), atol=1e-4)
    assert not np.allclose(base, run(clip, y * 0.5), atol=1e-4)
    with pytest.raises(AoizoraError, match="clip_fea"):
        forward(params, TINY_I2V, x, t, ctx, y=y)
    without = WanConfig(**{**vars(TINY_I2V), "clip": False})
    with pytest.raises(AoizoraError, match=r"clip_fea given.*WanConfig.clip=False"):
        forward(init_params(without, jax.random.key(0)), without, x, t, ctx, clip_fea=clip, y=y)


def test_bad_inputs_name_the_shape():
    cfg = WanConfig(dim=64, ffn_dim=96, num_heads=4, num_layers=1, text_dim=32, text_len=8,
                    freq_dim=32)
    params = init_params(cfg, jax.random.key(0))
    x = jnp.zeros((1, 16, 2, 4, 4))
    with pytest.raises(AoizoraError, match=r"\(2, 5, 4\).*patch_size"):
        forward(params, cfg, jnp.zeros((1, 16, 2, 5, 4)), jnp.ones(1), jnp.zeros((1, 4, 32)))
    with pytest.raises(AoizoraError, match=r"context has shape \(1, 9, 32\)"):
        forward(params, cfg, x, jnp.ones(1), jnp.zeros((1, 9, 32)))
