import json
import subprocess
import sys
import textwrap

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import Mesh

import aoizora_lab as az
from aoizora_lab.errors import AoizoraError
from aoizora_lab.models.parallel import ParallelPlan
from aoizora_lab.workload import Workload, lower_step


def test_presets_give_the_published_token_counts():
    # Official Wan 2.1 sizes: 832x480x81 -> 32,760 tokens; 1280x720x81 -> 75,600.
    small = Workload.preset("wan2.1-t2v-1.3b", "480p")
    big = Workload.preset("wan2.1-t2v-14b", "720p")
    assert small.latent_shape == (16, 21, 60, 104)
    assert (small.tokens, big.tokens) == (32_760, 75_600)
    assert small.tokens % 8 == 0 and small.tokens % 16 != 0 and big.tokens % 16 == 0
    assert small.batch == 2 and Workload.preset("wan2.1-t2v-1.3b", "480p", cfg=False).batch == 1


def test_wan22_workloads_take_their_vae_and_timesteps():
    # TI2V-5B's official 1280x704, 121 frames through the Wan 2.2 VAE (4 x 16 x 16, 48 channels)
    ti2v = Workload.parse("wan2.2-ti2v-5b@1280x704x121")
    stride = ti2v.config().vae_stride
    assert ti2v.latent_shape == (48, 1 + 120 // stride[0], 704 // stride[1], 1280 // stride[2])
    assert ti2v.tokens == ti2v.latent_shape[1] * (704 // 32) * (1280 // 32)
    inputs = ti2v.abstract_inputs()
    assert inputs["t"].shape == (1, ti2v.tokens) and "y" not in inputs
    # I2V-A14B: the condition latents, no CLIP tokens
    i2v = Workload.parse("wan2.2-i2v-a14b@1280x720x81").abstract_inputs()
    assert set(i2v) == {"latents", "t", "context", "negative_context", "y"}
    assert Workload.parse(ti2v.name) == ti2v
    # A14B: two experts, both resident unless swapped through the host (a name's -swap)
    a14b = Workload.parse("wan2.2-t2v-a14b@720p")
    swapped = Workload.parse("wan2.2-t2v-a14b@1280x720x81-text256-swap")
    assert (a14b.experts, a14b.resident_experts) == (2, 2)
    assert (swapped.experts, swapped.resident_experts) == (2, 1) and swapped.text_len == 256
    assert Workload.parse(swapped.name) == swapped and swapped.name.endswith("-text256-swap")
    assert a14b.sampling.boundary and ti2v.sampling.boundary is None
    with pytest.raises(AoizoraError, match=r"swap_experts=True for wan2.2-ti2v-5b.*two experts"):
        Workload.parse("wan2.2-ti2v-5b@1280x704x121-swap")
    with pytest.raises(AoizoraError, match=r"swap_experts=1 must be True .* or False"):
        Workload(model="wan2.2-t2v-a14b", height=720, width=1280, swap_experts=1)
    with pytest.raises(AoizoraError, match=r"1280x720.*multiples of 32.*1280x704"):
        Workload.parse("wan2.2-ti2v-5b@720p")


def test_abstract_inputs_allocate_nothing_and_match_the_model():
    w = Workload.preset("wan2.1-i2v-14b", "480p")
    inputs = w.abstract_inputs()
    assert all(isinstance(s, jax.ShapeDtypeStruct) for s in inputs.values())
    assert inputs["latents"].shape == (1, *w.latent_shape)
    assert inputs["y"].shape[1] + w.latent_shape[0] == w.config().in_dim
    assert set(inputs) == {"latents", "t", "context", "negative_context", "clip_fea", "y"}


@pytest.mark.parametrize(("kwargs", "pattern"), [
    ({"frames": 80}, r"frames=80.*4n \+ 1"),
    ({"height": 470}, r"832x470.*multiples of 16"),
    ({"width": 0}, r"width=0"),
    ({"text_len": 600}, r"text_len=600"),
    ({"model": "wan3"}, r"'wan3'"),
])
def test_bad_workloads_name_the_value(kwargs, pattern):
    base = {"model": "wan2.1-t2v-1.3b", "height": 480, "width": 832}
    with pytest.raises(AoizoraError, match=pattern):
        Workload(**{**base, **kwargs})
    with pytest.raises(AoizoraError, match=r"'1080p'.*480p"):
        Workload.preset("wan2.1-t2v-1.3b", "1080p")


# Compiled in a child process: some TPU compiles abort their process.
_COMPILE = textwrap.dedent("""
    import json, sys, time
    import numpy as np
    from jax.sharding import Mesh
    import aoizora_lab as az
    from aoizora_lab.models.parallel import ParallelPlan
    from aoizora_lab.workload import Workload, lower_step

    slice_name, model, resolution, shape = sys.argv[1:5]
    shape = tuple(int(n) for n in shape.split("x"))
    topo = az.Topology.from_name(slice_name, deviceless=True)
    devices = np.array(topo.devices)[topo.device_grid().ravel()].reshape(shape)
    roles = {"c": "cfg", "u": "ulysses"}
    plan = ParallelPlan(Mesh(devices, tuple(roles)), roles, fsdp_axes=("c", "u"),
                        attention="splash")
    start = time.time()
    compiled = lower_step(Workload.parse(f"{model}@{resolution}"), plan).compile()
    memory = compiled.memory_analysis()
    text = compiled.as_text()
    print(json.dumps({"seconds": time.time() - start, "peak": memory.peak_memory_in_bytes,
                      "all_to_all": text.count("all-to-all"),
                      "custom_calls": text.count("tpu_custom_call")}))
""")


@pytest.mark.slow
@pytest.mark.parametrize(("slice_name", "model", "resolution", "mesh"), [
    ("v5e:2x4", "wan2.1-t2v-1.3b", "480p", "2x4"),
    ("v5e:4x4", "wan2.1-t2v-14b", "720p", "2x8"),
    # Wan 2.2 TI2V-5B at its official size: the per-token modulation split with the tokens.
    ("v5e:2x4", "wan2.2-ti2v-5b", "1280x704x121", "2x4"),
])
def test_full_step_compiles_deviceless_for_tpu_and_fits_in_hbm(slice_name, model, resolution,
                                                                mesh):
    done = subprocess.run([sys.executable, "-c", _COMPILE, slice_name, model, resolution, mesh],
                          capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    usable = az.chip_spec("v5e").hbm_usable_bytes
    assert 0 < result["peak"] < usable
    assert result["all_to_all"] > 0, "Ulysses all-to-alls are in the compiled program"
    assert result["custom_calls"] > 0, "splash attention is a Pallas TPU custom call"
    print(f"{slice_name} {model}@{resolution}: compile {result['seconds']:.1f} s, "
          f"peak {result['peak'] / 2**30:.2f} GiB")


def test_denoise_step_lowers_on_host_devices():
    plan = ParallelPlan(Mesh(np.array(jax.devices()[:8]).reshape(2, 4), ("c", "u")),
                        {"c": "cfg", "u": "ulysses"}, fsdp_axes=("c", "u"))
    lowered = lower_step(Workload.preset("wan2.1-t2v-1.3b", "480p"), plan, num_layers=1,
                         dtype=jnp.float32)
    text = lowered.as_text()
    assert "all_to_all" in text and "sharding" in text
    ti2v = lower_step(Workload.parse("wan2.2-ti2v-5b@1280x704x121"), plan, num_layers=1,
                      dtype=jnp.float32)
    assert "all_to_all" in ti2v.as_text()


def test_a_swapping_workload_compiles_and_traces_the_resident_ones_program():
    from aoizora_lab.compile import _sweep

    resident = Workload.parse("wan2.2-t2v-a14b@720p")
    swapped = Workload.parse("wan2.2-t2v-a14b@720p-swap")
    assert swapped.program_fields() == resident.program_fields()
    assert "swap_experts" not in resident.program_fields()
    topology = az.Topology.from_name("v6e:2x4")
    assert _sweep(swapped, topology, 2) == _sweep(resident, topology, 2)
    assert Workload.parse("wan2.2-t2v-a14b@720p-nocfg").program_fields() != \
        resident.program_fields()
