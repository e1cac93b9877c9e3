import json
import re

import pytest

import aoizora_lab as az
from aoizora_lab.hardware import load_calibration


@pytest.mark.parametrize("generation", az.GENERATIONS)
def test_every_generation_has_a_consistent_spec(generation):
    spec = az.chip_spec(generation)
    assert spec.generation == generation
    assert spec.hbm_usable_bytes <= spec.hbm_bytes
    assert 0 < spec.ici_efficiency <= 1
    # A link moves far fewer bytes per second than the chip's own HBM.
    assert spec.ici_link_bandwidth < spec.hbm_bandwidth
    assert spec.torus_ndim == (2 if generation in ("v5e", "v6e") else 3)


def test_generation_name_is_normalised_and_unknown_ones_are_named():
    assert az.chip_spec(" V5E ").generation == "v5e"
    with pytest.raises(az.AoizoraError, match=r"'v9z'.*" + re.escape(str(list(az.GENERATIONS)))):
        az.chip_spec("v9z")


def test_keyword_overrides_replace_fields_and_mark_the_source():
    base = az.chip_spec("v5e")
    cloud = az.chip_spec("v5e", ici_link_bandwidth=az.ICI_LINK_BANDWIDTH_CLOUD["v5e"])
    assert cloud.ici_link_bandwidth == az.ICI_LINK_BANDWIDTH_CLOUD["v5e"]
    assert cloud.ici_link_bandwidth != base.ici_link_bandwidth
    assert cloud.peak_bf16_flops == base.peak_bf16_flops
    assert cloud.source == "overrides" and base.source == "defaults"


def test_bad_overrides_name_the_field():
    with pytest.raises(az.AoizoraError, match="ici_bandwith"):
        az.chip_spec("v5e", ici_bandwith=1e10)
    with pytest.raises(az.AoizoraError, match="ici_hop_latency=-1"):
        az.chip_spec("v5e", ici_hop_latency=-1)
    with pytest.raises(az.AoizoraError, match=r"ici_efficiency=1\.5"):
        az.chip_spec("v5e", ici_efficiency=1.5)


def test_calibration_file_is_applied_and_can_be_ignored(_no_user_calibration):
    folder = _no_user_calibration
    (folder / "v6e.json").write_text(json.dumps(
        {"generation": "v6e", "overrides": {"ici_link_bandwidth": 7.7e10}, "fit_error": 0.03}))
    calibrated = az.chip_spec("v6e")
    assert calibrated.ici_link_bandwidth == 7.7e10
    assert "v6e.json" in calibrated.source
    assert az.chip_spec("v6e", calibrated=False).ici_link_bandwidth != 7.7e10
    # Keyword overrides win over the calibration file.
    assert az.chip_spec("v6e", ici_link_bandwidth=6e10).ici_link_bandwidth == 6e10
    # Other generations are untouched.
    assert az.chip_spec("v5e").source == "defaults"


def test_broken_calibration_file_is_a_clear_error(_no_user_calibration):
    (_no_user_calibration / "v5e.json").write_text("{not json")
    with pytest.raises(az.AoizoraError, match=r"v5e\.json.*calibrated=False"):
        az.chip_spec("v5e")
    assert load_calibration("v6e") == {}
