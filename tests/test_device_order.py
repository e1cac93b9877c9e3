"""aoizora_lab.bench.order: the published order-only changes rebuilt as their sources describe
them, priced under every order model, and the compiler's labels behind the default."""

import numpy as np
import pandas as pd
import pytest

import aoizora_lab as az
from aoizora_lab.bench import order as device_order
from aoizora_lab.comm_model import mesh_axis_groups


def _measurement(key):
    return next(m for m in device_order.MEASUREMENTS if m.key == key)


def _groups_chips(m, placement, topology):
    """Each group of the measured collective as its member chips' coordinates, in order."""
    order = np.asarray(placement.order)
    return [topology.chip_coords[topology.device_chip[order[g]]]
            for g in mesh_axis_groups(m.mesh, list(m.axes))]


def _ring_hops(coords, topology):
    return [int(topology.offset_hops(coords[(i + 1) % len(coords)] - coords[i]))
            for i in range(len(coords))]


def test_maxtext_v6e_flag_turns_the_x_major_chain_into_a_ring():
    # PR #1239: JAX's generic torus path gave x-major order; reversing positions 4..7 makes
    # every hop of the 8-way axis (the closing one included) one link.
    m = _measurement("MaxText #1239 v6e-8")
    topology = az.Topology.from_name(m.slice_name)
    before, after = m.before[1](topology), m.after[1](topology)
    (chain,), (ring,) = (_groups_chips(m, p, topology) for p in (before, after))
    assert [tuple(c) for c in chain] == [(x, y) for x in range(2) for y in range(4)]
    assert max(_ring_hops(chain, topology)) == 4  # (1,3) -> (0,0)
    assert _ring_hops(ring, topology) == [1] * 8


@pytest.mark.parametrize(("key", "block"), [("MaxText #4911 v6e-128", (4, 2)),
                                            ("axlearn #952 v6e-256", (2, 2))])
def test_ring_meshes_put_every_group_on_a_ring_of_one_block(key, block):
    m = _measurement(key)
    topology = az.Topology.from_name(m.slice_name)
    groups = _groups_chips(m, m.after[1](topology), topology)
    assert sorted(int(c) for c in np.asarray(m.after[1](topology).order)) == list(
        range(topology.num_devices))
    for coords in groups:
        assert _ring_hops(coords, topology) == [1] * len(coords)
        spans = coords.max(axis=0) - coords.min(axis=0) + 1
        assert sorted(spans.tolist()) == sorted(block)
    before = _groups_chips(m, m.before[1](topology), topology)
    assert max(max(_ring_hops(c, topology)) for c in before) > 1  # what the change fixed


def test_tpu7x_change_moves_the_fsdp_groups_onto_the_core_axis():
    m = _measurement("JAX #39340 TPU7x")
    topology = az.Topology.from_name(m.slice_name)
    assert topology.devices_per_chip == 2
    for placement, chips in ((m.before[1](topology), 32), (m.after[1](topology), 16)):
        order = np.asarray(placement.order)
        for group in mesh_axis_groups(m.mesh, list(m.axes)):
            assert len(set(topology.device_chip[order[group]].tolist())) == chips


def test_rows_are_the_ici_model_and_reach_means_at_least_the_published_gain():
    rows = device_order.measurement_rows()
    done = rows[rows["status"] == "ok"]
    assert len(done) == len(device_order.MEASUREMENTS)
    m = device_order.MEASUREMENTS[0]
    topology = az.Topology.from_name(m.slice_name)
    collective = az.Collective(m.kind, mesh_axis_groups(m.mesh, list(m.axes)),
                               device_order.MESSAGE_BYTES)
    for model in az.comm_model.ORDER_MODELS:
        options = az.ModelOptions(order=model)
        expected = (az.estimate(collective, topology, m.before[1](topology), options=options)
                    .seconds / az.estimate(collective, topology, m.after[1](topology),
                                           options=options).seconds)
        assert done.iloc[0][f"{model}_ratio"] == pytest.approx(expected)
        reaches = done[f"{model}_ratio"] >= done["published_ratio"]
        assert (done[f"{model}_reaches"] == reaches).all()
    # The model before device orders could not see an order-only change on one chip set.
    assert done.iloc[0]["physical_ratio"] == pytest.approx(1.0)
    # How sure: the ensemble draws the order model with the link constants, so its interval
    # holds the draws' ratios under both order models it draws.
    first = done.iloc[0]
    assert first["ratio_p10"] <= first["ratio_p90"]
    assert 0 <= first["p_reaches"] <= 1
    assert first["ratio_p10"] <= max(first["compiler_ratio"], first["logical_ratio"]) * 1.001
    assert (done["p_reaches"] > 0).any()
    assert not rows[rows["status"] != "ok"].empty  # what cannot be rebuilt is a row


