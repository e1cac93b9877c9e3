import itertools

import numpy as np
import pytest

import aoizora_lab as az
from aoizora_lab.comm_model import compare_placements, standard_collectives

MB = 1e6


def _compact(topo):
    return topo.device_grid().ravel()


def _collectives(mesh_shape, size, rng):
    """Collectives of every kind over mesh axes, plus a random irregular grouping."""
    n = int(np.prod(mesh_shape))
    out = list(standard_collectives(mesh_shape, size))
    for axis in range(len(mesh_shape)):
        groups = az.mesh_axis_groups(mesh_shape, [axis])
        out += [az.Collective("reduce-scatter", groups, size / 4),
                az.Collective("all-to-all", groups, size)]
    shuffled = rng.permutation(n).reshape(-1, 4).tolist()
    out += [az.Collective(kind, shuffled, size) for kind in ("all-gather", "all-reduce")]
    out.append(az.Collective("collective-permute",
                             list(zip(range(n), rng.permutation(n), strict=True)), size))
    return out


def test_scaling_book_v5e_all_gather_without_wraparound_is_within_25_percent():
    # v5e slice {X: 8, Y: 4}; all-gather over Y (length 4, no wraparound) of bf16[2048, 8192]
    # in total, i.e. 8.4 MB shards: the profile measured 680 us (the scaling book's v5e profile).
    topo = az.Topology.simulated((8, 4), generation="v5e")
    assert topo.wrap == (False, False)
    mesh = (8, 4)
    gather_y = az.Collective("all-gather", az.mesh_axis_groups(mesh, [1]),
                             bytes=2048 * 8192 * 2)
    predicted = az.estimate(gather_y, topo, _compact(topo)).seconds
    assert predicted == pytest.approx(680e-6, rel=0.25)


def test_wrapped_ring_matches_the_bidirectional_ring_formula():
    # Independent check: a bidirectional ring all-gather of V bytes over X chips moves
    # (X-1)/X * V / 2 bytes over every link in each direction.
    topo = az.Topology.simulated((16,), wrap=(True,))
    chip = az.chip_spec("v5e")
    total = 64 * MB
    result = az.estimate(az.Collective("all-gather", [list(range(16))], total), topo)
    expected = 15 / 16 * total / 2 / (chip.ici_link_bandwidth * chip.ici_efficiency)
    assert result.bandwidth_seconds == pytest.approx(expected, rel=1e-9)
    assert result.latency_seconds == pytest.approx(8 * chip.ici_hop_latency)
    link_bytes = result.link_bytes[topo.link_exists]
    assert np.allclose(link_bytes, link_bytes[0]), "a full ring loads every link equally"


def test_wraparound_roughly_halves_a_large_all_gather_on_a_long_line():
    line = az.Topology.simulated((16,), wrap=(False,))
    ring = az.Topology.simulated((16,), wrap=(True,))
    gather = az.Collective("all-gather", [list(range(16))], 256 * MB)
    ratio = az.estimate(gather, ring).seconds / az.estimate(gather, line).seconds
    assert 0.45 < ratio < 0.55


@pytest.mark.parametrize(("shape", "wrapped"), [
    ((4, 4), (True, True)), ((8, 4), (True, False)), ((16,), (True,)), ((4, 4, 4), (True,) * 3),
    ((6, 4), (True, True)),
])
def test_adding_wraparound_never_slows_a_collective(shape, wrapped):
    rng = np.random.default_rng(2)
    plain = az.Topology.simulated(shape, wrap=(False,) * len(shape))
    torus = az.Topology.simulated(shape, wrap=wrapped)
    for trial in range(4):
        placement = _compact(plain) if trial == 0 else rng.permutation(plain.num_devices)
        for collective in _collectives(shape, 8 * MB, rng):
            slow = az.estimate(collective, plain, placement).seconds
            fast = az.estimate(collective, torus, placement).seconds
            assert fast <= slow * (1 + 1e-9), (collective.name, collective.kind, trial)


