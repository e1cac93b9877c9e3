"""Generate the UMT5-XXL text encoder golden fixture (tests/data/umt5_tiny.*) with torch.

One-off: needs torch, safetensors and numpy in a throwaway environment (never the project's),
e.g. ``python3 -m venv /tmp/torchenv && /tmp/torchenv/bin/pip install torch safetensors numpy``,
then ``/tmp/torchenv/bin/python tools/make_t5_fixture.py``. Neither the tests nor CI run it;
they read the files it writes.

It builds a tiny encoder with the official ``umt5_xxl(encoder_only=True, ...)`` factory (the
classes copied verbatim below, the released config overridden by small widths), randomises
every parameter with a fixed seed, and runs it as ``T5EncoderModel.__call__`` does: right-padded
token ids and the tokenizer's 0/1 attention mask into ``T5Encoder.forward``, then each prompt's
output cut to its token count. It does so in float32 (the golden output) and once more with the
same parameters cast to bfloat16, the released ``t5_dtype``.
"""

# The block between the VERBATIM markers is the official code, unmodified, hence its style.
# ruff: noqa: B006, B905, RUF059, UP008

import json
import math
import sys
from pathlib import Path

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F
from safetensors.torch import save_file

WAN21_REPO = "Wan-Video/Wan2.1"
WAN21_COMMIT = "9737cba9c1c3c4d04b33fcad41c111989865d315"
WAN21_PATH = "wan/modules/t5.py"

# ----- BEGIN VERBATIM: github.com/Wan-Video/Wan2.1, wan/modules/t5.py at
# 9737cba9c1c3c4d04b33fcad41c111989865d315, lines 20-469 (fp16_clamp .. umt5_xxl).
def fp16_clamp(x):
    if x.dtype == torch.float16 and torch.isinf(x).any():
        clamp = torch.finfo(x.dtype).max - 1000
        x = torch.clamp(x, min=-clamp, max=clamp)
    return x


def init_weights(m):
    if isinstance(m, T5LayerNorm):
        nn.init.ones_(m.weight)
    elif isinstance(m, T5Model):
        nn.init.normal_(m.token_embedding.weight, std=1.0)
    elif isinstance(m, T5FeedForward):
        nn.init.normal_(m.gate[0].weight, std=m.dim**-0.5)
        nn.init.normal_(m.fc1.weight, std=m.dim**-0.5)
        nn.init.normal_(m.fc2.weight, std=m.dim_ffn**-0.5)
    elif isinstance(m, T5Attention):
        nn.init.normal_(m.q.weight, std=(m.dim * m.dim_attn)**-0.5)
        nn.init.normal_(m.k.weight, std=m.dim**-0.5)
        nn.init.normal_(m.v.weight, std=m.dim**-0.5)
        nn.init.normal_(m.o.weight, std=(m.num_heads * m.dim_attn)**-0.5)
    elif isinstance(m, T5RelativeEmbedding):
        nn.init.normal_(
            m.embedding.weight, std=(2 * m.num_buckets * m.num_heads)**-0.5)


class GELU(nn.Module):

    def forward(self, x):
        return 0.5 * x * (1.0 + torch.tanh(
            math.sqrt(2.0 / math.pi) * (x + 0.044715 * torch.pow(x, 3.0))))


class T5LayerNorm(nn.Module):

    def __init__(self, dim, eps=1e-6):
        super(T5LayerNorm, self).__init__()
        self.dim = dim
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x):
        x = x * torch.rsqrt(x.float().pow(2).mean(dim=-1, keepdim=True) +
                            self.eps)
        if self.weight.dtype in [torch.float16, torch.bfloat16]:
            x = x.type_as(self.weight)
        return self.weight * x


