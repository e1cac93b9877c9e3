"""Figure builders: every directed link with the model's bytes, explorers, notebook display,
and the stage results the notebooks show (exclusions, pruning verdicts, compiled traffic,
ranking views)."""

import json

import numpy as np
import pandas as pd
import pytest

import aoizora_lab as az
from aoizora_lab import viz
from aoizora_lab.candidates import Candidate, explain_candidates
from aoizora_lab.comm_model import ModelOptions, mesh_axis_groups, standard_collectives
from aoizora_lab.compile import CompiledCandidate, Compiles
from aoizora_lab.cost import Predicted, op_seconds
from aoizora_lab.hlo import CollectiveSite, CommProgram, ComputeOp
from aoizora_lab.ir_estimate import IREstimate
from aoizora_lab.placement import Placement, RankedPlacement, Source
from aoizora_lab.planner import breakdown
from aoizora_lab.prune import PruneDecision, Pruning, Verdict
from aoizora_lab.topology import MINUS, PLUS
from aoizora_lab.viz import views
from aoizora_lab.viz.units import format_bytes, time_scale


def _collectives() -> list[az.Collective]:
    """A (2, 8) logical mesh: gather along the 8 axis, reduce along the 2 axis, a shift."""
    return [
        az.Collective("all-gather", az.mesh_axis_groups((2, 8), [1]), 8e6, count=3, name="ag"),
        az.Collective("all-reduce", az.mesh_axis_groups((2, 8), [0]), 4e6, name="ar"),
        az.Collective("collective-permute", [(i, (i + 1) % 16) for i in range(16)], 2e6),
    ]


def _placement(topology: az.Topology, seed: int = 0) -> Placement:
    order = np.random.default_rng(seed).permutation(topology.num_devices)
    return Placement(tuple(order.tolist()), "shuffled")


def _traces(fig, role: str) -> list:
    return [t for t in fig.data if t.meta == role]


def _link_rows(fig) -> dict[tuple[int, int, int], list[float]]:
    """customdata of every arrow, by (chip, axis, direction); fails on a link drawn twice."""
    rows: dict[tuple[int, int, int], list[float]] = {}
    for trace in _traces(fig, "links"):
        for row in trace.customdata:
            key = (int(row[0]), int(row[1]), int(row[2]))
            assert key not in rows, f"link {key} drawn twice"
            rows[key] = list(row[3:])
    return rows


def _existing_links(topology: az.Topology) -> set[tuple[int, int, int]]:
    return {tuple(k) for k in np.argwhere(topology.link_exists).tolist()}


@pytest.mark.parametrize("wrap", [(True, True), (False, False)])
def test_heatmap_carries_every_directed_link_with_the_estimated_bytes(wrap):
    topo = az.Topology.simulated((4, 4), wrap=wrap)
    est = az.estimate(_collectives(), topo, _placement(topo))
    fig = viz.torus_heatmap(topo, est.link_bytes)

    rows = _link_rows(fig)
    assert set(rows) == _existing_links(topo)
    assert len(rows) == topo.num_links == (64 if all(wrap) else 48)
    busiest = est.link_bytes.max()
    for key, (size, share) in rows.items():
        assert size == pytest.approx(est.link_bytes[key])
        assert share == pytest.approx(est.link_bytes[key] / busiest)
    assert busiest > 0 and max(size for size, _ in rows.values()) == pytest.approx(busiest)
    assert fig.layout.coloraxis.cmax == pytest.approx(busiest)


@pytest.mark.parametrize("wrap", [(True, True), (False, False), (True, False)])
def test_wraparound_links_are_drawn_exactly_when_the_slice_wraps(wrap):
    topo = az.Topology.simulated((4, 4), wrap=wrap)
    fig = viz.torus_heatmap(topo, az.estimate(_collectives(), topo).link_bytes)

    hover = [h for t in _traces(fig, "links") for h in t.hovertext]
    wrapped = [str(link) for link in topo.links() if link.wraparound]
    assert sum("(wraparound)" in h for h in hover) == len(wrapped) == 8 * sum(wrap)
    lanes_x = [x for t in _traces(fig, "link-lanes") for x in t.x if x is not None]
    lanes_y = [y for t in _traces(fig, "link-lanes") for y in t.y if y is not None]
    # Only wraparound stubs reach more than half a chip spacing past the edge chips.
    assert (min(lanes_x) < -0.5 and max(lanes_x) > 3.5) == wrap[0]
    assert (min(lanes_y) < -0.5 and max(lanes_y) > 3.5) == wrap[1]


def test_hover_names_the_link_its_bytes_share_and_collectives():
    topo = az.Topology.simulated((4, 4), wrap=(True, True))
    placement = _placement(topo, seed=3)
    link_bytes, users = viz.link_bytes_by_collective(_collectives(), topo, placement)
    fig = viz.torus_heatmap(topo, link_bytes, collectives_by_link=users, title="shuffled")

    chip = int(np.ravel_multi_index((0, 1), topo.shape))
    hover = {(int(r[0]), int(r[1]), int(r[2])): h
             for t in _traces(fig, "links") for r, h in zip(t.customdata, t.hovertext, strict=True)}
    text = hover[(chip, 0, PLUS)]
    assert text.startswith("<b>(0,1) -> (1,1) +x</b>")
    assert "bytes: " in text and "share of busiest link: " in text
    for name, size in users[(chip, 0, PLUS)]:
        assert f"{name}: {format_bytes(size)}" in text
    back = hover[(chip, 0, MINUS)]
    assert back.startswith("<b>(0,1) -> (3,1) -x (wraparound)</b>")
    assert fig.layout.title.text == "shuffled"


