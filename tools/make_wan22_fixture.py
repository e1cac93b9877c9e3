"""Generate the Wan 2.2 DiT golden fixtures (tests/data/wan22_tiny_*.{json,safetensors}) with torch,
and with ``--wan21 path/to/Wan2.1`` (commit 9737cba) Wan 2.1's I2V one (``wan21_tiny_i2v``).

One-off: needs torch, safetensors and numpy in a throwaway environment (never the project's),
e.g. ``python3 -m venv /tmp/torchenv && /tmp/torchenv/bin/pip install torch safetensors numpy``,
and a copy of the official code at the pinned commit (``git clone
https://github.com/Wan-Video/Wan2.2 && git -C Wan2.2 checkout 42bf4cf``), then
``/tmp/torchenv/bin/python tools/make_wan22_fixture.py path/to/Wan2.2``. Neither the tests nor
CI run it; they read the files it writes.

``wan/modules/model.py`` is imported unmodified (its sha256 is recorded) with three stand-ins
that change no arithmetic on CPU in float32: ``diffusers``' ``ModelMixin`` / ``ConfigMixin`` /
``register_to_config`` (config bookkeeping only), ``flash_attention`` (the CUDA flash-attn
kernel) as ``scaled_dot_product_attention`` with the same key-length mask, and the ``wan``
package ``__init__`` files (which import the pipelines) skipped. Three tiny random models:

- ``ti2v``: Wan 2.2's TI2V-5B layout (48 latent channels in and out) with per-token timesteps
  as ``textimage2video.py`` builds them: sample 0 image-conditioned (the first latent frame's
  tokens at t = 0, the rest and the padding at t), sample 1 text-only (every token at t);
- ``i2v``: I2V-A14B's layout (36 channels in: 16 noisy + 4 mask + 16 image latents; no CLIP
  image tokens, unlike Wan 2.1's i2v), one timestep per sample;
- ``t2v``: an A14B expert's layout, one timestep per sample;
- ``wan21_tiny_i2v`` (from the Wan 2.1 code): Wan 2.1 I2V-14B's layout, 36 channels in and the
  257 CLIP ViT-H/14 image tokens (``clip_fea``, 1280 wide, random here) through ``img_emb``
  into the image cross-attention, one timestep per sample.

It also writes ``wan22_schedules.json``: the official ``FlowUniPCMultistepScheduler``
(``wan/utils/fm_solvers_unipc.py``, imported unmodified with ``diffusers``' config mixins
stood in) timesteps for each official (steps, shift), which the expert schedule reads.
"""

import functools
import hashlib
import importlib.util
import inspect
import json
import sys
import types
from pathlib import Path

import torch
import torch.nn.functional as F
from safetensors.torch import save_file

WAN22_REPO = "Wan-Video/Wan2.2"
WAN22_COMMIT = "42bf4cfaa384bc21833865abc2f9e6c0e67233dc"
WAN22_PATH = "wan/modules/model.py"
WAN21_REPO = "Wan-Video/Wan2.1"
WAN21_COMMIT = "9737cba9c1c3c4d04b33fcad41c111989865d315"
# text_len 512: the official WanI2VCrossAttention splits image from text tokens at
# context length - T5_CONTEXT_TOKEN_NUMBER (512), not at 257, so only the released text_len works.
WAN21_I2V = dict(config=dict(model_type="i2v", in_dim=36, out_dim=16, text_len=512),
                 latent=(16, 3, 4, 6),
                 y_channels=20, timesteps=(900.0, 120.0), per_token=False, clip=(257, 1280),
                 factored={"img_emb.proj.1.weight": 8})
"""``factored``: weights stored as a rank-r product ``a @ b`` (``<name>.a`` [O, r], ``<name>.b``
[r, I]) instead of whole: ``img_emb``'s 1280 x 1280 linear (its width is CLIP's, fixed by the
official code) would be 6.5 MB of random numbers; a product of two random factors is as
asymmetric (a transposed weight still fails) and the test multiplies it back."""
OUT = Path(__file__).resolve().parent.parent / "tests" / "data"

TINY = dict(patch_size=(1, 2, 2), text_len=16, dim=64, ffn_dim=128, freq_dim=256, text_dim=32,
            num_heads=2, num_layers=2, window_size=(-1, -1), qk_norm=True, cross_attn_norm=True,
            eps=1e-6)
