"""One case spec: a workload on a slice is written one way and parses back to itself."""

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import aoizora_lab as az
from aoizora_lab.cases import Case, parse_case
from aoizora_lab.models.wan import PRESETS


@settings(max_examples=60, deadline=None)
@given(model=st.sampled_from(sorted(PRESETS)), width=st.integers(1, 120),
       height=st.integers(1, 120), frames=st.integers(0, 40), cfg=st.booleans(),
       text_len=st.integers(1, 512),
       slice_name=st.sampled_from(["v5e:2x4", "v5e:4x4", "v6e:4x4", "v5p:2x2x4"]))
def test_every_workload_name_parses_back(model, width, height, frames, cfg, text_len,
                                         slice_name):
    config = az.WanConfig.preset(model)
    step = config.vae_stride[1] * config.patch_size[1]  # 16 pixels, 32 for TI2V-5B
    workload = az.Workload(model=model, width=step * width, height=step * height,
                           frames=config.vae_stride[0] * frames + 1, cfg=cfg, text_len=text_len)
    assert az.Workload.parse(workload.name) == workload
    case = Case(workload, slice_name)
    assert parse_case(case.name) == case


@pytest.mark.parametrize(("spec", "width", "height", "frames", "cfg"), [
    ("wan2.1-t2v-14b@720p/v5e:4x4", 1280, 720, 81, True),
    ("wan2.1-t2v-1.3b@480px17/v5e:2x4", 832, 480, 17, True),
    ("wan2.1-t2v-1.3b@832x480-nocfg/v5e:2x4", 832, 480, 81, False),
])
def test_named_sizes_and_defaults(spec, width, height, frames, cfg):
    workload = parse_case(spec).workload
    assert (workload.width, workload.height, workload.frames, workload.cfg) == (
        width, height, frames, cfg)
    assert parse_case(spec).name.startswith(f"{workload.model}@{width}x{height}x{frames}")


@pytest.mark.parametrize(("spec", "fragments"), [
    ("wan2.1-t2v-14b@720p", ["WORKLOAD/SLICE"]),
    ("wan2.1-t2v-14b/v5e:4x4", ["MODEL@WIDTHxHEIGHT"]),
    ("wan2.1-t2v-14b@1080p/v5e:4x4", ["'1080p'", "480p"]),
    ("wan2.1-t2v-14b@1280x720/v5e:3x3", ["'3x3'"]),
    ("wan2.1-t2v-14b@1281x720/v5e:4x4", ["1281x720", "multiples of 16"]),
    ("wan9@1280x720/v5e:4x4", ["'wan9'"]),
    ("custom@64x64x5/v5e:2x4", ["custom WanConfig"]),
])
def test_bad_specs_name_the_bad_part(spec, fragments):
    with pytest.raises(az.AoizoraError) as error:
        parse_case(spec)
    message = str(error.value)
    assert spec in message or spec.split("/")[0] in message
    for fragment in fragments:
        assert fragment in message, (fragment, message)