def test_link_bytes_by_collective_splits_the_estimate_by_collective():
    topo = az.Topology.simulated((4, 4), wrap=(True, True))
    placement = _placement(topo, seed=1)
    collectives = _collectives()
    est = az.estimate(collectives, topo, placement)
    link_bytes, users = viz.link_bytes_by_collective(CommProgram(tuple(collectives), 16), topo,
                                                     placement)

    np.testing.assert_allclose(link_bytes, est.link_bytes)
    rebuilt = np.zeros_like(link_bytes)
    for key, pairs in users.items():
        assert [b for _, b in pairs] == sorted((b for _, b in pairs), reverse=True)
        rebuilt[key] = sum(b for _, b in pairs)
    np.testing.assert_allclose(rebuilt, est.link_bytes)
    assert {name for pairs in users.values() for name, _ in pairs} == {
        "ag", "ar", "collective-permute"}
    views = viz.collective_views(collectives, topo, placement)
    assert list(views) == ["all collectives", "ag", "ar", "collective-permute"]
    for view, part in zip(list(views)[1:], est.parts, strict=True):
        np.testing.assert_allclose(views[view], part.link_bytes)


def test_collective_names_fall_back_to_kind_and_number_repeats():
    gather = az.Collective("all-gather", [[0, 1]], 1.0)
    named = az.Collective("all-reduce", [[0, 1]], 1.0, name="ar.3")
    assert viz.collective_names([gather, gather, named]) == ["all-gather", "all-gather #2",
                                                             "ar.3"]


def test_3d_slice_has_a_panel_per_z_plane_and_shows_z_links():
    topo = az.Topology.simulated((2, 2, 4), generation="v5p")  # no wraparound: 2x2x4
    collectives = [az.Collective("all-gather", az.mesh_axis_groups((4, 4), [0]), 8e6,
                                 name="over z"),
                   az.Collective("all-to-all", az.mesh_axis_groups((4, 4), [1]), 4e6)]
    est = az.estimate(collectives, topo, _placement(topo))
    fig = viz.torus_heatmap(topo, est.link_bytes)

    panels = _traces(fig, "links")
    assert len(panels) == 4 and len({t.xaxis for t in panels}) == 4
    rows = _link_rows(fig)
    assert set(rows) == _existing_links(topo)
    for key, (size, _) in rows.items():
        assert size == pytest.approx(est.link_bytes[key])
    for z, trace in enumerate(panels):  # each link sits in its source chip's plane
        planes = {int(topo.chip_coords[int(r[0]), 2]) for r in trace.customdata}
        assert planes == {z}
        symbols = {s for s, r in zip(trace.marker.symbol, trace.customdata,
                                                  strict=True) if r[1] == 2}
        assert symbols == ({"circle-open-dot"} if z == 0 else {"circle-x-open"} if z == 3
                           else {"circle-open-dot", "circle-x-open"})
    assert est.link_bytes[:, 2].sum() > 0


def test_from_name_labels_chips_with_their_device_index():
    topo = az.Topology.from_name("v5e:4x4")
    fig = viz.torus_heatmap(topo, az.estimate(_collectives(), topo).link_bytes)
    (chips,) = _traces(fig, "chips")
    grid = topo.device_grid()
    expected = [str(grid[int(x), int(y), 0]) for x, y in zip(chips.x, chips.y, strict=True)]
    assert list(chips.text) == expected

    placement = _placement(topo, seed=2)
    labelled = _traces(viz.torus_heatmap(topo, np.zeros((16, 2, 2)), placement=placement),
                       "chips")[0]
    logical = {device: i for i, device in enumerate(placement.order)}
    assert list(labelled.text) == [str(logical[int(t)]) for t in chips.text]


def test_share_view_and_fixed_scale():
    topo = az.Topology.simulated((4, 4), wrap=(True, True))
    est = az.estimate(_collectives(), topo)
    share = viz.torus_heatmap(topo, est.link_bytes, value="share")
    colours = [c for t in _traces(share, "links") for c in t.marker.color]
    rows = _link_rows(share)
    assert colours == pytest.approx([r[1] for r in rows.values()])
    assert (share.layout.coloraxis.cmin, share.layout.coloraxis.cmax) == (0.0, 1.0)
    fixed = viz.torus_heatmap(topo, est.link_bytes, cmax=1e9)
    assert fixed.layout.coloraxis.cmax == 1e9
    with pytest.raises(az.AoizoraError, match="value="):
        viz.torus_heatmap(topo, est.link_bytes, value="seconds")


def test_link_bytes_of_another_topology_are_refused():
    torus = az.Topology.simulated((4, 4), wrap=(True, True))
    mesh = az.Topology.simulated((4, 4), wrap=(False, False))
    with pytest.raises(az.AoizoraError, match="does not have"):
        viz.torus_heatmap(mesh, az.estimate(_collectives(), torus).link_bytes)
    with pytest.raises(az.AoizoraError, match=r"shape \(16, 2\)"):
        viz.torus_heatmap(mesh, np.zeros((16, 2)))


def test_comparison_shares_one_scale_and_shows_the_difference():
    topo = az.Topology.simulated((4, 4), wrap=(False, False))
    left = az.estimate(_collectives(), topo).link_bytes
    right = az.estimate(_collectives(), topo, _placement(topo)).link_bytes
    fig = viz.heatmap_comparison(topo, left, right, left_title="compact",
                                 right_title="shuffled")

    first, second, change = _traces(fig, "links")
    assert first.marker.coloraxis == second.marker.coloraxis == "coloraxis"
    assert change.marker.coloraxis == "coloraxis2"
    assert fig.layout.coloraxis.cmax == pytest.approx(max(left.max(), right.max()))
    assert fig.layout.coloraxis2.cmin == pytest.approx(-fig.layout.coloraxis2.cmax)
    assert fig.layout.coloraxis2.cmax == pytest.approx(np.abs(right - left).max())
    for row in change.customdata:
        key = (int(row[0]), int(row[1]), int(row[2]))
        assert row[3:] == pytest.approx([left[key], right[key], right[key] - left[key]])
    assert "difference: shuffled − compact" in [a.text for a in fig.layout.annotations]

    cube = az.Topology.simulated((2, 2, 4), generation="v5p")
    est = az.estimate(_collectives(), cube)
    assert len(_traces(viz.heatmap_comparison(cube, est.link_bytes, 2 * est.link_bytes),
                       "links")) == 12  # 3 views x 4 z-planes