CASES = {
    "ti2v": dict(config=dict(model_type="ti2v", in_dim=48, out_dim=48), latent=(48, 3, 4, 6),
                 y_channels=0, timesteps=(700.0, 300.0), per_token=True),
    "i2v": dict(config=dict(model_type="i2v", in_dim=36, out_dim=16), latent=(16, 3, 4, 6),
                y_channels=20, timesteps=(900.0, 120.0), per_token=False),
    "t2v": dict(config=dict(model_type="t2v", in_dim=16, out_dim=16), latent=(16, 3, 4, 6),
                y_channels=0, timesteps=(999.0, 250.0), per_token=False),
}
PARAM_SEED, INPUT_SEED, PARAM_STD = 0, 10, 0.1
SEQ_PAD = 4  # the official seq_len pads each sample; the padding tokens get t as well
SCHEDULES = ((40, 12.0), (40, 5.0), (50, 5.0), (50, 3.0), (4, 12.0))  # (sample_steps, shift)
SCHEDULER_PATH = "wan/utils/fm_solvers_unipc.py"


def register_to_config(init):
    """diffusers' decorator, for what the scheduler reads: ``self.config.<init argument>``."""
    @functools.wraps(init)
    def wrapped(self, *args, **kwargs):
        bound = inspect.signature(init).bind(self, *args, **kwargs)
        bound.apply_defaults()
        self.config = types.SimpleNamespace(**dict(list(bound.arguments.items())[1:]))
        init(self, *args, **kwargs)
    return wrapped


def official_timesteps(root: Path) -> dict:
    """The official scheduler's timesteps, built as the pipelines build it."""
    cu = sys.modules["diffusers.configuration_utils"]
    su = types.ModuleType("diffusers.schedulers.scheduling_utils")
    su.KarrasDiffusionSchedulers, su.SchedulerOutput = [], object
    su.SchedulerMixin = type("SchedulerMixin", (), {})
    utils = types.ModuleType("diffusers.utils")
    utils.deprecate, utils.is_scipy_available = (lambda *a, **k: None), (lambda: False)
    cu.register_to_config = register_to_config
    cu.ConfigMixin = type("ConfigMixin", (), {"register_to_config": lambda self, **k: None})
    for name, module in (("diffusers.schedulers", types.ModuleType("diffusers.schedulers")),
                         ("diffusers.schedulers.scheduling_utils", su),
                         ("diffusers.utils", utils)):
        sys.modules[name] = module
    spec = importlib.util.spec_from_file_location("fm_solvers_unipc", root / SCHEDULER_PATH)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    out = []
    for steps, shift in SCHEDULES:
        # text2video.py: FlowUniPCMultistepScheduler(num_train_timesteps=1000, shift=1,
        # use_dynamic_shifting=False); set_timesteps(sampling_steps, shift=shift)
        scheduler = module.FlowUniPCMultistepScheduler(num_train_timesteps=1000, shift=1,
                                                       use_dynamic_shifting=False)
        scheduler.set_timesteps(steps, device="cpu", shift=shift)
        out.append({"steps": steps, "shift": shift,
                    "timesteps": [int(t) for t in scheduler.timesteps]})
    return {"description": "Official FlowUniPCMultistepScheduler timesteps (int64), as "
                           "text2video.py / image2video.py / textimage2video.py set them.",
            "wan22_repo": WAN22_REPO, "wan22_commit": WAN22_COMMIT, "path": SCHEDULER_PATH,
            "source_sha256": hashlib.sha256((root / SCHEDULER_PATH).read_bytes()).hexdigest(),
            "generator": "tools/make_wan22_fixture.py", "schedules": out}


