"""Generate the Wan 2.1 VAE golden fixtures with torch: the decoder's
(tests/data/wan21_vae_tiny.*) and, with ``--encoder``, the encoder's
(tests/data/wan21_vae_encoder_tiny.*).

One-off: needs torch, einops, safetensors and numpy in a throwaway environment (never the
project's), e.g. ``python3 -m venv /tmp/torchenv && /tmp/torchenv/bin/pip install torch einops
safetensors numpy``, then ``/tmp/torchenv/bin/python tools/make_vae_fixture.py``. Neither the
tests nor CI run it; they read the files it writes.

It builds a tiny ``WanVAE_`` from the official classes copied verbatim below, randomises every
decoder parameter with a fixed seed, and runs the official frame-by-frame ``WanVAE_.decode``
(un-normalise, ``conv2``, one latent frame at a time through ``Decoder3d`` with ``feat_cache``)
followed by ``WanVAE.decode``'s ``.float().clamp_(-1, 1)``, one sample at a time as
``WanVAE.decode`` does. With ``--encoder`` it randomises the encoder's parameters instead
(``encoder.*``, ``conv1.*``) and runs the official ``WanVAE_.encode`` (the first frame alone,
then 4 frames at a time with ``feat_cache``; ``conv1``; ``(mu - mean) * (1 / std)``) on a
random video, one sample at a time as ``WanVAE.encode``.
"""

# The block between the VERBATIM markers is the official code, unmodified, hence its style.
# ruff: noqa: B006, B905, E501, RUF005, RUF007, RUF059

import json
import sys
from pathlib import Path

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F
from einops import rearrange
from safetensors.torch import save_file

WAN21_REPO = "Wan-Video/Wan2.1"
WAN21_COMMIT = "9737cba9c1c3c4d04b33fcad41c111989865d315"
WAN21_PATH = "wan/modules/vae.py"

# ----- BEGIN VERBATIM: github.com/Wan-Video/Wan2.1, wan/modules/vae.py at
# 9737cba9c1c3c4d04b33fcad41c111989865d315, lines 14-589 (CACHE_T .. WanVAE_.clear_cache).
CACHE_T = 2


class CausalConv3d(nn.Conv3d):
    """
    Causal 3d convolusion.
    """

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self._padding = (self.padding[2], self.padding[2], self.padding[1],
                         self.padding[1], 2 * self.padding[0], 0)
        self.padding = (0, 0, 0)

    def forward(self, x, cache_x=None):
        padding = list(self._padding)
        if cache_x is not None and self._padding[4] > 0:
            cache_x = cache_x.to(x.device)
            x = torch.cat([cache_x, x], dim=2)
            padding[4] -= cache_x.shape[2]
        x = F.pad(x, padding)

        return super().forward(x)


class RMS_norm(nn.Module):

    def __init__(self, dim, channel_first=True, images=True, bias=False):
        super().__init__()
        broadcastable_dims = (1, 1, 1) if not images else (1, 1)
        shape = (dim, *broadcastable_dims) if channel_first else (dim,)

        self.channel_first = channel_first
        self.scale = dim**0.5
        self.gamma = nn.Parameter(torch.ones(shape))
        self.bias = nn.Parameter(torch.zeros(shape)) if bias else 0.

    def forward(self, x):
        return F.normalize(
            x, dim=(1 if self.channel_first else
                    -1)) * self.scale * self.gamma + self.bias


class Upsample(nn.Upsample):

    def forward(self, x):
        """
        Fix bfloat16 support for nearest neighbor interpolation.
        """
        return super().forward(x.float()).type_as(x)