def _symmetry_maps(topo):
    """Coordinate maps of the slice onto itself: mirrors, axis swaps, torus translations."""
    shape, ndim = topo.shape, topo.ndim
    maps = []
    for axis in range(ndim):
        def mirror(c, axis=axis):
            c = c.copy()
            c[:, axis] = shape[axis] - 1 - c[:, axis]
            return c
        maps.append(("mirror", mirror))
        if topo.wrap[axis]:
            def shift(c, axis=axis):
                c = c.copy()
                c[:, axis] = (c[:, axis] + 1) % shape[axis]
                return c
            maps.append(("translate", shift))
    for perm in itertools.permutations(range(ndim)):
        if all(shape[a] == shape[p] and topo.wrap[a] == topo.wrap[p]
               for a, p in enumerate(perm)) and list(perm) != list(range(ndim)):
            maps.append(("rotate", lambda c, perm=perm: c[:, list(perm)]))
    return maps


@pytest.mark.parametrize(("generation", "shape", "wrap"), [
    ("v5e", (4, 4), None), ("v5e", (4, 4), (True, True)), ("v5p", (4, 4, 4), None),
    ("v5p", (2, 2, 4), None), ("v5e", (8, 16), None),
])
def test_mirror_rotation_translation_of_a_placement_leave_the_time_unchanged(
        generation, shape, wrap):
    topo = az.Topology.simulated(shape, generation=generation, wrap=wrap)
    index_of = {tuple(c): i for i, c in enumerate(topo.coords)}
    rng = np.random.default_rng(3)
    maps = _symmetry_maps(topo)
    assert any(kind == "mirror" for kind, _ in maps)
    collectives = _collectives(shape, 4 * MB, rng)
    for placement in (_compact(topo), rng.permutation(topo.num_devices)):
        base = [az.estimate(c, topo, placement).seconds for c in collectives]
        for kind, mapping in maps:
            moved = mapping(topo.coords[placement])
            moved_placement = np.array([index_of[tuple(c)] for c in moved])
            times = [az.estimate(c, topo, moved_placement).seconds for c in collectives]
            np.testing.assert_allclose(times, base, rtol=1e-9, err_msg=kind)


@pytest.mark.parametrize("kind", az.COLLECTIVE_KINDS)
def test_more_groups_sharing_links_never_make_it_faster(kind):
    topo = az.Topology.simulated((4, 4))
    rng = np.random.default_rng(4)
    for _ in range(10):
        if kind == "collective-permute":
            groups = list(zip(range(16), rng.permutation(16), strict=True))
        else:
            groups = rng.permutation(16).reshape(4, 4).tolist()
        placement = rng.permutation(16)
        times = [az.estimate(az.Collective(kind, groups[:k], 8 * MB), topo, placement).seconds
                 for k in range(1, len(groups) + 1)]
        assert all(b >= a * (1 - 1e-12) for a, b in itertools.pairwise(times))


def test_placement_matters_for_a_collective_over_one_mesh_axis():
    topo = az.Topology.from_name("v5e:4x4", deviceless=False)
    gather = az.Collective("all-gather", az.mesh_axis_groups((4, 4), [1]), 32 * MB)
    compact = az.estimate(gather, topo, _compact(topo))
    scattered = az.estimate(gather, topo, np.random.default_rng(0).permutation(16))
    assert scattered.seconds > 1.2 * compact.seconds
    assert compact.busiest_link is not None
    assert compact.busiest_link_bytes == compact.link_bytes.max()


def test_kinds_relate_as_their_algorithms_say():
    topo = az.Topology.simulated((4, 4), wrap=(True, True))
    groups = az.mesh_axis_groups((4, 4), [0, 1])
    placement = np.random.default_rng(5).permutation(16)

    def bw(kind, size):
        return az.estimate(az.Collective(kind, groups, size), topo, placement).bandwidth_seconds

    assert bw("reduce-scatter", 2 * MB) == pytest.approx(bw("all-gather", 32 * MB))
    assert bw("all-reduce", 32 * MB) == pytest.approx(2 * bw("all-gather", 32 * MB))
    assert bw("all-to-all", 64 * MB) == pytest.approx(2 * bw("all-to-all", 32 * MB))


def test_members_on_one_chip_cost_nothing():
    topo = az.Topology.from_name("v4:2x2x2", deviceless=False)  # two devices per chip
    grid = topo.device_grid()
    same_chip = [list(grid[x, y, z]) for x in range(2) for y in range(2) for z in range(2)]
    result = az.estimate(az.Collective("all-gather", same_chip, 8 * MB), topo)
    assert result.seconds == 0 and result.busiest_link is None


