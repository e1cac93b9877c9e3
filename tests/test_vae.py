import dataclasses
import json
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from aoizora_lab.errors import AoizoraError
from aoizora_lab.models.safetensors_io import load_safetensors
from aoizora_lab.models.vae import (
    VAEConfig,
    abstract_decoder_params,
    abstract_encoder_params,
    decode,
    encode,
    encoder_param_shapes,
    init_decoder_params,
    latent_shape,
    load_decoder_params,
    load_encoder_params,
    param_shapes,
    video_shape,
)

FIXTURE = Path(__file__).resolve().parent / "data" / "wan21_vae_tiny.safetensors"
decode_jit = jax.jit(decode, static_argnums=2)


@pytest.fixture(scope="module")
def official():
    """The tiny official decoder: config, float32 parameters and the golden tensors."""
    meta = json.loads(FIXTURE.with_suffix(".json").read_text())
    tensors = load_safetensors(FIXTURE)
    config = VAEConfig(**meta["config"])  # the fixture's config keys construct the config
    return config, load_decoder_params(tensors, config), tensors


@pytest.mark.parametrize("chunk", [None, 1, 2])
def test_decode_matches_the_official_frame_by_frame_decode(official, chunk):
    """All frames at once, and streamed as the official code (1 latent frame at a time with
    the causal cache) and as MaxDiffusion's ``vae_decode_chunk`` 2 (padded last chunk)."""
    config, params, tensors = official
    run = jax.jit(lambda p, z: decode(p, z, config, chunk=chunk))
    video = np.asarray(run(params, jnp.asarray(tensors["input.z"])))
    expected = tensors["output.video"]
    assert video.shape == expected.shape == (2, 3, 9, 32, 32) and video.dtype == np.float32
    # float32 end to end; the error left (~1e-5) is float32 rounding: the same decoder in
    # float64 is as far from the float32 golden output. Any semantic slip (e.g. the time
    # upsampler seeing the first frame) is off by order one.
    assert np.abs(video - expected).max() < 5e-5
    assert np.linalg.norm(video - expected) / np.linalg.norm(expected) < 1e-5


def test_preset_output_has_1_plus_4_t_minus_1_frames_at_8x_the_size():
    config = VAEConfig.wan21()
    params = abstract_decoder_params(config)
    for latent in [(1, 16, 21, 90, 160), (2, 16, 1, 4, 6), (1, 16, 2, 3, 5)]:
        b, _, t, h, w = latent
        expected = (b, 3, 1 + 4 * (t - 1), 8 * h, 8 * w)
        out = jax.eval_shape(lambda p, z: decode(p, z, config), params,
                             jax.ShapeDtypeStruct(latent, jnp.bfloat16))
        assert out.shape == video_shape(config, latent) == expected
    assert video_shape(config, (1, 16, 21, 90, 160)) == (1, 3, 81, 720, 1280)  # 720p, 81 frames


def test_a_latent_with_the_wrong_channels_is_an_error_naming_it(official):
    config, params, _ = official
    with pytest.raises(AoizoraError, match=r"\(1, 4, 3, 4, 4\).*z_dim=16"):
        decode(params, jnp.zeros((1, 4, 3, 4, 4)), config)
    with pytest.raises(AoizoraError, match=r"\(16, 3, 4, 4\)"):
        video_shape(config, (16, 3, 4, 4))


def test_decode_is_causal_in_time(official):
    config, params, tensors = official
    z = jnp.asarray(tensors["input.z"])
    changed = z.at[:, :, -1].add(1.0)
    before, after = (np.asarray(decode_jit(params, x, config)) for x in (z, changed))
    first_of_last = 1 + 4 * (z.shape[2] - 2)  # output frames of latent frame T-1 start here
    np.testing.assert_array_equal(after[:, :, :first_of_last], before[:, :, :first_of_last])
    assert (np.abs(after - before).max(axis=(0, 1, 3, 4))[first_of_last:] > 1e-3).all()


def test_loader_reads_a_file_and_names_what_is_missing_or_misshaped(official):
    config, params, tensors = official
    from_file = load_decoder_params(FIXTURE, config)
    assert all(np.array_equal(from_file[k], params[k]) for k in params)
    broken = {k: v for k, v in tensors.items() if k != "decoder.upsamples.2.time_conv.bias"}
    with pytest.raises(AoizoraError, match=r"decoder\.upsamples\.2\.time_conv\.bias"):
        load_decoder_params(broken, config)
    wider = dataclasses.replace(config, dim=8)
    with pytest.raises(AoizoraError, match=r"decoder\.conv1\.weight.*shape"):
        load_decoder_params(tensors, wider)


