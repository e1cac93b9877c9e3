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
# # 5 · Realise the plan, export it, compile it — and time it on a TPU VM
#
# A plan is only useful if it runs on the ordinary JAX path. The winner becomes
#
# - a `jax.sharding.Mesh` whose device array is the placement's device order,
# - a `NamedSharding` for every weight and input,
# - a portable JSON plan file (the placement stored as physical chip coordinates, so it moves
#   between VMs of the same slice shape),
#
# and compiling it must give exactly the collectives the ranking scored.

# %% tags=["parameters"]
case = "wan2.1-t2v-1.3b@832x480x81/v5e:2x4"
layers = 2
budget = 20000
time_limit = 300.0  # seconds; None: the full search
plan_file = ""

# %% [markdown]
# `plan_file` is where to write the plan JSON (empty: a temporary file, shown below).

# %%
import json
import tempfile
from pathlib import Path

import jax
from IPython.display import Markdown, display

from aoizora_lab import measure
from aoizora_lab.notebook import notebook_inputs, record
from aoizora_lab.planner import plan
from aoizora_lab.realize import Plan
from aoizora_lab.topology import Topology

inputs = notebook_inputs(case=case, layers=layers, budget=budget,
                         time_limit=time_limit)
workload, slice_ = inputs.workload, inputs.topology
result = plan(workload, slice_, inputs.options)
best = result.best
mesh = best.mesh()
display(Markdown(f"**{best.candidate.name}** on {slice_.name}: mesh axes "
                 f"`{dict(mesh.shape)}`, placement *{best.placement.description}*."))
print("Device ids in mesh order:")
print(jax.numpy.asarray([[d.id for d in row] for row in mesh.devices.reshape(
    mesh.devices.shape[0], -1)]))

# %% [markdown]
# ## The plan file

# %%
path = Path(plan_file) if plan_file else Path(tempfile.mkdtemp()) / "plan.json"
best.to_json(path)
payload = json.loads(path.read_text())
print(json.dumps({k: v for k, v in payload.items() if k != "coords"}, indent=1))
print("coords of logical devices 0..3:", payload["coords"][:4])
loaded = Plan.from_json(path, slice_)
assert loaded.placement.order == best.placement.order

# %% [markdown]
# ## Compile the realised plan: is it what was scored?
#
# `Plan.verify` compiles the step under the plan's own mesh and shardings (its placement's
# device order, not the row-major chip order the compile sweep compiled in; deviceless when
# this machine has no TPU; `layers` deep, as the planner compiled), reads the collectives from
# the compiled HLO, scales the layer loop to the full depth, as notebook 3 did for every
# candidate, and compares them with `best.program`, the program the ranking scored: every
# collective by kind, logical replica groups, bytes and runs per step, the compiler's algorithm
# and schedule of each, and the predicted step of both on the plan's placement. Where they
# differ, a table lists every difference.

# %%
check = best.verify(num_layers=inputs.layers)
display(Markdown(check.summary() if check.equal else f"**{check.summary()}**"))
if not check.equal:
    display(check.to_frame())

# %% [markdown]
# ## Timing
#
# Predictions rank plans; only TPU devices can time them. On a TPU VM (`jax.devices()`
# returns TPU devices) this cell moves the plan onto the live chips (matching chips by
# coordinates), times the step with warm-up, then times the top placements, every baseline
# (existing system) and every ablation round-robin and compares the measured order with the
# predicted one: a high rank correlation means the model can be trusted to choose; a low one
# says to calibrate it (`measure.microbenchmarks` + `measure.calibrate`, see the README).

# %%
platform = jax.devices()[0].platform
if platform == "tpu":
    live = Topology.from_devices(jax.devices())
    timing = measure.time_plan(measure.retarget(best, live))
    display(Markdown(f"Measured **{timing.median_s * 1e3:.1f} ms** per step (spread "
                     f"{timing.spread:.1%}); predicted {best.predicted.total_s * 1e3:.1f} ms."))
    compared = measure.compare_plans(measure.plans_to_compare(result, top=3, topology=live))
    display(compared[["plan", "predicted_s", "measured_s", "spread"]])
    display(Markdown(f"Rank correlation of predicted and measured: Spearman "
                     f"{compared.attrs['spearman']:.2f}, Kendall {compared.attrs['kendall']:.2f}."))
    record("measured_step_s", timing.median_s)
    record("spearman", compared.attrs["spearman"])
else:
    display(Markdown(f"**Timing needs TPU devices.** This kernel sees `{platform}` devices "
                     "only, so the numbers above are predictions from the compiled program "
                     "and the ICI model, not measurements."))

# %%
record("plan_candidate", best.candidate.name)
record("realised_collectives_match", check.equal)
record("platform", platform)