def test_collective_breakdown_merges_small_collectives_into_other():
    topo = az.Topology.simulated((4, 4), wrap=(True, True))
    collectives = [*standard_collectives((4, 4), 8e6),
                   az.Collective("collective-permute", [(0, 1)], 10.0, name="tiny")]
    frame = breakdown(CommProgram(tuple(collectives), 16), topo, _placement(topo))
    fig = viz.collective_breakdown(frame, top=4)

    bars = {y for t in fig.data for y in t.y}
    kept = frame["collective"].iloc[:4].tolist()
    assert bars == {*kept, f"other ({len(frame) - 4} collectives)"}
    assert list(fig.layout.yaxis.categoryarray)[-1] == kept[0]  # heaviest on top
    factor, unit = time_scale(frame["seconds"].max())
    assert fig.layout.xaxis.title.text == f"time per step ({unit})"
    assert sum(x for t in fig.data for x in t.x) == pytest.approx(frame["seconds"].sum() * factor)
    assert {t.name for t in fig.data} == {f"{kind} {part}" for kind in frame["kind"]
                                          for part in ("exposed", "hidden")}
    assert "exposed" in fig.layout.title.subtitle.text
    plain = viz.collective_breakdown(frame.drop(columns=["exposed_s", "hidden_s"]), top=4)
    assert {t.name for t in plain.data} == set(frame["kind"])

    looped = frame.assign(loop=["layers"] * 3 + ["outside"] * (len(frame) - 3))
    per_loop = viz.collective_breakdown(looped, by="loop")
    assert {y for t in per_loop.data for y in t.y} == {"layers", "outside"}
    with pytest.raises(az.AoizoraError, match="lacks"):
        viz.collective_breakdown(frame.drop(columns="seconds"))


def test_collective_breakdown_shows_what_the_schedule_hides_and_what_it_exposes():
    frame = pd.DataFrame({"collective": ["ag", "a2a"], "kind": ["all-gather", "all-to-all"],
                          "seconds": [3e-3, 1e-3], "hidden_s": [2e-3, 0.0],
                          "exposed_s": [1e-3, 1e-3]})
    fig = viz.collective_breakdown(frame)
    by_name = {t.name: t for t in fig.data}
    factor, _ = time_scale(3e-3)
    assert by_name["all-gather hidden"].x[0] == pytest.approx(2e-3 * factor)
    assert by_name["all-gather exposed"].x[0] == pytest.approx(1e-3 * factor)
    assert by_name["all-to-all hidden"].x[0] == 0
    assert by_name["all-gather hidden"].marker.pattern.shape == "/"
    assert "hidden behind compute" in by_name["all-gather hidden"].hovertext[0]


def test_ranking_scatter_marks_the_best_placement():
    frame = pd.DataFrame({
        "candidate": ["cfg2-uly4", "cfg2-uly4", "cfg2-ring4", "uly8"],
        "placement": [Placement(tuple(range(8)), d) for d in "abcd"],
        "description": ["cfg on x:2 | uly on y:4", "uly on x:2,y:2", "ring on y:4", "plain"],
        "source": ["structured", "anneal", "structured", "extra"],
        "compute_s": [0.50, 0.50, 0.52, 0.45],
        "comm_s": [0.08, 0.05, 0.02, 0.20],
    })
    frame["total_s"] = frame["compute_s"] + frame["comm_s"]
    fig = viz.ranking_scatter(frame)

    names = [t.name for t in fig.data]
    assert names == ["cfg2-ring4", "cfg2-uly4", "uly8", "best"]  # by best total
    best = fig.data[-1]
    assert (best.x[0], best.y[0]) == pytest.approx((520.0, 20.0))  # ms
    assert "ring on y:4" in best.hovertext[0] and "rank 1 of 4" in best.hovertext[0]
    total = viz.ranking_scatter(frame, y="total_s")
    assert total.data[-1].y[0] == pytest.approx(540.0)
    # The title says what the y axis shows.
    assert "communication" in fig.layout.title.text
    assert "step time" in total.layout.title.text and "communication" not in total.layout.title.text
    with pytest.raises(az.AoizoraError, match=r"needs columns \['comm_s'\].*ranking.to_frame"):
        viz.ranking_scatter(frame.drop(columns=["comm_s"]))


