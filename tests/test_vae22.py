import dataclasses
import json
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from aoizora_lab.errors import AoizoraError
from aoizora_lab.models.safetensors_io import load_safetensors
from aoizora_lab.models.vae22 import (
    VAE22Config,
    _avg_down,
    _dup_up,
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

FIXTURE = Path(__file__).resolve().parent / "data" / "wan22_vae_tiny.safetensors"
decode_jit = jax.jit(decode, static_argnums=2)


@pytest.fixture(scope="module")
def official():
    """The tiny official decoder: config, float32 parameters and the golden tensors."""
    meta = json.loads(FIXTURE.with_suffix(".json").read_text())
    tensors = load_safetensors(FIXTURE)
    config = VAE22Config(**meta["config"])  # the fixture's config keys construct the config
    return config, load_decoder_params(tensors, config), tensors


@pytest.mark.parametrize("chunk", [None, 1, 2])
def test_decode_matches_the_official_frame_by_frame_decode(official, chunk):
    """All frames at once, and streamed as the official code (1 latent frame at a time with
    the causal cache) and as MaxDiffusion's ``vae_decode_chunk`` 2 (padded last chunk)."""
    config, params, tensors = official
    run = jax.jit(lambda p, z: decode(p, z, config, chunk=chunk))
    video = np.asarray(run(params, jnp.asarray(tensors["input.z"])))
    expected = tensors["output.video"]
    assert video.shape == expected.shape == (2, 3, 9, 32, 48) and video.dtype == np.float32
    # float32 end to end (measured: 4e-6 max); a semantic slip (e.g. the time upsampler seeing
    # the first frame, unpatchify's row and column offsets swapped) is off by order one.
    assert np.abs(video - expected).max() < 5e-5
    assert np.linalg.norm(video - expected) / np.linalg.norm(expected) < 1e-5


def test_dup_up_keeps_the_last_time_phase_of_the_first_frame(official):
    # 16 -> 8 channels: the time phases come from different channels, which the official
    # layout's time-doubling shortcuts (1024 -> 1024) never show.
    _, _, tensors = official
    x, expected = tensors["dupup.input"], tensors["dupup.output"]
    out = np.asarray(_dup_up(jnp.asarray(x), expected.shape[1], 2))
    assert out.shape == expected.shape == (1, 8, 5, 4, 6)
    np.testing.assert_array_equal(out, expected)  # a pure copy: bit exact


def test_preset_is_ti2v_5b_with_16x_space_and_4x_time():
    config = VAE22Config.wan22()
    params = abstract_decoder_params(config)
    shapes = param_shapes(config)
    assert shapes["decoder.conv1.weight"] == (1024, 48, 3, 3, 3)
    assert shapes["decoder.upsamples.1.upsamples.3.time_conv.weight"] == (2048, 1024, 3, 1, 1)
    assert shapes["decoder.upsamples.2.upsamples.3.resample.1.weight"] == (512, 512, 3, 3)
    assert shapes["decoder.upsamples.3.upsamples.0.shortcut.weight"] == (256, 512, 1, 1, 1)
    assert shapes["decoder.head.2.weight"] == (12, 256, 3, 3, 3)
    assert "decoder.upsamples.2.upsamples.3.time_conv.weight" not in shapes
    assert not any(k.startswith("decoder.upsamples.3.upsamples.3") for k in shapes)
    for latent in [(1, 48, 31, 44, 80), (2, 48, 1, 2, 3), (1, 48, 2, 3, 5)]:
        b, _, t, h, w = latent
        expected = (b, 3, 1 + 4 * (t - 1), 16 * h, 16 * w)
        out = jax.eval_shape(lambda p, z: decode(p, z, config), params,
                             jax.ShapeDtypeStruct(latent, jnp.bfloat16))
        assert out.shape == video_shape(config, latent) == expected
    # TI2V-5B at 1280x704, 121 frames: latent (121 - 1) // 4 + 1 = 31 frames of 44 x 80.
    assert video_shape(config, (1, 48, 31, 44, 80)) == (1, 3, 121, 704, 1280)


def test_decode_is_causal_in_time(official):
    config, params, tensors = official
    z = jnp.asarray(tensors["input.z"])
    changed = z.at[:, :, -1].add(1.0)
    before, after = (np.asarray(decode_jit(params, x, config)) for x in (z, changed))
    first_of_last = 1 + 4 * (z.shape[2] - 2)  # output frames of latent frame T-1 start here
    np.testing.assert_array_equal(after[:, :, :first_of_last], before[:, :, :first_of_last])
    assert (np.abs(after - before).max(axis=(0, 1, 3, 4))[first_of_last:] > 1e-3).all()


def test_bad_latents_and_checkpoints_are_errors_naming_them(official):
    config, params, tensors = official
    with pytest.raises(AoizoraError, match=r"\(1, 16, 3, 2, 3\).*z_dim=48"):
        decode(params, jnp.zeros((1, 16, 3, 2, 3)), config)
    with pytest.raises(AoizoraError, match=r"\(48, 3, 2, 3\)"):
        video_shape(config, (48, 3, 2, 3))
    from_file = load_decoder_params(FIXTURE, config)
    assert all(np.array_equal(from_file[k], params[k]) for k in params)
    name = "decoder.upsamples.1.upsamples.2.time_conv.bias"
    broken = {k: v for k, v in tensors.items() if k != name}
    with pytest.raises(AoizoraError, match=name.replace(".", r"\.")):
        load_decoder_params(broken, config)
    with pytest.raises(AoizoraError, match=r"decoder\.conv1\.weight.*shape"):
        load_decoder_params(tensors, dataclasses.replace(config, dec_dim=8))


def test_random_init_has_the_official_names_and_decodes_in_range():
    config = dataclasses.replace(VAE22Config.wan22(), dec_dim=2)
    params = init_decoder_params(config, jax.random.key(0))
    assert {k: v.shape for k, v in params.items()} == param_shapes(config)
    video = np.asarray(decode_jit(params, jnp.ones((1, 48, 2, 1, 2)), config))
    assert video.shape == (1, 3, 5, 16, 32) and np.isfinite(video).all()
    assert video.min() >= -1.0 and video.max() <= 1.0


def test_config_errors_quote_the_value_and_the_fix():
    with pytest.raises(AoizoraError, match=r"latent_mean has 4 values.*z_dim=48"):
        VAE22Config(latent_mean=(0.0,) * 4)
    with pytest.raises(AoizoraError, match=r"temperal_downsample=\(True,\).*3"):
        VAE22Config(temperal_downsample=(True,))
    with pytest.raises(AoizoraError, match=r"level 2 goes from 768 to 256.*DupUp3D"):
        VAE22Config(dim_mult=(1, 1, 3, 3))
    with pytest.raises(AoizoraError, match=r"dec_dim=0"):
        VAE22Config(dec_dim=0)


ENCODER_FIXTURE = FIXTURE.with_name("wan22_vae_encoder_tiny.safetensors")


@pytest.fixture(scope="module")
def official_encoder():
    """The tiny official encoder: config, float32 parameters and the golden tensors."""
    meta = json.loads(ENCODER_FIXTURE.with_suffix(".json").read_text())
    tensors = load_safetensors(ENCODER_FIXTURE)
    config = VAE22Config(**meta["config"])
    return config, load_encoder_params(tensors, config), tensors


@pytest.mark.parametrize("chunk", [None, 1, 2])
def test_encode_matches_the_official_chunked_encode(official_encoder, chunk):
    """All frames at once, streamed as the official code (the first frame, then 4 at a time)
    and 8 at a time (a padded last chunk): the same latent; and one frame alone, as TI2V-5B
    encodes its image."""
    config, params, tensors = official_encoder
    run = jax.jit(lambda p, v: encode(p, v, config, chunk=chunk))
    for video, golden in (("input.video", "output.mu"), ("input.image", "output.image_mu")):
        frames = jnp.asarray(tensors[video])
        mu, expected = np.asarray(run(params, frames)), tensors[golden]
        assert mu.shape == expected.shape == latent_shape(config, frames.shape)
        assert np.linalg.norm(mu - expected) / np.linalg.norm(expected) < 1e-5, golden
    assert tensors["output.mu"].shape == (2, 48, 3, 2, 3)


def test_the_shortcut_averages_time_pairs_after_a_zero_frame_in_front():
    # AvgDown3D on 3 frames halving time: [0, f0], [f1, f2]; channels 2 -> 1 in one group
    x = jnp.arange(1.0, 1.0 + 2 * 3 * 2 * 2).reshape(1, 2, 3, 2, 2)
    out = np.asarray(_avg_down(x, 1, 2, 2))
    assert out.shape == (1, 1, 2, 1, 1)
    assert out[0, 0, 0, 0, 0] == pytest.approx(float(x[:, :, 0].sum()) / 16)  # half zeros
    assert out[0, 0, 1, 0, 0] == pytest.approx(float(x[:, :, 1:].mean()))


def test_encoder_shapes_and_errors_name_the_bad_value():
    config = VAE22Config.wan22()
    image = jax.eval_shape(lambda p, v: encode(p, v, config), abstract_encoder_params(config),
                           jax.ShapeDtypeStruct((1, 3, 1, 704, 1280), jnp.bfloat16))
    assert image.shape == latent_shape(config, (1, 3, 1, 704, 1280)) == (1, 48, 1, 44, 80)
    assert latent_shape(config, (1, 3, 121, 704, 1280)) == (1, 48, 31, 44, 80)
    assert video_shape(config, (1, 48, 31, 44, 80)) == (1, 3, 121, 704, 1280)
    with pytest.raises(AoizoraError, match=r"\(1, 3, 1, 700, 1280\).*multiples of 16"):
        latent_shape(config, (1, 3, 1, 700, 1280))
    with pytest.raises(AoizoraError, match=r"chunk=0"):
        encode(abstract_encoder_params(config), jnp.zeros((1, 3, 1, 16, 16)), config, chunk=0)
    with pytest.raises(AoizoraError, match=r"VAE22Config.dim=0"):
        VAE22Config(dim=0)
    with pytest.raises(AoizoraError, match=r"encoder level 3 goes from 640 to 1280.*AvgDown3D"):
        VAE22Config(dim_mult=(1, 2, 4, 8))
    assert not set(encoder_param_shapes(config)) & set(param_shapes(config))
    assert encoder_param_shapes(config)["encoder.conv1.weight"] == (160, 12, 3, 3, 3)
