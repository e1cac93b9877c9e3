# ---
# jupyter:
#   jupytext:
#     cell_metadata_filter: tags,-all
#     formats: ipynb,py:percent
#     text_representation:
#       extension: .py
#       format_name: percent
#       format_version: '1.3'
#       jupytext_version: 1.19.7
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
#
# Compiler flags are one more dimension of the search: each kept candidate is compiled with
# libtpu's defaults and with MaxDiffusion's recommended flags (the `flags` column), and each
# compiled program is placed on its own.

# %% tags=["parameters"]
case = "wan2.1-t2v-1.3b@832x480x81/v5e:2x4"
layers = 2
budget = 20000
time_limit = 300.0  # seconds; None: the full search
compare = ""  # a setup of yours to compare with; empty: none
draws = 256  # draws of the model's uncertain constants and choices (at least 2)

# %% [markdown]
# `time_limit` answers within that many seconds, as `aoizora-lab plan` does (the plan of
# notebook 3, read back at once); `None` runs the full search. A system priced on only some of
# its setups within the limit is named in the headline's `partial` column.

# %%
from IPython.display import Markdown, display

from aoizora_lab import viz
from aoizora_lab.comm_model import estimate
from aoizora_lab.notebook import notebook_inputs, record
from aoizora_lab.placement import plain_order
from aoizora_lab.planner import plan

inputs = notebook_inputs(case=case, layers=layers, budget=budget,
                         time_limit=time_limit)
workload, slice_ = inputs.workload, inputs.topology
result = plan(workload, slice_, inputs.options.replace(compare=compare or None))
best = result.best
display(Markdown(
    f"**Best plan:** `{best.candidate.name}` with `{best.flags.label}` compiler flags, placed "
    f"as *{best.placement.description}* — predicted {best.predicted.total_s * 1e3:.1f} ms per "
    f"step (compute {best.predicted.compute_s * 1e3:.1f} ms, communication "
    f"{best.predicted.comm_s * 1e3:.1f} ms, {best.predicted.exposed_s * 1e3:.1f} ms of it "
    "exposed)."))

# %% [markdown]
# ## The ranking
#
# The best placements of every compiled candidate and flag set, fastest first. `source` says
# where a placement came from: a library's device order (plain order, `jax.make_mesh`,
# `create_device_mesh`), a structured layout, or local search.

# %%
ranking = result.ranking.to_frame()
columns = ["candidate", "flags", "description", "source", "compute_s", "comm_s", "total_s"]
display(ranking[columns].head(15).round(4))
viz.show(viz.ranking_scatter(ranking, y="total_s"))

# %% [markdown]
# ## Against the systems people run today
#
# Each existing system is built the way its own code and docs build it, compiled with the
# compiler flags its recipe sets, and priced by the *same* pipeline and model as the plan.
# `maxdiffusion-default` is MaxDiffusion as its Wan config ships (every chip on the `context`
# axis, flash attention with K/V gathered, `create_device_mesh` order); `maxdiffusion-best` is
# the best of MaxDiffusion's attention kernels × its recipes (context over every chip, or
# `ici_data_parallelism=2` × context; each also with `ici_tensor_parallelism=2`, Ulysses also
# in two head chunks, `ulysses_attention_chunks=2`), each compiled with the README's flags for
# its kernel (a flag that breaks a compile is dropped alone, and the row says which);
# `xdit-usp` is the official Wan 2.1 code on xDiT's USP,
# the best `--ulysses_size` × `--ring_size` split, tokens padded to a multiple of it, ranks in
# launch order. `recipe` is the setup in the system's own words, `speedup_of_plan` that row's
# latency / the plan's; a system that could not be built or compiled says why in `reason`.
# The search places the systems' programs too; where a setup's program (placed by the search
# or in its own order) is faster than everything the search found itself, it becomes the plan
# recommended, and the headline below says the search lost.

# %%
display(result.baselines.to_frame().round(4))

# %% [markdown]
# Every setup each system was tried with: what its code refuses (with the reason), and every
# other one compiled with its recipe's flags and priced (`estimate_s` is the IR estimate under
# the setup's own flags, shown for comparison: it has no schedule); `chosen` marks the one in
# the table above.