def test_random_init_has_the_official_names_and_decodes_in_range():
    config = dataclasses.replace(VAEConfig.wan21(), dim=4)
    params = init_decoder_params(config, jax.random.key(0))
    abstract = abstract_decoder_params(config, jnp.float32)
    assert {k: v.shape for k, v in params.items()} == {k: v.shape for k, v in abstract.items()}
    assert {k: v.shape for k, v in params.items()} == param_shapes(config)
    # Three residual blocks then an upsampler per level: upsample3d, upsample3d, upsample2d.
    assert "decoder.upsamples.7.time_conv.weight" in params
    assert "decoder.upsamples.11.resample.1.weight" in params
    assert "decoder.upsamples.11.time_conv.weight" not in params
    video = np.asarray(decode_jit(params, jnp.ones((1, 16, 2, 2, 2)), config))
    assert video.shape == (1, 3, 5, 16, 16) and np.isfinite(video).all()
    assert video.min() >= -1.0 and video.max() <= 1.0


def test_config_errors_quote_the_value_and_the_fix():
    with pytest.raises(AoizoraError, match=r"latent_mean has 4 values.*z_dim=16"):
        VAEConfig(latent_mean=(0.0,) * 4)
    with pytest.raises(AoizoraError, match=r"dim_mult=\(1, 2, 4, 4, 4\) must hold 1 to 4"):
        VAEConfig(dim_mult=(1, 2, 4, 4, 4), temperal_downsample=(False, False, True, True))
    with pytest.raises(AoizoraError, match=r"temperal_downsample=\(True,\).*3"):
        VAEConfig(temperal_downsample=(True,))


def test_a_bad_chunk_is_an_error_naming_it(official):
    config, params, tensors = official
    with pytest.raises(AoizoraError, match=r"chunk=0 must be a positive number of latent frames"):
        decode(params, jnp.asarray(tensors["input.z"]), config, chunk=0)


ENCODER_FIXTURE = FIXTURE.with_name("wan21_vae_encoder_tiny.safetensors")


@pytest.fixture(scope="module")
def official_encoder():
    """The tiny official encoder: config, float32 parameters and the golden tensors."""
    meta = json.loads(ENCODER_FIXTURE.with_suffix(".json").read_text())
    tensors = load_safetensors(ENCODER_FIXTURE)
    config = VAEConfig(**meta["config"])
    return config, load_encoder_params(tensors, config), tensors


@pytest.mark.parametrize("chunk", [None, 1, 2])
def test_encode_matches_the_official_chunked_encode(official_encoder, chunk):
    """All frames at once, streamed as the official code (the first frame, then 4 at a time)
    and 8 at a time (a padded last chunk): the same latent."""
    config, params, tensors = official_encoder
    video = jnp.asarray(tensors["input.video"])
    mu = np.asarray(jax.jit(lambda p, v: encode(p, v, config, chunk=chunk))(params, video))
    expected = tensors["output.mu"]
    assert mu.shape == expected.shape == latent_shape(config, video.shape) == (2, 16, 3, 2, 3)
    assert np.linalg.norm(mu - expected) / np.linalg.norm(expected) < 1e-5


def test_encode_is_causal_and_drops_nothing(official_encoder):
    """A change in the last 4 frames moves only the last latent frame; the first frame alone
    makes the first latent frame (what an image-to-video latent's first frame is)."""
    config, params, tensors = official_encoder
    video = jnp.asarray(tensors["input.video"])
    run = jax.jit(lambda p, v: encode(p, v, config))
    before, after = (np.asarray(run(params, v)) for v in (video, video.at[:, :, -1].add(0.5)))
    np.testing.assert_array_equal(after[:, :, :-1], before[:, :, :-1])
    assert np.abs(after[:, :, -1] - before[:, :, -1]).max() > 1e-3
    first = np.asarray(run(params, video[:, :, :1]))
    np.testing.assert_allclose(first[:, :, 0], before[:, :, 0], rtol=1e-5, atol=1e-6)


def test_encoder_shapes_and_errors_name_the_bad_value():
    config = VAEConfig.wan21()
    out = jax.eval_shape(lambda p, v: encode(p, v, config), abstract_encoder_params(config),
                         jax.ShapeDtypeStruct((1, 3, 81, 720, 1280), jnp.bfloat16))
    assert out.shape == latent_shape(config, (1, 3, 81, 720, 1280)) == (1, 16, 21, 90, 160)
    assert video_shape(config, out.shape) == (1, 3, 81, 720, 1280)  # decode inverts the shape
    with pytest.raises(AoizoraError, match=r"\(1, 3, 80, 720, 1280\).*1 \+ 4 k"):
        latent_shape(config, (1, 3, 80, 720, 1280))
    with pytest.raises(AoizoraError, match=r"chunk=0"):
        encode(abstract_encoder_params(config), jnp.zeros((1, 3, 1, 8, 8)), config, chunk=0)
    assert not set(encoder_param_shapes(config)) & set(param_shapes(config))
