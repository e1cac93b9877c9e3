import collections
import itertools

import numpy as np
import pytest

import aoizora_lab as az
from aoizora_lab.topology import SLICE_SHAPES_2D, SMALL_SLICE_SHAPES_3D

# Deviceless topology names libtpu accepts (get_topology_desc, checked with libtpu 0.0.42.1).
LIBTPU_NAMES = ["v5e:2x2", "v5e:2x4", "v5e:4x4", "v5e:4x8", "v5e:8x8", "v5e:8x16", "v6e:4x4",
                "v5p:2x2x4", "v5p:4x4x4", "v4:2x2x2"]


def _offered():
    for gen in ("v5e", "v6e"):
        for shape in SLICE_SHAPES_2D:
            yield gen, shape
    for gen in ("v4", "v5p"):
        for shape in (*SMALL_SLICE_SHAPES_3D, (4, 4, 4), (4, 4, 8), (8, 8, 8)):
            yield gen, shape


@pytest.mark.parametrize(("generation", "shape"), list(_offered()))
def test_wraparound_rules_for_every_offered_shape(generation, shape):
    name = f"{generation}:{'x'.join(map(str, shape))}"
    topo = az.Topology.from_name(name, deviceless=False)
    assert topo.shape == shape and topo.name == name
    if generation in ("v5e", "v6e"):
        assert topo.wrap == tuple(n == 16 for n in shape)
    else:
        assert topo.wrap == (all(n % 4 == 0 for n in shape),) * 3
    # Links: one per neighbour pair per direction, plus the closing pair of a wrapped axis.
    expected_links = sum(2 * (n if wrap else n - 1) * (topo.num_chips // n)
                         for n, wrap in zip(shape, topo.wrap, strict=True))
    assert topo.num_links == expected_links
    wrap_axes = {link.axis for link in topo.links() if link.wraparound}
    assert wrap_axes == {a for a, w in enumerate(topo.wrap) if w and shape[a] > 1}


def test_named_wraparound_examples():
    assert az.Topology.from_name("v5e:4x4", deviceless=False).wrap == (False, False)
    assert az.Topology.from_name("v5e:8x16", deviceless=False).wrap == (False, True)
    assert az.Topology.from_name("v5e:16x16", deviceless=False).wrap == (True, True)
    assert az.Topology.from_name("v5p:4x4x4", deviceless=False).wrap == (True,) * 3
    assert az.Topology.from_name("v5p:2x2x4", deviceless=False).wrap == (False,) * 3


@pytest.mark.parametrize("name", LIBTPU_NAMES)
def test_libtpu_coordinates_match_the_topology(name):
    topo = az.Topology.from_name(name, deviceless=True)
    assert topo.source == "libtpu deviceless"
    assert topo.devices is not None and len(topo.devices) == topo.num_devices
    libtpu_coords = np.array([tuple(d.coords)[: topo.ndim] for d in topo.devices])
    np.testing.assert_array_equal(topo.coords, libtpu_coords)
    # The simulated fallback has the same chips, each holding the same number of devices.
    simulated = az.Topology.simulated(topo.shape, generation=topo.generation)
    assert collections.Counter(map(tuple, simulated.coords)) == collections.Counter(
        map(tuple, topo.coords))
    assert simulated.wrap == topo.wrap


def test_slice_libtpu_does_not_offer_falls_back_to_simulated_with_a_note():
    topo = az.Topology.from_name("v5e:1x1")
    assert topo.devices is None and topo.source == "simulated"
    assert "v5e:1x1" in topo.note and "simulated" in topo.note
    with pytest.raises(az.AoizoraError, match="v5e:1x1"):
        az.Topology.from_name("v5e:1x1", deviceless=True)


@pytest.mark.parametrize(("name", "pattern"), [
    ("v5e:3x3", r"'3x3'.*1x1, 2x2, 2x4, 4x4"),
    ("v9:4x4", r"'v9'.*v5e"),
    ("v5e-4x4", r"'v5e-4x4'.*GENERATION:SHAPE"),
    ("v5p:4x4", r"v5p.*'4x4'.*multiple of 4"),
    ("v5p:4x4x6", r"'4x4x6'"),
])
def test_bad_slice_names_name_the_bad_value_and_the_valid_ones(name, pattern):
    with pytest.raises(az.AoizoraError, match=pattern):
        az.Topology.from_name(name, deviceless=False)


def test_device_count_mismatch_is_a_clear_error():
    with pytest.raises(az.AoizoraError, match=r"8 devices.*3 devices.*device_count=8"):
        az.Topology.simulated((2, 4), devices=[object()] * 3)
    with pytest.raises(az.AoizoraError, match="same number of devices on every chip"):
        az.Topology("v5e", (2, 2), (False, False), np.array([[0, 0], [1, 0], [0, 1]]))
    with pytest.raises(az.AoizoraError, match=r"\.coords"):
        import jax

        az.Topology.from_devices(jax.devices())


def test_host_devices_stand_in_for_chips():
    import jax

    topo = az.Topology.simulated((2, 4), devices=jax.devices()[:8])
    assert topo.source == "host devices" and topo.devices == tuple(jax.devices()[:8])
    # Axis 0 is fastest in the simulated device order.
    np.testing.assert_array_equal(topo.coords[:3], [[0, 0], [1, 0], [0, 1]])


def _bfs_distances(topo):
    """Shortest hop counts over the directed link graph, found independently of routes."""
    neighbours = collections.defaultdict(set)
    for link in topo.links():
        neighbours[link.src].add(link.dst)
    chips = [tuple(map(int, c)) for c in topo.chip_coords]
    dist = {}
    for start in chips:
        seen, frontier, d = {start: 0}, [start], 0
        while frontier:
            d += 1
            frontier = [n for c in frontier for n in neighbours[c] if n not in seen]
            for n in frontier:
                seen.setdefault(n, d)
        dist[start] = seen
    return dist


TOPOLOGIES = [
    ("v5e", (4, 4), None), ("v5e", (8, 16), None), ("v5p", (4, 4, 4), None),
    ("v5p", (2, 2, 4), None), ("v5e", (4, 6), (True, False)), ("v5e", (5, 3), (True, True)),
]


@pytest.mark.parametrize(("generation", "shape", "wrap"), TOPOLOGIES)
def test_routes_are_shortest_and_dimension_ordered(generation, shape, wrap):
    topo = az.Topology.simulated(shape, generation=generation, wrap=wrap)
    bfs = _bfs_distances(topo)
    distances = topo.hop_distances()
    rng = np.random.default_rng(0)
    pairs = rng.integers(0, topo.num_devices, size=(60, 2))
    for a, b in pairs:
        route = topo.route(int(a), int(b))
        src, dst = tuple(topo.coords[a]), tuple(topo.coords[b])
        assert len(route) == distances[a, b] == bfs[src][dst] == topo.hop_distance(a, b)
        here = src
        for link in route:
            assert link.src == here
            here = link.dst
        assert here == dst
        axes = [link.axis for link in route]
        assert axes == sorted(axes), "dimension order: axis 0 first, then 1, then 2"
        for axis in set(axes):
            assert len({link.direction for link in route if link.axis == axis}) == 1


def test_tie_on_a_wrapped_axis_goes_the_plus_way():
    topo = az.Topology.simulated((4,), wrap=(True,))
    route = topo.route(0, 2)
    assert [link.dst for link in route] == [(1,), (2,)]
    assert all(link.direction == 1 for link in route)
    across = topo.route(0, 3)
    assert len(across) == 1 and across[0].wraparound and across[0].direction == -1


@pytest.mark.parametrize(("generation", "shape", "wrap"), TOPOLOGIES)
@pytest.mark.parametrize("balanced", [True, False])
def test_route_loads_conserve_bytes_times_hops(generation, shape, wrap, balanced):
    topo = az.Topology.simulated(shape, generation=generation, wrap=wrap)
    rng = np.random.default_rng(1)
    src = rng.integers(0, topo.num_chips, 200)
    dst = rng.integers(0, topo.num_chips, 200)
    weights = rng.uniform(1, 1e6, 200)
    orders = list(itertools.permutations(range(topo.ndim))) if balanced else None
    loads = topo.route_loads(src, dst, weights, axis_orders=orders, split_ties=balanced)
    hops = topo.chip_distances(src, dst)[np.arange(200), np.arange(200)]
    assert loads.sum() == pytest.approx(float((weights * hops).sum()), rel=1e-9)
    assert not loads[~topo.link_exists].any(), "bytes only on links that exist"


def test_unbalanced_route_loads_follow_route():
    topo = az.Topology.simulated((4, 4), wrap=(True, False))
    a, b = 1, 14
    loads = topo.route_loads(topo.device_chip[[a]], topo.device_chip[[b]], [5.0],
                             split_ties=False)
    expected = np.zeros_like(loads)
    for link in topo.route(a, b):
        chip = int(np.ravel_multi_index(link.src, topo.shape))
        expected[chip, link.axis, 0 if link.direction == 1 else 1] += 5.0
    np.testing.assert_array_equal(loads, expected)


def test_device_grid_puts_each_device_on_its_chip():
    topo = az.Topology.from_name("v4:2x2x2")
    grid = topo.device_grid()
    assert grid.shape == (2, 2, 2, 2)
    for index in itertools.product(*(range(n) for n in grid.shape)):
        np.testing.assert_array_equal(topo.coords[grid[index]], index[:3])
    assert sorted(grid.ravel()) == list(range(topo.num_devices))


def test_describe_names_the_slice_and_its_source():
    text = az.Topology.from_name("v5e:8x16", deviceless=False).describe()
    assert text.startswith("v5e:8x16: 128 chips")
    assert "y: 16 wraps" in text and "x: 8 wraps" not in text
    assert len(text.splitlines()) == 3 + 16  # three header lines, one row of chips per y


def test_portable_slices_pickle_and_rebuild_with_the_same_key():
    import pickle

    import jax

    deviceless = az.Topology.from_name("v5e:2x4", deviceless=True)
    simulated = az.Topology.from_name("v5p:2x2x4", deviceless=False)
    for topology in (deviceless, simulated):
        assert topology.portable
        again = pickle.loads(pickle.dumps(topology))
        assert again.cache_key == topology.cache_key and again.source == topology.source
    assert pickle.loads(pickle.dumps(deviceless)).devices is not None  # libtpu's, rebuilt
    assert not pickle.loads(pickle.dumps(simulated)).coords.flags.writeable
    host = az.Topology.simulated((2, 4), devices=jax.devices()[:8])
    assert not host.portable


def test_where_a_slice_comes_from_is_one_of_four_states():
    import dataclasses

    from aoizora_lab.topology import DeviceSource

    simulated = az.Topology.simulated((2, 4))
    assert simulated.source is DeviceSource.SIMULATED
    assert dataclasses.replace(simulated, source="host devices").source is DeviceSource.HOST
    with pytest.raises(az.AoizoraError, match="'renumbered': one of"):
        dataclasses.replace(simulated, source="renumbered")
