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
    WanConfig,
    abstract_params,
    forward,
    init_params,
    load_official_weights,
    param_count,
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
    assert set(PRESETS) == {"wan2.1-t2v-1.3b", "wan2.1-t2v-14b", "wan2.1-i2v-14b"}


@pytest.mark.parametrize(("kwargs", "pattern"), [
    ({"model_type": "flf2v"}, r"'flf2v'"),
    ({"dim": 100, "num_heads": 3}, r"dim=100.*num_heads=3"),
    ({"window_size": (4, 4)}, r"window_size=\(4, 4\)"),
    ({"num_layers": 0}, r"num_layers=0"),
    ({"patch_size": "ab"}, r"patch_size='ab'.*\(1, 2, 2\)"),
    ({"window_size": None}, r"window_size=None"),
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


def test_bad_inputs_name_the_shape():
    cfg = WanConfig(dim=64, ffn_dim=96, num_heads=4, num_layers=1, text_dim=32, text_len=8,
                    freq_dim=32)
    params = init_params(cfg, jax.random.key(0))
    x = jnp.zeros((1, 16, 2, 4, 4))
    with pytest.raises(AoizoraError, match=r"\(2, 5, 4\).*patch_size"):
        forward(params, cfg, jnp.zeros((1, 16, 2, 5, 4)), jnp.ones(1), jnp.zeros((1, 4, 32)))
    with pytest.raises(AoizoraError, match=r"context has shape \(1, 9, 32\)"):
        forward(params, cfg, x, jnp.ones(1), jnp.zeros((1, 9, 32)))
