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
# # 3 · Compile the survivors with the real TPU compiler
#
# The estimates of notebook 2 guess what the partitioner will do. Here the plan's compiles
# run in libtpu for the slice — *deviceless*: no TPU is needed, the compiler only needs the
# slice's topology. Each compile runs in its own process (some compiles abort the whole
# process) and is cached on disk, so re-running is cheap.
#
# A plan compiles three kinds of job: every survivor of pruning with each searched flag set,
# the existing systems' setups (each with its recipe's flags) and yours. They are built up
# front, each once, and an admission policy runs them: the full search runs every one but
# the further flag sets that cannot win; a time-limited plan (`time_limit`, the command
# line's 5 minutes by default) runs the likeliest winners and every system's setups that could
# beat them first, and starts no compile that would end after the limit.
#
# From the compiled HLO the workbench reads every collective (kind, replica groups, bytes,
# how often it runs, whether the schedule runs it asynchronously) and every compute op (FLOPs
# and HBM bytes), and the compiler's own memory figures.

# %% tags=["parameters"]
case = "wan2.1-t2v-1.3b@832x480x81/v5e:2x4"
layers = 2
budget = 20000
time_limit = 300.0  # seconds; None: the full search

# %% [markdown]
# `layers` compiles a shallower model of the same width and scales the layer loop to the full
# depth (its collectives and its compute run `depth / layers` times as often): the result is
# the full model's program, in a fraction of the compile time. `None` compiles the full depth.
# The plan places each program as it comes back (`budget` placements each), so notebook 4
# reads this plan back at once.

# %%
from IPython.display import display

from aoizora_lab import viz
from aoizora_lab.compile import Compiles
from aoizora_lab.notebook import notebook_inputs, record
from aoizora_lab.planner import plan

inputs = notebook_inputs(case=case, layers=layers, budget=budget,
                         time_limit=time_limit)
workload, slice_ = inputs.workload, inputs.topology
result = plan(workload, slice_, inputs.options)
compiled = result.compiled
summary = compiled.to_frame()
display(summary.round(3))

# %% [markdown]
# One row per survivor and flag set, first flag set first, best IR estimate first. A status
# other than `ok` (out of memory, compiler crash, timeout) is a row, not a failure of the
# sweep: the message says what the compiler reported. A compile the plan did not run says
# why (`time limit`, `compile budget`). The further flag sets the flag rule spared (their
# compute alone could not beat a step already priced) are listed apart:

# %%
display(Compiles(result.skipped).to_frame()[["candidate", "flags", "message"]])

# %% [markdown]
# The existing systems' setups that are no survivor's compile, with their recipes' flags
# (notebook 4 prices them):

# %%
display(result.baseline_compiles.to_frame().round(3))

# %% [markdown]
# ## What each candidate really communicates
#
# Bytes per device per step by collective kind, split into what the compiler scheduled
# asynchronously (it may hide behind compute) and synchronously (it adds to the step).

# %%
traffic = compiled.traffic()
display(traffic.pivot(index="program", columns="collective", values="gb").fillna(0).round(2))
viz.show(viz.traffic_chart(compiled))

# %% [markdown]
# Ulysses candidates pay in all-to-alls (synchronous unless the flags, like MaxDiffusion's
# Ulysses set, make them asynchronous); context candidates gather every key and value (large,
# asynchronous all-gathers); FSDP adds the weight gathers. Which of these the
# placement can make cheaper is the subject of notebook 4.

# %%
every = Compiles([*compiled, *result.baseline_compiles])
frame = every.to_frame()
record("search", inputs.search)
record("compiled", len(every.ran))
record("compiled_ok", len(every.ok))
record("not_run", len(every.not_run))
record("compile_seconds", round(float(frame["compile_s"].sum()), 1))
record("peak_hbm_gib_max", round(float(frame["peak_gib"].max()), 3) if every.ok else None)
