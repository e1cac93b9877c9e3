"""TPU7x (Ironwood): its chip constants, its slices (two devices per chip) and the intra-chip
path the comm model and the placement scorer price between the two devices of one chip."""

import dataclasses
import re

import numpy as np
import pytest
from tiny import WORKLOAD

import aoizora_lab as az
from aoizora_lab.candidates import Candidate
from aoizora_lab.compile import compile_candidates
from aoizora_lab.placement import PlacementScorer, search_placements, structured_placements

MB = 1e6
CHIP = az.chip_spec("tpu7x", calibrated=False)


@pytest.fixture(scope="module")
def slice8():
    """tpu7x:2x2x1: 4 chips, 8 devices (libtpu's devices where it is installed)."""
    return az.Topology.from_name("tpu7x:2x2x1")


def _same_chip_pairs(topology):
    return [tuple(int(d) for d in pair)
            for pair in topology.device_grid().reshape(topology.num_chips, -1)]


def _neighbour_pairs(topology):
    """One device of chip (0, 0, 0) and one of chip (1, 0, 0): one ICI hop apart."""
    grid = topology.device_grid()
    return [(int(grid[0, 0, 0, 0]), int(grid[1, 0, 0, 0]))]


def test_the_chip_spec_has_positive_published_numbers():
    for name in ("peak_bf16_flops", "hbm_bytes", "hbm_usable_bytes", "hbm_bandwidth",
                 "ici_link_bandwidth", "ici_hop_latency", "ici_efficiency",
                 "intra_chip_bandwidth"):
        assert 0 < getattr(CHIP, name) < np.inf, name
    assert CHIP.torus_ndim == 3
    # The intra-chip path is faster than an ICI link and no faster than the chip's HBM.
    assert CHIP.ici_link_bandwidth < CHIP.intra_chip_bandwidth <= CHIP.hbm_bandwidth
    assert az.ICI_LINK_BANDWIDTH_CLOUD["tpu7x"] > 0
    # One device per chip elsewhere: their intra-chip path stays free, as before.
    assert az.chip_spec("v5e").intra_chip_bandwidth == np.inf


@pytest.mark.parametrize(("name", "chips", "wrap"), [
    ("tpu7x:2x2x1", 4, False), ("tpu7x:2x2x2", 8, False), ("tpu7x:2x4x4", 32, False),
    ("tpu7x:4x4x4", 64, True), ("tpu7x:4x4x8", 128, True),
])
def test_slices_have_two_devices_per_chip_and_the_3d_wraparound_rule(name, chips, wrap):
    for deviceless in (None, False):
        topology = az.Topology.from_name(name, deviceless=deviceless)
        assert topology.generation == "tpu7x" and topology.name == name
        assert topology.num_chips == chips and topology.num_devices == 2 * chips
        assert topology.devices_per_chip == 2
        assert topology.wrap == (wrap,) * 3


def test_libtpu_gives_its_deviceless_devices_and_v7x_names_point_to_tpu7x():
    pytest.importorskip("libtpu")
    topology = az.Topology.from_name("tpu7x:2x2x1", deviceless=True)
    assert topology.source == "libtpu deviceless" and len(topology.devices) == 8
    assert [tuple(d.coords)[:3] for d in topology.devices] == [tuple(c) for c in topology.coords]
    # Each chip holds core 0 and core 1.
    cores = {tuple(c): set() for c in topology.coords}
    for device, coords in zip(topology.devices, topology.coords, strict=True):
        cores[tuple(coords)].add(device.core_on_chip)
    assert all(found == {0, 1} for found in cores.values())
    with pytest.raises(az.AoizoraError, match=r"'v7x'.*'tpu7x'"):
        az.Topology.from_name("v7x:2x2x1")


@pytest.mark.parametrize("kind", ["all-to-all", "collective-permute"])
def test_a_same_chip_transfer_takes_the_intra_chip_path(slice8, kind):
    pairs = _same_chip_pairs(slice8)
    if kind == "collective-permute":  # both devices of every chip send to each other
        pairs = pairs + [(b, a) for a, b in pairs]
    on_chip = az.estimate(az.Collective(kind, pairs, 32 * MB), slice8, chip=CHIP)
    # Per chip: an all-to-all moves half the result each way, a permute the whole of it.
    per_chip = 32 * MB * (1 if kind == "all-to-all" else 2)
    assert on_chip.seconds == pytest.approx(per_chip / CHIP.intra_chip_bandwidth, rel=1e-12)
    assert on_chip.latency_seconds == 0 and not on_chip.link_bytes.any()
    np.testing.assert_allclose(on_chip.chip_bytes, per_chip)
    assert on_chip.busiest_link.intra_chip and on_chip.busiest_link_bytes == per_chip
    assert "within chip" in str(on_chip.busiest_link)
    # The same transfer between neighbouring chips crosses an ICI link and costs more.
    across = _neighbour_pairs(slice8)
    if kind == "collective-permute":
        across = across + [(b, a) for a, b in across]
    between = az.estimate(az.Collective(kind, across, 32 * MB), slice8, chip=CHIP)
    assert 0 < on_chip.seconds < between.seconds
    assert not between.chip_bytes.any() and not between.busiest_link.intra_chip


def test_members_on_one_chip_gather_over_the_intra_chip_path(slice8):
    gather = az.Collective("all-gather", _same_chip_pairs(slice8), 8 * MB)
    result = az.estimate(gather, slice8, chip=CHIP)
    # Each device sends its 4 MB shard to the other: 8 MB per chip.
    assert result.seconds == pytest.approx(8 * MB / CHIP.intra_chip_bandwidth, rel=1e-12)
    # With an infinitely fast path it is free, as on every one-device-per-chip generation.
    free = dataclasses.replace(CHIP, intra_chip_bandwidth=np.inf)
    free_result = az.estimate(gather, slice8, chip=free)
    assert free_result.seconds == 0 and free_result.busiest_link is None