# %%
display(result.baselines.trials().round(4))

# %% [markdown]
# ## Where the gain comes from
#
# Three measures, each a ratio of predicted steps (`seconds` is the step it compares):
#
# - **vs existing systems** — the headline: each system's best step / the search's own best
#   (a survivor's program, best placed); the `best:` row is the fastest existing system. Below
#   1, a system won: the `recommended plan` row is then its setup.
# - **placement gain** — the plan's own compiled program in the device order plain order,
#   `jax.make_mesh` or `create_device_mesh` gives it / in its best placement: what the placement
#   search alone buys (NaN where that library refuses the mesh).
# - **strategy gain** — the best existing system / the best compiled candidate (with its
#   flags) in plain device order: what the sharding and flag choice alone buys, without placement.
#
# Placement gain and strategy gain are *ablations* of the plan (one of its ideas taken away),
# never baselines: nobody runs them.

# %%
display(result.headline.to_frame().round(4))

# %% [markdown]
# ## How sure is the answer?
#
# Every number above is a prediction from constants nobody measured for these programs (the
# attention kernel's efficiency, the links' achieved bandwidth and per-hop latency, how much of
# a collective the compute beside it really hides...) and from modelling choices public
# evidence does not settle (the compiler's own op estimates or the roofline; how a collective
# follows its group's device order). `aoizora_lab.uncertainty` holds a range for each, with
# its source, and prices every compiled program again under `draws` draws of all of them
# together, the same draws for every program, so a plan and a system are compared draw by
# draw. Placements are the ones the search found with the default model.

# %%
from aoizora_lab.uncertainty import Ensemble, assess, sources

display(sources()[["name", "range", "drawn", "generations"]])
sure = assess(result, Ensemble(count=draws))
display(sure.odds_frame().round(3))
viz.show(viz.step_bands(sure))
display(sure.to_frame().drop(columns=["median_winner"]).round(4))

# %% [markdown]
# `p_plan_faster` is the share of draws in which the search's own best is faster than the
# system, `speedup_low` / `speedup_high` the 80 % interval of the system's step over the
# plan's; `known` is False where a time limit left setups of that system that could win
# uncompiled (the odds are then against the setups compiled only, and the answer not
# known). An interval that straddles 1 means the model's own uncertainty could reverse the
# answer. The **robust** choice (lowest 90th-percentile step) and the **least-regret** one
# (smallest worst-case loss against the best option of each draw) are marked beside the
# lowest median; where they differ, the cheaper-looking option is the riskier one.
#
# What drives the spread, for the two comparisons a reader acts on: the plan against the best
# system (does the headline hold?) and against the robust choice, or where the plan is the robust
# choice the best other sharding among its own options (does the ranking hold?). For each drawn
# constant, the rank correlation between its value and the rival's step over the plan's (for a
# choice, the median ratio under each alternative). A constant near the top is the one a
# measurement on a real slice would settle first (`measure.calibrate` fits the ICI constants,
# `measure.calibrate_compute` the compute efficiencies; a calibrated constant is taken as known
# and not drawn). Where the ratio moves by less than 0.1 % over the draws, the two run nearly the
# same program and no constant changes the answer: the correlations would rank noise, so they are
# not shown.

# %%
import numpy as np

plan_option = sure.option(sure.plan)
sharding = sure.plan.split(" (")[0]  # the plan's candidate; its other flags and orders
rivals = {"the best system": min((o for o in sure if not o.ours), key=lambda o: o.point_s,
                                 default=None),
          "the robust choice" if sure.robust != sure.plan else
          "the runner-up sharding of the plan's own options": (
              sure.option(sure.robust) if sure.robust != sure.plan else min(
                  (o for o in sure if o.ours and o.label.split(" (")[0] != sharding),
                  key=lambda o: o.median_s, default=None))}