def test_explorer_figure_has_a_button_per_view_carrying_its_data():
    topo = az.Topology.simulated((4, 4), wrap=(True, True))
    placement = _placement(topo)
    views = viz.collective_views(_collectives(), topo, placement)
    _, users = viz.link_bytes_by_collective(_collectives(), topo, placement)
    fig = viz.heatmap_explorer_figure(topo, views, collectives_by_view={"all collectives": users})

    (menu,) = fig.layout.updatemenus
    assert [b.label for b in menu.buttons] == list(views)
    top = max(v.max() for v in views.values())
    for button, (name, link_bytes) in zip(menu.buttons, views.items(), strict=True):
        assert button.method == "update"
        restyle, relayout, indices = button.args
        assert [fig.data[i].meta for i in indices].count("links") == 1
        (arrows,) = [k for k, i in enumerate(indices) if fig.data[i].meta == "links"]
        for row in restyle["customdata"][arrows]:
            assert row[3] == pytest.approx(link_bytes[int(row[0]), int(row[1]), int(row[2])])
        assert len(restyle["customdata"][arrows]) == topo.num_links
        assert restyle["marker.color"][arrows] == pytest.approx(
            [row[3] for row in restyle["customdata"][arrows]])
        assert relayout["title.text"].endswith(f"— {name}")
        assert relayout["coloraxis.cmax"] == pytest.approx(top)  # one scale for all views
        json.dumps(button.args)  # plain JSON, as the exported page needs
    first = _link_rows(fig)
    assert all(v[0] == pytest.approx(views["all collectives"][k]) for k, v in first.items())
    listed = [any("collectives:" in h for hover in b.args[0]["hovertext"] if hover for h in hover)
              for b in menu.buttons]
    assert listed == [True, False, False, False]  # users given for the total view only


def test_explorer_widget_follows_its_dropdowns():
    topo = az.Topology.simulated((4, 4), wrap=(True, True))
    views = {}
    for label, placement in [("compact", topo.device_grid().ravel()),
                             ("shuffled", _placement(topo))]:
        for name, link_bytes in viz.collective_views(_collectives(), topo, placement).items():
            views[("cfg2-uly8", label, name)] = link_bytes
    views[("uly16", "compact", "all collectives")] = 2 * views[("cfg2-uly8", "compact", "ag")]
    explorer = viz.heatmap_explorer_widget(topo, views)

    dropdowns = explorer.dropdowns
    assert list(dropdowns) == ["candidate", "placement", "collective"]
    assert explorer.selection == ("cfg2-uly8", "compact", "all collectives")
    assert dropdowns["collective"].options == ("all collectives", "ag", "ar",
                                               "collective-permute")

    def shown() -> dict:
        return {k: v[0] for k, v in _link_rows(explorer.figure).items()}

    dropdowns["placement"].value = "shuffled"
    dropdowns["collective"].value = "ar"
    assert explorer.selection == ("cfg2-uly8", "shuffled", "ar")
    target = views[("cfg2-uly8", "shuffled", "ar")]
    assert all(size == pytest.approx(target[k]) for k, size in shown().items())
    bundle = explorer.output.outputs[0]["data"]
    assert bundle["application/vnd.plotly.v1+json"]["layout"]["title"]["text"].endswith(
        "cfg2-uly8 / shuffled / ar")

    dropdowns["candidate"].value = "uly16"  # narrows the later dropdowns to what exists
    assert dropdowns["placement"].options == ("compact",)
    assert explorer.selection == ("uly16", "compact", "all collectives")
    target = views[("uly16", "compact", "all collectives")]
    assert all(size == pytest.approx(target[k]) for k, size in shown().items())
    assert len(explorer.output.outputs) == 1
    assert "application/vnd.jupyter.widget-view+json" in explorer._repr_mimebundle_()
    with pytest.raises(az.AoizoraError, match="levels"):
        viz.heatmap_explorer_widget(topo, {("a", "b"): target})


def test_show_publishes_plotly_json_and_html_without_plotlyjs(monkeypatch):
    import IPython.display

    topo = az.Topology.simulated((4, 4), wrap=(True, True))
    link_bytes, users = viz.link_bytes_by_collective(_collectives(), topo)
    fig = viz.torus_heatmap(topo, link_bytes, collectives_by_link=users)
    published = []
    monkeypatch.setattr(IPython.display, "display",
                        lambda obj, raw=False: published.append((obj, raw)))
    viz.show(fig)

    ((bundle, raw),) = published
    assert raw is True
    assert set(bundle) == {"application/vnd.plotly.v1+json", "text/html", "text/plain"}
    spec = bundle["application/vnd.plotly.v1+json"]
    json.dumps(spec)
    assert len(spec["data"]) == len(fig.data)
    html = bundle["text/html"]
    assert "Plotly.newPlot" in html
    assert "<script src=" not in html and "cdn" not in html.lower()
    assert "plotly.js v" not in html and len(html) < 400_000  # plotly.js is not inlined
    # The page's Plotly.newPlot call carries exactly the figure's traces.
    call = html[html.index("Plotly.newPlot(") + len("Plotly.newPlot("):]
    data, _ = json.JSONDecoder().raw_decode(call[call.index(",") + 1:].lstrip())
    assert data == spec["data"]
    (arrows,) = [t for t in data if t.get("meta") == "links"]
    assert arrows["hovertext"] == list(_traces(fig, "links")[0].hovertext)
    assert arrows["customdata"][0][3] == pytest.approx(link_bytes[0, 0, PLUS])
    assert bundle["text/plain"] == f"<plotly figure: {fig.layout.title.text}>"


# ---- what the notebooks show: stage results, their aggregations and charts -----------------

def _space_1_3b_on_8_chips():
    workload = az.Workload.parse("wan2.1-t2v-1.3b@832x480x81")
    return explain_candidates(workload, az.Topology.simulated((2, 4), generation="v5e"))