class T5Attention(nn.Module):

    def __init__(self, dim, dim_attn, num_heads, dropout=0.1):
        assert dim_attn % num_heads == 0
        super(T5Attention, self).__init__()
        self.dim = dim
        self.dim_attn = dim_attn
        self.num_heads = num_heads
        self.head_dim = dim_attn // num_heads

        # layers
        self.q = nn.Linear(dim, dim_attn, bias=False)
        self.k = nn.Linear(dim, dim_attn, bias=False)
        self.v = nn.Linear(dim, dim_attn, bias=False)
        self.o = nn.Linear(dim_attn, dim, bias=False)
        self.dropout = nn.Dropout(dropout)

    def forward(self, x, context=None, mask=None, pos_bias=None):
        """
        x:          [B, L1, C].
        context:    [B, L2, C] or None.
        mask:       [B, L2] or [B, L1, L2] or None.
        """
        # check inputs
        context = x if context is None else context
        b, n, c = x.size(0), self.num_heads, self.head_dim

        # compute query, key, value
        q = self.q(x).view(b, -1, n, c)
        k = self.k(context).view(b, -1, n, c)
        v = self.v(context).view(b, -1, n, c)

        # attention bias
        attn_bias = x.new_zeros(b, n, q.size(1), k.size(1))
        if pos_bias is not None:
            attn_bias += pos_bias
        if mask is not None:
            assert mask.ndim in [2, 3]
            mask = mask.view(b, 1, 1,
                             -1) if mask.ndim == 2 else mask.unsqueeze(1)
            attn_bias.masked_fill_(mask == 0, torch.finfo(x.dtype).min)

        # compute attention (T5 does not use scaling)
        attn = torch.einsum('binc,bjnc->bnij', q, k) + attn_bias
        attn = F.softmax(attn.float(), dim=-1).type_as(attn)
        x = torch.einsum('bnij,bjnc->binc', attn, v)

        # output
        x = x.reshape(b, -1, n * c)
        x = self.o(x)
        x = self.dropout(x)
        return x


class T5FeedForward(nn.Module):

    def __init__(self, dim, dim_ffn, dropout=0.1):
        super(T5FeedForward, self).__init__()
        self.dim = dim
        self.dim_ffn = dim_ffn

        # layers
        self.gate = nn.Sequential(nn.Linear(dim, dim_ffn, bias=False), GELU())
        self.fc1 = nn.Linear(dim, dim_ffn, bias=False)
        self.fc2 = nn.Linear(dim_ffn, dim, bias=False)
        self.dropout = nn.Dropout(dropout)

    def forward(self, x):
        x = self.fc1(x) * self.gate(x)
        x = self.dropout(x)
        x = self.fc2(x)
        x = self.dropout(x)
        return x


class T5SelfAttention(nn.Module):

    def __init__(self,
                 dim,
                 dim_attn,
                 dim_ffn,
                 num_heads,
                 num_buckets,
                 shared_pos=True,
                 dropout=0.1):
        super(T5SelfAttention, self).__init__()
        self.dim = dim
        self.dim_attn = dim_attn
        self.dim_ffn = dim_ffn
        self.num_heads = num_heads
        self.num_buckets = num_buckets
        self.shared_pos = shared_pos

        # layers
        self.norm1 = T5LayerNorm(dim)
        self.attn = T5Attention(dim, dim_attn, num_heads, dropout)
        self.norm2 = T5LayerNorm(dim)
        self.ffn = T5FeedForward(dim, dim_ffn, dropout)
        self.pos_embedding = None if shared_pos else T5RelativeEmbedding(
            num_buckets, num_heads, bidirectional=True)

    def forward(self, x, mask=None, pos_bias=None):
        e = pos_bias if self.shared_pos else self.pos_embedding(
            x.size(1), x.size(1))
        x = fp16_clamp(x + self.attn(self.norm1(x), mask=mask, pos_bias=e))
        x = fp16_clamp(x + self.ffn(self.norm2(x)))
        return x