def _collectives(topology):
    mesh = (2, topology.num_devices // 2)
    over_1 = az.mesh_axis_groups(mesh, [1])
    return [
        az.Collective("all-to-all", az.mesh_axis_groups(mesh, [0]), 8 * MB, count=3),
        az.Collective("all-gather", over_1, 4 * MB),
        az.Collective("all-reduce", az.mesh_axis_groups(mesh, [0, 1]), 2 * MB),
        az.Collective("reduce-scatter", az.mesh_axis_groups(mesh, [0]), 1 * MB),
        az.Collective("collective-permute",
                      [(g[i], g[(i + 1) % len(g)]) for g in over_1 for i in range(len(g))],
                      16 * MB, count=5),
    ]


@pytest.mark.parametrize("name", ["tpu7x:2x2x1", "tpu7x:2x2x2"])
def test_the_scorer_agrees_with_the_ici_model(name):
    topology = az.Topology.from_name(name, deviceless=False)
    rng = np.random.default_rng(7)
    orders = [rng.permutation(topology.num_devices) for _ in range(12)]
    orders += [p.order for p in structured_placements((2, topology.num_devices // 2),
                                                      topology)[:8]]
    for collective in _collectives(topology):
        scorer = PlacementScorer([collective], topology, chip=CHIP)
        expected = [az.estimate(collective, topology, o, chip=CHIP).seconds for o in orders]
        np.testing.assert_allclose(scorer.scores(orders), expected, rtol=1e-12,
                                   err_msg=collective.kind)
    # The orders do put traffic on the intra-chip path.
    assert any(az.estimate(_collectives(topology), topology, o, chip=CHIP).chip_bytes.any()
               for o in orders)


def test_the_search_puts_each_ulysses_pair_on_one_chip(slice8):
    # uly2 x ring4: all-to-alls over the Ulysses axis, K/V permutes around the ring.
    mesh = (2, 4)
    uly = az.mesh_axis_groups(mesh, [0])
    ring = az.mesh_axis_groups(mesh, [1])
    program = [
        az.Collective("all-to-all", uly, 64 * MB, count=40),
        az.Collective("collective-permute",
                      [(g[i], g[(i + 1) % 4]) for g in ring for i in range(4)], 8 * MB,
                      count=120),
    ]
    found = search_placements(program, mesh, slice8, budget=2_000, axis_names=["uly", "ring"],
                              chip=CHIP)
    best = np.array(found[0].placement.order)
    chip_of = slice8.device_chip[best]
    for pair in uly:
        assert chip_of[pair[0]] == chip_of[pair[1]], found[0].placement.description
    # The ring crosses chips: its four members sit on four different chips.
    for members in ring:
        assert len(set(chip_of[members].tolist())) == 4
    # The structured enumeration proposes such orders itself: Ulysses on the cores axis.
    inside = [p for p in structured_placements(mesh, slice8, ["uly", "ring"])
              if all(slice8.device_chip[p.order[a]] == slice8.device_chip[p.order[b]]
                     for a, b in uly)]
    assert inside and all(p.description.startswith("uly on core:2") for p in inside)


def _compiled(name, cache):
    """The tiny step under candidate ``name``, compiled deviceless on ``tpu7x:2x2x1``."""
    topology = az.Topology.from_name("tpu7x:2x2x1", deviceless=True)
    candidate = Candidate.from_name(name, attention="blockwise")
    [result] = compile_candidates([candidate], WORKLOAD, topology, cache_dir=cache)
    assert result.status == "ok", result.message[:500]
    return topology, result


@pytest.mark.slow
def test_a_deviceless_compile_of_the_tiny_step_on_tpu7x(tmp_path):
    topology, result = _compiled("cfg2-uly2-ring2", tmp_path)
    assert result.program is not None and result.program.collectives
    assert result.memory["peak"] < CHIP.hbm_bytes / topology.devices_per_chip
    # The compiled program prices on the slice, the intra-chip path included.
    plain = az.estimate(result.program, topology, chip=CHIP)
    assert plain.seconds > 0


@pytest.mark.slow
def test_collectives_the_sparsecores_run_are_read_and_overlap(tmp_path):
    # TPU7x offloads FSDP's weight gathers to its SparseCores: each sits alone in a computation
    # that a `call-start(...), async_execution_thread="sparsecore", to_apply=%comp` runs until
    # its `call-done`. None of them may go missing from the program the cost model prices.
    _, result = _compiled("cfg2-ctx4-fsdp", tmp_path)
    text = result.hlo_text
    called = re.findall(r"call-start\([^\n]*async_execution_thread=\"sparsecore\"[^\n]*"
                        r"to_apply=%([\w.\-]+)", text)
    assert called  # what this test is about: the compiler still offloads
    offloaded = set()
    for name in called:
        body = re.search(rf"\n%{re.escape(name)} \(.*?\n}}", text, re.S).group(0)
        offloaded |= set(re.findall(r"%((?:all-gather|all-reduce|reduce-scatter|all-to-all|"
                                    r"collective-permute)[\w.\-]*) = ", body))
    assert offloaded
    sites = {c.name: s for c, s in zip(result.program.collectives, result.program.sites,
                                       strict=True)}
    assert offloaded <= set(sites), sorted(offloaded - set(sites))
    assert all(sites[name].asynchronous for name in offloaded)
