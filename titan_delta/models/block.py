"""Decoder block: x + mixer(RMSNorm(x)), then + SwiGLU(RMSNorm(·)). The mixer is chosen by name."""

from __future__ import annotations

import math

import torch
from torch import nn

from titan_delta.models.args import ModelArgs
from titan_delta.models.components.mlp import SwiGLU
from titan_delta.models.components.norms import RMSNorm
from titan_delta.models.context import MixerContext
from titan_delta.models.mixers.registry import build_mixer


class DecoderBlock(nn.Module):
    def __init__(self, layer_id: int, mixer_name: str, args: ModelArgs) -> None:
        super().__init__()
        self.layer_id = layer_id
        self.mixer_name = mixer_name
        self.mixer_norm = RMSNorm(args.dim, args.norm_eps)
        self.mixer = build_mixer(mixer_name, args)
        self.mlp_norm = RMSNorm(args.dim, args.norm_eps)
        self.mlp = SwiGLU(args.dim, args.ffn_dim)
        # Projections back into the residual stream shrink with depth so the stream's variance stays O(1).
        depth = layer_id + 1 if args.depth_init else args.n_layers
        self.init_std = args.init_std
        self.out_std = args.init_std / math.sqrt(2 * depth)

    def init_weights(self) -> None:
        self.mixer_norm.reset_parameters()
        self.mlp_norm.reset_parameters()
        self.mixer.init_weights(self.init_std, self.out_std)
        self.mlp.init_weights(self.init_std, self.out_std)

    def forward(self, x: torch.Tensor, ctx: MixerContext) -> torch.Tensor:
        if ctx.cache is None:
            h = x + self.mixer(self.mixer_norm(x), ctx)
        else:
            h = x + self.mixer(self.mixer_norm(x), ctx, cache=ctx.cache.layer(self.layer_id))
        return h + self.mlp(self.mlp_norm(h))