class T5CrossAttention(nn.Module):

    def __init__(self,
                 dim,
                 dim_attn,
                 dim_ffn,
                 num_heads,
                 num_buckets,
                 shared_pos=True,
                 dropout=0.1):
        super(T5CrossAttention, self).__init__()
        self.dim = dim
        self.dim_attn = dim_attn
        self.dim_ffn = dim_ffn
        self.num_heads = num_heads
        self.num_buckets = num_buckets
        self.shared_pos = shared_pos

        # layers
        self.norm1 = T5LayerNorm(dim)
        self.self_attn = T5Attention(dim, dim_attn, num_heads, dropout)
        self.norm2 = T5LayerNorm(dim)
        self.cross_attn = T5Attention(dim, dim_attn, num_heads, dropout)
        self.norm3 = T5LayerNorm(dim)
        self.ffn = T5FeedForward(dim, dim_ffn, dropout)
        self.pos_embedding = None if shared_pos else T5RelativeEmbedding(
            num_buckets, num_heads, bidirectional=False)

    def forward(self,
                x,
                mask=None,
                encoder_states=None,
                encoder_mask=None,
                pos_bias=None):
        e = pos_bias if self.shared_pos else self.pos_embedding(
            x.size(1), x.size(1))
        x = fp16_clamp(x + self.self_attn(self.norm1(x), mask=mask, pos_bias=e))
        x = fp16_clamp(x + self.cross_attn(
            self.norm2(x), context=encoder_states, mask=encoder_mask))
        x = fp16_clamp(x + self.ffn(self.norm3(x)))
        return x


class T5RelativeEmbedding(nn.Module):

    def __init__(self, num_buckets, num_heads, bidirectional, max_dist=128):
        super(T5RelativeEmbedding, self).__init__()
        self.num_buckets = num_buckets
        self.num_heads = num_heads
        self.bidirectional = bidirectional
        self.max_dist = max_dist

        # layers
        self.embedding = nn.Embedding(num_buckets, num_heads)

    def forward(self, lq, lk):
        device = self.embedding.weight.device
        # rel_pos = torch.arange(lk).unsqueeze(0).to(device) - \
        #     torch.arange(lq).unsqueeze(1).to(device)
        rel_pos = torch.arange(lk, device=device).unsqueeze(0) - \
            torch.arange(lq, device=device).unsqueeze(1)
        rel_pos = self._relative_position_bucket(rel_pos)
        rel_pos_embeds = self.embedding(rel_pos)
        rel_pos_embeds = rel_pos_embeds.permute(2, 0, 1).unsqueeze(
            0)  # [1, N, Lq, Lk]
        return rel_pos_embeds.contiguous()

    def _relative_position_bucket(self, rel_pos):
        # preprocess
        if self.bidirectional:
            num_buckets = self.num_buckets // 2
            rel_buckets = (rel_pos > 0).long() * num_buckets
            rel_pos = torch.abs(rel_pos)
        else:
            num_buckets = self.num_buckets
            rel_buckets = 0
            rel_pos = -torch.min(rel_pos, torch.zeros_like(rel_pos))

        # embeddings for small and large positions
        max_exact = num_buckets // 2
        rel_pos_large = max_exact + (torch.log(rel_pos.float() / max_exact) /
                                     math.log(self.max_dist / max_exact) *
                                     (num_buckets - max_exact)).long()
        rel_pos_large = torch.min(
            rel_pos_large, torch.full_like(rel_pos_large, num_buckets - 1))
        rel_buckets += torch.where(rel_pos < max_exact, rel_pos, rel_pos_large)
        return rel_buckets