def load_official(root: Path) -> types.ModuleType:
    """``wan/modules/model.py`` from ``root``, unmodified, with the stand-ins above."""
    diffusers = types.ModuleType("diffusers")
    cu = types.ModuleType("diffusers.configuration_utils")
    mu = types.ModuleType("diffusers.models.modeling_utils")
    cu.ConfigMixin = type("ConfigMixin", (), {})
    cu.register_to_config = lambda fn: fn
    mu.ModelMixin = type("ModelMixin", (torch.nn.Module,), {})
    for name, module in (("diffusers", diffusers), ("diffusers.configuration_utils", cu),
                         ("diffusers.models", types.ModuleType("diffusers.models")),
                         ("diffusers.models.modeling_utils", mu)):
        sys.modules[name] = module

    def flash_attention(q, k, v, q_lens=None, k_lens=None, **_):
        # [B, L, N, D]; keys j >= k_lens[b] masked, every query row kept (as the CUDA kernel).
        lk = k.shape[1]
        mask = None
        if k_lens is not None:
            mask = (torch.arange(lk)[None, :] < k_lens[:, None])[:, None, None, :]
        out = F.scaled_dot_product_attention(q.transpose(1, 2), k.to(v.dtype).transpose(1, 2),
                                             v.transpose(1, 2), attn_mask=mask)
        return out.transpose(1, 2).to(q.dtype)

    for name in ("wan", "wan.modules"):
        package = types.ModuleType(name)
        package.__path__ = [str(root / name.replace(".", "/"))]
        sys.modules[name] = package
    attention = types.ModuleType("wan.modules.attention")
    attention.flash_attention = flash_attention
    sys.modules["wan.modules.attention"] = attention
    spec = importlib.util.spec_from_file_location("wan.modules.model", root / WAN22_PATH)
    module = importlib.util.module_from_spec(spec)
    sys.modules["wan.modules.model"] = module
    spec.loader.exec_module(module)
    return module