# Wan 2.1 1.3B (12 heads, 32,760 tokens: divisible by 8) on 8 chips. Role-degree tuples of
# product 8 over (cfg, ulysses, ring, context, tp): weights unsharded or fsdp, and with cfg > 1
# also fsdpseq (weights over the sequence axes only). cfg 1: 20 tuples x 2; cfg 2: 10 x 3;
# cfg 4: the other factor 2 on one of 4 roles, x 3 (12 options); cfg 8: one tuple x 3;
# ulysses x tp = 8 takes all of the 8: (1, 8), (2, 4), (4, 2), (8, 1) (8 options); tp8-fsdp
# has no axis besides tp to shard over, and fsdpseq none besides tp and cfg when the rest is
# tp (cfg2-tp4, cfg4-tp2, cfg8).
EXPECTED_EXCLUSIONS = {
    "cfg degree 4 > 2 passes per step": 12,
    "12 heads not divisible by ulysses x tp = 8": 8,
    "fsdp needs an axis besides tp and cfg to shard weights over (fsdpseq)": 3,
    "cfg degree 8 > 2 passes per step": 3,
    "fsdp needs an axis besides tp to shard weights over": 1,
}


def test_exclusions_count_every_option_under_each_rule_it_breaks():
    space = _space_1_3b_on_8_chips()
    frame = space.exclusions()

    assert list(frame.columns) == ["reason", "combinations", "examples"]
    assert dict(zip(frame["reason"], frame["combinations"], strict=True)) == EXPECTED_EXCLUSIONS
    assert list(frame["combinations"]) == sorted(frame["combinations"], reverse=True)
    assert len(space) == 20 * 2 + 10 * 3 + 4 * 3 + 1 * 3
    examples = dict(zip(frame["reason"], frame["examples"], strict=True))
    assert examples["fsdp needs an axis besides tp to shard weights over"] == "tp8-fsdp"
    assert examples["cfg degree 8 > 2 passes per step"] == "cfg8, cfg8-fsdp, cfg8-fsdpseq"
    assert len(examples["cfg degree 4 > 2 passes per step"].split(", ")) == 6  # first six


def test_exclusion_chart_draws_a_bar_per_reason_heaviest_on_top():
    space = _space_1_3b_on_8_chips()
    fig = viz.exclusion_chart(space)

    (bars,) = fig.data
    assert dict(zip(bars.y, bars.x, strict=True)) == EXPECTED_EXCLUSIONS
    assert EXPECTED_EXCLUSIONS[bars.y[-1]] == 12 and bars.y[0].startswith("fsdp")  # bottom-up
    assert "e.g. tp8-fsdp" in bars.hovertext[0]
    # Options breaking two rules: tp8-fsdp (heads), cfg8-fsdpseq and cfg4-tp2-fsdpseq (cfg).
    invalid = sum(EXPECTED_EXCLUSIONS.values()) - 3
    assert f"{invalid} of 85 combinations excluded, by 5 reasons" in fig.layout.title.subtitle.text


def _estimate(name: str, estimate_s: float, lower_s: float) -> IREstimate:
    return IREstimate(
        candidate=name, flops=1e12, hbm_bytes=1e9, param_bytes=1e9,
        largest_activation_bytes=1e8, memory_lower_bound_bytes=1.1e9, comm_bytes=2e9,
        comm_bytes_by_axes={}, collectives=(), lower_bound_seconds=lower_s,
        compute_lower_bound_seconds=lower_s, comm_lower_bound_seconds=0.0,
        estimate_seconds=estimate_s, compute_estimate_seconds=estimate_s,
        comm_estimate_seconds=0.0, trace_seconds=0.1, notes=())


def test_pruning_scatter_colours_by_verdict_and_leaves_out_failed_traces():
    rows = [("cfg2-uly4", Verdict.KEPT_BEST, 2.0, 1.5), ("cfg2-ring4", Verdict.KEPT_BEST, 2.1, 1.6),
            ("uly8", Verdict.UNLIKELY, 3.0, 2.0), ("tp8", Verdict.CANNOT_WIN, 9.0, 5.0),
            ("cfg2-tp4", Verdict.CANNOT_WIN, 8.0, 4.0)]
    decisions = [PruneDecision(Candidate.from_name(name), verdict, verdict.value,
                               _estimate(name, est, low), i)
                 for i, (name, verdict, est, low) in enumerate(rows)]
    decisions.append(PruneDecision(Candidate.from_name("ctx8"), Verdict.TRACE_FAILED,
                                   "trace failed: boom", None, 5))
    fig = viz.pruning_scatter(Pruning(decisions))

    points = {t.name: t for t in fig.data if t.meta == "verdict"}
    assert set(points) == {"kept: among the best estimates", "unlikely to win", "cannot win"}
    cannot = points["cannot win"]
    assert sorted(zip(cannot.x, cannot.y, strict=True)) == [(4.0, 8.0), (5.0, 9.0)]  # seconds
    assert list(points["kept: among the best estimates"].y) == [2.0, 2.1]
    assert points["kept: among the best estimates"].marker.symbol == "circle"
    assert cannot.marker.symbol == "x" and "tp8" in "".join(cannot.hovertext)
    assert sum(len(t.x) for t in points.values()) == 5  # the failed trace has no point
    assert "ctx8" not in json.dumps(fig.to_plotly_json()["data"], default=str)
    assert "2 kept of 5 traced; 1 trace failed" in fig.layout.title.subtitle.text


def _site_program(rows, num_devices=8):
    """A CommProgram from (kind, bytes, count, asynchronous) rows on 8 devices."""
    collectives, sites = [], []
    for i, (kind, size, count, asynchronous) in enumerate(rows):
        groups = ([(d, (d + 1) % num_devices) for d in range(num_devices)]
                  if kind == "collective-permute" else [tuple(range(num_devices))])
        collectives.append(az.Collective(kind, groups, size, count=count, name=f"c{i}"))
        sites.append(CollectiveSite((), "", asynchronous))
    return CommProgram(tuple(collectives), num_devices, sites=tuple(sites))


