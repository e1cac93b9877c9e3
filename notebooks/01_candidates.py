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
# # 1 · Candidates: every way to split one denoising step
#
# A Wan 2.1 denoising step runs the DiT twice (the conditional and the unconditional pass of
# classifier-free guidance) over a video of *tokens*. This notebook lists every way the
# workbench can split that work over the chips of a TPU slice, and says why the combinations
# it refuses cannot work.
#
# The **roles** a mesh axis can play:
#
# - **cfg** — the two guidance passes run on different chips (at most 2-way);
# - **ulysses** — tokens split across chips, then an all-to-all regroups them by attention
#   head, so each chip attends over *all* tokens for a subset of heads;
# - **ring** — tokens split; key/value blocks travel around a ring of chips (ppermute);
# - **context** — tokens split; every chip gathers *all* keys and values (MaxDiffusion's way);
# - **tp** — tensor parallelism: weight matrices split across chips, partial sums all-reduced;
# - **fsdp** — a flag, not an axis: weights stored sharded over the other axes and gathered
#   layer by layer just before use.
#
# A *candidate* gives each role a degree; the degrees multiply to the number of chips.

# %% tags=["parameters"]
case = "wan2.1-t2v-1.3b@832x480x81/v5e:2x4"

# %% [markdown]
# `case` names the workload and the slice in one spec, `MODEL@WIDTHxHEIGHTxFRAMES/SLICE`:
# the default is Wan 2.1 T2V 1.3B at 832 × 480 pixels and 81 frames, on a v5e slice of
# 2 × 4 chips (a report may pass another case; the lines below say which one ran).

# %%
from IPython.display import Markdown, display

from aoizora_lab import viz
from aoizora_lab.candidates import explain_candidates
from aoizora_lab.notebook import notebook_inputs, record

inputs = notebook_inputs(case=case)
workload, slice_ = inputs.workload, inputs.topology
print(slice_.describe())
print(f"\n{workload.name}: {workload.tokens:,} tokens per pass")

# %% [markdown]
# ## Every combination, and whether it can run
#
# `explain_candidates` lists every assignment of degrees to roles whose product is the chip
# count, with fsdp off and on. A combination is *valid* when the model's shapes divide evenly
# (heads over ulysses × tp, tokens over the sequence axes, weights over tp), the roles make
# sense together and the weights a chip stores fit its memory.

# %%
space = explain_candidates(workload, slice_)
table = space.to_frame()
display(Markdown(f"**{len(space)} combinations, {len(space.valid)} valid** on {slice_.name} "
                 f"({slice_.num_devices} devices)."))
display(table[table["valid"]].drop(columns=["valid", "reason"]).reset_index(drop=True))

# %% [markdown]
# ## Why the others were excluded
#
# Each refused combination carries every rule it breaks, so one combination can count under
# several reasons. Reading them is the quickest way to learn the constraints: CFG
# parallelism stops at two (there are only two passes), Ulysses needs the heads to divide,
# and so on.

# %%
exclusions = space.exclusions()
display(exclusions)
viz.show(viz.exclusion_chart(space))

# %%
record("combinations", len(space))
record("valid_candidates", len(space.valid))
record("exclusion_reasons", len(exclusions))