for who, rival in rivals.items():
    if rival is None:
        continue
    ratio = rival.steps / plan_option.steps
    low, high = np.quantile(ratio, [0.1, 0.9])
    moves = high / low - 1 >= 1e-3
    display(Markdown(f"**Against {who}**, {rival.label}: its step over the plan's is "
                     f"{np.median(ratio):.4f}x at the median (80 %: {low:.4f} - {high:.4f}x)"
                     + ("." if moves else
                        ": it moves by less than 0.1 %, nothing here changes this answer.")))
    if moves:
        display(sure.drivers(slice_, against=rival.label).round(3))
display(Markdown("\n".join(f"- {line}" for line in sure.summary(slice_))))

# %% [markdown]
# ### The order choice, collective by collective
#
# The placement was searched under one order model (the plan's: `compiler` unless
# `--order-model` said otherwise), and a placement's gain can rest on it. Under `compiler`
# an all-gather maps any device order onto the emitter's own ring, so a scrambled group order
# costs nothing; under `logical` it runs along the group's order, and a group whose order
# jumps across the slice pays every long hop. Below: the winning program on its placement and
# on plain device order, priced under each alternative of the order choice, and the
# collectives whose time moves most between them. A placement that gains little over plain
# order under one model and loses much under the other is the risk the robust choice above
# prices: the plan's program in each library order is one of its options (role `order`).

# %%
import dataclasses

import pandas as pd

from aoizora_lab.cost import breakdown, predict
from aoizora_lab.uncertainty import CHOICES

orders = list(next(c for c in CHOICES if c.name == "order").values)
models = {o: dataclasses.replace(inputs.options.model, order=o) for o in orders}
where = {"winning placement": best.placement, "plain order": plain_order(slice_)}
display(pd.DataFrame(
    [{"placement": name, "order_model": o,
      "step_s": predict(best.program, slice_, placement, options=m).total_s}
     for name, placement in where.items() for o, m in models.items()]
).pivot(index="placement", columns="order_model", values="step_s").round(4))
frames = {o: breakdown(best.program, slice_, best.placement, options=m).set_index("collective")
          for o, m in models.items()}
moved = pd.DataFrame({"kind": frames[orders[0]]["kind"],
                      **{o: frame["seconds"] for o, frame in frames.items()}})
moved["moved_s"] = moved[orders].max(axis=1) - moved[orders].min(axis=1)
moved = moved[moved["moved_s"] > 0].sort_values("moved_s", ascending=False)
display(moved.head(5).round(5) if len(moved) else Markdown(
    "The order choice moves no collective of the winning program on its placement."))

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
# ### Same program, plain device order
#
# The placement gain as a picture: the winning program in plain device order (left) and in the
# winning placement (right), on one colour scale, then their difference.

# %%
plain_bytes = estimate(program, slice_, plain_order(slice_)).link_bytes
viz.show(viz.heatmap_comparison(slice_, plain_bytes, link_bytes, left_title="plain order",
                                right_title="winning placement"))

# %% [markdown]
# ### The order inside a group
#
# Placement is also the *order* of the devices inside each collective's group. libtpu runs an
# all-reduce (and a reduce-scatter) of up to 8 devices as one bidirectional ring from logical
# device *i* to *i + 1*, each step routed over the links between their chips; larger groups
# and all-gathers it lays out itself (the compiler's own labels and the published order-only
# gains are in `reports/benchmarks.md`, "Device order"). So the same chips cost more as a
# chain whose hops cross the slice than as a ring of one-link hops. Below: the winner's
# heaviest collective that runs along its order, in plain device order and in the winning
# placement, then the effect alone: an all-reduce over the same chips of a block of this
# slice as a chain and as a ring. One group's hops are drawn over the loads: green takes one
# link, red more; `#i` is a device's position in the group, and each panel names its time
# and busiest link.

# %%
ordered = viz.ordered_collective(program, slice_)
if ordered is not None:
    viz.show(viz.order_comparison(slice_, ordered, plain_order(slice_), best.placement,
                                  right_title="winning placement"))
else:
    display(Markdown(f"The winner runs no collective along its order here (`{best.candidate.name}`"
                     "'s gathers and large groups are laid out by the compiler)."))
if (pair := viz.chain_and_ring(slice_)) is not None:
    display(Markdown("The same chips as a chain and as a ring:"))
    viz.show(viz.order_comparison(slice_, *pair))

