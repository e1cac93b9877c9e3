import jax
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from aoizora_lab.errors import AoizoraError
from aoizora_lab.models.attention import (
    attention_fn,
    blockwise_attention,
    dense_attention,
    merge_partials,
    splash_block_sizes,
)


def _qkv(key, batch, sq, sk, heads, dim):
    kq, kk, kv = jax.random.split(jax.random.key(key), 3)
    return (jax.random.normal(kq, (batch, sq, heads, dim)),
            jax.random.normal(kk, (batch, sk, heads, dim)),
            jax.random.normal(kv, (batch, sk, heads, dim)))


@pytest.mark.slow  # a jit compile per example
@settings(max_examples=12, deadline=None)
@given(sq=st.integers(1, 40), sk=st.integers(1, 40), block=st.integers(1, 16),
       heads=st.integers(1, 3), valid=st.integers(1, 40), seed=st.integers(0, 1000))
def test_blockwise_matches_dense_for_any_lengths_blocks_and_padding(sq, sk, block, heads,
                                                                    valid, seed):
    q, k, v = _qkv(seed, 2, sq, sk, heads, 8)
    valid = min(valid, sk)
    out, lse = blockwise_attention(q, k, v, kv_valid=valid, block_q=block, block_kv=block)
    ref_out, ref_lse = dense_attention(q, k, v, kv_valid=valid)
    np.testing.assert_allclose(out, ref_out, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(lse, ref_lse, rtol=1e-5, atol=1e-5)


def test_dense_reference_is_softmax_attention():
    q, k, v = _qkv(0, 1, 5, 7, 2, 4)
    scores = np.einsum("bqhd,bkhd->bhqk", q, k) / 2.0
    probs = np.exp(scores - scores.max(-1, keepdims=True))
    probs /= probs.sum(-1, keepdims=True)
    np.testing.assert_allclose(dense_attention(q, k, v)[0],
                               np.einsum("bhqk,bkhd->bqhd", probs, v), rtol=1e-5)


def test_masked_keys_are_ignored():
    q, k, v = _qkv(1, 1, 6, 10, 2, 8)
    noisy_k = k.at[:, 7:].set(1e3)
    noisy_v = v.at[:, 7:].set(-1e3)
    for fn in (dense_attention, blockwise_attention):
        clean = fn(q, k[:, :7], v[:, :7])[0]
        np.testing.assert_allclose(fn(q, noisy_k, noisy_v, kv_valid=7)[0], clean, rtol=1e-5,
                                   atol=1e-6)


def test_merging_partials_over_split_keys_equals_attention_over_all_keys():
    q, k, v = _qkv(2, 2, 9, 24, 3, 8)
    whole = dense_attention(q, k, v)
    parts = [dense_attention(q, k[:, i:i + 8], v[:, i:i + 8]) for i in (0, 8, 16)]
    merged = merge_partials(merge_partials(parts[0], parts[1]), parts[2])
    np.testing.assert_allclose(merged[0], whole[0], rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(merged[1], whole[1], rtol=1e-5)
    # A fully masked partial carries no weight in a merge.
    empty = dense_attention(q, k[:, :8], v[:, :8], kv_valid=0)
    np.testing.assert_allclose(merge_partials(whole, empty)[0], whole[0], rtol=1e-5, atol=1e-6)


def test_blockwise_runs_32k_tokens_without_materialising_scores():
    seq, heads, dim = 32_768, 1, 64
    q, k, v = _qkv(3, 1, seq, seq, heads, dim)
    step = jax.jit(lambda q, k, v: blockwise_attention(q, k, v, kv_valid=seq - 8))
    compiled = step.lower(q, k, v).compile()
    score_bytes = seq * seq * 4
    temp = compiled.memory_analysis().temp_size_in_bytes
    assert temp < score_bytes / 64, f"temp {temp} B is not far below S*S scores {score_bytes} B"
    out, _ = compiled(q, k, v)
    rows = np.array([0, 1, 4_097, 20_000, seq - 1])
    ref, _ = dense_attention(q[:, rows], k, v, kv_valid=seq - 8)
    np.testing.assert_allclose(np.asarray(out)[:, rows], ref, rtol=2e-4, atol=2e-5)


def test_splash_block_sizes_follow_the_measured_limits():
    # 75,600 tokens on v5e: 1024 / 1024 / 512 is what compiles (measured deviceless).
    assert splash_block_sizes(75_600, 75_600) == (1024, 1024, 512)
    block_q, block_kv, compute = splash_block_sizes(300, 257)
    assert block_q >= 300 and block_kv >= 257
    assert block_q % 128 == block_kv % 128 == 0 and block_kv % compute == 0


def test_unknown_backend_is_named():
    with pytest.raises(AoizoraError, match=r"'flash'.*blockwise"):
        attention_fn("flash")


# -- splash attention, the kernel every TPU plan uses, run by the Pallas interpreter on CPU

def _splash(q, k, v, **options):
    from aoizora_lab.models.attention import splash_attention

    return splash_attention(q, k, v, interpret=True, **options)


@pytest.mark.parametrize(("sq", "sk", "valid"), [(128, 256, 256), (100, 300, 211)])
def test_splash_matches_dense_with_padding_and_masked_keys(sq, sk, valid):
    # 100 queries and 300 keys are padded to the 128-wide blocks; keys past `valid` carry
    # huge values that would dominate the output if they were not masked.
    q, k, v = _qkv(3, 2, sq, sk, 2, 64)
    k, v = k.at[:, valid:].set(1e3), v.at[:, valid:].set(-1e3)
    out, lse = _splash(q, k, v, kv_valid=valid)
    ref_out, ref_lse = dense_attention(q, k, v, kv_valid=valid)
    assert out.shape == ref_out.shape and lse.shape == ref_lse.shape
    np.testing.assert_allclose(out, ref_out, rtol=2e-5, atol=2e-5)
    np.testing.assert_allclose(lse, ref_lse, rtol=2e-5, atol=2e-5)


def test_splash_log_sum_exp_merges_a_ring_exactly():
    # A ring step attends to one K/V shard at a time and merges by log-sum-exp: with splash
    # partials the merge must equal attention over all keys.
    q, k, v = _qkv(4, 1, 128, 384, 2, 64)
    parts = [_splash(q, k[:, i:i + 128], v[:, i:i + 128]) for i in (0, 128, 256)]
    merged = merge_partials(merge_partials(parts[0], parts[1]), parts[2])
    whole = dense_attention(q, k, v)
    np.testing.assert_allclose(merged[0], whole[0], rtol=2e-5, atol=2e-5)
    np.testing.assert_allclose(merged[1], whole[1], rtol=2e-5, atol=2e-5)