class T5Encoder(nn.Module):

    def __init__(self,
                 vocab,
                 dim,
                 dim_attn,
                 dim_ffn,
                 num_heads,
                 num_layers,
                 num_buckets,
                 shared_pos=True,
                 dropout=0.1):
        super(T5Encoder, self).__init__()
        self.dim = dim
        self.dim_attn = dim_attn
        self.dim_ffn = dim_ffn
        self.num_heads = num_heads
        self.num_layers = num_layers
        self.num_buckets = num_buckets
        self.shared_pos = shared_pos

        # layers
        self.token_embedding = vocab if isinstance(vocab, nn.Embedding) \
            else nn.Embedding(vocab, dim)
        self.pos_embedding = T5RelativeEmbedding(
            num_buckets, num_heads, bidirectional=True) if shared_pos else None
        self.dropout = nn.Dropout(dropout)
        self.blocks = nn.ModuleList([
            T5SelfAttention(dim, dim_attn, dim_ffn, num_heads, num_buckets,
                            shared_pos, dropout) for _ in range(num_layers)
        ])
        self.norm = T5LayerNorm(dim)

        # initialize weights
        self.apply(init_weights)

    def forward(self, ids, mask=None):
        x = self.token_embedding(ids)
        x = self.dropout(x)
        e = self.pos_embedding(x.size(1),
                               x.size(1)) if self.shared_pos else None
        for block in self.blocks:
            x = block(x, mask, pos_bias=e)
        x = self.norm(x)
        x = self.dropout(x)
        return x


class T5Decoder(nn.Module):

    def __init__(self,
                 vocab,
                 dim,
                 dim_attn,
                 dim_ffn,
                 num_heads,
                 num_layers,
                 num_buckets,
                 shared_pos=True,
                 dropout=0.1):
        super(T5Decoder, self).__init__()
        self.dim = dim
        self.dim_attn = dim_attn
        self.dim_ffn = dim_ffn
        self.num_heads = num_heads
        self.num_layers = num_layers
        self.num_buckets = num_buckets
        self.shared_pos = shared_pos

        # layers
        self.token_embedding = vocab if isinstance(vocab, nn.Embedding) \
            else nn.Embedding(vocab, dim)
        self.pos_embedding = T5RelativeEmbedding(
            num_buckets, num_heads, bidirectional=False) if shared_pos else None
        self.dropout = nn.Dropout(dropout)
        self.blocks = nn.ModuleList([
            T5CrossAttention(dim, dim_attn, dim_ffn, num_heads, num_buckets,
                             shared_pos, dropout) for _ in range(num_layers)
        ])
        self.norm = T5LayerNorm(dim)

        # initialize weights
        self.apply(init_weights)

    def forward(self, ids, mask=None, encoder_states=None, encoder_mask=None):
        b, s = ids.size()

        # causal mask
        if mask is None:
            mask = torch.tril(torch.ones(1, s, s).to(ids.device))
        elif mask.ndim == 2:
            mask = torch.tril(mask.unsqueeze(1).expand(-1, s, -1))

        # layers
        x = self.token_embedding(ids)
        x = self.dropout(x)
        e = self.pos_embedding(x.size(1),
                               x.size(1)) if self.shared_pos else None
        for block in self.blocks:
            x = block(x, mask, encoder_states, encoder_mask, pos_bias=e)
        x = self.norm(x)
        x = self.dropout(x)
        return x


class T5Model(nn.Module):

    def __init__(self,
                 vocab_size,
                 dim,
                 dim_attn,
                 dim_ffn,
                 num_heads,
                 encoder_layers,
                 decoder_layers,
                 num_buckets,
                 shared_pos=True,
                 dropout=0.1):
        super(T5Model, self).__init__()
        self.vocab_size = vocab_size
        self.dim = dim
        self.dim_attn = dim_attn
        self.dim_ffn = dim_ffn
        self.num_heads = num_heads
        self.encoder_layers = encoder_layers
        self.decoder_layers = decoder_layers
        self.num_buckets = num_buckets

        # layers
        self.token_embedding = nn.Embedding(vocab_size, dim)
        self.encoder = T5Encoder(self.token_embedding, dim, dim_attn, dim_ffn,
                                 num_heads, encoder_layers, num_buckets,
                                 shared_pos, dropout)
        self.decoder = T5Decoder(self.token_embedding, dim, dim_attn, dim_ffn,
                                 num_heads, decoder_layers, num_buckets,
                                 shared_pos, dropout)
        self.head = nn.Linear(dim, vocab_size, bias=False)

        # initialize weights
        self.apply(init_weights)

    def forward(self, encoder_ids, encoder_mask, decoder_ids, decoder_mask):
        x = self.encoder(encoder_ids, encoder_mask)
        x = self.decoder(decoder_ids, decoder_mask, x, encoder_mask)
        x = self.head(x)
        return x


