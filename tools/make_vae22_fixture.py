"""Generate the Wan 2.2 VAE decoder golden fixture (tests/data/wan22_vae_tiny.*) and, with
``--encoder``, the encoder's (tests/data/wan22_vae_encoder_tiny.*) with torch.

One-off: needs torch, einops, safetensors and numpy in a throwaway environment (never the
project's), e.g. ``python3 -m venv /tmp/torchenv && /tmp/torchenv/bin/pip install torch einops
safetensors numpy``, then ``/tmp/torchenv/bin/python tools/make_vae22_fixture.py``. Neither the
tests nor CI run it; they read the files it writes.

It builds a tiny ``WanVAE_`` (the Wan 2.2 one, which TI2V-5B's ``Wan2_2_VAE`` wraps) from the
official classes copied verbatim below, randomises every decoder parameter with a fixed seed,
and runs the official frame-by-frame ``WanVAE_.decode`` (un-normalise, ``conv2``, one latent
frame at a time through ``Decoder3d`` with ``feat_cache`` and ``first_chunk``, ``unpatchify``)
followed by ``Wan2_2_VAE.decode``'s ``.float().clamp_(-1, 1)``, one sample at a time as
``Wan2_2_VAE.decode`` does. With ``--encoder`` it randomises the encoder's parameters
(``encoder.*``, ``conv1.*``) and runs the official ``WanVAE_.encode`` (``patchify``, the first
frame alone, then 4 frames at a time with ``feat_cache``; ``conv1``; the mean half
normalised) on a video and on single frames, as TI2V-5B encodes its image
(``textimage2video.py``: ``self.vae.encode([img])`` with ``img`` ``[3, 1, H, W]``).
"""

# The block between the VERBATIM markers is the official code, unmodified, hence its style.
# ruff: noqa: B006, B905, F841, RUF005, RUF007, RUF059

import json
import sys
from pathlib import Path

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F
from einops import rearrange
from safetensors.torch import save_file

WAN22_REPO = "Wan-Video/Wan2.2"
WAN22_COMMIT = "42bf4cfaa384bc21833865abc2f9e6c0e67233dc"
WAN22_PATH = "wan/modules/vae2_2.py"

# ----- BEGIN VERBATIM: github.com/Wan-Video/Wan2.2, wan/modules/vae2_2.py at
# 42bf4cfaa384bc21833865abc2f9e6c0e67233dc, lines 14-860 (CACHE_T .. WanVAE_.clear_cache).
CACHE_T = 2


class CausalConv3d(nn.Conv3d):
    """
    Causal 3d convolusion.
    """

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self._padding = (
            self.padding[2],
            self.padding[2],
            self.padding[1],
            self.padding[1],
            2 * self.padding[0],
            0,
        )
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
        self.bias = nn.Parameter(torch.zeros(shape)) if bias else 0.0

    def forward(self, x):
        return (F.normalize(x, dim=(1 if self.channel_first else -1)) *
                self.scale * self.gamma + self.bias)


class Upsample(nn.Upsample):

    def forward(self, x):
        """
        Fix bfloat16 support for nearest neighbor interpolation.
        """
        return super().forward(x.float()).type_as(x)


