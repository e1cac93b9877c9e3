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
# # 3 · Compile the survivors with the real TPU compiler
#
# The estimates of notebook 2 guess what the partitioner will do. Here every surviving
# candidate is compiled by libtpu for the slice — *deviceless*: no TPU is needed, the compiler
# only needs the slice's topology. Each compile runs in its own process (some compiles abort
# the whole process) and is cached on disk, so re-running is cheap.
#
# From the compiled HLO the workbench reads every collective (kind, replica groups, bytes,
# how often it runs, whether the schedule runs it asynchronously) and every compute op (FLOPs
# and HBM bytes), and the compiler's own memory figures.

# %% tags=["parameters"]
case = "wan2.1-t2v-1.3b@832x480x81/v5e:2x4"
layers = 2

# %% [markdown]
# `layers` compiles a shallower model of the same width and scales the layer loop to the full
# depth (its collectives and its compute run `depth / layers` times as often): the result is
# the full model's program, in a fraction of the compile time. `None` compiles the full depth.

# %%
from IPython.display import display

from aoizora_lab import viz
from aoizora_lab.candidates import explain_candidates
from aoizora_lab.compile import compile_candidates
from aoizora_lab.notebook import notebook_inputs, record
from aoizora_lab.prune import prune

inputs = notebook_inputs(case=case, layers=layers)
workload, slice_ = inputs.workload, inputs.topology
pruning = prune(explain_candidates(workload, slice_).valid, workload, slice_)
compiled = compile_candidates(pruning.kept, workload, slice_, num_layers=inputs.layers)
summary = compiled.to_frame()
display(summary.round(3))

# %% [markdown]
# A status other than `ok` (out of memory, compiler crash, timeout) is a row, not a failure
# of the sweep: the message says what the compiler reported.
#
# ## What each candidate really communicates
#
# Bytes per device per step by collective kind, split into what the compiler scheduled
# asynchronously (it may hide behind compute) and synchronously (it adds to the step).

# %%
traffic = compiled.traffic()
display(traffic.pivot(index="candidate", columns="collective", values="gb").fillna(0).round(2))
viz.show(viz.traffic_chart(compiled))

# %% [markdown]
# Ulysses candidates pay in synchronous all-to-alls; context candidates gather every key and
# value (large, asynchronous all-gathers); FSDP adds the weight gathers. Which of these the
# placement can make cheaper is the subject of notebook 4.

# %%
record("compiled", len(compiled))
record("compiled_ok", len(compiled.ok))
record("compile_seconds", round(float(summary["compile_s"].sum()), 1))
record("peak_hbm_gib_max", round(float(summary["peak_gib"].max()), 3) if compiled.ok else None)
