import dataclasses
import json
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from aoizora_lab.errors import AoizoraError
from aoizora_lab.models.safetensors_io import load_safetensors
from aoizora_lab.models.t5 import (
    T5Config,
    abstract_encoder_params,
    encode,
    init_encoder_params,
    load_encoder_params,
    param_shapes,
    relative_position_bucket,
    zero_padded_context,
)

FIXTURE = Path(__file__).resolve().parent / "data" / "umt5_tiny.safetensors"
encode_jit = jax.jit(encode, static_argnums=3)


@pytest.fixture(scope="module")
def official():
    """The tiny official encoder: config, float32 parameters, golden tensors and metadata."""
    meta = json.loads(FIXTURE.with_suffix(".json").read_text())
    tensors = load_safetensors(FIXTURE)
    config = T5Config(**meta["config"])  # the fixture's config keys construct the config
    return config, load_encoder_params(tensors, config), tensors, meta


@pytest.fixture(scope="module")
def states(official):
    config, params, tensors, _ = official
    return np.asarray(encode_jit(params, tensors["input.ids"], tensors["input.mask"], config))


def test_encode_matches_the_official_encoder(official, states):
    _, _, tensors, meta = official
    expected = tensors["output.context"]
    assert states.shape == expected.shape == (2, 160, 32) and states.dtype == np.float32
    # float32 end to end; the error left (~4e-6 on values of std 1) is float32 rounding: the
    # official encoder run in float64 is as far (3.4e-6) from the float32 golden output. A
    # semantic slip (attention scaling, a bucket off by one, GELU without tanh) is off by 1e-2+.
    assert np.abs(states - expected).max() < 2e-5
    assert np.linalg.norm(states - expected) / np.linalg.norm(expected) < 2e-6
    # What the DiT gets: the official per-prompt cuts u[:v], zero-padded back by WanModel.
    context = np.asarray(zero_padded_context(states, tensors["input.mask"]))
    np.testing.assert_allclose(context, tensors["output.context_zero_padded"], rtol=0, atol=2e-5)
    assert meta["seq_lens"] == [160, 37] and not context[1, 37:].any()


def test_bfloat16_encode_is_as_close_to_the_official_bfloat16_run_as_rounding_allows(official):
    config, _, tensors, _ = official
    params = load_encoder_params(tensors, config, jnp.bfloat16)
    states = np.asarray(encode_jit(params, tensors["input.ids"], tensors["input.mask"], config))
    expected, exact = tensors["output.context_bf16"], tensors["output.context"]
    # bf16 (the released t5_dtype) rounds after every torch op; XLA rounds in other places, so
    # the two bf16 runs differ by about 1% (0.05 here), less than either differs from float32.
    error = np.linalg.norm(states - expected) / np.linalg.norm(expected)
    assert error < 0.02
    assert error < np.linalg.norm(expected - exact) / np.linalg.norm(exact)


def test_padding_is_masked_out_of_the_tokens_but_padded_rows_are_computed(official, states):
    config, params, tensors, _ = official
    ids, mask = tensors["input.ids"], tensors["input.mask"]
    n = int(mask[1].sum())
    assert n == 37 and not ids[1, n:].any()  # right padding with id 0, as the tokenizer
    changed = ids.copy()
    changed[1, n:] = np.arange(2, 2 + ids.shape[1] - n) % config.vocab
    after = np.asarray(encode_jit(params, changed, mask, config))
    # Masked keys get weight exp(finfo.min) = 0: the prompt's rows do not move by a bit.
    np.testing.assert_array_equal(after[:, :n], states[:, :n])
    np.testing.assert_array_equal(after[0], states[0])
    # Padded positions still attend (to the tokens) as queries: their rows follow their ids.
    assert np.abs(after[1, n:] - states[1, n:]).max() > 0.1
    # Unmasking the padding changes the prompt's own rows.
    assert np.abs(np.asarray(encode_jit(params, ids, np.ones_like(mask), config))[1, :n]
                  - states[1, :n]).max() > 1e-2
    # No mask is the same as an all-ones mask (prompt 0 has no padding; batch 1 is another
    # compile, whose float32 rounding differs by ulps).
    no_mask = np.asarray(encode_jit(params, ids[:1], None, config))
    np.testing.assert_allclose(no_mask[0], states[0], rtol=0, atol=1e-5)


def test_relative_position_buckets_follow_the_official_formula(official):
    # Bidirectional, 32 buckets, max_dist 128: rel = key - query. |rel| < 8 is exact; then
    # 8 + trunc(log(|rel| / 8) / log(128 / 8) * 8), at most 15; keys after the query add 16.
    # E.g. -20: 8 + trunc(log(2.5) / log(16) * 8) = 8 + trunc(2.64) = 10; -64: 8 + 6 = 14.
    hand = {0: 0, -1: 1, -7: 7, -8: 8, -15: 9, -16: 10, -20: 10, -64: 14, -127: 15,
            -128: 15, -1000: 15, 1: 17, 5: 21, 8: 24, 12: 25, 16: 26, 127: 31, 1000: 31}
    rel = np.array(list(hand))
    assert relative_position_bucket(rel).tolist() == list(hand.values())
    # Decoder (unidirectional) buckets: later keys all 0; 16 exact distances, 32 buckets.
    assert relative_position_bucket(np.array([3, 0, -1, -15, -16, -20, -64, -200]),
                                     bidirectional=False).tolist() == [0, 0, 1, 15, 16, 17, 26, 31]
    # The official torch float32 buckets for every offset of a 512-token prompt.
    _, _, tensors, _ = official
    official_buckets = tensors["official.buckets"]
    assert official_buckets.shape == (1023,)
    np.testing.assert_array_equal(relative_position_bucket(np.arange(-511, 512)), official_buckets)