def _compiles() -> Compiles:
    first = _site_program([("all-gather", 8e6, 3, True), ("all-gather", 2e6, 1, True),
                           ("all-gather", 1e6, 2, False), ("all-to-all", 4e6, 5, False)])
    second = _site_program([("collective-permute", 5e6, 4, True)])
    return Compiles([
        CompiledCandidate(Candidate.from_name("cfg2-ctx4-fsdp"), "ok", "", 1.0, program=first),
        CompiledCandidate(Candidate.from_name("tp8"), "oom", "RESOURCE_EXHAUSTED", 1.0),
        CompiledCandidate(Candidate.from_name("cfg2-ring4"), "ok", "", 1.0, program=second),
    ])


# GB per device per step, bytes x runs summed by hand from _compiles().
EXPECTED_TRAFFIC = {
    ("cfg2-ctx4-fsdp", "all-gather (async)"): (8e6 * 3 + 2e6) / 1e9,
    ("cfg2-ctx4-fsdp", "all-gather (sync)"): 2e6 / 1e9,
    ("cfg2-ctx4-fsdp", "all-to-all (sync)"): 20e6 / 1e9,
    ("cfg2-ring4", "collective-permute (async)"): 20e6 / 1e9,
}


def test_compiles_traffic_sums_bytes_by_kind_and_schedule_of_ok_compiles():
    traffic = _compiles().traffic()

    assert list(traffic.columns) == ["candidate", "flags", "program", "kind", "schedule",
                                     "collective", "gb"]
    assert (traffic["program"] == traffic["candidate"]).all()  # one flag set: named as is
    got = {(c, label): gb for c, label, gb in
           zip(traffic["candidate"], traffic["collective"], traffic["gb"], strict=True)}
    assert got.keys() == EXPECTED_TRAFFIC.keys()  # tp8 did not compile: no rows
    for key, gb in EXPECTED_TRAFFIC.items():
        assert got[key] == pytest.approx(gb), key
    assert list(dict.fromkeys(traffic["candidate"])) == ["cfg2-ctx4-fsdp", "cfg2-ring4"]
    assert set(traffic["schedule"]) == {"async", "sync"}


def test_a_candidate_compiled_with_two_flag_sets_is_two_programs():
    import dataclasses

    from aoizora_lab.compile import Compiles, compiler_flags

    compiles = _compiles()
    again = dataclasses.replace(compiles.ok[0], flags=compiler_flags("maxdiffusion-ulysses"))
    traffic = Compiles([*compiles, again]).traffic()
    assert list(dict.fromkeys(traffic["program"])) == [
        "cfg2-ctx4-fsdp · default", "cfg2-ring4 · default",
        "cfg2-ctx4-fsdp · maxdiffusion-ulysses"]
    table = traffic.pivot(index="program", columns="collective", values="gb")
    assert table.loc["cfg2-ctx4-fsdp · maxdiffusion-ulysses"].equals(
        table.loc["cfg2-ctx4-fsdp · default"])
    fig = viz.traffic_chart(Compiles([*compiles, again]))
    assert len(fig.layout.yaxis.categoryarray) == 3


def test_traffic_chart_stacks_each_candidate_and_hatches_the_asynchronous_part():
    fig = viz.traffic_chart(_compiles())

    totals: dict[str, float] = {}
    for bar in fig.data:
        assert (bar.marker.pattern.shape == "/") == bar.name.endswith("(async)"), bar.name
        for candidate, gb in zip(bar.y, bar.x, strict=True):
            totals[candidate] = totals.get(candidate, 0.0) + gb
    assert totals == pytest.approx({"cfg2-ctx4-fsdp": 0.048, "cfg2-ring4": 0.020})
    assert {bar.name for bar in fig.data} == {label for _, label in EXPECTED_TRAFFIC}
    assert list(fig.layout.yaxis.categoryarray) == ["cfg2-ring4", "cfg2-ctx4-fsdp"]


def _ranked(topo):
    program = CommProgram(tuple(_collectives()), 16)
    candidate = Candidate.from_name("cfg2-uly8")
    same = "local search from: structured: cfg on x:2 | ulysses on y:4,x:2 (and more)"
    entries = [RankedPlacement(candidate, Placement(_placement(topo, seed).order, same),
                               Predicted(1.0, 0.1 * seed, 1.0 + 0.1 * seed), Source.LOCAL_SEARCH)
               for seed in range(3)]
    return entries, {(candidate.name, "default"): program}


def test_ranking_views_give_each_ranked_placement_its_own_estimate():
    topo = az.Topology.simulated((4, 4), wrap=(True, True))
    entries, programs = _ranked(topo)
    views, users = viz.ranking_views(entries, programs, topo)

    assert len(views) == 3 and list(views) == list(users)  # same descriptions, distinct labels
    assert [name.split(" ")[0] for name in views] == ["#1", "#2", "#3"]
    for entry, data in zip(entries, views.values(), strict=True):
        np.testing.assert_allclose(data, az.estimate(_collectives(), topo,
                                                     entry.placement).link_bytes)
    first = next(iter(users.values()))
    link, pairs = next(iter(first.items()))
    assert sum(b for _, b in pairs) == pytest.approx(views[next(iter(views))][link])
    with pytest.raises(az.AoizoraError,
                       match="No compiled program for \\('cfg2-uly8', 'default'\\)"):
        viz.ranking_views(entries, {}, topo)