class Resample(nn.Module):

    def __init__(self, dim, mode):
        assert mode in (
            "none",
            "upsample2d",
            "upsample3d",
            "downsample2d",
            "downsample3d",
        )
        super().__init__()
        self.dim = dim
        self.mode = mode

        # layers
        if mode == "upsample2d":
            self.resample = nn.Sequential(
                Upsample(scale_factor=(2.0, 2.0), mode="nearest-exact"),
                nn.Conv2d(dim, dim, 3, padding=1),
            )
        elif mode == "upsample3d":
            self.resample = nn.Sequential(
                Upsample(scale_factor=(2.0, 2.0), mode="nearest-exact"),
                nn.Conv2d(dim, dim, 3, padding=1),
                # nn.Conv2d(dim, dim//2, 3, padding=1)
            )
            self.time_conv = CausalConv3d(
                dim, dim * 2, (3, 1, 1), padding=(1, 0, 0))
        elif mode == "downsample2d":
            self.resample = nn.Sequential(
                nn.ZeroPad2d((0, 1, 0, 1)),
                nn.Conv2d(dim, dim, 3, stride=(2, 2)))
        elif mode == "downsample3d":
            self.resample = nn.Sequential(
                nn.ZeroPad2d((0, 1, 0, 1)),
                nn.Conv2d(dim, dim, 3, stride=(2, 2)))
            self.time_conv = CausalConv3d(
                dim, dim, (3, 1, 1), stride=(2, 1, 1), padding=(0, 0, 0))
        else:
            self.resample = nn.Identity()

    def forward(self, x, feat_cache=None, feat_idx=[0]):
        b, c, t, h, w = x.size()
        if self.mode == "upsample3d":
            if feat_cache is not None:
                idx = feat_idx[0]
                if feat_cache[idx] is None:
                    feat_cache[idx] = "Rep"
                    feat_idx[0] += 1
                else:
                    cache_x = x[:, :, -CACHE_T:, :, :].clone()
                    if (cache_x.shape[2] < 2 and feat_cache[idx] is not None and
                            feat_cache[idx] != "Rep"):
                        # cache last frame of last two chunk
                        cache_x = torch.cat(
                            [
                                feat_cache[idx][:, :, -1, :, :].unsqueeze(2).to(
                                    cache_x.device),
                                cache_x,
                            ],
                            dim=2,
                        )
                    if (cache_x.shape[2] < 2 and feat_cache[idx] is not None and
                            feat_cache[idx] == "Rep"):
                        cache_x = torch.cat(
                            [
                                torch.zeros_like(cache_x).to(cache_x.device),
                                cache_x
                            ],
                            dim=2,
                        )
                    if feat_cache[idx] == "Rep":
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
        x = rearrange(x, "b c t h w -> (b t) c h w")
        x = self.resample(x)
        x = rearrange(x, "(b t) c h w -> b c t h w", t=t)

        if self.mode == "downsample3d":
            if feat_cache is not None:
                idx = feat_idx[0]
                if feat_cache[idx] is None:
                    feat_cache[idx] = x.clone()
                    feat_idx[0] += 1
                else:
                    cache_x = x[:, :, -1:, :, :].clone()
                    x = self.time_conv(
                        torch.cat([feat_cache[idx][:, :, -1:, :, :], x], 2))
                    feat_cache[idx] = cache_x
                    feat_idx[0] += 1
        return x

    def init_weight(self, conv):
        conv_weight = conv.weight.detach().clone()
        nn.init.zeros_(conv_weight)
        c1, c2, t, h, w = conv_weight.size()
        one_matrix = torch.eye(c1, c2)
        init_matrix = one_matrix
        nn.init.zeros_(conv_weight)
        conv_weight.data[:, :, 1, 0, 0] = init_matrix  # * 0.5
        conv.weight = nn.Parameter(conv_weight)
        nn.init.zeros_(conv.bias.data)

    def init_weight2(self, conv):
        conv_weight = conv.weight.data.detach().clone()
        nn.init.zeros_(conv_weight)
        c1, c2, t, h, w = conv_weight.size()
        init_matrix = torch.eye(c1 // 2, c2)
        conv_weight[:c1 // 2, :, -1, 0, 0] = init_matrix
        conv_weight[c1 // 2:, :, -1, 0, 0] = init_matrix
        conv.weight = nn.Parameter(conv_weight)
        nn.init.zeros_(conv.bias.data)


class ResidualBlock(nn.Module):

    def __init__(self, in_dim, out_dim, dropout=0.0):
        super().__init__()
        self.in_dim = in_dim
        self.out_dim = out_dim

        # layers
        self.residual = nn.Sequential(
            RMS_norm(in_dim, images=False),
            nn.SiLU(),
            CausalConv3d(in_dim, out_dim, 3, padding=1),
            RMS_norm(out_dim, images=False),
            nn.SiLU(),
            nn.Dropout(dropout),
            CausalConv3d(out_dim, out_dim, 3, padding=1),
        )
        self.shortcut = (
            CausalConv3d(in_dim, out_dim, 1)
            if in_dim != out_dim else nn.Identity())

    def forward(self, x, feat_cache=None, feat_idx=[0]):
        h = self.shortcut(x)
        for layer in self.residual:
            if isinstance(layer, CausalConv3d) and feat_cache is not None:
                idx = feat_idx[0]
                cache_x = x[:, :, -CACHE_T:, :, :].clone()
                if cache_x.shape[2] < 2 and feat_cache[idx] is not None:
                    # cache last frame of last two chunk
                    cache_x = torch.cat(
                        [
                            feat_cache[idx][:, :, -1, :, :].unsqueeze(2).to(
                                cache_x.device),
                            cache_x,
                        ],
                        dim=2,
                    )
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
        x = rearrange(x, "b c t h w -> (b t) c h w")
        x = self.norm(x)
        # compute query, key, value
        q, k, v = (
            self.to_qkv(x).reshape(b * t, 1, c * 3,
                                   -1).permute(0, 1, 3,
                                               2).contiguous().chunk(3, dim=-1))

        # apply attention
        x = F.scaled_dot_product_attention(
            q,
            k,
            v,
        )
        x = x.squeeze(1).permute(0, 2, 1).reshape(b * t, c, h, w)

        # output
        x = self.proj(x)
        x = rearrange(x, "(b t) c h w-> b c t h w", t=t)
        return x + identity


def patchify(x, patch_size):
    if patch_size == 1:
        return x
    if x.dim() == 4:
        x = rearrange(
            x, "b c (h q) (w r) -> b (c r q) h w", q=patch_size, r=patch_size)
    elif x.dim() == 5:
        x = rearrange(
            x,
            "b c f (h q) (w r) -> b (c r q) f h w",
            q=patch_size,
            r=patch_size,
        )
    else:
        raise ValueError(f"Invalid input shape: {x.shape}")

    return x


def unpatchify(x, patch_size):
    if patch_size == 1:
        return x

    if x.dim() == 4:
        x = rearrange(
            x, "b (c r q) h w -> b c (h q) (w r)", q=patch_size, r=patch_size)
    elif x.dim() == 5:
        x = rearrange(
            x,
            "b (c r q) f h w -> b c f (h q) (w r)",
            q=patch_size,
            r=patch_size,
        )
    return x


class AvgDown3D(nn.Module):

    def __init__(
        self,
        in_channels,
        out_channels,
        factor_t,
        factor_s=1,
    ):
        super().__init__()
        self.in_channels = in_channels
        self.out_channels = out_channels
        self.factor_t = factor_t
        self.factor_s = factor_s
        self.factor = self.factor_t * self.factor_s * self.factor_s

        assert in_channels * self.factor % out_channels == 0
        self.group_size = in_channels * self.factor // out_channels

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        pad_t = (self.factor_t - x.shape[2] % self.factor_t) % self.factor_t
        pad = (0, 0, 0, 0, pad_t, 0)
        x = F.pad(x, pad)
        B, C, T, H, W = x.shape
        x = x.view(
            B,
            C,
            T // self.factor_t,
            self.factor_t,
            H // self.factor_s,
            self.factor_s,
            W // self.factor_s,
            self.factor_s,
        )
        x = x.permute(0, 1, 3, 5, 7, 2, 4, 6).contiguous()
        x = x.view(
            B,
            C * self.factor,
            T // self.factor_t,
            H // self.factor_s,
            W // self.factor_s,
        )
        x = x.view(
            B,
            self.out_channels,
            self.group_size,
            T // self.factor_t,
            H // self.factor_s,
            W // self.factor_s,
        )
        x = x.mean(dim=2)
        return x


class DupUp3D(nn.Module):

    def __init__(
        self,
        in_channels: int,
        out_channels: int,
        factor_t,
        factor_s=1,
    ):
        super().__init__()
        self.in_channels = in_channels
        self.out_channels = out_channels

        self.factor_t = factor_t
        self.factor_s = factor_s
        self.factor = self.factor_t * self.factor_s * self.factor_s

        assert out_channels * self.factor % in_channels == 0
        self.repeats = out_channels * self.factor // in_channels

    def forward(self, x: torch.Tensor, first_chunk=False) -> torch.Tensor:
        x = x.repeat_interleave(self.repeats, dim=1)
        x = x.view(
            x.size(0),
            self.out_channels,
            self.factor_t,
            self.factor_s,
            self.factor_s,
            x.size(2),
            x.size(3),
            x.size(4),
        )
        x = x.permute(0, 1, 5, 2, 6, 3, 7, 4).contiguous()
        x = x.view(
            x.size(0),
            self.out_channels,
            x.size(2) * self.factor_t,
            x.size(4) * self.factor_s,
            x.size(6) * self.factor_s,
        )
        if first_chunk:
            x = x[:, :, self.factor_t - 1:, :, :]
        return x


class Down_ResidualBlock(nn.Module):

    def __init__(self,
                 in_dim,
                 out_dim,
                 dropout,
                 mult,
                 temperal_downsample=False,
                 down_flag=False):
        super().__init__()

        # Shortcut path with downsample
        self.avg_shortcut = AvgDown3D(
            in_dim,
            out_dim,
            factor_t=2 if temperal_downsample else 1,
            factor_s=2 if down_flag else 1,
        )

        # Main path with residual blocks and downsample
        downsamples = []
        for _ in range(mult):
            downsamples.append(ResidualBlock(in_dim, out_dim, dropout))
            in_dim = out_dim

        # Add the final downsample block
        if down_flag:
            mode = "downsample3d" if temperal_downsample else "downsample2d"
            downsamples.append(Resample(out_dim, mode=mode))

        self.downsamples = nn.Sequential(*downsamples)

    def forward(self, x, feat_cache=None, feat_idx=[0]):
        x_copy = x.clone()
        for module in self.downsamples:
            x = module(x, feat_cache, feat_idx)

        return x + self.avg_shortcut(x_copy)


class Up_ResidualBlock(nn.Module):

    def __init__(self,
                 in_dim,
                 out_dim,
                 dropout,
                 mult,
                 temperal_upsample=False,
                 up_flag=False):
        super().__init__()
        # Shortcut path with upsample
        if up_flag:
            self.avg_shortcut = DupUp3D(
                in_dim,
                out_dim,
                factor_t=2 if temperal_upsample else 1,
                factor_s=2 if up_flag else 1,
            )
        else:
            self.avg_shortcut = None

        # Main path with residual blocks and upsample
        upsamples = []
        for _ in range(mult):
            upsamples.append(ResidualBlock(in_dim, out_dim, dropout))
            in_dim = out_dim

        # Add the final upsample block
        if up_flag:
            mode = "upsample3d" if temperal_upsample else "upsample2d"
            upsamples.append(Resample(out_dim, mode=mode))

        self.upsamples = nn.Sequential(*upsamples)

    def forward(self, x, feat_cache=None, feat_idx=[0], first_chunk=False):
        x_main = x.clone()
        for module in self.upsamples:
            x_main = module(x_main, feat_cache, feat_idx)
        if self.avg_shortcut is not None:
            x_shortcut = self.avg_shortcut(x, first_chunk)
            return x_main + x_shortcut
        else:
            return x_main


class Encoder3d(nn.Module):

    def __init__(
        self,
        dim=128,
        z_dim=4,
        dim_mult=[1, 2, 4, 4],
        num_res_blocks=2,
        attn_scales=[],
        temperal_downsample=[True, True, False],
        dropout=0.0,
    ):
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
        self.conv1 = CausalConv3d(12, dims[0], 3, padding=1)

        # downsample blocks
        downsamples = []
        for i, (in_dim, out_dim) in enumerate(zip(dims[:-1], dims[1:])):
            t_down_flag = (
                temperal_downsample[i]
                if i < len(temperal_downsample) else False)
            downsamples.append(
                Down_ResidualBlock(
                    in_dim=in_dim,
                    out_dim=out_dim,
                    dropout=dropout,
                    mult=num_res_blocks,
                    temperal_downsample=t_down_flag,
                    down_flag=i != len(dim_mult) - 1,
                ))
            scale /= 2.0
        self.downsamples = nn.Sequential(*downsamples)

        # middle blocks
        self.middle = nn.Sequential(
            ResidualBlock(out_dim, out_dim, dropout),
            AttentionBlock(out_dim),
            ResidualBlock(out_dim, out_dim, dropout),
        )

        # # output blocks
        self.head = nn.Sequential(
            RMS_norm(out_dim, images=False),
            nn.SiLU(),
            CausalConv3d(out_dim, z_dim, 3, padding=1),
        )

    def forward(self, x, feat_cache=None, feat_idx=[0]):

        if feat_cache is not None:
            idx = feat_idx[0]
            cache_x = x[:, :, -CACHE_T:, :, :].clone()
            if cache_x.shape[2] < 2 and feat_cache[idx] is not None:
                cache_x = torch.cat(
                    [
                        feat_cache[idx][:, :, -1, :, :].unsqueeze(2).to(
                            cache_x.device),
                        cache_x,
                    ],
                    dim=2,
                )
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
                    cache_x = torch.cat(
                        [
                            feat_cache[idx][:, :, -1, :, :].unsqueeze(2).to(
                                cache_x.device),
                            cache_x,
                        ],
                        dim=2,
                    )
                x = layer(x, feat_cache[idx])
                feat_cache[idx] = cache_x
                feat_idx[0] += 1
            else:
                x = layer(x)

        return x


class Decoder3d(nn.Module):

    def __init__(
        self,
        dim=128,
        z_dim=4,
        dim_mult=[1, 2, 4, 4],
        num_res_blocks=2,
        attn_scales=[],
        temperal_upsample=[False, True, True],
        dropout=0.0,
    ):
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
            ResidualBlock(dims[0], dims[0], dropout),
            AttentionBlock(dims[0]),
            ResidualBlock(dims[0], dims[0], dropout),
        )

        # upsample blocks
        upsamples = []
        for i, (in_dim, out_dim) in enumerate(zip(dims[:-1], dims[1:])):
            t_up_flag = temperal_upsample[i] if i < len(
                temperal_upsample) else False
            upsamples.append(
                Up_ResidualBlock(
                    in_dim=in_dim,
                    out_dim=out_dim,
                    dropout=dropout,
                    mult=num_res_blocks + 1,
                    temperal_upsample=t_up_flag,
                    up_flag=i != len(dim_mult) - 1,
                ))
        self.upsamples = nn.Sequential(*upsamples)

        # output blocks
        self.head = nn.Sequential(
            RMS_norm(out_dim, images=False),
            nn.SiLU(),
            CausalConv3d(out_dim, 12, 3, padding=1),
        )

    def forward(self, x, feat_cache=None, feat_idx=[0], first_chunk=False):
        if feat_cache is not None:
            idx = feat_idx[0]
            cache_x = x[:, :, -CACHE_T:, :, :].clone()
            if cache_x.shape[2] < 2 and feat_cache[idx] is not None:
                cache_x = torch.cat(
                    [
                        feat_cache[idx][:, :, -1, :, :].unsqueeze(2).to(
                            cache_x.device),
                        cache_x,
                    ],
                    dim=2,
                )
            x = self.conv1(x, feat_cache[idx])
            feat_cache[idx] = cache_x
            feat_idx[0] += 1
        else:
            x = self.conv1(x)

        for layer in self.middle:
            if isinstance(layer, ResidualBlock) and feat_cache is not None:
                x = layer(x, feat_cache, feat_idx)
            else:
                x = layer(x)

        ## upsamples
        for layer in self.upsamples:
            if feat_cache is not None:
                x = layer(x, feat_cache, feat_idx, first_chunk)
            else:
                x = layer(x)

        ## head
        for layer in self.head:
            if isinstance(layer, CausalConv3d) and feat_cache is not None:
                idx = feat_idx[0]
                cache_x = x[:, :, -CACHE_T:, :, :].clone()
                if cache_x.shape[2] < 2 and feat_cache[idx] is not None:
                    cache_x = torch.cat(
                        [
                            feat_cache[idx][:, :, -1, :, :].unsqueeze(2).to(
                                cache_x.device),
                            cache_x,
                        ],
                        dim=2,
                    )
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

    def __init__(
        self,
        dim=160,
        dec_dim=256,
        z_dim=16,
        dim_mult=[1, 2, 4, 4],
        num_res_blocks=2,
        attn_scales=[],
        temperal_downsample=[True, True, False],
        dropout=0.0,
    ):
        super().__init__()
        self.dim = dim
        self.z_dim = z_dim
        self.dim_mult = dim_mult
        self.num_res_blocks = num_res_blocks
        self.attn_scales = attn_scales
        self.temperal_downsample = temperal_downsample
        self.temperal_upsample = temperal_downsample[::-1]

        # modules
        self.encoder = Encoder3d(
            dim,
            z_dim * 2,
            dim_mult,
            num_res_blocks,
            attn_scales,
            self.temperal_downsample,
            dropout,
        )
        self.conv1 = CausalConv3d(z_dim * 2, z_dim * 2, 1)
        self.conv2 = CausalConv3d(z_dim, z_dim, 1)
        self.decoder = Decoder3d(
            dec_dim,
            z_dim,
            dim_mult,
            num_res_blocks,
            attn_scales,
            self.temperal_upsample,
            dropout,
        )

    def forward(self, x, scale=[0, 1]):
        mu = self.encode(x, scale)
        x_recon = self.decode(mu, scale)
        return x_recon, mu

    def encode(self, x, scale):
        self.clear_cache()
        x = patchify(x, patch_size=2)
        t = x.shape[2]
        iter_ = 1 + (t - 1) // 4
        for i in range(iter_):
            self._enc_conv_idx = [0]
            if i == 0:
                out = self.encoder(
                    x[:, :, :1, :, :],
                    feat_cache=self._enc_feat_map,
                    feat_idx=self._enc_conv_idx,
                )
            else:
                out_ = self.encoder(
                    x[:, :, 1 + 4 * (i - 1):1 + 4 * i, :, :],
                    feat_cache=self._enc_feat_map,
                    feat_idx=self._enc_conv_idx,
                )
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
                    feat_idx=self._conv_idx,
                    first_chunk=True,
                )
            else:
                out_ = self.decoder(
                    x[:, :, i:i + 1, :, :],
                    feat_cache=self._feat_map,
                    feat_idx=self._conv_idx,
                )
                out = torch.cat([out, out_], 2)
        out = unpatchify(out, patch_size=2)
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
        # cache encode
        self._enc_conv_num = count_conv3d(self.encoder)
        self._enc_conv_idx = [0]
        self._enc_feat_map = [None] * self._enc_conv_num


# ----- END VERBATIM

# Official latent statistics, from Wan2_2_VAE.__init__ in the same file.
MEAN = [
    -0.2289, -0.0052, -0.1323, -0.2339, -0.2799, 0.0174, 0.1838, 0.1557,
    -0.1382, 0.0542, 0.2813, 0.0891, 0.1570, -0.0098, 0.0375, -0.1825,
    -0.2246, -0.1207, -0.0698, 0.5109, 0.2665, -0.2108, -0.2158, 0.2502,
    -0.2055, -0.0322, 0.1109, 0.1567, -0.0729, 0.0899, -0.2799, -0.1230,
    -0.0313, -0.1649, 0.0117, 0.0723, -0.2839, -0.2083, -0.0520, 0.3748,
    0.0152, 0.1957, 0.1433, -0.2944, 0.3573, -0.0548, -0.1681, -0.0667,
]
STD = [
    0.4765, 1.0364, 0.4514, 1.1677, 0.5313, 0.4990, 0.4818, 0.5013,
    0.8158, 1.0344, 0.5894, 1.0901, 0.6885, 0.6165, 0.8454, 0.4978,
    0.5759, 0.3523, 0.7135, 0.6804, 0.5833, 1.4146, 0.8986, 0.5659,
    0.7069, 0.5338, 0.4889, 0.4917, 0.4069, 0.4999, 0.6866, 0.4093,
    0.5709, 0.6065, 0.6415, 0.4944, 0.5726, 1.2042, 0.5458, 1.6887,
    0.3971, 1.0600, 0.3943, 0.5537, 0.5444, 0.4089, 0.7468, 0.7744,
]

# Tiny model: the official Wan 2.2 layout (z_dim 48, dim_mult [1, 2, 4, 4],
# temperal_downsample [False, True, True] as Wan2_2_VAE passes it, attn_scales []) with the
# decoder at dec_dim 4 instead of 256 (encoder dim 4 instead of 160; it is built, consuming
# RNG, but unused) and one residual block (+1) per decoder level instead of two (+1).
MODEL_ARGS = {
    "dim": 4,
    "dec_dim": 4,
    "z_dim": 48,
    "dim_mult": [1, 2, 4, 4],
    "num_res_blocks": 1,
    "attn_scales": [],
    "temperal_downsample": [False, True, True],
}
PARAM_SEED = 0
INPUT_SEED = 10
LATENT_SHAPE = (2, 48, 3, 2, 3)  # [B, z_dim, T, h, w]; h != w catches a swapped unpatchify
DUPUP_SEED = 20
DUPUP_SHAPE = (1, 16, 3, 2, 3)  # DupUp3D input [B, C, T, H, W]
DUPUP_OUT = 8
GAMMA_STD = 0.1
BIAS_STD = 0.1
OUT = Path(__file__).resolve().parents[1] / "tests" / "data"
NAME = "wan22_vae_tiny"


def randomise(model: nn.Module, prefixes: tuple[str, ...] = ("decoder.", "conv2.")
              ) -> dict[str, torch.Tensor]:
    """Every parameter under ``prefixes`` random, so that none is left at an identity-like
    init.

    The official init leaves RMS_norm gammas at 1 and the attention ``proj`` at 0; a fixture
    with those would not test them.
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
    model = WanVAE_(**MODEL_ARGS, dropout=0.0).eval()
    params = randomise(model)
    torch.manual_seed(INPUT_SEED)
    z = torch.randn(LATENT_SHAPE)
    mean = torch.tensor(MEAN, dtype=torch.float32)
    std = torch.tensor(STD, dtype=torch.float32)
    scale = [mean, 1.0 / std]  # as Wan2_2_VAE.__init__

    # The last two levels' outputs (the largest) are left out to keep the file small.
    levels = len(model.decoder.upsamples) - 2
    watched = {"conv2": model.conv2, "middle": model.decoder.middle[2]}
    watched.update({f"upsamples.{i}": model.decoder.upsamples[i] for i in range(levels)})
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
            videos.append(out.float().clamp_(-1, 1))  # Wan2_2_VAE.decode
    video = torch.cat(videos)

    # DupUp3D where the time phases differ (in 16 -> out 8: phase p of channel o is input
    # channel 2 o + p): in the official layout both time-doubling shortcuts keep the width,
    # so the phase that first_chunk keeps would not show in output.video. Run as in decode:
    # one frame at a time, first_chunk=True on the first.
    torch.manual_seed(DUPUP_SEED)
    dupup_in = torch.randn(DUPUP_SHAPE)
    dupup = DupUp3D(DUPUP_SHAPE[1], DUPUP_OUT, factor_t=2, factor_s=2)
    dupup_out = torch.cat([dupup(dupup_in[:, :, i:i + 1], first_chunk=i == 0)
                           for i in range(DUPUP_SHAPE[2])], 2)
    tensors = dict(params)
    tensors["input.z"] = z
    tensors["output.video"] = video
    tensors["output.unclamped"] = torch.cat(unclamped)
    for name, parts in per_sample.items():
        tensors[f"intermediate.{name}"] = torch.cat(parts)
    tensors["dupup.input"] = dupup_in
    tensors["dupup.output"] = dupup_out
    tensors = {k: v.contiguous() for k, v in tensors.items()}
    save_file(tensors, OUT / f"{NAME}.safetensors")

    num_params = sum(p.numel() for p in params.values())
    # VAE22Config's fields: the decoder's arguments (dec_dim, not the encoder's dim; the Wan 2.2
    # decoder ignores attn_scales) and the latent statistics.
    config = {k: v for k, v in MODEL_ARGS.items() if k not in ("dim", "attn_scales")}
    meta = {
        "description": ("Golden reference from the official Wan2.2 PyTorch video VAE decoder "
                        f"(github.com/{WAN22_REPO}, {WAN22_PATH}; the VAE of TI2V-5B) for a "
                        "tiny random decoder."),
        "wan22_repo": WAN22_REPO,
        "wan22_commit": WAN22_COMMIT,
        "wan22_path": WAN22_PATH,
        "generator": "tools/make_vae22_fixture.py (official classes copied verbatim)",
        "torch_version": torch.__version__,
        "model_args": MODEL_ARGS,
        "config": {**config, "latent_mean": MEAN, "latent_std": STD},
        "temperal_upsample": MODEL_ARGS["temperal_downsample"][::-1],
        "param_seed": PARAM_SEED,
        "input_seed": INPUT_SEED,
        "dtype": "float32",
        "device": "cpu",
        "init": (f"torch.manual_seed(param_seed); m = WanVAE_(**model_args, dropout=0.0) "
                 "(official init, encoder included, consumes RNG); then, without reseeding, "
                 "for each 'decoder.*' / 'conv2.*' parameter in named_parameters order: "
                 f"'.gamma' <- 1 + {GAMMA_STD} * randn, '.bias' <- normal(0, {BIAS_STD}), "
                 "weights <- normal(0, 1/sqrt(fan_in)) with fan_in = in_channels * kernel "
                 "volume."),
        "inputs": ("torch.manual_seed(input_seed); input.z = torch.randn(latent_shape): the "
                   "normalised latent, as the DiT produces it."),
        "decode": ("For each sample u: WanVAE_.decode(u.unsqueeze(0), scale=[mean, 1/std]) "
                   "(z / (1/std) + mean; conv2; Decoder3d one latent frame at a time with "
                   "feat_cache, CACHE_T=2, first_chunk=True on frame 0; unpatchify with "
                   "patch_size 2), then .float().clamp_(-1, 1) as Wan2_2_VAE.decode; "
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
            **{f"intermediate.upsamples.{i}": f"output of decoder.upsamples[{i}] "
               "(Up_ResidualBlock: residual blocks and resampler plus the DupUp3D shortcut), "
               "chunks concatenated in time" for i in range(levels)},
        },
        "dupup_keys": {"dupup.input": list(dupup_in.shape),
                       "dupup.output": list(dupup_out.shape)},
        "dupup": (f"torch.manual_seed({DUPUP_SEED}); dupup.input = torch.randn(shape); "
                  f"dupup.output = DupUp3D({DUPUP_SHAPE[1]}, {DUPUP_OUT}, factor_t=2, "
                  "factor_s=2) applied one frame at a time, first_chunk=True on frame 0, "
                  "frames concatenated (as Up_ResidualBlock's shortcut during decode)."),
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


ENCODER_NAME = "wan22_vae_encoder_tiny"
ENCODER_PARAM_SEED = 1
ENCODER_INPUT_SEED = 11
# [B, 3, 1 + 4 k, H, W]: chunks of 1, 4, 4 frames; H, W multiples of 16 (3 halvings and the
# 2 x 2 patchify), H != W
VIDEO_SHAPE = (2, 3, 9, 32, 48)
IMAGE_SHAPE = (2, 3, 1, 32, 48)  # single frames, as TI2V-5B encodes its image


def main_encoder() -> None:
    torch.manual_seed(ENCODER_PARAM_SEED)
    model = WanVAE_(**MODEL_ARGS, dropout=0.0).eval()
    params = randomise(model, ("encoder.", "conv1."))
    torch.manual_seed(ENCODER_INPUT_SEED)
    video = torch.rand(VIDEO_SHAPE) * 2 - 1
    image = torch.rand(IMAGE_SHAPE) * 2 - 1
    scale = [torch.tensor(MEAN, dtype=torch.float32), 1.0 / torch.tensor(STD, dtype=torch.float32)]
    latents, features, images = [], [], []
    with torch.no_grad():
        for u in video:
            chunks, handles = record({"encoder": model.encoder})
            latents.append(model.encode(u.unsqueeze(0), scale).float())  # Wan2_2_VAE.encode
            for h in handles:
                h.remove()
            features.append(torch.cat(chunks["encoder"], 2))
        images = [model.encode(u.unsqueeze(0), scale).float() for u in image]
    mu = torch.cat(latents)
    image_mu = torch.cat(images)
    tensors = {**params, "input.video": video, "output.mu": mu,
               "intermediate.encoder": torch.cat(features), "input.image": image,
               "output.image_mu": image_mu}
    save_file({k: v.contiguous() for k, v in tensors.items()}, OUT / f"{ENCODER_NAME}.safetensors")
    config = {k: v for k, v in MODEL_ARGS.items() if k != "attn_scales"}
    meta = {
        "description": ("Golden reference from the official Wan2.2 PyTorch video VAE encoder "
                        f"(github.com/{WAN22_REPO}, {WAN22_PATH}; the VAE of TI2V-5B) for a tiny "
                        "random encoder."),
        "wan22_repo": WAN22_REPO,
        "wan22_commit": WAN22_COMMIT,
        "wan22_path": WAN22_PATH,
        "generator": "tools/make_vae22_fixture.py --encoder (official classes copied verbatim)",
        "torch_version": torch.__version__,
        "model_args": MODEL_ARGS,
        "config": {**config, "latent_mean": MEAN, "latent_std": STD},
        "param_seed": ENCODER_PARAM_SEED,
        "input_seed": ENCODER_INPUT_SEED,
        "dtype": "float32",
        "init": "As the decoder fixture's, for the 'encoder.*' / 'conv1.*' parameters.",
        "inputs": ("torch.manual_seed(input_seed); input.video = torch.rand(video_shape) * 2 - "
                   "1; then input.image = torch.rand(image_shape) * 2 - 1"),
        "encode": ("For each sample u: WanVAE_.encode(u.unsqueeze(0), scale=[mean, 1/std]) "
                   "(patchify(x, 2); Encoder3d on the first frame, then 4 frames at a time with "
                   "feat_cache; conv1; mu = first z_dim channels; (mu - mean) * (1/std)), "
                   ".float() as Wan2_2_VAE.encode; torch.no_grad(). output.image_mu: the same "
                   "on each one-frame input.image."),
        "param_keys": {k: list(v.shape) for k, v in params.items()},
        "input_keys": {"input.video": list(video.shape), "input.image": list(image.shape)},
        "output_keys": {"output.mu": list(mu.shape), "output.image_mu": list(image_mu.shape)},
        "intermediate_notes": {"intermediate.encoder": "Encoder3d's output (2 z_dim channels), "
                               "chunks concatenated in time, before conv1"},
    }
    (OUT / f"{ENCODER_NAME}.json").write_text(json.dumps(meta, indent=1) + "\n")
    print(f"video {tuple(video.shape)} -> mu {tuple(mu.shape)}; image -> "
          f"{tuple(image_mu.shape)}", file=sys.stderr)


if __name__ == "__main__":
    main_encoder() if sys.argv[1:] == ["--encoder"] else main()
