"""The other programs of a generation, split on a slice: the same numbers as unsplit (on CPU
host devices, against the official golden outputs), real halo exchanges, clear errors, and
(slow) a deviceless compile priced by the cost model."""

import json
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from aoizora_lab.compile import CompileStatus
from aoizora_lab.errors import AoizoraError
from aoizora_lab.models import t5, vae, vae22
from aoizora_lab.models.safetensors_io import load_safetensors
from aoizora_lab.parts import (
    DecodePart,
    EncodePart,
    VideoEncodePart,
    encode_splits,
    part_from_spec,
    part_mesh,
    part_spec,
    price_part,
    sharded_encode,
    sharded_vae,
    vae_splits,
)
from aoizora_lab.topology import Topology

DATA = Path(__file__).resolve().parent / "data"


def _fixture(name, config_type, load):
    meta = json.loads((DATA / f"{name}.json").read_text())
    tensors = load_safetensors(DATA / f"{name}.safetensors")
    config = config_type(**meta["config"])
    return config, load(tensors, config), tensors


@pytest.mark.parametrize(("rows", "cols", "chunk"), [(2, 2, None), (1, 2, 1), (2, 1, 2)])
def test_a_split_decode_gives_the_official_video_with_halo_exchanges(rows, cols, chunk):
    config, params, tensors = _fixture("wan21_vae_tiny", vae.VAEConfig, vae.load_decoder_params)
    z = jnp.asarray(tensors["input.z"])
    part = DecodePart(tuple(z.shape), rows=rows, cols=cols, chunk=chunk)
    run = sharded_vae(part, part_mesh(part, jax.devices()[:8]), config)
    video = run(params, z)
    np.testing.assert_allclose(np.asarray(video), tensors["output.video"], atol=5e-5)
    # Split for real: the video comes back in tiles, and the program exchanges halos.
    h, w = video.shape[3:]
    assert video.sharding.shard_shape(video.shape)[3:] == (h // rows, w // cols)
    assert "collective-permute" in run.lower(params, z).compile().as_text()


@pytest.mark.parametrize(("name", "module", "config", "latent", "rows", "cols", "chunk"), [
    ("wan2.2", vae22, vae22.VAE22Config(dec_dim=4, num_res_blocks=1), (1, 48, 3, 4, 6),
     2, 3, 1),
    ("wan2.1", vae, vae.VAEConfig(dim=4, num_res_blocks=1), (1, 16, 2, 8, 6), 3, 1, None),
])
def test_a_split_decode_equals_the_unsplit_one(name, module, config, latent, rows, cols,
                                                chunk):
    """Wan 2.2's decoder split (its fixture's latent is too small to split), and a split that
    does not divide the latent (8 rows in tiles of 3, 3, 2), against the same decode unsplit."""
    params = module.init_decoder_params(config, jax.random.key(0))
    z = jax.random.normal(jax.random.key(1), latent)
    part = DecodePart(latent, vae=name, rows=rows, cols=cols, chunk=chunk)
    devices = jax.devices()[: part.devices * (8 // part.devices)]
    video = sharded_vae(part, part_mesh(part, devices), config)(params, z)
    whole = jax.jit(lambda p, z: module.decode(p, z, config, chunk=chunk))(params, z)
    np.testing.assert_allclose(np.asarray(video), np.asarray(whole), atol=5e-5)


def test_a_split_wan22_image_encode_equals_the_unsplit_one():
    """TI2V-5B's image through the Wan 2.2 encoder, in latent tiles (a small config)."""
    from aoizora_lab.models import vae22

    config = vae22.VAE22Config(dim=4, dec_dim=4, num_res_blocks=1)
    params = vae22.init_encoder_params(config, jax.random.key(0))
    latent = (1, 48, 1, 4, 6)
    image = jax.random.uniform(jax.random.key(1), vae22.video_shape(config, latent),
                               minval=-1.0, maxval=1.0)
    part = VideoEncodePart(latent, vae="wan2.2", rows=2, cols=3)
    run = sharded_vae(part, part_mesh(part, jax.devices()[:6]), config)
    mu = run(params, image)
    whole = jax.jit(lambda p, v: vae22.encode(p, v, config))(params, image)
    assert mu.shape == latent
    np.testing.assert_allclose(np.asarray(mu), np.asarray(whole), atol=5e-5)


@pytest.mark.parametrize(("rows", "cols", "chunk"), [(2, 3, None), (3, 1, 1)])
def test_a_split_video_encode_equals_the_unsplit_one_with_halo_exchanges(rows, cols, chunk):
    """The VAE encoder in latent tiles (8 rows in tiles of 3, 3, 2 included: a split that does
    not divide), all frames at once and as the official 1-then-4 chunks."""
    config = vae.VAEConfig(dim=4, num_res_blocks=1)
    params = vae.init_encoder_params(config, jax.random.key(0))
    latent = (1, 16, 3, 8, 6)
    video = jax.random.uniform(jax.random.key(1), vae.video_shape(config, latent),
                               minval=-1.0, maxval=1.0)
    part = VideoEncodePart(latent, rows=rows, cols=cols, chunk=chunk)
    devices = jax.devices()[: part.devices * (8 // part.devices)]
    run = sharded_vae(part, part_mesh(part, devices), config)
    mu = run(params, video)
    whole = jax.jit(lambda p, v: vae.encode(p, v, config, chunk=chunk))(params, video)
    assert mu.shape == latent
    np.testing.assert_allclose(np.asarray(mu), np.asarray(whole), atol=5e-5)
    assert "collective-permute" in run.lower(params, video).compile().as_text()


@pytest.mark.parametrize(("prompt_split", "tp"), [(2, 2), (1, 4), (2, 1)])
def test_a_split_encoder_gives_the_official_states(prompt_split, tp):
    config, params, tensors = _fixture("umt5_tiny", t5.T5Config, t5.load_encoder_params)
    ids, mask = tensors["input.ids"], tensors["input.mask"]
    part = EncodePart(prompts=ids.shape[0], text_len=ids.shape[1], prompt_split=prompt_split,
                      tp=tp)
    run = sharded_encode(part, part_mesh(part, jax.devices()[:8]), config)
    states = run(params, ids, mask)
    np.testing.assert_allclose(np.asarray(states), tensors["output.context"], atol=2e-5)
    assert states.sharding.shard_shape(states.shape)[0] == ids.shape[0] // prompt_split
    if tp > 1:  # the heads are split: partial sums meet in all-reduces
        assert "all-reduce" in run.lower(params, ids, mask).compile().as_text()


def test_parts_round_trip_through_their_job_spec():
    for part in (DecodePart((1, 16, 21, 90, 160), rows=2, cols=4),
                 VideoEncodePart((1, 16, 21, 90, 160), rows=2, cols=4, chunk=1),
                 EncodePart(prompts=2, prompt_split=2, tp=4)):
        assert part_from_spec(json.loads(json.dumps(part_spec(part)))) == part


def test_bad_parts_are_errors_that_name_the_value_and_the_fix():
    with pytest.raises(AoizoraError, match=r"rows=46 must be 1 or an integer up to .* 90"):
        DecodePart((1, 16, 21, 90, 160), rows=46)
    with pytest.raises(AoizoraError, match=r"chunk=0 must be None \(every frame at once\)"):
        DecodePart((1, 16, 21, 90, 160), chunk=0)
    with pytest.raises(AoizoraError, match=r"vae='wan3'.*one of"):
        DecodePart((1, 16, 21, 90, 160), vae="wan3")
    with pytest.raises(AoizoraError, match=r"has 16 channels; the wan2.2 VAE's latent has 48"):
        DecodePart((1, 16, 21, 90, 160), vae="wan2.2")
    with pytest.raises(AoizoraError, match=r"has 16 channels; the wan2.2 VAE's latent has 48"):
        VideoEncodePart((1, 16, 1, 44, 80), vae="wan2.2")
    with pytest.raises(AoizoraError, match=r"VideoEncodePart.rows=46"):
        VideoEncodePart((1, 16, 21, 90, 160), rows=46)
    with pytest.raises(AoizoraError, match=r"cols=True must be 1 or an integer"):
        DecodePart((1, 16, 21, 90, 160), cols=True)
    with pytest.raises(AoizoraError, match=r"latent=\(1, 16, 21\).*\[B, z_dim, T, h, w\]"):
        DecodePart((1, 16, 21))
    with pytest.raises(AoizoraError, match=r"prompt_split=2 must divide prompts=1"):
        EncodePart(prompts=1, prompt_split=2)
    with pytest.raises(AoizoraError, match=r"splits over 3 devices.*slice's 8"):
        DecodePart((1, 16, 21, 90, 160), rows=3).mesh_shape(8)
    with pytest.raises(AoizoraError, match=r"tp=3 must divide"):
        config = _fixture("umt5_tiny", t5.T5Config, t5.load_encoder_params)[0]
        part = EncodePart(prompts=2, text_len=8, prompt_split=1, tp=3)
        sharded_encode(part, part_mesh(part, jax.devices()[:6]), config)


@pytest.mark.parametrize(("latent", "devices"), [((1, 16, 21, 90, 160), 8),
                                                  ((1, 16, 21, 60, 104), 256),
                                                  ((1, 48, 21, 44, 80), 16)])
def test_vae_splits_use_the_most_devices_squarest_first(latent, devices):
    vae = "wan2.2" if latent[1] == 48 else "wan2.1"
    splits = vae_splits(latent, devices, vae=vae, keep=3, chunks=(None,))
    h, w = latent[3], latent[4]
    possible = [(r, c) for r in range(1, h // 2 + 1) for c in range(1, w // 2 + 1)
                if h % r == 0 and w % c == 0 and devices % (r * c) == 0]
    most = max(r * c for r, c in possible)
    assert splits and all(p.devices == most for p in splits)
    perimeters = [h // p.rows + w // p.cols for p in splits]
    assert perimeters == sorted(perimeters)
    assert min(perimeters) == min(h // r + w // c for r, c in possible if r * c == most)


def test_vae_splits_chunk_a_short_video_at_most_its_length():
    splits = vae_splits((1, 16, 2, 4, 6), 8, chunks=(None, 1, 5))
    assert {p.chunk for p in splits} == {None, 1, 2}
    # one frame (TI2V-5B's image) has nothing to stream: all at once only
    image = vae_splits((1, 48, 1, 44, 80), 8, part=VideoEncodePart, vae="wan2.2")
    assert {p.chunk for p in image} == {None} and len(image) == 2


def test_vae_splits_of_an_encode_are_encodes_chunked_as_the_official_code():
    decodes = vae_splits((1, 16, 21, 90, 160), 8)
    encodes = vae_splits((1, 16, 21, 90, 160), 8, part=VideoEncodePart)
    assert all(type(p) is VideoEncodePart for p in encodes)
    assert [(p.rows, p.cols) for p in encodes] == [(p.rows, p.cols) for p in decodes]
    assert {p.chunk for p in encodes} == {None, 1} and {p.chunk for p in decodes} == {None, 5}
    assert len({p.name for p in encodes + decodes}) == len(encodes + decodes)


@pytest.mark.parametrize(("devices", "prompts"), [(8, 2), (6, 2), (3, 2), (8, 1)])
def test_encode_splits_put_the_prompts_apart_where_the_devices_allow(devices, prompts):
    splits = encode_splits(devices, prompts=prompts, max_tp=4)
    apart = prompts if devices % prompts == 0 else 1
    assert {(p.prompt_split, p.tp) for p in splits} == {
        (apart, t) for t in (1, 2, 4) if devices % (apart * t) == 0}
    for p in splits:
        p.mesh_shape(devices)  # every split fits the slice


@pytest.mark.slow
def test_a_decode_compiles_deviceless_and_prices_its_halos(tmp_path):
    topology = Topology.from_name("v5e:2x4", deviceless=True)
    part = DecodePart((1, 16, 3, 16, 24), rows=2, cols=4, chunk=1)
    priced = price_part(part, topology, cache_dir=tmp_path)
    assert priced.status == CompileStatus.OK, priced.message
    assert priced.predicted.compute_s > 0 and priced.predicted.comm_s > 0
    assert priced.predicted.total_s >= priced.predicted.compute_s
    assert priced.hbm_bytes > 0 and len(priced.placement) == 8
    again = price_part(part, topology, cache_dir=tmp_path)  # read back from the cache
    assert again.predicted == priced.predicted
    # The program prices again under the plans' ensemble: a spread of positive times.
    from aoizora_lab.uncertainty import price

    draws = price(priced.program, topology, priced.placement)
    assert (draws > 0).all() and draws.max() > draws.min()


@pytest.mark.slow
@pytest.mark.parametrize(("latent", "vae"), [((1, 16, 3, 16, 24), "wan2.1"),
                                             ((1, 48, 1, 4, 8), "wan2.2")])
def test_a_video_encode_compiles_deviceless_on_the_released_encoder(tmp_path, latent, vae):
    """Wan 2.1's on a condition video, Wan 2.2's on one frame (TI2V-5B's image)."""
    topology = Topology.from_name("v5e:2x4", deviceless=True)
    priced = price_part(VideoEncodePart(latent, vae=vae, rows=2, cols=4), topology,
                        cache_dir=tmp_path)
    assert priced.status == CompileStatus.OK, priced.message
    assert priced.predicted.compute_s > 0 and priced.predicted.comm_s > 0
    assert priced.part.name.startswith(f"vae-encode-{vae}-rows2-cols4")


@pytest.mark.slow
def test_a_part_that_cannot_lower_is_a_result_with_its_reason(tmp_path):
    topology = Topology.from_name("v5e:2x4", deviceless=True)
    priced = price_part(EncodePart(prompts=2, text_len=16, prompt_split=1, tp=8),
                        topology, cache_dir=tmp_path, timeout_s=1.0)
    assert priced.status == CompileStatus.TIMEOUT and not priced.ok
    assert "no result after 1 s" in priced.message


def test_the_vae_is_the_one_for_the_latents_channels():
    from aoizora_lab.parts import VAES, vae_for

    assert {vae_for((1, channels, 3, 4, 4)): channels for channels in VAES.values()} == VAES
    with pytest.raises(AoizoraError, match=r"latent of 32 channels.*\(1, 32, 3, 4, 4\)"):
        vae_for((1, 32, 3, 4, 4))


@pytest.mark.parametrize("workers", [1, 3])
def test_plan_part_prices_every_split_in_order_the_first_alone(monkeypatch, workers):
    import threading
    import time

    from tiny import priced_part

    from aoizora_lab import parts

    running, most, order = [0], [], []
    lock = threading.Lock()

    def fake(part, topology, **kwargs):
        with lock:
            running[0] += 1
            most.append(running[0])
            order.append(part.cols)
        time.sleep(0.1)
        with lock:
            running[0] -= 1
        return priced_part(part, float(part.cols))

    monkeypatch.setattr(parts, "price_part", fake)
    splits = [DecodePart((1, 16, 3, 16, 24), cols=c) for c in (4, 1, 2, 3)]
    priced = parts.plan_part(splits, None, workers=workers)
    assert [p.part for p in priced] == splits and priced.best.part.cols == 1
    assert order[0] == 4 and most[0] == 1  # the first alone: its host peak sizes the rest
    assert max(most) == workers