def test_preset_is_the_released_umt5_xxl_encoder():
    config = T5Config.umt5_xxl()
    assert config == T5Config() and config.head_dim == 64 and not config.shared_pos
    shapes = param_shapes(config)
    assert sum(int(np.prod(s)) for s in shapes.values()) == 5_680_910_336
    assert shapes["blocks.23.pos_embedding.embedding.weight"] == (32, 64)
    assert shapes["blocks.0.ffn.gate.0.weight"] == (10240, 4096)
    assert "pos_embedding.embedding.weight" not in shapes
    out = jax.eval_shape(lambda p, i, m: encode(p, i, m, config), abstract_encoder_params(config),
                         jax.ShapeDtypeStruct((2, 512), jnp.int32),
                         jax.ShapeDtypeStruct((2, 512), jnp.int32))
    assert out.shape == (2, 512, 4096) and out.dtype == jnp.float32


def test_loader_reads_a_file_and_names_what_is_missing_or_misshaped(official):
    config, params, tensors, _ = official
    from_file = load_encoder_params(FIXTURE, config)
    assert all(np.array_equal(from_file[k], params[k]) for k in params)
    assert list(params) == list(official[3]["param_keys"])  # official named_parameters order
    broken = {k: v for k, v in tensors.items() if k != "blocks.1.pos_embedding.embedding.weight"}
    with pytest.raises(AoizoraError, match=r"blocks\.1\.pos_embedding\.embedding\.weight"):
        load_encoder_params(broken, config)
    wider = dataclasses.replace(config, dim_ffn=128)
    with pytest.raises(AoizoraError, match=r"blocks\.0\.ffn\.gate\.0\.weight.*shape"):
        load_encoder_params(tensors, wider)


@pytest.mark.parametrize("shared_pos", [False, True])
def test_random_init_has_the_official_names_and_encodes_in_range(shared_pos):
    config = T5Config(vocab=100, dim=16, dim_attn=32, dim_ffn=24, num_heads=4, num_layers=3,
                      shared_pos=shared_pos)
    params = init_encoder_params(config, jax.random.key(0))
    abstract = abstract_encoder_params(config, jnp.float32)
    assert {k: v.shape for k, v in params.items()} == {k: v.shape for k, v in abstract.items()}
    assert {k: v.shape for k, v in params.items()} == param_shapes(config)
    assert ("pos_embedding.embedding.weight" in params) == shared_pos
    assert ("blocks.2.pos_embedding.embedding.weight" in params) == (not shared_pos)
    ids = jnp.arange(20, dtype=jnp.int32).reshape(2, 10)
    states = np.asarray(encode_jit(params, ids, jnp.ones_like(ids), config))
    rms = np.sqrt(np.mean(np.square(states), axis=-1))
    assert states.shape == (2, 10, 16) and np.allclose(rms, 1.0, atol=1e-3)  # unit norm weight


def test_bad_tokens_and_configs_are_errors_quoting_the_value(official):
    config, params, tensors, _ = official
    ids, mask = tensors["input.ids"], tensors["input.mask"]
    with pytest.raises(AoizoraError, match=r"\[0, 64\].*vocab=64"):
        encode(params, np.where(ids == 1, 64, ids), mask, config)
    with pytest.raises(AoizoraError, match=r"\[-1, 61\].*\[0, 63\]"):
        encode(params, ids - 1, mask, config)
    with pytest.raises(AoizoraError, match=r"shape \(160,\).*\[B, L\]"):
        encode(params, ids[0], mask[0], config)
    with pytest.raises(AoizoraError, match=r"float32 must be a \[B, L\] integer"):
        encode(params, ids.astype(np.float32), mask, config)
    with pytest.raises(AoizoraError, match=r"mask shape \(2, 12\).*\(2, 160\)"):
        encode(params, ids, mask[:, :12], config)
    with pytest.raises(AoizoraError, match=r"dim_attn=100.*num_heads=64"):
        T5Config(dim_attn=100)
    with pytest.raises(AoizoraError, match=r"num_buckets=31 must be an even integer"):
        T5Config(num_buckets=31)
    with pytest.raises(AoizoraError, match=r"num_layers=0"):
        T5Config(num_layers=0)
    with pytest.raises(AoizoraError, match=r"states \[B, L, dim\].*\(2, 160\)"):
        zero_padded_context(jnp.zeros((2, 160)), mask)