# %% [markdown]
# ### Against the best existing system's layout
#
# The fastest existing system (the `best:` row above) as the planner built and priced it, on
# the left, the plan on the right: different programs, so the picture shows both where the
# bytes go and how many there are. (Where that system's setup became the plan, the two agree.)

# %%
system = result.headline.best_system
if system:
    theirs = result.baselines[system].plan
    their_bytes = estimate(theirs.program, slice_, theirs.placement).link_bytes
    viz.show(viz.heatmap_comparison(slice_, their_bytes, link_bytes,
                                    left_title=f"{system}: {theirs.candidate.name}",
                                    right_title=f"plan: {best.candidate.name}"))
else:
    display(Markdown("No existing system could be built and compiled here:"))
    display(result.baselines.to_frame()[["baseline", "status", "reason"]])

# %% [markdown]
# ## Your setup
#
# With `compare` set to a setup you run — MaxDiffusion config keys
# (`ici_data_parallelism=2 attention=ulysses`), Wan / xDiT flags (`--ulysses_size 2
# --ring_size 4`) or a mesh (`candidate=cfg2-uly4 order=0,1,2,...`) — it is priced like the
# existing systems (row `yours` above), and the steps from it to the plan are shown: your setup
# as you run it, your sharding and flags placed by the search, then the plan; `speedup` is your
# step / that row's. Below, your setup's link bytes beside the plan's.

# %%
if not compare:
    display(Markdown("No setup of yours given: set `compare`, e.g. papermill "
                     "`-p compare \"ici_data_parallelism=2 attention=ulysses\"`, or "
                     "`compare:` in a report's parameters in `data/reports.yaml`."))
elif result.baselines["yours"].plan is None:
    yours = result.baselines["yours"]
    display(Markdown(f"Your setup is **{yours.status.value}**: {yours.reason}"))
else:
    display(result.advice(budget=inputs.budget).round(4))
    mine = result.baselines["yours"].plan
    my_bytes = estimate(mine.program, slice_, mine.placement).link_bytes
    viz.show(viz.heatmap_comparison(slice_, my_bytes, link_bytes,
                                    left_title=f"yours: {mine.candidate.name}",
                                    right_title=f"plan: {best.candidate.name}"))

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
views |= viz.heaviest_collective_views(program, slice_, best.placement, top=4, prefix="winner",
                                      options=inputs.options.model)
viz.show(viz.heatmap_explorer_figure(slice_, views, collectives_by_view=users_by_view,
                                     title="Link bytes: pick a view"))

# %%
explorer = viz.heatmap_explorer_widget(
    slice_, viz.ranking_collective_views(result.ranking[:6], result.programs, slice_))
explorer  # a live widget in JupyterLab

# %% [markdown]
# The headline values: the speedup over the best existing system, and the plan's two
# ablations, its placement gain over plain device order and the strategy gain (None where no
# existing system was priced, and the speedup None where a time limit left a system's setup
# that could win uncompiled: not known, `headline.unchecked` names them), with the 80 %
# intervals of the plan's step and of its speedup from the draws above.

# %%
headline = result.headline
record("best_candidate", best.candidate.name)
record("best_placement", best.placement.description)
record("best_flags", best.flags.label)
record("predicted_step_s", best.predicted.total_s)
record("speedup_over_best_existing_system",
       headline.vs_existing if headline.best_system and not headline.unchecked else None)
record("systems_not_known", list(headline.unchecked))
record("placement_gain_vs_plain", headline.placement_gain["plain"])
record("strategy_gain", headline.strategy_gain if headline.best_system else None)
record("placements_ranked", len(result.ranking))
best_odds = next((o for o in sure.odds if o.system == headline.best_system), None)
record("p_plan_faster_than_best_system",  # None where the headline is not known
       None if headline.unchecked or best_odds is None else best_odds.probability)
record("robust_choice", sure.robust)
record("predicted_step_p10_s", plan_option.low_s)  # the plan's step, 80 % interval
record("predicted_step_p90_s", plan_option.high_s)
record("speedup_p10", None if headline.unchecked or best_odds is None else best_odds.speedup[0])
record("speedup_p90", None if headline.unchecked or best_odds is None else best_odds.speedup[2])
