"""Mixer names → builders that derive each mixer's config from the model args."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from torch import nn

from titan_delta.models.mixers.attention import AttentionConfig, SoftmaxAttention
from titan_delta.models.mixers.deltaformer import DeltaFormerAttention, DeltaFormerConfig
from titan_delta.models.mixers.gated_deltaproduct import GatedDeltaProduct, GatedDeltaProductConfig
from titan_delta.models.mixers.names import MIXER_NAMES

if TYPE_CHECKING:
    from titan_delta.models.args import ModelArgs


def _attention(args: ModelArgs, window: int | None) -> SoftmaxAttention:
    return SoftmaxAttention(
        AttentionConfig(
            dim=args.dim,
            n_heads=args.n_heads,
            n_kv_heads=args.kv_heads,
            head_dim=args.attn_head_dim,
            window=window,
            qk_norm=args.qk_norm,
            use_rope=args.attn_rope,
            rope_theta=args.rope_theta,
            norm_eps=args.norm_eps,
        )
    )


def build_full_attention(args: ModelArgs) -> nn.Module:
    return _attention(args, window=None)


def build_sliding_window_attention(args: ModelArgs) -> nn.Module:
    return _attention(args, window=args.window_size)


def build_deltaformer(args: ModelArgs) -> nn.Module:
    return DeltaFormerAttention(
        DeltaFormerConfig(
            dim=args.dim,
            n_heads=args.n_heads,
            n_kv_heads=args.kv_heads,
            head_dim=args.attn_head_dim,
            kernel=args.deltaformer_kernel,
            probe=args.deltaformer_probe,
            beta=args.deltaformer_beta,
            use_rope=args.deltaformer_rope,
            rope_theta=args.rope_theta,
            qk_norm=args.qk_norm,
            norm_eps=args.norm_eps,
            backend=args.op_backend,
        )
    )


def build_gated_deltaproduct(args: ModelArgs) -> nn.Module:
    return GatedDeltaProduct(
        GatedDeltaProductConfig(
            dim=args.dim,
            n_heads=args.gdp_heads,
            head_dim=args.gdp_key_dim,
            head_v_dim=args.gdp_value_dim,
            num_householder=args.gdp_num_householder,
            allow_neg_eigval=args.gdp_allow_neg_eigval,
            conv_size=args.gdp_conv_size,
            use_forget_gate=args.gdp_forget_gate,
            use_short_conv=args.gdp_short_conv,
            use_output_gate=args.gdp_output_gate,
            norm_eps=args.norm_eps,
            backend=args.op_backend,
        )
    )


MIXER_BUILDERS: dict[str, Callable[[ModelArgs], nn.Module]] = {
    "attention": build_full_attention,
    "swa": build_sliding_window_attention,
    "deltaformer": build_deltaformer,
    "gated_deltaproduct": build_gated_deltaproduct,
}
if tuple(MIXER_BUILDERS) != MIXER_NAMES:  # one list of names for the args' checks and the builders
    raise ImportError(f"mixer builders {tuple(MIXER_BUILDERS)} do not match names.MIXER_NAMES {MIXER_NAMES}")


def build_mixer(name: str, args: ModelArgs) -> nn.Module:
    if name not in MIXER_BUILDERS:
        raise ValueError(f"unknown mixer {name!r}; expected one of {MIXER_NAMES}")
    return MIXER_BUILDERS[name](args)
