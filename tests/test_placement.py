import itertools

import jax
import numpy as np
import pytest

import aoizora_lab as az
from aoizora_lab.comm_model import direct_flows, ring_flows
from aoizora_lab.flow_kernels import ALL_TO_ALL, PERMUTE, RING, route_group_changes
from aoizora_lab.placement import (
    Placement,
    PlacementScorer,
    canonical,
    search_placements,
    structured_placements,
    symmetries,
)


def _program(mesh):
    return [az.Collective("all-gather", az.mesh_axis_groups(mesh, [1]), 8e6, count=30),
            az.Collective("all-to-all", az.mesh_axis_groups(mesh, [1]), 4e6, count=60),
            az.Collective("all-reduce", az.mesh_axis_groups(mesh, [0]), 1e6, count=5),
            az.Collective("all-gather", az.mesh_axis_groups(mesh, [1]), 2e6, count=10),
            az.Collective("reduce-scatter", az.mesh_axis_groups(mesh, [1]), 1e6, count=3)]


ORDERS = az.comm_model.ORDER_MODELS


@pytest.mark.parametrize("order", ORDERS)
@pytest.mark.parametrize(("shape", "wrap"), [((4, 4), None), ((4, 4), (True, True)),
                                             ((2, 2, 4), None)])
def test_scorer_is_the_ici_model(shape, wrap, order):
    topology = az.Topology.simulated(shape, generation="v5p" if len(shape) == 3 else "v5e",
                                     wrap=wrap)
    mesh = (2, topology.num_devices // 2)
    program = _program(mesh)
    options = az.ModelOptions(order=order)
    scorer = PlacementScorer(program, topology, options=options)
    assert len(scorer.structures) == 4  # the two all-gathers over the same groups merged
    rng = np.random.default_rng(0)
    orders = [rng.permutation(topology.num_devices) for _ in range(20)]
    orders += [p.order for p in structured_placements(mesh, topology)[:10]]
    expected = [az.estimate(program, topology, o, options=options).seconds for o in orders]
    np.testing.assert_allclose(scorer.scores(orders), expected, rtol=1e-12)
    np.testing.assert_allclose(scorer.scores(orders), expected, rtol=1e-12)  # from the cache


@pytest.mark.parametrize("order", ORDERS)
@pytest.mark.parametrize(("shape", "per_chip"), [((8, 16), 1), ((2, 4), 2)])
def test_scorer_fallbacks_match_the_ici_model(shape, per_chip, order):
    # 128 chips: sparse routes and row-wise chip sets; two devices per chip: chip sets with
    # repeated chips, where regularity needs the members per chip.
    topology = az.Topology.simulated(shape, devices_per_chip=per_chip)
    mesh = (2, topology.num_devices // 2)
    program = _program(mesh)
    options = az.ModelOptions(order=order)
    scorer = PlacementScorer(program, topology, options=options)
    rng = np.random.default_rng(2)
    orders = [rng.permutation(topology.num_devices) for _ in range(4)]
    orders.append(structured_placements(mesh, topology)[0].order)
    expected = [az.estimate(program, topology, o, options=options).seconds for o in orders]
    np.testing.assert_allclose(scorer.scores(orders), expected, rtol=1e-12)


def _with_ring_shift(program, mesh):
    """``program`` plus a ring shift along mesh axis 1 (each position in two permute pairs)."""
    shift = [(ring[k], ring[(k + 1) % len(ring)])
             for ring in az.mesh_axis_groups(mesh, [1]) for k in range(len(ring))]
    return [*program, az.Collective("collective-permute", shift, 3e6, count=20)]


def _shifted_case(shape, wrap, per_chip):
    """A simulated slice, a (2, n/2) mesh over it and _program with a ring shift on it."""
    topology = az.Topology.simulated(shape, generation="v5p" if len(shape) == 3 else "v5e",
                                     wrap=wrap, devices_per_chip=per_chip)
    mesh = (2, topology.num_devices // 2)
    return topology, mesh, _with_ring_shift(_program(mesh), mesh)


@pytest.mark.parametrize("order", ORDERS)
@pytest.mark.parametrize(("shape", "wrap", "per_chip"), [
    ((4, 4), None, 1), ((4, 4), (True, True), 1), ((2, 2, 4), None, 1), ((2, 4), None, 2),
    ((8, 8), None, 1)])
def test_swap_scores_are_the_scores_of_the_swapped_orders(shape, wrap, per_chip, order):
    topology, mesh, program = _shifted_case(shape, wrap, per_chip)
    n = topology.num_devices
    options = az.ModelOptions(order=order)
    scorer = PlacementScorer(program, topology, options=options)
    rng = np.random.default_rng(3)
    # Bases: a structured placement (regular groups) and a random one (irregular groups).
    bases = np.array([structured_placements(mesh, topology)[0].order, rng.permutation(n)])
    orders = bases[rng.integers(0, 2, size=300)]
    first, second = rng.integers(0, n, size=(2, 300))  # same position twice: no swap
    swapped = orders.copy()
    rows = np.arange(len(orders))
    swapped[rows, first], swapped[rows, second] = orders[rows, second], orders[rows, first]
    expected = [az.estimate(program, topology, o, options=options).seconds
                for o in swapped[:40]]
    np.testing.assert_allclose(scorer.swap_scores(orders, first, second)[:40], expected,
                               rtol=1e-9)
    fresh = PlacementScorer(program, topology, options=options)
    np.testing.assert_allclose(scorer.swap_scores(orders, first, second),
                               fresh.scores(swapped), rtol=1e-9)
    # A swapped order as the next base (what the local search does after a move) is priced
    # from the terms the last call kept, and swaps back to where it came from.
    again = scorer.swap_scores(swapped[:5], second[:5], first[:5])
    np.testing.assert_allclose(again, fresh.scores(orders[:5]), rtol=1e-9)
    assert scorer.evaluations == 300 + 300 + 5


@pytest.mark.parametrize(("layout", "members"), [(PERMUTE, 2), (ALL_TO_ALL, 5), (RING, 6),
                                                  (RING, 2)])
def test_routed_group_changes_are_the_flows_after_minus_before(layout, members):
    topology = az.Topology.simulated((4, 4), generation="v5e", wrap=(True, False))
    scorer = PlacementScorer([], topology)
    rng = np.random.default_rng(layout)
    before = np.array([rng.permutation(16)[:members] for _ in range(30)])
    after = before.copy()
    after[::2, 0] = (after[::2, 0] + 1 + rng.integers(0, 2, size=15)) % 16  # one chip moves
    after[1::3] = before[1::3]  # some groups unchanged
    weight_before, weight_after = rng.choice([0.0, 0.5, 2.0], size=(2, 30))
    rows = rng.integers(0, 4, size=30)
    changed = np.zeros((4, scorer._num_links))
    route_group_changes(changed, layout, before, after, weight_before, weight_after, rows,
                        *scorer._routes)

    def flows(chips, weight):  # the comm model's own flow lists, one group at a time
        out = []
        for group, w, row in zip(chips, weight, rows, strict=True):
            src, dst, _ = (ring_flows(group, 1.0) if layout == RING else direct_flows(
                "collective-permute" if layout == PERMUTE else "all-to-all", group, 1.0))
            out.append((src, dst, np.full(len(src), w), np.full(len(src), row)))
        return [np.concatenate(part) for part in zip(*out, strict=True)]

    src, dst, size, row = flows(before, weight_before)
    expected = -scorer._link_loads((src, dst, size), row, 4)
    src, dst, size, row = flows(after, weight_after)
    expected += scorer._link_loads((src, dst, size), row, 4)
    np.testing.assert_allclose(changed, expected, atol=1e-12)
    assert np.abs(expected).sum() > 0


@pytest.mark.parametrize(("shape", "wrap"), [((16, 16), (True, True)), ((8, 8), None),
                                           ((4, 4, 4), (True, False, True)), ((2, 8), None)])
def test_longest_distance_of_a_group_by_offsets_is_the_longest_pair(shape, wrap):
    """The scorer finds large groups' longest hop from their autocorrelation and a swapped
    group's from the moved chips: both must be the longest distance of any two members."""
    topology = az.Topology.simulated(shape, generation="v5p" if len(shape) == 3 else "v5e",
                                     wrap=wrap)
    scorer = PlacementScorer([], topology)
    rng = np.random.default_rng(5)
    n = topology.num_chips
    for size in (2, 5, n // 2, n):
        sets = np.array([rng.choice(n, size, replace=False) for _ in range(20)])
        pairs = topology.chip_distances(sets.ravel(), sets.ravel()).reshape(
            20, size, 20, size)
        longest = pairs[np.arange(20), :, np.arange(20), :].reshape(20, -1).max(axis=1)
        np.testing.assert_array_equal(scorer._longest_by_offsets(sets), longest)
        # One member moved to a chip outside the set: from the old longest and the moves.
        moved = sets.copy()
        outside = [np.setdiff1d(np.arange(n), row) for row in sets]
        for row, free in enumerate(outside):
            if len(free):
                moved[row, rng.integers(size)] = rng.choice(free)
        expected = [topology.chip_distances(row, row).max() for row in moved]
        np.testing.assert_array_equal(scorer._moved_hops(sets, moved, longest), expected)


def test_snake_ring_and_folded_orders_keep_ring_neighbours_close():
    # A logical ring of 8 without wraparound links: on 2x4 a snake closes the ring with one-hop
    # steps only, on 4x2 a block ring does (its snake crosses the block); on a line of 8 a
    # folded order needs at most two hops per step. Plain orders always have a longer
    # closing hop.
    for shape, style, longest in (((2, 4), "snake", 1), ((4, 2), "ring", 1),
                                  ((8,), "folded", 2)):
        topology = az.Topology.simulated(shape, wrap=(False,) * len(shape))
        distances = topology.hop_distances()

        def longest_step(placement, d=distances):
            return max(d[placement.order[i], placement.order[(i + 1) % 8]] for i in range(8))

        placements = structured_placements((8,), topology, ["ring"])
        styled = [p for p in placements if p.description.endswith(style)]
        plain = [p for p in placements
                 if p.description.endswith(("x:2", "y:4", "x:8", "x:4", "y:2"))]
        assert styled and plain
        assert min(longest_step(p) for p in styled) == longest
        assert min(longest_step(p) for p in plain) > longest


def test_symmetric_placements_score_equal_and_are_deduplicated():
    topology = az.Topology.simulated((4, 4))
    maps = symmetries(topology)
    assert len(maps) == 8  # the square's mirrors and rotations (no wraparound)
    program = _program((2, 8))
    scorer = PlacementScorer(program, topology)
    base = np.random.default_rng(1).permutation(16)
    images = [m[base] for m in maps]
    assert np.allclose(scorer.scores(images), scorer.score(base))
    assert len({canonical(i, maps) for i in images}) == 1
    table = search_placements(program, (2, 8), topology, budget=200).to_frame()
    keys = [canonical(p.order, maps) for p in table["placement"]]
    assert len(keys) == len(set(keys))  # one row per symmetry class
    assert table["busiest_link"].str.contains("->").all()


def test_structured_placements_include_the_compact_one_and_are_permutations():
    topology = az.Topology.simulated((4, 4))
    placements = structured_placements((2, 8), topology, ["cfg", "uly"])
    orders = {p.order for p in placements}
    assert tuple(topology.device_grid().ravel()) in orders
    assert all(sorted(o) == list(range(16)) for o in orders)
    assert any("cfg on x:2 | uly on x:2·y:4" == p.description for p in placements)
    with pytest.raises(az.AoizoraError, match=r"\(2, 4\) has 8 devices"):
        structured_placements((2, 4), topology)


@pytest.mark.parametrize("order", ORDERS)
@pytest.mark.parametrize(("shape", "mesh"), [((2, 3), (2, 3)),
                                             pytest.param((2, 4), (2, 4),
                                                          marks=pytest.mark.slow)])
def test_search_reaches_the_exhaustive_optimum_on_small_slices(shape, mesh, order):
    topology = az.Topology.simulated(shape)
    program = _program(mesh)
    options = az.ModelOptions(order=order)
    scorer = PlacementScorer(program, topology, options=options)
    everything = np.array(list(itertools.permutations(range(topology.num_devices))))
    optimum = scorer.scores(everything).min()
    found = search_placements(program, mesh, topology, budget=2_000, options=options)
    assert found[0].exposed_s == pytest.approx(optimum, rel=1e-12)
    assert found[0].exposed_s == pytest.approx(scorer.score(np.array(found[0].placement.order)))


@pytest.mark.parametrize("order", ["compiler", "logical"])
def test_search_finds_the_ring_order_where_collectives_follow_the_order(order):
    # One mesh axis of 8 over all chips of a 2x4 slice: every order is the same chip set, so
    # only the order can matter. Brute force over all 40,320 orders: the best ones run the
    # all-reduce around a ring of one-link hops, the search finds one, and the model without
    # orders sees no difference at all.
    topology = az.Topology.simulated((2, 4))
    program = [az.Collective("all-reduce", [list(range(8))], 16e6, count=10),
               az.Collective("reduce-scatter", [list(range(8))], 2e6, count=10)]
    options = az.ModelOptions(order=order)
    scorer = PlacementScorer(program, topology, options=options)
    every = np.array(list(itertools.permutations(range(8))))
    scores = scorer.scores(every)
    sample = every[:: len(every) // 50]
    np.testing.assert_allclose(
        scorer.scores(sample),
        [az.estimate(program, topology, o, options=options).seconds for o in sample],
        rtol=1e-12)
    assert scores.max() > 1.5 * scores.min()
    found = search_placements(program, (8,), topology, budget=2_000, options=options)
    assert found[0].exposed_s == pytest.approx(scores.min(), rel=1e-12)
    ring = found[0].placement.order
    distances = topology.hop_distances()  # between devices
    assert all(distances[ring[i], ring[(i + 1) % 8]] == 1 for i in range(8))
    flat = PlacementScorer(program, topology, options=az.ModelOptions(order="physical"))
    assert np.ptp(flat.scores(every[::97])) == pytest.approx(0.0, abs=1e-15)


def test_local_search_is_seeded_and_deterministic():
    topology = az.Topology.simulated((4, 4))
    program = _program((4, 4))
    first = search_placements(program, (4, 4), topology, budget=500, seed=3)
    again = search_placements(program, (4, 4), topology, budget=500, seed=3)
    assert [s.placement.order for s in first] == [s.placement.order for s in again]


def test_block_rings_step_one_position_at_a_time():
    from aoizora_lab.placement import block_ring

    for major, minor in [(4, 2), (2, 4), (3, 2), (2, 3), (4, 4), (6, 3), (3, 4)]:
        ring = block_ring(major, minor)
        assert sorted(ring) == [(a, b) for a in range(major) for b in range(minor)]
        steps = zip(ring, ring[1:] + ring[:1], strict=True)
        assert all(abs(p[0] - q[0]) + abs(p[1] - q[1]) == 1 for p, q in steps)
    with pytest.raises(az.AoizoraError, match="3 x 3 block"):
        block_ring(3, 3)


def test_placement_value_type():
    with pytest.raises(az.AoizoraError, match="not a permutation"):
        Placement((0, 0, 1))
    topology = az.Topology.simulated((2, 4), devices=jax.devices()[:8])
    placement = Placement(tuple(reversed(range(8))))
    mesh_devices = placement.device_order(topology, (2, 4))
    assert mesh_devices.shape == (2, 4) and mesh_devices[0, 0] == topology.devices[7]
    assert az.estimate(_program((2, 4)), topology, placement).seconds > 0  # __array__


def test_search_reaches_the_optimum_of_a_program_with_irregular_groups():
    # Groups that are no mesh axis: a strided all-gather, an irregular all-to-all and a
    # permute whose pairs cross the mesh; brute force over all 40,320 orders of a 2x4 slice.
    topology = az.Topology.simulated((2, 4))
    program = [
        az.Collective("all-gather", [[0, 5, 2, 7], [1, 4, 3, 6]], 8e6, count=20),
        az.Collective("all-to-all", [[0, 3], [1, 6], [2, 5], [4, 7]], 6e6, count=30),
        az.Collective("collective-permute", [(0, 7), (7, 2), (2, 5), (5, 0), (1, 6), (6, 3),
                                             (3, 4), (4, 1)], 3e6, count=40),
    ]
    scorer = PlacementScorer(program, topology)
    every = np.array(list(itertools.permutations(range(topology.num_devices))))
    scores = scorer.scores(every)
    optimum = scores.min()
    assert optimum < np.median(scores)  # placement matters for this program
    found = search_placements(program, (8,), topology, budget=3_000)
    assert found[0].exposed_s == pytest.approx(optimum, rel=1e-12)
    assert found[0].exposed_s == pytest.approx(
        az.estimate(program, topology, found[0].placement).seconds, rel=1e-12)
    assert 0 < scorer.lower_bound() <= optimum  # no order beats the bound
    for model in ("logical", "physical"):  # the bound, under every order model, over all
        other = PlacementScorer(program, topology, options=az.ModelOptions(order=model))
        assert 0 < other.lower_bound() <= other.scores(every).min()


@pytest.mark.parametrize("order_model", ["compiler", "logical", "physical"])
@pytest.mark.parametrize(("shape", "wrap", "per_chip"), [
    ((2, 4), None, 1), ((4, 4), (True, True), 1), ((2, 2, 4), None, 1), ((2, 4), None, 2)])
def test_lower_bound_is_below_every_placement(shape, wrap, per_chip, order_model):
    # The bound counts bytes a chip must inject whatever the order, so it holds under every
    # device-order model.
    topology, mesh, program = _shifted_case(shape, wrap, per_chip)
    scorer = PlacementScorer(program, topology, options=az.ModelOptions(order=order_model))
    rng = np.random.default_rng(5)
    orders = [rng.permutation(topology.num_devices) for _ in range(200)]
    orders += [p.order for p in structured_placements(mesh, topology)]
    assert scorer.lower_bound() <= scorer.scores(orders).min()


@pytest.mark.parametrize(("members", "held_by"), [(64, "hops"), (2, "injection")])
def test_lower_bound_of_a_lone_all_to_all(members, held_by):
    # 8x8 without wraparound: 4 links a chip, 224 links in all. Every device sends
    # (n - 1) / n of 1 GB: no faster than over its 4 links (injection); and each byte crosses
    # at least as many links as the distance to the nearest n - 1 chips of the best chip
    # (hops), spread at best evenly over all 224.
    topology = az.Topology.simulated((8, 8))
    chip = az.chip_spec("v5e", hbm_bandwidth=1e30)  # HBM out of the way
    collective = az.Collective("all-to-all", [tuple(range(members))], 1e9, count=3)
    bound = PlacementScorer([collective], topology, chip=chip).lower_bound()
    rate = chip.ici_link_bandwidth * chip.ici_efficiency
    injection = (members - 1) / members * 1e9 / (4 * rate)
    everyone = np.arange(64)
    nearest = min(sorted(row)[1:members] for row in
                  topology.chip_distances(everyone, everyone).tolist())
    hops = 1e9 * sum(nearest) / 224 / rate
    assert bound == pytest.approx(3 * max(injection, hops))
    assert (hops > injection) == (held_by == "hops")
    assert bound < az.estimate(collective, topology, chip=chip).seconds