def make(official: types.ModuleType, name: str, case: dict, source_sha: str,
         repo: str = WAN22_REPO, commit: str = WAN22_COMMIT, prefix: str = "wan22") -> None:
    config = {**TINY, **case["config"]}
    torch.manual_seed(PARAM_SEED)
    model = official.WanModel(**config).eval()
    for _, p in model.named_parameters():
        p.data.normal_(0, PARAM_STD)
    factors = {}
    for key, rank in case.get("factored", {}).items():
        weight = model.get_parameter(key)
        a = torch.randn(weight.shape[0], rank) * PARAM_STD
        b = torch.randn(rank, weight.shape[1]) / rank ** 0.5
        weight.data.copy_(a @ b)  # float32 on CPU: the test's numpy product agrees to ~1e-7
        factors |= {f"{key}.a": a, f"{key}.b": b}
    torch.manual_seed(INPUT_SEED)
    xs = [torch.randn(case["latent"]) for _ in range(2)]
    contexts = [torch.randn(config["text_len"] - 3 * i, config["text_dim"]) for i in range(2)]
    ys = [torch.randn(case["y_channels"], *case["latent"][1:]) for _ in range(2)]
    # CLIP tokens as rank-16 products too (stored as factors, as the factored weights).
    clip_factors = ([(torch.randn(1, case["clip"][0], 16), torch.randn(16, case["clip"][1]) / 4)
                     for _ in range(2)] if "clip" in case else None)
    clips = [a @ b for a, b in clip_factors] if clip_factors else None
    f, h, w = case["latent"][1:]
    pf, ph, pw = config["patch_size"]
    tokens = (f // pf) * (h // ph) * (w // pw)
    seq_len = tokens + SEQ_PAD
    t = torch.tensor(case["timesteps"], dtype=torch.float32)
    if case["per_token"]:
        # textimage2video.py: masks_like(zero=True) zeroes the first latent frame (sample 0),
        # zero=False keeps it (sample 1); tokens take mask2[0][:, ::2, ::2] * t, padding t.
        per_token = []
        for i, ti in enumerate(t):
            mask = torch.ones(f, h, w)
            if i == 0:
                mask[0] = 0
            row = (mask[:, ::ph, ::pw] * ti).flatten()
            per_token.append(torch.cat([row, row.new_ones(seq_len - row.numel()) * ti]))
        t_in = torch.stack(per_token)
    else:
        t_in = t
    with torch.no_grad():  # one video a call, as the official pipelines run (t [1] or [1, L])
        out = [model([xs[i]], t=t_in[i:i + 1], context=[contexts[i]], seq_len=seq_len,
                     y=[ys[i]] if case["y_channels"] else None,
                     **({"clip_fea": clips[i]} if clips else {}))[0] for i in range(2)]
    tensors = {f"input.x.{i}": x for i, x in enumerate(xs)}
    tensors |= {f"input.context.{i}": c for i, c in enumerate(contexts)}
    if case["y_channels"]:
        tensors |= {f"input.y.{i}": y for i, y in enumerate(ys)}
    for i, (a, b) in enumerate(clip_factors or ()):
        tensors |= {f"input.clip_fea.{i}.a": a, f"input.clip_fea.{i}.b": b}
    tensors["input.t"] = t_in[:, :tokens] if case["per_token"] else t_in
    tensors |= {f"output.{i}": o for i, o in enumerate(out)}
    tensors |= {k: v for k, v in model.state_dict().items() if k not in case.get("factored", {})}
    tensors |= factors
    path = OUT / f"{prefix}_tiny_{name}.safetensors"
    save_file({k: v.contiguous() for k, v in tensors.items()}, str(path))
    meta = {
        "description": f"Golden reference from the official PyTorch WanModel "
                       f"(github.com/{repo}, {WAN22_PATH}) for a tiny random {name} DiT.",
        f"{prefix}_repo": repo, f"{prefix}_commit": commit, f"{prefix}_path": WAN22_PATH,
        "source_sha256": source_sha, "generator": "tools/make_wan22_fixture.py",
        "torch_version": torch.__version__, "config": config, "param_seed": PARAM_SEED,
        "input_seed": INPUT_SEED, "param_init_std": PARAM_STD, "seq_len": seq_len,
        "tokens": tokens, "per_token_timesteps": case["per_token"],
        "timesteps": list(case["timesteps"]),
        "init": "torch.manual_seed(param_seed); m = WanModel(**config); then every parameter "
                "in named_parameters order <- normal(0, param_init_std); then each factored "
                "weight <- a @ b, a = randn(O, r) * param_init_std, b = randn(r, I) / sqrt(r).",
        "factored": {key: {"rank": r, "stored": [f"{key}.a", f"{key}.b"]}
                     for key, r in case.get("factored", {}).items()},
        "inputs": "torch.manual_seed(input_seed); x_i = randn(latent) for both samples, then "
                  "context_i = randn(text_len - 3 i, text_dim), then y_i = randn(y channels, "
                  "F, H, W) (empty unless i2v), then (Wan 2.1 i2v) clip_fea_i = a @ b, stored as "
                  "input.clip_fea.i.a = randn(1, 257, 16) and .b = randn(16, 1280) / 4.",
        "t": "input.t: [B] one timestep per sample, or [B, tokens] per token (the padding "
             "tokens, which the official code also gives t, left out: they do not reach the "
             "output).",
        "stand_ins": ["diffusers config mixins (bookkeeping only)",
                      "flash_attention -> float32 scaled_dot_product_attention with the same "
                      "key-length mask (k_lens), every query row kept",
                      "wan/__init__.py and wan/modules/__init__.py not executed"],
        "run": "CPU, float32, torch.no_grad(), eval(); one sample a call (batch 1, as the "
               "pipelines call it: a 1-D t of more than one sample does not expand to seq_len).",
        "param_keys": {k: list(v.shape) for k, v in model.state_dict().items()},
    }
    path.with_suffix(".json").write_text(json.dumps(meta, indent=1) + "\n")
    print(f"wrote {path} ({sum(v.numel() for v in tensors.values())} values)")


def main() -> None:
    if sys.argv[1] == "--wan21":  # Wan 2.1's I2V (CLIP tokens): its own model.py
        root = Path(sys.argv[2]).resolve()
        sha = hashlib.sha256((root / WAN22_PATH).read_bytes()).hexdigest()
        make(load_official(root), "i2v", WAN21_I2V, sha, WAN21_REPO, WAN21_COMMIT, "wan21")
        return
    root = Path(sys.argv[1]).resolve()
    source = (root / WAN22_PATH).read_bytes()
    official = load_official(root)
    sha = hashlib.sha256(source).hexdigest()
    for name, case in CASES.items():
        make(official, name, case, sha)
    path = OUT / "wan22_schedules.json"
    path.write_text(json.dumps(official_timesteps(root), indent=1) + "\n")
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
