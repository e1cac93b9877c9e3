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
# # 6 · The whole video: where a generation's time goes
#
# Notebooks 1–5 plan one denoising step. A person waits for a whole video, which runs three
# programs one after the other on the same slice:
#
# 1. the **text encoder** (UMT5-XXL, 24 layers 4096 wide): once, on the prompt and — with
#    classifier-free guidance — the negative prompt;
# 2. the **denoising steps**: the DiT step of notebooks 1–5, `steps` times (the model's
#    official `sample_steps`: 50 for Wan 2.1 T2V, 40 for Wan 2.2 A14B, whose high-noise expert
#    runs the steps above the boundary timestep and the low-noise expert the rest);
# 3. the **VAE decoder**: once, on the final latent, to pixels.
#
# An image-to-video model also runs the VAE *encoder* once, on its condition (the image, then
# zero frames; TI2V-5B's image alone), before the steps.
#
# `plan_generation` plans the programs other than the step as *parts*: each is split over the
# slice in a few ways worth trying, every split compiled deviceless with the TPU compiler and
# priced by the same model as the step. The DiT's weights stay in HBM for the whole video, so
# a part runs the fastest split whose memory fits **beside them** (`fits`). Each part has its
# own mesh; switching meshes between parts moves only the text states and the latent (a few
# MB), which is not priced, and `dit_order_s` says what the part would take on the DiT plan's
# own device order instead. So
#
#     seconds = encode (+ video encode) + steps x step + decode

# %% tags=["parameters"]
case = "wan2.1-t2v-1.3b@832x480x81/v5e:2x4"
layers = 2
budget = 20000
time_limit = 300.0  # seconds; None: the full search
steps = None  # denoising steps; None: the model's official sample_steps

# %%
from IPython.display import Markdown, display

from aoizora_lab import viz
from aoizora_lab.generation import plan_generation
from aoizora_lab.notebook import known, notebook_inputs, record
from aoizora_lab.planner import plan

inputs = notebook_inputs(case=case, layers=layers, budget=budget, time_limit=time_limit)
workload, slice_ = inputs.workload, inputs.topology
result = plan(workload, slice_, inputs.options)  # the step's plan (cached by notebooks 1-5)
video = plan_generation(result.best, steps)
frame = video.to_frame()
display(Markdown(f"**{workload.name}** on {slice_.name}, {video.steps} steps: "
                 + (f"**{video.total_s:.1f} s** of TPU time per video."
                    if known(video.total_s) is not None else
                    "not known: a part has no split that compiled (its `status` below).")))
display(frame)
viz.show(viz.generation_chart(frame))

# %% [markdown]
# The steps dominate whenever the video is long and the model large: each step runs the DiT
# twice (both CFG passes). The decoder is a single program, but a heavy one: 3D convolutions at
# full resolution on every frame. The text encoder is small next to them (512 tokens).

# %% [markdown]
# ## How the VAE decode is split
#
# The decoder's activations are video frames, so the natural split is **spatial**: the
# latent's rows × columns in tiles, one tile per device (devices left over hold copies). Every
# 3x3 convolution then needs its neighbours' edge rows and columns: XLA's SPMD partitioner
# adds that **halo exchange** as collective-permutes between neighbouring tiles, and the
# middle block's attention gathers a whole frame. The decoder's upsamplers double both sides
# at every level, so one tiling fits every level.
#
# Each split runs all frames at once or **streamed** (`chunk`: the first latent frame alone,
# then `chunk` at a time, carrying each causal convolution's last frames), as the official
# code and MaxDiffusion decode; streaming bounds the activations' memory.
#
# The baseline is **MaxDiffusion's decode**, compiled beside the splits: the latent's width
# over every device (`vae_spatial: -1`), one latent frame at a time, float32
# (`maxdiffusion_s` in the breakdown above; NaN where the latent is too narrow for every
# device, or it did not compile). It is also one of the choices, as the DiT plan adopts a
# system's setup that beats its own candidates: a split of the same family (the width, one
# frame at a time) that the splits' heuristic (the squarest tiles, two chunk sizes) leaves out.
# Where it is the fastest that fits, the decode runs it.

# %%
display(video.decode.to_frame().drop(columns=["message"]))
decode = video.chosen(video.decode)
maxdiffusion = video.maxdiffusion.get("decode")
if decode is None:
    display(Markdown("**No decode split compiled** (see the `status` column)."))
else:
    seconds, order = video.run_of(decode)
    beside = (f"{(decode.hbm_bytes + video.resident_bytes) / 2**30:.1f} GiB per device with "
              f"the DiT's weights ({video.resident_bytes / 2**30:.1f} GiB)")
    theirs = video.runs_maxdiffusions(decode, "decode")
    display(Markdown(
        f"Chosen split: **{decode.part.name}**"
        + (" (MaxDiffusion's own decode)" if theirs else "")
        + f" on {order.description}, {seconds:.2f} s, {beside}"
        + (": **does not fit**, the DiT's weights would have to leave HBM while it runs"
           if video.fits(decode) is False else "")
        + (f"; MaxDiffusion's decode: {maxdiffusion.seconds:.2f} s "
           f"({maxdiffusion.seconds / seconds:.2f}x)"
           if maxdiffusion and maxdiffusion.ok and not theirs else "") + "."))
    display(decode.program.to_frame()[["kind", "bytes", "count", "group_size", "num_groups"]]
            .groupby(["kind", "group_size"], as_index=False)
            .agg(collectives=("count", "size"), runs=("count", "sum"),
                 bytes_per_run=("bytes", "mean")))

# %% [markdown]
# The decode's halo traffic on the torus: every directed link coloured by the bytes the chosen
# split sends over it (tiles next to each other on the mesh exchange edges).

# %%
if decode is not None and decode.program.collectives:
    link_bytes, users = viz.link_bytes_by_collective(decode.program, slice_, order)
    viz.show(viz.torus_heatmap(slice_, link_bytes, collectives_by_link=users,
                               placement=order,
                               title=f"VAE decode {decode.part.name}: bytes per link"))

# %% [markdown]
# ## The text encoder
#
# Both prompts at once: the prompts apart on two groups of devices, and within a group the
# heads and the FFN's columns apart (Megatron tensor parallelism: one all-reduce after the
# attention and one after the FFN of every layer).

# %%
display(video.encode.to_frame().drop(columns=["message"]))

# %%
record("total_s", known(video.total_s))
record("steps", video.steps)
record("expert_steps", list(video.expert_steps))
record("encode_s", known(video.encode_s))
record("decode_s", known(video.decode_s))
record("decode_split", decode.part.name if decode is not None else "")
record("decode_splits_tried", len(video.decode))
record("decode_fits_beside_dit", video.fits(decode) if decode is not None else None)
record("decode_order", order.description if decode is not None else "")
record("maxdiffusion_decode_s", maxdiffusion.seconds if maxdiffusion and maxdiffusion.ok else None)