def test_program_sums_its_collectives_and_counts_scale():
    topo = az.Topology.simulated((2, 4))
    one = az.Collective("all-gather", az.mesh_axis_groups((2, 4), [1]), 4 * MB)
    many = az.Collective("all-gather", one.groups, 4 * MB, count=40, name="layers")
    single = az.estimate(one, topo)
    looped = az.estimate(many, topo)
    assert looped.seconds == pytest.approx(40 * single.seconds)
    np.testing.assert_allclose(looped.link_bytes, 40 * single.link_bytes)
    program = az.estimate([one, many], topo)
    assert program.seconds == pytest.approx(41 * single.seconds)
    assert len(program.parts) == 2
    np.testing.assert_allclose(program.link_bytes, 41 * single.link_bytes)

    class Program:
        collectives = (one, many)

    assert az.estimate(Program(), topo).seconds == pytest.approx(program.seconds)


def test_options_switch_the_modelling_choices():
    topo = az.Topology.simulated((4, 4))
    gather = az.Collective("all-gather", [list(range(16))], 32 * MB)
    concurrent = az.estimate(gather, topo)
    sequential = az.estimate(gather, topo, options=az.ModelOptions(multi_axis="sequential"))
    assert sequential.seconds > concurrent.seconds
    with pytest.raises(az.AoizoraError, match="'fastest'"):
        az.ModelOptions(routing="fastest")


@pytest.mark.parametrize(("make", "pattern"), [
    (lambda: az.Collective("broadcast", [[0, 1]], 1), r"'broadcast'.*all-gather"),
    (lambda: az.Collective("all-gather", [[0, 1], [1, 2]], 1), "disjoint"),
    (lambda: az.Collective("all-gather", [[0, -1]], 1), "non-negative"),
    (lambda: az.Collective("collective-permute", [[0, 1, 2]], 1), r"\(source, target\)"),
    (lambda: az.Collective("all-gather", [[0, 1]], -5), "bytes=-5"),
    (lambda: az.Collective("all-gather", [["a", "b"]], 1), "integer logical device ids"),
    (lambda: az.Collective("all-gather", [[0, 1]], 1, count=1.5), r"count=1\.5"),
])
def test_bad_collectives_name_the_bad_value(make, pattern):
    with pytest.raises(az.AoizoraError, match=pattern):
        make()


def test_bad_placements_and_ids_are_clear_errors():
    topo = az.Topology.simulated((2, 2))
    gather = az.Collective("all-gather", [[0, 1, 2, 3]], 1)
    with pytest.raises(az.AoizoraError, match=r"\[0, 0, 1, 2\].*permutation"):
        az.estimate(gather, topo, [0, 0, 1, 2])
    with pytest.raises(az.AoizoraError, match="permutation"):
        az.estimate(gather, topo, [0, 1, 2])
    with pytest.raises(az.AoizoraError, match="logical device 7"):
        az.estimate(az.Collective("all-gather", [[0, 7]], 1), topo)


def test_mesh_axis_groups_follow_row_major_ids():
    assert az.mesh_axis_groups((2, 4), [1]) == [[0, 1, 2, 3], [4, 5, 6, 7]]
    assert az.mesh_axis_groups((2, 4), [0]) == [[0, 4], [1, 5], [2, 6], [3, 7]]
    assert az.mesh_axis_groups((2, 4), [0, 1]) == [list(range(8))]
    with pytest.raises(az.AoizoraError, match=r"\[2\]"):
        az.mesh_axis_groups((2, 4), [2])


def test_compare_placements_reports_each_placement():
    topo = az.Topology.simulated((4, 4))
    table = compare_placements(standard_collectives((4, 4), 8 * MB), topo,
                               {"compact": _compact(topo), "reversed": _compact(topo)[::-1]})
    assert list(table.columns[:3]) == ["collective", "groups", "compact us"]
    assert (table["slowest / fastest"] >= 1).all()
    # Reversing the device order is a point reflection of the slice: same times.
    np.testing.assert_allclose(table["compact us"], table["reversed us"])


