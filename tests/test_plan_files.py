"""Plan files are portable: a plan saved on one device numbering loads onto another slice of
the same shape by chip coordinates (and core on the chip), never by device index."""

import dataclasses

import numpy as np
import pytest

import aoizora_lab as az
from aoizora_lab.candidates import Candidate
from aoizora_lab.cost import Predicted
from aoizora_lab.placement import Placement
from aoizora_lab.realize import Plan, device_slots


@pytest.mark.parametrize(("slice_name", "candidate"), [
    ("v5e:4x4", "cfg2-uly8-fsdp"),   # libtpu numbers devices 0, 1, 4, 5, ... across the chips
    ("v4:2x2x2", "cfg2-uly8-fsdp"),  # two devices (TensorCores) per chip
])
def test_a_plan_moves_between_device_numberings_by_chip_coordinates(tmp_path, slice_name,
                                                                    candidate):
    saved_on = az.Topology.from_name(slice_name, deviceless=True)
    # The same slice with its devices numbered backwards (a VM may number them any way).
    renumbered = dataclasses.replace(saved_on, coords=saved_on.coords[::-1], devices=None,
                                     source=az.topology.DeviceSource.SIMULATED)
    assert renumbered.name == saved_on.name
    slots_a, slots_b = device_slots(saved_on), device_slots(renumbered)
    # The two slices number their devices differently (else this proves nothing).
    assert [slots_a[i] for i in range(saved_on.num_devices)] != [
        slots_b[i] for i in range(renumbered.num_devices)]
    order = tuple(int(i) for i in np.random.default_rng(7).permutation(saved_on.num_devices))
    plan = Plan(az.Workload.preset("wan2.1-t2v-14b", "720p"), saved_on,
                Candidate.from_name(candidate), Placement(order, "shuffled"),
                Predicted(1.0, 0.5, 1.25))
    path = tmp_path / "plan.json"
    plan.to_json(path)
    moved = Plan.from_json(path, renumbered)
    # Logical device i sits on the same chip (and core) on both slices ...
    assert [slots_b[d] for d in moved.placement.order] == [slots_a[d] for d in order]
    # ... which is another device index wherever the numberings differ.
    assert moved.placement.order != order
    assert moved.candidate == plan.candidate and moved.predicted == plan.predicted
    # Moving back gives the original order.
    moved_path = tmp_path / "moved.json"
    moved.to_json(moved_path)
    assert Plan.from_json(moved_path, saved_on).placement.order == order


def test_a_plan_file_carries_its_compiler_flags(tmp_path):
    from aoizora_lab.compile import FLAG_SETS

    topology = az.Topology.from_name("v5e:2x4", deviceless=True)
    plan = Plan(az.Workload.preset("wan2.1-t2v-14b", "480p"), topology,
                Candidate.from_name("cfg2-uly4-fsdpseq"), Placement(tuple(range(8)), "plain"),
                Predicted(1.0, 0.5, 1.25), flags=FLAG_SETS["maxdiffusion-ulysses"])
    plan.to_json(tmp_path / "plan.json")
    payload = (tmp_path / "plan.json").read_text()
    assert "--xla_tpu_enable_async_all_to_all=true" in payload
    loaded = Plan.from_json(tmp_path / "plan.json", topology)
    assert loaded.flags == FLAG_SETS["maxdiffusion-ulysses"]
    assert loaded.candidate.name == "cfg2-uly4-fsdpseq" and not loaded.candidate.fsdp_over_cfg
    # A plan with the compiler's defaults writes no flags, and one without flags loads so.
    dataclasses.replace(plan, flags=FLAG_SETS["default"]).to_json(tmp_path / "bare.json")
    assert "libtpu_init_args" not in (tmp_path / "bare.json").read_text()
    assert Plan.from_json(tmp_path / "bare.json", topology).flags == FLAG_SETS["default"]
    (tmp_path / "bad.json").write_text(payload.replace("--xla_tpu_enable_async_all_to_all",
                                                       "xla_oops"))
    with pytest.raises(az.AoizoraError, match="xla_oops"):
        Plan.from_json(tmp_path / "bad.json", topology)