def _t5(name,
        encoder_only=False,
        decoder_only=False,
        return_tokenizer=False,
        tokenizer_kwargs={},
        dtype=torch.float32,
        device='cpu',
        **kwargs):
    # sanity check
    assert not (encoder_only and decoder_only)

    # params
    if encoder_only:
        model_cls = T5Encoder
        kwargs['vocab'] = kwargs.pop('vocab_size')
        kwargs['num_layers'] = kwargs.pop('encoder_layers')
        _ = kwargs.pop('decoder_layers')
    elif decoder_only:
        model_cls = T5Decoder
        kwargs['vocab'] = kwargs.pop('vocab_size')
        kwargs['num_layers'] = kwargs.pop('decoder_layers')
        _ = kwargs.pop('encoder_layers')
    else:
        model_cls = T5Model

    # init model
    with torch.device(device):
        model = model_cls(**kwargs)

    # set device
    model = model.to(dtype=dtype, device=device)

    # init tokenizer
    if return_tokenizer:
        from .tokenizers import HuggingfaceTokenizer
        tokenizer = HuggingfaceTokenizer(f'google/{name}', **tokenizer_kwargs)
        return model, tokenizer
    else:
        return model


def umt5_xxl(**kwargs):
    cfg = dict(
        vocab_size=256384,
        dim=4096,
        dim_attn=4096,
        dim_ffn=10240,
        num_heads=64,
        encoder_layers=24,
        decoder_layers=24,
        num_buckets=32,
        shared_pos=False,
        dropout=0.1)
    cfg.update(**kwargs)
    return _t5('umt5-xxl', **cfg)
# ----- END VERBATIM

# Tiny encoder: the released umt5_xxl structure (relative position embeddings per layer,
# shared_pos=False; 32 buckets; max_dist 128; dim_attn = dim) at small widths.
CONFIG = {
    "vocab_size": 64,
    "dim": 32,
    "dim_attn": 32,
    "dim_ffn": 64,
    "num_heads": 4,
    "encoder_layers": 2,
    "num_buckets": 32,
    "shared_pos": False,
}
TEXT_LEN = 160  # > max_dist = 128, so the farthest bucket's clamp is exercised too
SEQ_LENS = (TEXT_LEN, 37)  # tokens per prompt, EOS included: one full, one padded
PAD_ID, EOS_ID = 0, 1  # google/umt5-xxl's pad and eos ids
PARAM_SEED = 0
INPUT_SEED = 10
GAMMA_STD = 0.1
POS_STD = 1.0
BUCKET_RANGE = 511  # official buckets stored for rel_pos in [-511, 511]: all of text_len 512
OUT = Path(__file__).resolve().parents[1] / "tests" / "data"
NAME = "umt5_tiny"


def randomise(model: nn.Module) -> dict[str, torch.Tensor]:
    """Every parameter random, so that none is left at an identity-like init.

    The official init leaves T5LayerNorm weights at 1 and gives ``q`` and the relative
    embeddings tiny scales (std ``(dim * dim_attn) ** -0.5`` and ``(2 * 32 * heads) ** -0.5``),
    which would leave attention nearly uniform and the position bias untested.
    """
    params = {}
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name == "norm.weight" or name.endswith((".norm1.weight", ".norm2.weight")):
                p.copy_(1.0 + GAMMA_STD * torch.randn_like(p))
            elif name == "token_embedding.weight":
                p.normal_(0.0, 1.0)  # as the official init
            elif name.endswith("pos_embedding.embedding.weight"):
                p.normal_(0.0, POS_STD)
            else:  # Linear [out, in]
                p.normal_(0.0, p.shape[1] ** -0.5)
            params[name] = p.detach().clone().contiguous()
    return params