def test_a_slice_that_cannot_be_built_is_a_row_with_its_reason():
    def refuse(name):
        raise az.AoizoraError(f"no slice {name}")

    rows = device_order.measurement_rows(device_order.MEASUREMENTS[:1], topology_of=refuse)
    assert rows.iloc[0]["status"].startswith("not rebuilt: AoizoraError: no slice v6e:2x4")


def test_targets_count_only_the_measured_setups():
    rows = pd.DataFrame([
        {"status": "ok", "measured_setup": True, **{f"{m}_reaches": True
                                                    for m in az.comm_model.ORDER_MODELS}},
        {"status": "ok", "measured_setup": False, **{f"{m}_reaches": False
                                                     for m in az.comm_model.ORDER_MODELS}},
        {"status": "not rebuilt: x", "measured_setup": True}])
    targets = device_order.order_targets(rows).set_index("order model")
    assert (targets["reaches"] == "1 of 1").all()
    assert targets.loc[az.ModelOptions().order, "default"] == "yes"
    assert device_order.ENSEMBLE_ROW not in targets.index  # no intervals, no calibration row


@pytest.mark.parametrize(("p90", "published", "reached"), [(1.3, 1.1, True), (1.05, 1.1, False)])
def test_the_ensemble_row_asks_the_intervals_top_to_reach_each_published_gain(p90, published,
                                                                            reached):
    models = {f"{m}_reaches": True for m in az.comm_model.ORDER_MODELS}
    rows = pd.DataFrame([
        {"status": "ok", "measured_setup": True, "ratio_p90": 2.0, "published_ratio": 1.05,
         **models},
        {"status": "ok", "measured_setup": True, "ratio_p90": p90, "published_ratio": published,
         **models},
        {"status": "ok", "measured_setup": False, "ratio_p90": 0.5, "published_ratio": 1.5,
         **models}])  # not the measured setup: not counted
    row = device_order.order_targets(rows).set_index("order model").loc[device_order.ENSEMBLE_ROW]
    assert row["reaches"] == f"{1 + reached} of 2"
    assert row["every published gain reached"] == ("met" if reached else "missed")


def test_section_has_its_tables_and_leaves_out_the_labels_not_compiled():
    check = device_order.device_order_check(compile_probes=False)
    text = check.markdown()
    assert text.startswith(device_order.SECTION)
    assert "MaxText #4911" in text and "What the compiler says" not in text


@pytest.mark.slow
def test_compiler_labels_small_all_reduces_as_rings_in_order_and_large_ones_not():
    # The evidence behind RING_IN_ORDER_MAX_MEMBERS, compiled again (child processes).
    probes = [p for p in device_order.PROBES if p.kind == "all-reduce"
              and p.slice_name in ("v6e:2x4", "v5e:4x4") and p.mesh in ((8,), (16,))]
    rows = device_order.probe_rows(probes, workers=1)
    small = rows[rows["group"] <= az.comm_model.RING_IN_ORDER_MAX_MEMBERS]
    large = rows[rows["group"] > az.comm_model.RING_IN_ORDER_MAX_MEMBERS]
    assert len(small) >= 3 and len(large) >= 2
    assert (small["strategy"] == "UniDirection1DRingStrategy").all()
    assert (small["reordering map"] == "no").all()
    assert (small["model reads"] == "ring").all()
    assert not (large["strategy"] == "UniDirection1DRingStrategy").any()
    assert (large["model reads"] == "physical").all()