def test_heaviest_collective_views_pick_the_slowest_collectives():
    topo = az.Topology.simulated((4, 4), wrap=(True, True))
    placement = _placement(topo)
    collectives = _collectives()
    alone = {c.name or c.kind: az.estimate([c], topo, placement) for c in collectives}
    slowest = sorted(alone, key=lambda name: -alone[name].seconds)[:2]
    views = viz.heaviest_collective_views(CommProgram(tuple(collectives), 16), topo, placement,
                                          top=2, prefix="winner")

    assert list(views) == [f"winner · {name}" for name in slowest]
    for name in slowest:
        np.testing.assert_allclose(views[f"winner · {name}"], alone[name].link_bytes)
    # Priced under the model it is given, as the other views are.
    routed = ModelOptions(routing="dimension-order")
    priced = viz.heaviest_collective_views(CommProgram(tuple(collectives), 16), topo,
                                           placement, top=1, options=routed)
    [(name, loads)] = priced.items()
    np.testing.assert_allclose(
        loads, az.estimate([c for c in collectives if (c.name or c.kind) == name], topo,
                           placement, options=routed).link_bytes)


def test_heaviest_collective_views_say_how_much_of_an_async_collective_is_hidden():
    topo = az.Topology.simulated((4, 4), wrap=(True, True))
    placement = _placement(topo)
    gather = az.Collective("all-gather", mesh_axis_groups((4, 4), [1]), 8e6, name="ag")
    alone = az.estimate(gather, topo, placement).seconds
    op = ComputeOp(az.chip_spec("v5e").peak_bf16_flops * alone / 4, 0.0, 1, 0, "matmul",
                   anchors=(("main", 1),))
    program = CommProgram((gather,), 16, sites=(CollectiveSite((), "", True, "main", 0, 2),),
                          ops=(op,))
    [label] = viz.heaviest_collective_views(program, topo, placement, top=1)
    hidden = min(1.0, op_seconds(op, az.chip_spec("v5e")) / alone)
    assert label == f"ag ({hidden:.0%} hidden)" and 0 < hidden < 1


def test_ranking_collective_views_key_every_placement_and_collective():
    topo = az.Topology.simulated((4, 4), wrap=(True, True))
    entries, programs = _ranked(topo)
    views = viz.ranking_collective_views(entries, programs, topo, collectives=3)

    assert len(views) == 3 * 3
    keys = list(views)
    assert keys[0][0] == "cfg2-uly8" and keys[0][1].startswith("#1 local search")
    assert [k[2] for k in keys[:3]] == ["all collectives", "ag", "ar"]
    np.testing.assert_allclose(views[keys[3]], az.estimate(_collectives(), topo,
                                                           entries[1].placement).link_bytes)
    viz.heatmap_explorer_widget(topo, views)  # the widget takes them as they are


# ---- large slices: blocks and regions ----------------------------------------------------

def _random_loads(topology, seed=0):
    loads = np.random.default_rng(seed).uniform(1.0, 9.0, size=(topology.num_chips,
                                                                 topology.ndim, 2))
    return loads * topology.link_exists


@pytest.mark.parametrize(("shape", "wrap", "block"), [((16, 16), (True, True), 4),
                                                      ((8, 4), (False, False), 2),
                                                      ((4, 4, 4), (True, True, True), 2)])