# ----------------------------------------------------------------------------- device order


def _device_at(topo):
    """Physical device index of each chip coordinate (one device per chip)."""
    return {tuple(int(v) for v in c): i for i, c in enumerate(topo.coords)}


def _ring_of_2xn(n):
    """A Hamiltonian ring of a 2 x n block: down column 0, back up column 1."""
    return [(0, y) for y in range(n)] + [(1, y) for y in reversed(range(n))]


LINE_LAYOUTS = [
    ((4, 4), (4, 4), [1], "row-major"), ((4, 4), (4, 4), [0], "row-major"),
    ((8, 8), (4, 16), [1], "row-major"), ((4, 4), (16,), [0], "row-major"),
    ((2, 2, 4), (4, 4), [1], "row-major"), ((4, 4), (4, 4), [1], "reversed lines"),
    ((2, 2, 2), (4, 4), [1], "row-major"), ((2, 2, 2), (8, 2), [0], "row-major")]
"""Meshes whose axes follow the physical lines (slice shape, mesh, the group's axes, order)."""


def _along_lines(shape, mesh, style):
    """The slice and a device order whose mesh axes follow its physical lines: coordinate
    row-major, a chip's devices innermost (``"reversed lines"``: each line run backwards)."""
    generation = "tpu7x" if shape == (2, 2, 2) else "v5p" if len(shape) == 3 else "v5e"
    topo = az.Topology.simulated(shape, generation=generation)
    coords = [tuple(int(v) for v in c) for c in topo.chip_coords]
    order = sorted(range(topo.num_devices),
                   key=lambda i: (coords[topo.device_chip[i]][::-1], i))
    if style == "reversed lines":
        order = np.array(order).reshape(mesh)[:, ::-1].ravel().tolist()
    return topo, order


@pytest.mark.parametrize("kind", ["all-gather", "reduce-scatter", "all-reduce"])
@pytest.mark.parametrize(("shape", "mesh", "axes", "style"), LINE_LAYOUTS)
def test_orders_along_the_physical_lines_cost_what_the_per_axis_rings_cost(
        kind, shape, mesh, axes, style):
    # "logical" runs along the group's order; where that order follows the physical lines
    # (each mesh axis on one physical axis, in or against physical order, the devices of a
    # chip innermost) it is the per-axis algorithm of "physical" link for link. (2, 2, 2):
    # tpu7x, two devices per chip.
    topo, order = _along_lines(shape, mesh, style)
    collective = az.Collective(kind, az.mesh_axis_groups(mesh, axes), 8 * MB)
    logical = az.estimate(collective, topo, order, options=az.ModelOptions(order="logical"))
    physical = az.estimate(collective, topo, order, options=az.ModelOptions(order="physical"))
    assert logical.seconds == pytest.approx(physical.seconds, rel=1e-12)
    np.testing.assert_allclose(logical.link_bytes, physical.link_bytes, rtol=1e-12)


@pytest.mark.parametrize("kind", ["all-gather", "reduce-scatter", "all-reduce"])
@pytest.mark.parametrize(("shape", "mesh", "axes", "style"), LINE_LAYOUTS)
def test_the_compiler_model_leaves_the_physical_lines_only_for_small_rings_in_group_order(
        kind, shape, mesh, axes, style):
    # The same layouts: the default model prices all-gathers (a reordering map) and groups
    # of more than 8 (per-axis rings) as "physical" does, a group along one physical line
    # within hop latency of it, and a reduction of 3 to 8 devices spread over several axes
    # (a row-major block, a chip's two TPU7x devices and a line) as a ring in group order,
    # whose row-major hops cut corners over two or more links: dearer.
    topo, order = _along_lines(shape, mesh, style)
    groups = az.mesh_axis_groups(mesh, axes)
    collective = az.Collective(kind, groups, 8 * MB)
    compiler, physical = (az.estimate(collective, topo, order, options=az.ModelOptions(order=m))
                          for m in ("compiler", "physical"))
    chips = [topo.device_chip[order[i]] for i in groups[0]]
    spanned = (int((np.ptp(topo.chip_coords[chips], axis=0) > 0).sum())
               + (len(set(chips)) < len(chips)))  # a chip's devices: the core axis
    if kind == "all-gather" or len(groups[0]) > 8:
        assert compiler.seconds == pytest.approx(physical.seconds, rel=1e-12)
    elif spanned == 1:
        assert compiler.seconds == pytest.approx(physical.seconds, rel=0.01)
    else:
        assert compiler.seconds > 1.3 * physical.seconds