def tokens() -> tuple[torch.Tensor, torch.Tensor]:
    """Right-padded ids and the 0/1 mask, as HuggingfaceTokenizer(seq_len=text_len) returns."""
    ids = torch.full((len(SEQ_LENS), TEXT_LEN), PAD_ID, dtype=torch.long)
    mask = torch.zeros((len(SEQ_LENS), TEXT_LEN), dtype=torch.long)
    for i, n in enumerate(SEQ_LENS):
        ids[i, :n - 1] = torch.randint(2, CONFIG["vocab_size"], (n - 1,))
        ids[i, n - 1] = EOS_ID
        mask[i, :n] = 1
    return ids, mask


def encode(model: nn.Module, ids: torch.Tensor, mask: torch.Tensor):
    """T5EncoderModel.__call__ after tokenising: the full output and the per-prompt cuts."""
    seq_lens = mask.gt(0).sum(dim=1).long()
    context = model(ids, mask)
    return context, [u[:v] for u, v in zip(context, seq_lens)], seq_lens


def main() -> None:
    torch.manual_seed(PARAM_SEED)
    model = umt5_xxl(encoder_only=True, return_tokenizer=False, dtype=torch.float32,
                     device="cpu", **CONFIG).eval().requires_grad_(False)
    params = randomise(model)
    torch.manual_seed(INPUT_SEED)
    ids, mask = tokens()

    hidden = {}
    handles = [model.token_embedding.register_forward_hook(
        lambda _m, _i, out: hidden.__setitem__("embedding", out.detach().clone()))]
    handles.append(model.blocks[0].register_forward_hook(
        lambda _m, _i, out: hidden.__setitem__("blocks.0", out.detach().clone())))
    with torch.no_grad():
        context, cut, seq_lens = encode(model, ids, mask)
        for h in handles:
            h.remove()
        assert [len(u) for u in cut] == list(SEQ_LENS)
        bias0 = model.blocks[0].pos_embedding(TEXT_LEN, TEXT_LEN)  # [1, N, L, L]
        rel = torch.arange(-BUCKET_RANGE, BUCKET_RANGE + 1)
        buckets = model.blocks[0].pos_embedding._relative_position_bucket(rel)
        bf16 = umt5_xxl(encoder_only=True, return_tokenizer=False, dtype=torch.bfloat16,
                        device="cpu", **CONFIG).eval().requires_grad_(False)
        bf16.load_state_dict(params)  # copy_ casts to bfloat16
        context_bf16, _, _ = encode(bf16, ids, mask)
    # What WanModel.forward gets as text: each cut zero-padded back to text_len.
    padded = torch.stack([torch.cat([u, u.new_zeros(TEXT_LEN - u.size(0), u.size(1))])
                          for u in cut])

    tensors = dict(params)
    tensors["input.ids"] = ids
    tensors["input.mask"] = mask
    tensors["output.context"] = context
    tensors["output.context_zero_padded"] = padded
    tensors["output.context_bf16"] = context_bf16.float()
    tensors["intermediate.embedding"] = hidden["embedding"]
    tensors["intermediate.blocks.0"] = hidden["blocks.0"]
    tensors["official.buckets"] = buckets
    tensors = {k: v.contiguous() for k, v in tensors.items()}
    save_file(tensors, OUT / f"{NAME}.safetensors")

    num_params = sum(p.numel() for p in params.values())
    meta = {
        "description": ("Golden reference from the official Wan2.1 PyTorch UMT5-XXL text "
                        f"encoder (github.com/{WAN21_REPO}, {WAN21_PATH}) for a tiny random "
                        "encoder."),
        "wan21_repo": WAN21_REPO,
        "wan21_commit": WAN21_COMMIT,
        "wan21_path": WAN21_PATH,
        "generator": "tools/make_t5_fixture.py (official classes copied verbatim)",
        "torch_version": torch.__version__,
        "config": {"vocab": CONFIG["vocab_size"], "num_layers": CONFIG["encoder_layers"],
                   **{k: v for k, v in CONFIG.items()
                      if k not in ("vocab_size", "encoder_layers")}},
        "official_kwargs": CONFIG,
        "text_len": TEXT_LEN,
        "seq_lens": list(SEQ_LENS),
        "pad_id": PAD_ID,
        "eos_id": EOS_ID,
        "param_seed": PARAM_SEED,
        "input_seed": INPUT_SEED,
        "dtype": "float32",
        "device": "cpu",
        "init": ("torch.manual_seed(param_seed); m = umt5_xxl(encoder_only=True, dtype=float32, "
                 "device='cpu', **official_kwargs) (official init, consumes RNG); then, without "
                 "reseeding, for each parameter in named_parameters order: T5LayerNorm weights "
                 f"<- 1 + {GAMMA_STD} * randn, token_embedding <- normal(0, 1), relative "
                 f"position embeddings <- normal(0, {POS_STD}), Linear weights [out, in] <- "
                 "normal(0, 1/sqrt(in))."),
        "inputs": ("torch.manual_seed(input_seed); for each prompt of n = seq_lens[i] tokens: "
                   "ids[:n-1] <- randint(2, vocab), ids[n-1] = eos_id, the rest pad_id; mask = "
                   "1 on the n tokens, 0 on the padding (HuggingfaceTokenizer with "
                   "padding='max_length', max_length=text_len)."),
        "encode": ("T5EncoderModel.__call__ after tokenising: seq_lens = mask.gt(0).sum(1); "
                   "output.context = T5Encoder(ids, mask) (eval, no_grad, all text_len "
                   "positions); the official return is [u[:v] for u, v in zip(context, "
                   "seq_lens)]; output.context_zero_padded is those cuts zero-padded back to "
                   "text_len, as WanModel.forward pads them. output.context_bf16: the same "
                   "parameters and inputs through the model built with dtype=bfloat16 "
                   "(the released t5_dtype), output cast to float32."),
        "layouts": ("Parameters keep the official state-dict names and layouts (Linear "
                    "[out, in], Embedding [num, dim], T5LayerNorm weight [dim]); activations "
                    "[B, L, dim]."),
        "param_keys": {k: list(v.shape) for k, v in params.items()},
        "num_params": num_params,
        "input_keys": {"input.ids": list(ids.shape), "input.mask": list(mask.shape)},
        "output_keys": {k: list(tensors[k].shape) for k in
                        ("output.context", "output.context_zero_padded",
                         "output.context_bf16")},
        "intermediate_keys": {k: list(v.shape) for k, v in tensors.items()
                              if k.startswith("intermediate.")},
        "intermediate_notes": {
            "intermediate.embedding": "token_embedding(ids)",
            "intermediate.blocks.0": "output of blocks[0] (attention and FFN residuals)",
        },
        "official.buckets": (f"T5RelativeEmbedding(num_buckets={CONFIG['num_buckets']}, "
                             "bidirectional=True, max_dist=128)._relative_position_bucket("
                             f"arange(-{BUCKET_RANGE}, {BUCKET_RANGE + 1})) on CPU: entry i is "
                             f"the bucket of rel_pos = key - query = i - {BUCKET_RANGE}."),
        "output_stats": {
            "mean": float(context.mean()), "std": float(context.std()),
            "abs_max": float(context.abs().max()),
            "bf16_vs_f32_abs_max": float((context_bf16.float() - context).abs().max()),
            "position_bias_abs_max": float(bias0.abs().max()),
        },
    }
    (OUT / f"{NAME}.json").write_text(json.dumps(meta, indent=1) + "\n")
    size = (OUT / f"{NAME}.safetensors").stat().st_size
    print(f"{num_params} parameters, {size} bytes; context {tuple(context.shape)}; "
          f"stats {meta['output_stats']}; numpy {np.__version__}", file=sys.stderr)


if __name__ == "__main__":
    main()