def test_blocks_carry_the_busiest_link_between_them(shape, wrap, block):
    topology = az.Topology.simulated(shape, wrap=wrap, generation="v5p" if len(shape) == 3
                                     else "v5e")
    loads = _random_loads(topology)
    view = views.coarsen(topology, loads, block)
    assert view.topology.shape == tuple(n // block for n in shape)
    assert view.topology.wrap == wrap
    # Brute force: every original link whose two chips lie in different blocks.
    expected = np.zeros_like(view.link_bytes)
    inside = np.zeros(view.topology.num_chips)
    for chip, axis, direction in np.argwhere(topology.link_exists).tolist():
        link = topology.link(chip, axis, direction)
        src, dst = (tuple(c // block for c in end) for end in (link.src, link.dst))
        cell = int(np.flatnonzero((view.topology.chip_coords == src).all(axis=1))[0])
        if src != dst:
            expected[cell, axis, direction] = max(expected[cell, axis, direction],
                                                  loads[chip, axis, direction])
        else:
            inside[cell] = max(inside[cell], loads[chip, axis, direction])
    np.testing.assert_array_equal(view.link_bytes, expected)
    assert not view.link_bytes[~view.topology.link_exists].any()
    busiest_inside = int(np.argmax(inside))
    assert format_bytes(inside[busiest_inside]) in view.hover[busiest_inside]


def test_a_region_keeps_its_chips_links_and_labels():
    topology = az.Topology.simulated((16, 16))  # v5e: wraps at 16
    loads = _random_loads(topology, seed=1)
    fig = viz.torus_heatmap(topology, loads, region=((4, 8), (12, 16)))
    rows = _link_rows(fig)
    view_topology = az.Topology.simulated((8, 8), wrap=(False, False))
    assert len(rows) == int(view_topology.link_exists.sum())  # nothing leaves the region
    for (cell, axis, direction), row in rows.items():
        x, y = view_topology.chip_coords[cell]
        chip = 16 * (x + 4) + (y + 8)  # row-major, y fastest
        assert row[0] == pytest.approx(loads[chip, axis, direction])
    (chips,) = _traces(fig, "chips")
    labels = chips.text
    assert labels[0] == str(topology.device_grid()[4, 8, 0])  # the device on chip (4, 8)
    assert "region x 4–11, y 8–15" in fig.layout.title.subtitle.text
    # Spanning all of x keeps the x wraparound; a part of y does not.
    whole_x = viz.torus_heatmap(topology, loads, region=((0, 0), (16, 4)))
    wrapped = [h for t in _traces(whole_x, "links") for h in t.hovertext if "(wraparound)" in h]
    assert wrapped and all("x (wraparound)" in h for h in wrapped)


def test_large_slices_are_drawn_in_blocks_by_default_with_the_whole_scale():
    topology = az.Topology.simulated((16, 16))
    loads = _random_loads(topology, seed=2)
    loads[16 * 4, 0, PLUS] = 100.0  # the busiest link: chip (4, 0) +x, inside its 2x2 block
    fig = viz.torus_heatmap(topology, loads, value="share")
    assert views.auto_block(topology) == 2
    eight = az.Topology.simulated((8, 8), wrap=(True, True))  # the wraparound kept
    assert len(_link_rows(fig)) == int(eight.link_exists.sum())
    assert max(row[1] for row in _link_rows(fig).values()) < 0.1  # share of the whole busiest
    assert "blocks of 2x2 chips" in fig.layout.title.subtitle.text
    assert views.auto_block(az.Topology.simulated((8, 8))) == 1  # 64 chips: every link
    # Offered shapes whose axes a power of 2 does not tile still get a block that does.
    for shape in ((12, 24, 24), (20, 20, 20)):
        odd = az.Topology.simulated(shape, generation="v5p")
        block = views.auto_block(odd)
        assert all(n <= block or n % block == 0 for n in shape)
        assert views._cells(shape, block) <= views.MAX_DETAILED_CHIPS
        view = views.coarsen(odd, np.zeros((odd.num_chips, odd.ndim, 2)), block)
        assert view.topology.num_chips <= views.MAX_DETAILED_CHIPS
    with pytest.raises(az.AoizoraError, match=r"block=3 .*one of \[1, 2, 4, 8, 16\]"):
        viz.torus_heatmap(topology, loads, block=3)
    with pytest.raises(az.AoizoraError, match="pass one of them"):
        viz.torus_heatmap(topology, loads, block=2, region=((0, 0), (4, 4)))
    with pytest.raises(az.AoizoraError, match=r"region \(0, 0\) to \(4, 17\)"):
        viz.torus_heatmap(topology, loads, region=((0, 0), (4, 17)))
    comparison = viz.heatmap_comparison(topology, loads, loads * 2)
    assert "blocks of 2x2 chips" in comparison.layout.title.subtitle.text


def test_order_comparison_draws_each_hop_and_names_the_busiest_link():
    # The same 8 chips of a 2x4 slice as a row-major chain and as a ring: an all-reduce runs
    # along the order, so the chain's hops that cross the block are drawn red, the ring's
    # eight hops all green, and each panel title carries its time and busiest link.
    topo = az.Topology.simulated((2, 4), generation="v6e")
    at = {tuple(int(v) for v in c): i for i, c in enumerate(topo.coords)}
    chain = Placement(tuple(at[(x, y)] for y in range(4) for x in range(2)), "chain")
    ring = Placement(tuple(at[c] for c in [(0, y) for y in range(4)]
                           + [(1, y) for y in reversed(range(4))]), "ring")
    reduce = az.Collective("all-reduce", [list(range(8))], 64e6, name="tp all-reduce")
    fig = viz.order_comparison(topo, reduce, chain, ring)
    hops = [t for t in fig.data if t.meta == "order-hops"]
    assert len(hops) == 2 * 8  # every hop of both orders, the closing ones included
    chain_hops, ring_hops = hops[:8], hops[8:]
    assert all(t.line.color == viz.order.NEAR_HOP and t.text.endswith(": 1 link")
               for t in ring_hops)
    far = [t for t in chain_hops if t.line.color == viz.order.FAR_HOP]
    assert far and all(not t.text.endswith(": 1 link") for t in far)
    titles = [a.text for a in fig.layout.annotations]
    for placement in (chain, ring):
        found = az.estimate(reduce, topo, placement)
        assert any(t.startswith(placement.description) and str(found.busiest_link) in t
                   for t in titles)
    with pytest.raises(az.AoizoraError, match="group=3"):
        viz.order_comparison(topo, reduce, chain, ring, group=3)


@pytest.mark.parametrize(("shape", "generation"), [((2, 4), "v5e"), ((4, 4), "v5e"),
                                                   ((2, 2, 4), "v5p"), ((2, 2, 2), "tpu7x")])
def test_chain_and_ring_are_the_same_chips_and_only_the_ring_has_one_link_hops(shape,
                                                                              generation):
    topo = az.Topology.simulated(shape, generation=generation)
    collective, chain, ring = viz.chain_and_ring(topo)
    (members,) = collective.groups
    chips = [topo.device_chip[np.asarray(p.order)[list(members)]] for p in (chain, ring)]
    assert sorted(chips[0]) == sorted(chips[1])
    hops = [[int(topo.offset_hops(topo.chip_coords[c[(i + 1) % len(c)]]
                                  - topo.chip_coords[c[i]])) for i in range(len(c))]
            for c in chips]
    assert hops[1] == [1] * len(members) and max(hops[0]) > 1
    assert az.estimate(collective, topo, chain).seconds > az.estimate(
        collective, topo, ring).seconds


def test_ordered_collective_is_the_heaviest_that_follows_its_order():
    topo = az.Topology.simulated((4, 4))
    program = [az.Collective("all-gather", mesh_axis_groups((2, 8), [1]), 64e6, count=9),
               az.Collective("all-reduce", mesh_axis_groups((4, 4), [1]), 2e6, count=3),
               az.Collective("reduce-scatter", mesh_axis_groups((2, 8), [1]), 1e6, count=4),
               az.Collective("all-reduce", mesh_axis_groups((8, 2), [1]), 9e6, count=9),
               az.Collective("all-reduce", [list(range(16))], 99e6, count=9)]
    # The gather and the 16-device all-reduce are laid out by the compiler, pairs are the
    # same in any order: of the rest, the one that takes longest.
    rest = program[1:3]
    slowest = max(rest, key=lambda c: az.estimate(c, topo).seconds)
    assert viz.ordered_collective(program, topo) is slowest
    assert viz.ordered_collective([program[0], program[3], program[4]], topo) is None