def test_an_all_reduce_runs_along_its_group_order_under_the_compiler_model():
    # v6e:2x4, 64 MB over all 8 chips: in the ring order every hop of the bidirectional ring
    # is one link, so each link carries (n - 1) / 2 shards per pass each way, two passes; in
    # coordinate row-major order hops cross two and four links and share them.
    topo = az.Topology.simulated((2, 4), generation="v6e")
    at = _device_at(topo)
    ring = [at[c] for c in _ring_of_2xn(4)]
    row_major = [at[(x, y)] for y in range(4) for x in range(2)]
    reduce = az.Collective("all-reduce", [list(range(8))], 64 * MB)
    compiler = az.ModelOptions(order="compiler")
    in_ring = az.estimate(reduce, topo, ring, options=compiler)
    assert in_ring.busiest_link_bytes == pytest.approx(2 * 7 / 2 * 64 * MB / 8)
    used = in_ring.link_bytes[in_ring.link_bytes > 0]
    assert len(used) == 2 * 8 and np.allclose(used, in_ring.busiest_link_bytes)  # 8 hops
    # A byte goes halfway round, 4 one-link hops, in each of the two passes.
    hop = az.chip_spec("v6e").ici_hop_latency
    assert in_ring.latency_seconds == pytest.approx(2 * 4 * hop)
    chained = az.estimate(reduce, topo, row_major, options=compiler)
    assert chained.busiest_link_bytes > 1.5 * in_ring.busiest_link_bytes
    # The all-gather's emitter maps any order onto its own ring: the order does not matter.
    gather = az.Collective("all-gather", [list(range(8))], 64 * MB)
    assert az.estimate(gather, topo, ring, options=compiler).seconds == pytest.approx(
        az.estimate(gather, topo, row_major, options=compiler).seconds)
    # Without the order (the model before it), both cost the same.
    physical = az.ModelOptions(order="physical")
    assert az.estimate(reduce, topo, ring, options=physical).seconds == pytest.approx(
        az.estimate(reduce, topo, row_major, options=physical).seconds)


def test_groups_larger_than_the_ring_limit_do_not_follow_their_order():
    topo = az.Topology.simulated((4, 4), generation="v5e")
    rng = np.random.default_rng(5)
    reduce = az.Collective("all-reduce", [list(range(16))], 32 * MB)
    times = {az.estimate(reduce, topo, rng.permutation(16)).seconds for _ in range(5)}
    assert len({round(t, 15) for t in times}) == 1
    assert az.comm_model.order_algorithm("all-reduce", 16, topo, az.ModelOptions()) == \
        "physical"
    limit = az.comm_model.RING_IN_ORDER_MAX_MEMBERS
    assert az.comm_model.order_algorithm("all-reduce", limit, topo, az.ModelOptions()) == "ring"


def test_order_grid_finds_lines_and_refuses_rings_and_snakes():
    topo = az.Topology.simulated((4, 4), generation="v5e")
    index = {tuple(int(v) for v in c): i for i, c in enumerate(topo.chip_coords)}

    def grid(points):
        found = az.comm_model.order_grid(np.array([index[p] for p in points]), topo)
        return None if found is None else found.shape

    assert grid([(0, 0), (1, 0), (0, 1), (1, 1)]) == (2, 2)       # y outer, x inner
    assert grid([(0, 0), (2, 0), (3, 0), (1, 0)]) == (4,)         # a folded line
    assert grid([(0, 0), (1, 0), (1, 1), (0, 1)]) is None         # a ring of the block
    assert grid([(0, 0), (1, 0), (2, 0), (3, 0), (3, 1), (2, 1), (1, 1), (0, 1)]) is None
    assert grid([(0, 0), (1, 1)]) is None                         # a diagonal step


def test_model_options_refuse_an_unknown_order_with_the_choices():
    with pytest.raises(az.AoizoraError, match=r"order='ring'.*compiler"):
        az.ModelOptions(order="ring")
