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
model = "wan2.1-t2v-1.3b"
size = [832, 480]
frames = 81
topology = "v5e:2x4"

# %%
from IPython.display import Markdown, display

from aoizora_lab import viz
from aoizora_lab.candidates import explain_candidates
from aoizora_lab.notebook import notebook_inputs, record

inputs = notebook_inputs(model=model, size=size, frames=frames, topology=topology)
workload, slice_ = inputs.workload, inputs.topology
print(slice_.describe())
print(f"\n{workload.name}: {workload.tokens:,} tokens per pass")

# %% [markdown]
# ## Every combination, and whether it can run
#
# The table holds every assignment of degrees to roles whose product is the chip count. A
# combination is *valid* when the model's shapes divide evenly (heads over ulysses × tp,
# tokens over the sequence axes, weights over tp) and the roles make sense together.

# %%
table = explain_candidates(workload, slice_)
valid = table[table["valid"]]
display(Markdown(f"**{len(table)} combinations, {len(valid)} valid** on {slice_.name} "
                 f"({slice_.num_devices} devices)."))
display(valid.drop(columns=["valid", "reason"]).reset_index(drop=True))

# %% [markdown]
# ## Why the others were excluded
#
# Each refused combination carries the first rule it breaks. Reading them is the quickest way
# to learn the constraints: CFG parallelism stops at two (there are only two passes), Ulysses
# needs the heads to divide, and so on.

# %%
invalid = table[~table["valid"]]
reasons = invalid.groupby("reason")["name"].agg(["count", lambda n: ", ".join(list(n)[:6])])
reasons.columns = ["combinations", "examples"]
display(reasons.sort_values("combinations", ascending=False))

# %%
import plotly.express as px

counts = reasons.reset_index().sort_values("combinations")
figure = px.bar(counts, x="combinations", y="reason", orientation="h",
                title="Why combinations were excluded", height=120 + 40 * len(counts))
figure.update_layout(yaxis_title=None, margin={"l": 20})
viz.show(figure)

# %%
record("combinations", len(table))
record("valid_candidates", len(valid))
record("exclusion_reasons", len(reasons))
