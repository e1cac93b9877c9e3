# ---
# jupyter:
#   jupytext:
#     cell_metadata_filter: tags,-all
#     formats: ipynb,py:percent
#     text_representation:
#       extension: .py
#       format_name: percent
#       format_version: '1.3'
#       jupytext_version: 1.19.6
# ---

# %% [markdown]
# # 4 · Physical placement: where each logical device sits on the torus
#
# A candidate fixes a *logical* mesh, e.g. `cfg2-uly4` is a 2 × 4 mesh whose second axis
# runs all-to-alls. Which physical chip hosts each logical device is a separate choice — the
# **placement** — and it decides which inter-chip links every collective uses. Two
# placements of the same program move the same bytes, but one may pile them on a few links
# while the other spreads them, or route a ring's closing hop across the whole slice.
#
# For each compiled candidate the workbench scores placements with a topology-aware model of
# the links (every transfer routed link by link, contention summed per link, the busiest
# link sets the time):
#
# 1. every *structured* placement: each logical axis on whole physical axes or factors of
#    them, in every nesting order, plain or as a snake or folded ring, plus what
#    `jax.make_mesh` and `mesh_utils.create_device_mesh` would pick;
# 2. once per symmetry class (mirrors, rotations, translations of the torus leave every
#    score unchanged);
# 3. then a seeded local search (batched simulated annealing over swaps) from the best few.
#
# Predicted step latency = compute + synchronous communication + whatever asynchronous
# communication does not fit behind compute.

# %% tags=["parameters"]
model = "wan2.1-t2v-1.3b"
size = [832, 480]
frames = 81
topology = "v5e:2x4"
layers = 2
budget = 20000

# %%
from IPython.display import Markdown, display

from aoizora_lab import baselines, viz
from aoizora_lab.comm_model import estimate
from aoizora_lab.notebook import notebook_inputs, record
from aoizora_lab.placement import Placement
from aoizora_lab.planner import plan

inputs = notebook_inputs(model=model, size=size, frames=frames, topology=topology,
                         layers=layers, budget=budget)
workload, slice_ = inputs.workload, inputs.topology
result = plan(workload, slice_, num_layers=inputs.layers, budget=inputs.budget)
best = result.best
display(Markdown(
    f"**Best plan:** `{best.candidate.name}` placed as *{best.placement.description}* — "
    f"predicted {best.predicted.total_s * 1e3:.1f} ms per step "
    f"(compute {best.predicted.compute_s * 1e3:.1f} ms, communication "
    f"{best.predicted.comm_s * 1e3:.1f} ms before overlap)."))

# %% [markdown]
# ## The ranking
#
# The best placements of every compiled candidate, fastest first. `source` says where a
# placement came from: a structured layout, a library default (`extra`), or local search.

# %%
columns = ["candidate", "description", "source", "compute_s", "comm_s", "total_s"]
display(result.placements[columns].head(15).round(4))
viz.show(viz.ranking_scatter(result.placements, y="total_s"))

# %% [markdown]
# ## Against the solutions people use today
#
# Each baseline is a candidate plus a device order, compiled and scored by the *same*
# pipeline and model: MaxDiffusion's CFG × context with `create_device_mesh`, xDiT's USP
# (Ulysses × ring) in plain device order, the best candidate on `jax.make_mesh`, and the
# best candidate in plain order (a topology-blind search). `speedup_of_plan` is baseline
# latency / plan latency.

# %%
display(result.baselines.round(4))

# %% [markdown]
# ## Where the winner's bytes go
#
# Every directed link of the slice, coloured by the bytes the winning plan sends over it per
# step (hover a link for its load and the collectives that use it). A balanced picture means
# the placement spreads traffic; one hot link is a bottleneck.

# %%
program = best.program
link_bytes, users = viz.link_bytes_by_collective(program, slice_, best.placement)
viz.show(viz.torus_heatmap(slice_, link_bytes, collectives_by_link=users,
                           placement=best.placement,
                           title=f"{best.candidate.name}: bytes per link per step"))

# %% [markdown]
# ### Same program, default device order
#
# The placement-only gain: the winning candidate in plain device order (left) and in the
# winning placement (right), on one colour scale, then their difference.

# %%
plain = Placement(tuple(range(slice_.num_devices)), "plain device order")
plain_bytes = estimate(program, slice_, plain).link_bytes
viz.show(viz.heatmap_comparison(slice_, plain_bytes, link_bytes, left_title="plain order",
                                right_title="winning placement"))

# %% [markdown]
# ### Against MaxDiffusion's layout
#
# The MaxDiffusion baseline (CFG × context, K/V gathered, `create_device_mesh` order) on the
# left, the plan on the right: different programs, so the picture shows both where the bytes
# go and how many there are.

# %%
md_candidate, md_placement = baselines.maxdiffusion(workload, slice_)
if md_candidate.name in result.programs:
    md_bytes = estimate(result.programs[md_candidate.name], slice_, md_placement).link_bytes
    viz.show(viz.heatmap_comparison(slice_, md_bytes, link_bytes,
                                    left_title=f"maxdiffusion: {md_candidate.name}",
                                    right_title=f"plan: {best.candidate.name}"))
else:
    print(f"The MaxDiffusion baseline {md_candidate.name} did not compile: see the table above.")

# %% [markdown]
# ## Breakdown of the winner
#
# Time per collective on the winning placement, heaviest first, with its busiest link.

# %%
display(best.breakdown.head(12))
viz.show(viz.collective_breakdown(best.breakdown))

# %% [markdown]
# ## Explore
#
# Pick a view: the winner's top placements and each of its heaviest collectives. (In
# JupyterLab, the widget explorer below lets you pick candidate, placement and collective
# independently; in the exported page the dropdown is the static fallback.)

# %%
views, users_by_view = {}, {}
for _, row in result.placements.head(4).iterrows():
    name = f"{row['candidate']} · {row['description'][:60]}"
    views[name], users_by_view[name] = viz.link_bytes_by_collective(
        result.programs[row["candidate"]], slice_, row["placement"])
per_collective = viz.collective_views(program, slice_, best.placement)
for collective in best.breakdown["collective"].head(4):
    if collective in per_collective:
        views[f"winner · {collective}"] = per_collective[collective]
viz.show(viz.heatmap_explorer_figure(slice_, views, collectives_by_view=users_by_view,
                                     title="Link bytes: pick a view"))

# %%
explorer_views = {}
for _, row in result.placements.head(6).iterrows():
    loads = viz.collective_views(result.programs[row["candidate"]], slice_, row["placement"])
    for collective, bytes_ in list(loads.items())[:6]:
        explorer_views[(row["candidate"], row["description"][:60], collective)] = bytes_
explorer = viz.heatmap_explorer_widget(slice_, explorer_views)
explorer  # a live widget in JupyterLab

# %%
ok = result.baselines[result.baselines["status"] == "ok"]
others = ok[ok["baseline"] != "aoizora-lab"]
record("best_candidate", best.candidate.name)
record("best_placement", best.placement.description)
record("predicted_step_s", best.predicted.total_s)
record("speedup_over_best_baseline", float(others["total_s"].min() / best.predicted.total_s))
record("placements_ranked", len(result.placements))
