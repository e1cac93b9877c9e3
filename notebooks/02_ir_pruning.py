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
# # 2 · IR estimates and pruning: compile only what could win
#
# Compiling one candidate with the real TPU compiler takes tens of seconds; a slice has dozens
# of valid candidates. Before compiling, the workbench *traces* each candidate (no devices, no
# compile: a fraction of a second) and reads the traced program:
#
# - FLOPs and HBM bytes of every matmul and attention kernel, per device;
# - parameter bytes per device and the largest activation: a memory floor;
# - the collectives the sharding implies (all-gathers where a sharding is removed,
#   all-to-alls where it moves between dimensions, all-reduces of partial sums).
#
# From these it derives a **lower bound** (compute at peak, every collective at the full
# bandwidth of all links of a chip: nothing can beat it) and a quick **estimate** (typical
# efficiencies, collectives priced by the topology-aware ICI model). Both apply the planner's
# *overlap rule*: collectives the TPU compiler runs asynchronously (weight and K/V
# all-gathers, ring permutes) hide behind compute up to its length; tensor parallel
# all-reduces add, and so do all-to-alls unless a flag set the planner searches makes them
# asynchronous (MaxDiffusion's Ulysses flags do): as the planner does, each candidate is
# estimated under each searched flag set and keeps the lowest (`also_async` names what the
# estimate's flags hide besides).

# %% tags=["parameters"]
case = "wan2.1-t2v-1.3b@832x480x81/v5e:2x4"

# %%
from IPython.display import Markdown, display

from aoizora_lab import viz
from aoizora_lab.candidates import explain_candidates
from aoizora_lab.hardware import device_spec
from aoizora_lab.notebook import notebook_inputs, record
from aoizora_lab.prune import Verdict, prune

inputs = notebook_inputs(case=case)
workload, slice_ = inputs.workload, inputs.topology
candidates = explain_candidates(workload, slice_).valid
pruning = prune(candidates, workload, slice_,
                flag_async=inputs.options.flag_async(slice_))
device = device_spec(slice_)  # a chip's share per device (TPU7x: two devices per chip)
display(Markdown(f"Traced **{len(candidates)}** valid candidates of {workload.name} on "
                 f"{slice_.name}; usable HBM per device {device.hbm_usable_bytes / 2**30:.2f} "
                 "GiB."))

# %% [markdown]
# ## The rules
#
# Applied in order; the first that applies decides, and names the candidate's *verdict*:
#
# 1. **cannot fit** (`over_hbm`) — parameters plus the largest activation exceed a device's
#    usable HBM;
# 2. **cannot win** (`cannot_win`) — its *lower bound* is more than 25 % above the best
#    *estimate*;
# 3. **unlikely to win** (`unlikely`) — its estimate is more than 10 % above the best
#    estimate;
# 4. **over the compile budget** (`over_budget`) — beyond the best quarter of all candidates;
# 5. the three best estimates that fit are always kept (`kept_best`), so a poor estimate
#    never empties the compile queue; the others that pass are `kept`.
#
# A candidate whose trace fails is dropped (`trace_failed`) with the error as its reason.
# Ties (estimates equal to three significant digits, as when every collective hides behind
# compute) go to the candidate with less communication: the overlap rule is optimistic.

# %%
columns = ["candidate", "verdict", "estimate_s", "lower_bound_s", "compute_estimate_s",
           "comm_estimate_s", "comm_gb_per_device", "memory_lower_bound_gib", "reason"]
display(pruning.to_frame()[columns].round(4))

# %%
viz.show(viz.pruning_scatter(pruning, title="IR estimate vs lower bound per candidate "
                                            "(kept ones compile next)"))

# %% [markdown]
# Candidates far to the right cannot win even with a perfect placement; the kept ones sit
# at the bottom. Communication that the overlap rule hides still matters when compute is
# short, so the next notebook compiles the survivors and reads what the compiler really did.

# %%
# Decisions run best estimate first; nothing is kept only when nothing fits or traces.
best = next((d for d in pruning if d.verdict.keep), None)
record("traced_candidates", sum(d.verdict is not Verdict.TRACE_FAILED for d in pruning))
record("kept_candidates", len(pruning.kept))
record("best_estimate_candidate", best.candidate.name if best else None)
record("best_estimate_s", best.estimate.estimate_seconds if best else None)
