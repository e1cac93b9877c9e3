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
# Predicted step latency = compute + the communication the compiled schedule leaves
# exposed. The compiler runs some collectives asynchronously (a start ... done pair); such a
# collective hides only behind the compute scheduled between its start and its done, and
# collectives in flight together share links. The search minimises exactly that exposed time.

# %% tags=["parameters"]
case = "wan2.1-t2v-1.3b@832x480x81/v5e:2x4"
layers = 2
budget = 20000

# %%
from IPython.display import Markdown, display

from aoizora_lab import viz
from aoizora_lab.comm_model import estimate
from aoizora_lab.notebook import notebook_inputs, record
from aoizora_lab.placement import plain_order
from aoizora_lab.planner import plan

inputs = notebook_inputs(case=case, layers=layers, budget=budget)
workload, slice_ = inputs.workload, inputs.topology
result = plan(workload, slice_, num_layers=inputs.layers, budget=inputs.budget)
best = result.best
display(Markdown(
    f"**Best plan:** `{best.candidate.name}` placed as *{best.placement.description}* — "
    f"predicted {best.predicted.total_s * 1e3:.1f} ms per step "
    f"(compute {best.predicted.compute_s * 1e3:.1f} ms, communication "
    f"{best.predicted.comm_s * 1e3:.1f} ms, {best.predicted.exposed_s * 1e3:.1f} ms of it "
    "exposed)."))

# %% [markdown]
# ## The ranking
#
# The best placements of every compiled candidate, fastest first. `source` says where a
# placement came from: a library's device order (plain order, `jax.make_mesh`,
# `create_device_mesh`), a structured layout, or local search.

# %%
ranking = result.ranking.to_frame()
columns = ["candidate", "description", "source", "compute_s", "comm_s", "total_s"]
display(ranking[columns].head(15).round(4))
viz.show(viz.ranking_scatter(ranking, y="total_s"))

# %% [markdown]
# ## Against the solutions people use today, and ablations of the plan
#
# Each row is a candidate plus a device order, compiled and scored by the *same* pipeline and
# model. The **baselines (existing systems)** are what people run today: MaxDiffusion's
# CFG × context with `create_device_mesh` (`maxdiffusion`) and xDiT's USP, Ulysses × ring in
# plain device order (`xdit-usp`). The **ablations** take one idea away from the plan
# (`ablation` is true): `jax-default` is the plan's candidate placed by `jax.make_mesh` (no
# placement search), `logical-only` the best candidate in plain order (a topology-blind
# search). `speedup_of_plan` is that row's latency / the plan's latency; a row that could not
# be built or compiled says why in `reason`. Where one of them is predicted faster than the
# search's own best, it becomes the plan.

# %%
display(result.baselines.to_frame().round(4))

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
plain_bytes = estimate(program, slice_, plain_order(slice_)).link_bytes
viz.show(viz.heatmap_comparison(slice_, plain_bytes, link_bytes, left_title="plain order",
                                right_title="winning placement"))

# %% [markdown]
# ### Against MaxDiffusion's layout
#
# The MaxDiffusion baseline (CFG × context, K/V gathered, `create_device_mesh` order) as
# the planner built and priced it, on the left, the plan on the right: different programs,
# so the picture shows both where the bytes go and how many there are.

# %%
maxdiffusion = result.baselines["maxdiffusion"]
if maxdiffusion.plan is not None:
    md_plan = maxdiffusion.plan
    md_bytes = estimate(md_plan.program, slice_, md_plan.placement).link_bytes
    viz.show(viz.heatmap_comparison(slice_, md_bytes, link_bytes,
                                    left_title=f"maxdiffusion: {md_plan.candidate.name}",
                                    right_title=f"plan: {best.candidate.name}"))
else:
    display(Markdown(f"The MaxDiffusion baseline is **{maxdiffusion.status.value}**: "
                     f"{maxdiffusion.reason}"))

# %% [markdown]
# ## Breakdown of the winner
#
# Time per collective on the winning placement, heaviest first, with its busiest link: how
# much of it the schedule hides behind compute (`hidden_s`, hatched in the chart) and how much
# the step waits for (`exposed_s`, solid). `window_s` is the compute between the
# collective's start and done; `in_flight_with` counts the collectives sharing its links then.

# %%
display(best.breakdown.head(12))
viz.show(viz.collective_breakdown(best.breakdown))

# %% [markdown]
# ## Explore
#
# Pick a view: the top placements of the ranking and the winner's heaviest collectives. (In
# JupyterLab, the widget explorer below lets you pick candidate, placement and collective
# independently; in the exported page the dropdown is the static fallback.)

# %%
views, users_by_view = viz.ranking_views(result.ranking[:4], result.programs, slice_)
views |= viz.heaviest_collective_views(program, slice_, best.placement, top=4, prefix="winner")
viz.show(viz.heatmap_explorer_figure(slice_, views, collectives_by_view=users_by_view,
                                     title="Link bytes: pick a view"))

# %%
explorer = viz.heatmap_explorer_widget(
    slice_, viz.ranking_collective_views(result.ranking[:6], result.programs, slice_))
explorer  # a live widget in JupyterLab

# %% [markdown]
# The headline speedups: over the best baseline (existing system) that compiled, and,
# separately, over the best ablation.

# %%
existing = [o.plan for o in result.baselines if o.plan is not None and not o.ablation]
ablations = [o.plan for o in result.baselines if o.plan is not None and o.ablation]
record("best_candidate", best.candidate.name)
record("best_placement", best.placement.description)
record("predicted_step_s", best.predicted.total_s)
record("speedup_over_best_existing_system",
       min(p.predicted.total_s for p in existing) / best.predicted.total_s
       if existing else None)
record("speedup_over_best_ablation",
       min(p.predicted.total_s for p in ablations) / best.predicted.total_s
       if ablations else None)
record("placements_ranked", len(result.ranking))
