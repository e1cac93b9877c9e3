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
model = "wan2.1-t2v-1.3b"
size = [832, 480]
frames = 81
topology = "v5e:2x4"
layers = 2

# %% [markdown]
# `layers` compiles a shallower model of the same width and scales the layer loop to the full
# depth (its collectives and its compute run `depth / layers` times as often): the result is
# the full model's program, in a fraction of the compile time. `None` compiles the full depth.

# %%
import pandas as pd
from IPython.display import display

from aoizora_lab import viz
from aoizora_lab.candidates import candidates_from_table, default_attention, explain_candidates
from aoizora_lab.compile import compile_candidates
from aoizora_lab.notebook import notebook_inputs, record
from aoizora_lab.planner import compiled_table
from aoizora_lab.prune import prune, survivors

inputs = notebook_inputs(model=model, size=size, frames=frames, topology=topology,
                         layers=layers)
workload, slice_ = inputs.workload, inputs.topology
candidates = candidates_from_table(explain_candidates(workload, slice_),
                                   default_attention(slice_))
pruning = prune(candidates, workload, slice_)
compiled = compile_candidates(survivors(candidates, pruning), workload, slice_,
                              num_layers=inputs.layers)
display(compiled_table(compiled).round(3))

# %% [markdown]
# A status other than `ok` (out of memory, compiler crash, timeout) is a row, not a failure
# of the sweep: the message says what the compiler reported.
#
# ## What each candidate really communicates
#
# Bytes per device per step by collective kind, split into what the compiler scheduled
# asynchronously (it may hide behind compute) and synchronously (it adds to the step).

# %%
rows = []
for result in compiled:
    if result.status != "ok":
        continue
    frame = result.program.to_frame()
    frame["gb"] = frame["bytes"] * frame["count"] / 1e9
    frame["schedule"] = frame["asynchronous"].map({True: "async", False: "sync"})
    for (kind, schedule), gb in frame.groupby(["kind", "schedule"])["gb"].sum().items():
        rows.append({"candidate": result.candidate.name, "collective": f"{kind} ({schedule})",
                     "gb": gb})
traffic = pd.DataFrame(rows)
display(traffic.pivot_table(index="candidate", columns="collective", values="gb",
                            fill_value=0).round(2))

# %%
import plotly.express as px

figure = px.bar(traffic, x="gb", y="candidate", color="collective", orientation="h",
                title="Collective bytes per device per step (compiled HLO)")
figure.update_layout(xaxis_title="GB per device per step", yaxis_title=None)
viz.show(figure)

# %% [markdown]
# Ulysses candidates pay in synchronous all-to-alls; context candidates gather every key and
# value (large, asynchronous all-gathers); FSDP adds the weight gathers. Which of these the
# placement can make cheaper is the subject of notebook 4.

# %%
ok = [r for r in compiled if r.status == "ok"]
record("compiled", len(compiled))
record("compiled_ok", len(ok))
record("compile_seconds", round(sum(r.compile_seconds for r in compiled), 1))
record("peak_hbm_gib_max", round(max((r.memory.get("peak", 0) for r in ok), default=0)
                                 / 2**30, 3))