class Resample(nn.Module):

    def __init__(self, dim, mode):
        assert mode in ('none', 'upsample2d', 'upsample3d', 'downsample2d',
                        'downsample3d')
        super().__init__()
        self.dim = dim
        self.mode = mode

        # layers
        if mode == 'upsample2d':
            self.resample = nn.Sequential(
                Upsample(scale_factor=(2., 2.), mode='nearest-exact'),
                nn.Conv2d(dim, dim // 2, 3, padding=1))
        elif mode == 'upsample3d':
            self.resample = nn.Sequential(
                Upsample(scale_factor=(2., 2.), mode='nearest-exact'),
                nn.Conv2d(dim, dim // 2, 3, padding=1))
            self.time_conv = CausalConv3d(
                dim, dim * 2, (3, 1, 1), padding=(1, 0, 0))

        elif mode == 'downsample2d':
            self.resample = nn.Sequential(
                nn.ZeroPad2d((0, 1, 0, 1)),
                nn.Conv2d(dim, dim, 3, stride=(2, 2)))
        elif mode == 'downsample3d':
            self.resample = nn.Sequential(
                nn.ZeroPad2d((0, 1, 0, 1)),
                nn.Conv2d(dim, dim, 3, stride=(2, 2)))
            self.time_conv = CausalConv3d(
                dim, dim, (3, 1, 1), stride=(2, 1, 1), padding=(0, 0, 0))

        else:
            self.resample = nn.Identity()

    def forward(self, x, feat_cache=None, feat_idx=[0]):
        b, c, t, h, w = x.size()
        if self.mode == 'upsample3d':
            if feat_cache is not None:
                idx = feat_idx[0]
                if feat_cache[idx] is None:
                    feat_cache[idx] = 'Rep'
                    feat_idx[0] += 1
                else:

                    cache_x = x[:, :, -CACHE_T:, :, :].clone()
                    if cache_x.shape[2] < 2 and feat_cache[
                            idx] is not None and feat_cache[idx] != 'Rep':
                        # cache last frame of last two chunk
                        cache_x = torch.cat([
                            feat_cache[idx][:, :, -1, :, :].unsqueeze(2).to(
                                cache_x.device), cache_x
                        ],
                                            dim=2)
                    if cache_x.shape[2] < 2 and feat_cache[
                            idx] is not None and feat_cache[idx] == 'Rep':
                        cache_x = torch.cat([
                            torch.zeros_like(cache_x).to(cache_x.device),
                            cache_x
                        ],
                                            dim=2)
                    if feat_cache[idx] == 'Rep':
                        x = self.time_conv(x)
                    else:
                        x = self.time_conv(x, feat_cache[idx])
                    feat_cache[idx] = cache_x
                    feat_idx[0] += 1

                    x = x.reshape(b, 2, c, t, h, w)
                    x = torch.stack((x[:, 0, :, :, :, :], x[:, 1, :, :, :, :]),
                                    3)
                    x = x.reshape(b, c, t * 2, h, w)
        t = x.shape[2]
        x = rearrange(x, 'b c t h w -> (b t) c h w')
        x = self.resample(x)
        x = rearrange(x, '(b t) c h w -> b c t h w', t=t)

        if self.mode == 'downsample3d':
            if feat_cache is not None:
                idx = feat_idx[0]
                if feat_cache[idx] is None:
                    feat_cache[idx] = x.clone()
                    feat_idx[0] += 1
                else:

                    cache_x = x[:, :, -1:, :, :].clone()
                    # if cache_x.shape[2] < 2 and feat_cache[idx] is not None and feat_cache[idx]!='Rep':
                    #     # cache last frame of last two chunk
                    #     cache_x = torch.cat([feat_cache[idx][:, :, -1, :, :].unsqueeze(2).to(cache_x.device), cache_x], dim=2)

                    x = self.time_conv(
                        torch.cat([feat_cache[idx][:, :, -1:, :, :], x], 2))
                    feat_cache[idx] = cache_x
                    feat_idx[0] += 1
        return x

    def init_weight(self, conv):
        conv_weight = conv.weight
        nn.init.zeros_(conv_weight)
        c1, c2, t, h, w = conv_weight.size()
        one_matrix = torch.eye(c1, c2)
        init_matrix = one_matrix
        nn.init.zeros_(conv_weight)
        #conv_weight.data[:,:,-1,1,1] = init_matrix * 0.5
        conv_weight.data[:, :, 1, 0, 0] = init_matrix  #* 0.5
        conv.weight.data.copy_(conv_weight)
        nn.init.zeros_(conv.bias.data)

    def init_weight2(self, conv):
        conv_weight = conv.weight.data
        nn.init.zeros_(conv_weight)
        c1, c2, t, h, w = conv_weight.size()
        init_matrix = torch.eye(c1 // 2, c2)
        #init_matrix = repeat(init_matrix, 'o ... -> (o 2) ...').permute(1,0,2).contiguous().reshape(c1,c2)
        conv_weight[:c1 // 2, :, -1, 0, 0] = init_matrix
        conv_weight[c1 // 2:, :, -1, 0, 0] = init_matrix
        conv.weight.data.copy_(conv_weight)
        nn.init.zeros_(conv.bias.data)


class ResidualBlock(nn.Module):

    def __init__(self, in_dim, out_dim, dropout=0.0):
        super().__init__()
        self.in_dim = in_dim
        self.out_dim = out_dim

        # layers
        self.residual = nn.Sequential(
            RMS_norm(in_dim, images=False), nn.SiLU(),
            CausalConv3d(in_dim, out_dim, 3, padding=1),
            RMS_norm(out_dim, images=False), nn.SiLU(), nn.Dropout(dropout),
            CausalConv3d(out_dim, out_dim, 3, padding=1))
        self.shortcut = CausalConv3d(in_dim, out_dim, 1) \
            if in_dim != out_dim else nn.Identity()

    def forward(self, x, feat_cache=None, feat_idx=[0]):
        h = self.shortcut(x)
        for layer in self.residual:
            if isinstance(layer, CausalConv3d) and feat_cache is not None:
                idx = feat_idx[0]
                cache_x = x[:, :, -CACHE_T:, :, :].clone()
                if cache_x.shape[2] < 2 and feat_cache[idx] is not None:
                    # cache last frame of last two chunk
                    cache_x = torch.cat([
                        feat_cache[idx][:, :, -1, :, :].unsqueeze(2).to(
                            cache_x.device), cache_x
                    ],
                                        dim=2)
                x = layer(x, feat_cache[idx])
                feat_cache[idx] = cache_x
                feat_idx[0] += 1
            else:
                x = layer(x)
        return x + h


class AttentionBlock(nn.Module):
    """
    Causal self-attention with a single head.
    """

    def __init__(self, dim):
        super().__init__()
        self.dim = dim

        # layers
        self.norm = RMS_norm(dim)
        self.to_qkv = nn.Conv2d(dim, dim * 3, 1)
        self.proj = nn.Conv2d(dim, dim, 1)

        # zero out the last layer params
        nn.init.zeros_(self.proj.weight)

    def forward(self, x):
        identity = x
        b, c, t, h, w = x.size()
        x = rearrange(x, 'b c t h w -> (b t) c h w')
        x = self.norm(x)
        # compute query, key, value
        q, k, v = self.to_qkv(x).reshape(b * t, 1, c * 3,
                                         -1).permute(0, 1, 3,
                                                     2).contiguous().chunk(
                                                         3, dim=-1)

        # apply attention
        x = F.scaled_dot_product_attention(
            q,
            k,
            v,
        )
        x = x.squeeze(1).permute(0, 2, 1).reshape(b * t, c, h, w)

        # output
        x = self.proj(x)
        x = rearrange(x, '(b t) c h w-> b c t h w', t=t)
        return x + identity


class Encoder3d(nn.Module):

    def __init__(self,
                 dim=128,
                 z_dim=4,
                 dim_mult=[1, 2, 4, 4],
                 num_res_blocks=2,
                 attn_scales=[],
                 temperal_downsample=[True, True, False],
                 dropout=0.0):
        super().__init__()
        self.dim = dim
        self.z_dim = z_dim
        self.dim_mult = dim_mult
        self.num_res_blocks = num_res_blocks
        self.attn_scales = attn_scales
        self.temperal_downsample = temperal_downsample

        # dimensions
        dims = [dim * u for u in [1] + dim_mult]
        scale = 1.0

        # init block
        self.conv1 = CausalConv3d(3, dims[0], 3, padding=1)

        # downsample blocks
        downsamples = []
        for i, (in_dim, out_dim) in enumerate(zip(dims[:-1], dims[1:])):
            # residual (+attention) blocks
            for _ in range(num_res_blocks):
                downsamples.append(ResidualBlock(in_dim, out_dim, dropout))
                if scale in attn_scales:
                    downsamples.append(AttentionBlock(out_dim))
                in_dim = out_dim

            # downsample block
            if i != len(dim_mult) - 1:
                mode = 'downsample3d' if temperal_downsample[
                    i] else 'downsample2d'
                downsamples.append(Resample(out_dim, mode=mode))
                scale /= 2.0
        self.downsamples = nn.Sequential(*downsamples)

        # middle blocks
        self.middle = nn.Sequential(
            ResidualBlock(out_dim, out_dim, dropout), AttentionBlock(out_dim),
            ResidualBlock(out_dim, out_dim, dropout))

        # output blocks
        self.head = nn.Sequential(
            RMS_norm(out_dim, images=False), nn.SiLU(),
            CausalConv3d(out_dim, z_dim, 3, padding=1))

    def forward(self, x, feat_cache=None, feat_idx=[0]):
        if feat_cache is not None:
            idx = feat_idx[0]
            cache_x = x[:, :, -CACHE_T:, :, :].clone()
            if cache_x.shape[2] < 2 and feat_cache[idx] is not None:
                # cache last frame of last two chunk
                cache_x = torch.cat([
                    feat_cache[idx][:, :, -1, :, :].unsqueeze(2).to(
                        cache_x.device), cache_x
                ],
                                    dim=2)
            x = self.conv1(x, feat_cache[idx])
            feat_cache[idx] = cache_x
            feat_idx[0] += 1
        else:
            x = self.conv1(x)

        ## downsamples
        for layer in self.downsamples:
            if feat_cache is not None:
                x = layer(x, feat_cache, feat_idx)
            else:
                x = layer(x)

        ## middle
        for layer in self.middle:
            if isinstance(layer, ResidualBlock) and feat_cache is not None:
                x = layer(x, feat_cache, feat_idx)
            else:
                x = layer(x)

        ## head
        for layer in self.head:
            if isinstance(layer, CausalConv3d) and feat_cache is not None:
                idx = feat_idx[0]
                cache_x = x[:, :, -CACHE_T:, :, :].clone()
                if cache_x.shape[2] < 2 and feat_cache[idx] is not None:
                    # cache last frame of last two chunk
                    cache_x = torch.cat([
                        feat_cache[idx][:, :, -1, :, :].unsqueeze(2).to(
                            cache_x.device), cache_x
                    ],
                                        dim=2)
                x = layer(x, feat_cache[idx])
                feat_cache[idx] = cache_x
                feat_idx[0] += 1
            else:
                x = layer(x)
        return x


class Decoder3d(nn.Module):

    def __init__(self,
                 dim=128,
                 z_dim=4,
                 dim_mult=[1, 2, 4, 4],
                 num_res_blocks=2,
                 attn_scales=[],
                 temperal_upsample=[False, True, True],
                 dropout=0.0):
        super().__init__()
        self.dim = dim
        self.z_dim = z_dim
        self.dim_mult = dim_mult
        self.num_res_blocks = num_res_blocks
        self.attn_scales = attn_scales
        self.temperal_upsample = temperal_upsample

        # dimensions
        dims = [dim * u for u in [dim_mult[-1]] + dim_mult[::-1]]
        scale = 1.0 / 2**(len(dim_mult) - 2)

        # init block
        self.conv1 = CausalConv3d(z_dim, dims[0], 3, padding=1)

        # middle blocks
        self.middle = nn.Sequential(
            ResidualBlock(dims[0], dims[0], dropout), AttentionBlock(dims[0]),
            ResidualBlock(dims[0], dims[0], dropout))

        # upsample blocks
        upsamples = []
        for i, (in_dim, out_dim) in enumerate(zip(dims[:-1], dims[1:])):
            # residual (+attention) blocks
            if i == 1 or i == 2 or i == 3:
                in_dim = in_dim // 2
            for _ in range(num_res_blocks + 1):
                upsamples.append(ResidualBlock(in_dim, out_dim, dropout))
                if scale in attn_scales:
                    upsamples.append(AttentionBlock(out_dim))
                in_dim = out_dim

            # upsample block
            if i != len(dim_mult) - 1:
                mode = 'upsample3d' if temperal_upsample[i] else 'upsample2d'
                upsamples.append(Resample(out_dim, mode=mode))
                scale *= 2.0
        self.upsamples = nn.Sequential(*upsamples)

        # output blocks
        self.head = nn.Sequential(
            RMS_norm(out_dim, images=False), nn.SiLU(),
            CausalConv3d(out_dim, 3, 3, padding=1))

    def forward(self, x, feat_cache=None, feat_idx=[0]):
        ## conv1
        if feat_cache is not None:
            idx = feat_idx[0]
            cache_x = x[:, :, -CACHE_T:, :, :].clone()
            if cache_x.shape[2] < 2 and feat_cache[idx] is not None:
                # cache last frame of last two chunk
                cache_x = torch.cat([
                    feat_cache[idx][:, :, -1, :, :].unsqueeze(2).to(
                        cache_x.device), cache_x
                ],
                                    dim=2)
            x = self.conv1(x, feat_cache[idx])
            feat_cache[idx] = cache_x
            feat_idx[0] += 1
        else:
            x = self.conv1(x)

        ## middle
        for layer in self.middle:
            if isinstance(layer, ResidualBlock) and feat_cache is not None:
                x = layer(x, feat_cache, feat_idx)
            else:
                x = layer(x)

        ## upsamples
        for layer in self.upsamples:
            if feat_cache is not None:
                x = layer(x, feat_cache, feat_idx)
            else:
                x = layer(x)

        ## head
        for layer in self.head:
            if isinstance(layer, CausalConv3d) and feat_cache is not None:
                idx = feat_idx[0]
                cache_x = x[:, :, -CACHE_T:, :, :].clone()
                if cache_x.shape[2] < 2 and feat_cache[idx] is not None:
                    # cache last frame of last two chunk
                    cache_x = torch.cat([
                        feat_cache[idx][:, :, -1, :, :].unsqueeze(2).to(
                            cache_x.device), cache_x
                    ],
                                        dim=2)
                x = layer(x, feat_cache[idx])
                feat_cache[idx] = cache_x
                feat_idx[0] += 1
            else:
                x = layer(x)
        return x


def count_conv3d(model):
    count = 0
    for m in model.modules():
        if isinstance(m, CausalConv3d):
            count += 1
    return count


class WanVAE_(nn.Module):

    def __init__(self,
                 dim=128,
                 z_dim=4,
                 dim_mult=[1, 2, 4, 4],
                 num_res_blocks=2,
                 attn_scales=[],
                 temperal_downsample=[True, True, False],
                 dropout=0.0):
        super().__init__()
        self.dim = dim
        self.z_dim = z_dim
        self.dim_mult = dim_mult
        self.num_res_blocks = num_res_blocks
        self.attn_scales = attn_scales
        self.temperal_downsample = temperal_downsample
        self.temperal_upsample = temperal_downsample[::-1]

        # modules
        self.encoder = Encoder3d(dim, z_dim * 2, dim_mult, num_res_blocks,
                                 attn_scales, self.temperal_downsample, dropout)
        self.conv1 = CausalConv3d(z_dim * 2, z_dim * 2, 1)
        self.conv2 = CausalConv3d(z_dim, z_dim, 1)
        self.decoder = Decoder3d(dim, z_dim, dim_mult, num_res_blocks,
                                 attn_scales, self.temperal_upsample, dropout)

    def forward(self, x):
        mu, log_var = self.encode(x)
        z = self.reparameterize(mu, log_var)
        x_recon = self.decode(z)
        return x_recon, mu, log_var

    def encode(self, x, scale):
        self.clear_cache()
        ## cache
        t = x.shape[2]
        iter_ = 1 + (t - 1) // 4
        ## 对encode输入的x，按时间拆分为1、4、4、4....
        for i in range(iter_):
            self._enc_conv_idx = [0]
            if i == 0:
                out = self.encoder(
                    x[:, :, :1, :, :],
                    feat_cache=self._enc_feat_map,
                    feat_idx=self._enc_conv_idx)
            else:
                out_ = self.encoder(
                    x[:, :, 1 + 4 * (i - 1):1 + 4 * i, :, :],
                    feat_cache=self._enc_feat_map,
                    feat_idx=self._enc_conv_idx)
                out = torch.cat([out, out_], 2)
        mu, log_var = self.conv1(out).chunk(2, dim=1)
        if isinstance(scale[0], torch.Tensor):
            mu = (mu - scale[0].view(1, self.z_dim, 1, 1, 1)) * scale[1].view(
                1, self.z_dim, 1, 1, 1)
        else:
            mu = (mu - scale[0]) * scale[1]
        self.clear_cache()
        return mu

    def decode(self, z, scale):
        self.clear_cache()
        # z: [b,c,t,h,w]
        if isinstance(scale[0], torch.Tensor):
            z = z / scale[1].view(1, self.z_dim, 1, 1, 1) + scale[0].view(
                1, self.z_dim, 1, 1, 1)
        else:
            z = z / scale[1] + scale[0]
        iter_ = z.shape[2]
        x = self.conv2(z)
        for i in range(iter_):
            self._conv_idx = [0]
            if i == 0:
                out = self.decoder(
                    x[:, :, i:i + 1, :, :],
                    feat_cache=self._feat_map,
                    feat_idx=self._conv_idx)
            else:
                out_ = self.decoder(
                    x[:, :, i:i + 1, :, :],
                    feat_cache=self._feat_map,
                    feat_idx=self._conv_idx)
                out = torch.cat([out, out_], 2)
        self.clear_cache()
        return out

    def reparameterize(self, mu, log_var):
        std = torch.exp(0.5 * log_var)
        eps = torch.randn_like(std)
        return eps * std + mu

    def sample(self, imgs, deterministic=False):
        mu, log_var = self.encode(imgs)
        if deterministic:
            return mu
        std = torch.exp(0.5 * log_var.clamp(-30.0, 20.0))
        return mu + std * torch.randn_like(std)

    def clear_cache(self):
        self._conv_num = count_conv3d(self.decoder)
        self._conv_idx = [0]
        self._feat_map = [None] * self._conv_num
        #cache encode
        self._enc_conv_num = count_conv3d(self.encoder)
        self._enc_conv_idx = [0]
        self._enc_feat_map = [None] * self._enc_conv_num
# ----- END VERBATIM

# Official latent statistics, from WanVAE.__init__ in the same file.
MEAN = [
    -0.7571, -0.7089, -0.9113, 0.1075, -0.1745, 0.9653, -0.1517, 1.5508,
    0.4134, -0.0715, 0.5517, -0.3632, -0.1922, -0.9497, 0.2503, -0.2921
]
STD = [
    2.8184, 1.4541, 2.3275, 2.6558, 1.2196, 1.7708, 2.6052, 2.0743,
    3.2687, 2.1526, 2.8652, 1.5579, 1.6382, 1.1253, 2.8251, 1.9160
]

# Tiny decoder: the official layout (dim_mult [1, 2, 4, 4], temperal_downsample
# [False, True, True], attn_scales []) at dim 4 instead of 96, one residual block (+1) per level.
CONFIG = {
    "dim": 4,
    "z_dim": 16,
    "dim_mult": [1, 2, 4, 4],
    "num_res_blocks": 1,
    "attn_scales": [],
    "temperal_downsample": [False, True, True],
}
PARAM_SEED = 0
INPUT_SEED = 10
LATENT_SHAPE = (2, 16, 3, 4, 4)  # [B, z_dim, T, h, w]
GAMMA_STD = 0.1
BIAS_STD = 0.1
OUT = Path(__file__).resolve().parents[1] / "tests" / "data"
NAME = "wan21_vae_tiny"


def randomise(model: nn.Module, prefixes: tuple[str, ...] = ("decoder.", "conv2.")
              ) -> dict[str, torch.Tensor]:
    """Every parameter under ``prefixes`` random, so that none is left at an identity-like init.

    The official init leaves RMS_norm gammas at 1, the attention ``proj`` at 0 and
    ``Resample.init_weight*`` unused; a fixture with those would not test them.
    """
    params = {}
    with torch.no_grad():
        for name, p in model.named_parameters():
            if not name.startswith(prefixes):
                continue
            if name.endswith(".gamma"):
                p.copy_(1.0 + GAMMA_STD * torch.randn_like(p))
            elif name.endswith(".bias"):
                p.normal_(0.0, BIAS_STD)
            else:
                p.normal_(0.0, p[0].numel() ** -0.5)
            params[name] = p.detach().clone().contiguous()
    return params


def record(modules: dict[str, nn.Module]) -> tuple[dict[str, list], list]:
    """Forward hooks that keep each module's per-chunk outputs (the decode runs frame by frame)."""
    chunks: dict[str, list] = {name: [] for name in modules}
    handles = [module.register_forward_hook(
        lambda _m, _i, out, name=name: chunks[name].append(out.detach().clone()))
        for name, module in modules.items()]
    return chunks, handles


def main() -> None:
    torch.manual_seed(PARAM_SEED)
    model = WanVAE_(**CONFIG, dropout=0.0).eval()
    params = randomise(model)
    torch.manual_seed(INPUT_SEED)
    z = torch.randn(LATENT_SHAPE)
    mean = torch.tensor(MEAN, dtype=torch.float32)
    std = torch.tensor(STD, dtype=torch.float32)
    scale = [mean, 1.0 / std]  # as WanVAE.__init__

    upsample3d = [i for i, m in enumerate(model.decoder.upsamples)
                  if isinstance(m, Resample) and m.mode == "upsample3d"]
    watched = {"conv2": model.conv2, "middle": model.decoder.middle[2]}
    watched.update({f"upsamples.{i}": model.decoder.upsamples[i] for i in upsample3d})
    per_sample = {name: [] for name in watched}
    unclamped, videos = [], []
    with torch.no_grad():
        for u in z:
            chunks, handles = record(watched)
            out = model.decode(u.unsqueeze(0), scale)
            for h in handles:
                h.remove()
            for name, parts in chunks.items():
                per_sample[name].append(torch.cat(parts, 2))
            unclamped.append(out.float().clone())  # .float() is a no-op on float32: copy first
            videos.append(out.float().clamp_(-1, 1))  # WanVAE.decode
    video = torch.cat(videos)
    tensors = dict(params)
    tensors["input.z"] = z
    tensors["output.video"] = video
    tensors["output.unclamped"] = torch.cat(unclamped)
    for name, parts in per_sample.items():
        tensors[f"intermediate.{name}"] = torch.cat(parts)
    tensors = {k: v.contiguous() for k, v in tensors.items()}
    save_file(tensors, OUT / f"{NAME}.safetensors")

    num_params = sum(p.numel() for p in params.values())
    meta = {
        "description": ("Golden reference from the official Wan2.1 PyTorch video VAE decoder "
                        f"(github.com/{WAN21_REPO}, {WAN21_PATH}) for a tiny random decoder."),
        "wan21_repo": WAN21_REPO,
        "wan21_commit": WAN21_COMMIT,
        "wan21_path": WAN21_PATH,
        "generator": "tools/make_vae_fixture.py (official classes copied verbatim)",
        "torch_version": torch.__version__,
        "config": {**CONFIG, "latent_mean": MEAN, "latent_std": STD},
        "temperal_upsample": CONFIG["temperal_downsample"][::-1],
        "param_seed": PARAM_SEED,
        "input_seed": INPUT_SEED,
        "dtype": "float32",
        "device": "cpu",
        "init": (f"torch.manual_seed(param_seed); m = WanVAE_(**config, dropout=0.0) (official "
                 "init, encoder included, consumes RNG); then, without reseeding, for each "
                 "'decoder.*' / 'conv2.*' parameter in named_parameters order: '.gamma' <- "
                 f"1 + {GAMMA_STD} * randn, '.bias' <- normal(0, {BIAS_STD}), weights <- "
                 "normal(0, 1/sqrt(fan_in)) with fan_in = in_channels * kernel volume."),
        "inputs": ("torch.manual_seed(input_seed); input.z = torch.randn(latent_shape): the "
                   "normalised latent, as the DiT produces it."),
        "decode": ("For each sample u: WanVAE_.decode(u.unsqueeze(0), scale=[mean, 1/std]) "
                   "(z / (1/std) + mean; conv2; Decoder3d one latent frame at a time with "
                   "feat_cache, CACHE_T=2), then .float().clamp_(-1, 1) as WanVAE.decode; "
                   "torch.no_grad(), eval()."),
        "layouts": ("All tensors NCDHW ([B, C, T, H, W]); parameters keep the official "
                    "state-dict names and layouts (Conv3d [O, I, kt, kh, kw], Conv2d "
                    "[O, I, kh, kw], RMS_norm gamma [C, 1, 1, 1] or [C, 1, 1])."),
        "param_keys": {k: list(v.shape) for k, v in params.items()},
        "num_params": num_params,
        "input_keys": {"input.z": list(z.shape)},
        "output_keys": {"output.video": list(video.shape),
                        "output.unclamped": list(tensors["output.unclamped"].shape)},
        "intermediate_keys": {k: list(v.shape) for k, v in tensors.items()
                              if k.startswith("intermediate.")},
        "intermediate_notes": {
            "intermediate.conv2": "conv2(z / (1/std) + mean), the decoder's input",
            "intermediate.middle": "output of decoder.middle[2] (end of the middle blocks)",
            **{f"intermediate.upsamples.{i}": f"output of decoder.upsamples[{i}] (upsample3d: "
               "time then space upsampling), chunks concatenated in time" for i in upsample3d},
        },
        "output_stats": {
            "mean": float(video.mean()), "std": float(video.std()),
            "unclamped_abs_max": float(tensors["output.unclamped"].abs().max()),
            "fraction_clamped": float((tensors["output.unclamped"].abs() > 1).float().mean()),
        },
    }
    (OUT / f"{NAME}.json").write_text(json.dumps(meta, indent=1) + "\n")
    size = (OUT / f"{NAME}.safetensors").stat().st_size
    print(f"{num_params} parameters, {size} bytes; video {tuple(video.shape)}; "
          f"stats {meta['output_stats']}; numpy {np.__version__}", file=sys.stderr)


ENCODER_NAME = "wan21_vae_encoder_tiny"
ENCODER_PARAM_SEED = 1
ENCODER_INPUT_SEED = 11
VIDEO_SHAPE = (2, 3, 9, 16, 24)  # [B, 3, 1 + 4 k, H, W]: chunks of 1, 4, 4 frames


def main_encoder() -> None:
    torch.manual_seed(ENCODER_PARAM_SEED)
    model = WanVAE_(**CONFIG, dropout=0.0).eval()
    params = randomise(model, ("encoder.", "conv1."))
    torch.manual_seed(ENCODER_INPUT_SEED)
    video = torch.rand(VIDEO_SHAPE) * 2 - 1
    scale = [torch.tensor(MEAN, dtype=torch.float32), 1.0 / torch.tensor(STD, dtype=torch.float32)]
    latents, features = [], []
    with torch.no_grad():
        for u in video:
            chunks, handles = record({"encoder": model.encoder})
            latents.append(model.encode(u.unsqueeze(0), scale).float())  # WanVAE.encode
            for h in handles:
                h.remove()
            features.append(torch.cat(chunks["encoder"], 2))
    mu = torch.cat(latents)
    tensors = {**params, "input.video": video, "output.mu": mu,
               "intermediate.encoder": torch.cat(features)}
    save_file({k: v.contiguous() for k, v in tensors.items()}, OUT / f"{ENCODER_NAME}.safetensors")
    meta = {
        "description": ("Golden reference from the official Wan2.1 PyTorch video VAE encoder "
                        f"(github.com/{WAN21_REPO}, {WAN21_PATH}) for a tiny random encoder."),
        "wan21_repo": WAN21_REPO,
        "wan21_commit": WAN21_COMMIT,
        "wan21_path": WAN21_PATH,
        "generator": "tools/make_vae_fixture.py --encoder (official classes copied verbatim)",
        "torch_version": torch.__version__,
        "config": {**CONFIG, "latent_mean": MEAN, "latent_std": STD},
        "param_seed": ENCODER_PARAM_SEED,
        "input_seed": ENCODER_INPUT_SEED,
        "dtype": "float32",
        "init": ("As the decoder fixture's, for the 'encoder.*' / 'conv1.*' parameters."),
        "inputs": ("torch.manual_seed(input_seed); input.video = torch.rand(video_shape) * 2 - 1"),
        "encode": ("For each sample u: WanVAE_.encode(u.unsqueeze(0), scale=[mean, 1/std]) "
                   "(Encoder3d on the first frame, then 4 frames at a time with feat_cache; "
                   "conv1; mu = first z_dim channels; (mu - mean) * (1/std)); torch.no_grad()."),
        "param_keys": {k: list(v.shape) for k, v in params.items()},
        "input_keys": {"input.video": list(video.shape)},
        "output_keys": {"output.mu": list(mu.shape)},
        "intermediate_notes": {"intermediate.encoder": "Encoder3d's output (2 z_dim channels), "
                               "chunks concatenated in time, before conv1"},
    }
    (OUT / f"{ENCODER_NAME}.json").write_text(json.dumps(meta, indent=1) + "\n")
    print(f"video {tuple(video.shape)} -> mu {tuple(mu.shape)}", file=sys.stderr)


if __name__ == "__main__":
    main_encoder() if sys.argv[1:] == ["--encoder"] else main()
