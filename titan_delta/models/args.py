"""Model arguments: one dataclass for every family (torchtitan's BaseModelArgs), validated on creation.

Layer pattern (which mixer each layer uses), ``layer_pattern``:
- None: every layer uses ``mixer``.
- a string: a period of comma-separated mixer names, ``name*k`` repeating a name k times, tiled over the
  layers (n_layers must be a multiple of the period): "deltaformer*2,swa" = every 3rd layer SWA.
- a list/tuple of exactly n_layers names: one per layer.
Mixer names: "attention" (full causal), "swa" (sliding window), "deltaformer", "gated_deltaproduct".
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from torch import nn
from torchtitan.protocols.model import BaseModelArgs

from titan_delta.models.components.mlp import swiglu_hidden_dim
from titan_delta.models.mixers.attention_masks import ATTN_BACKENDS
from titan_delta.models.mixers.deltaformer import BETA_MODES, KAPPA_KERNELS, PROBES
from titan_delta.models.mixers.names import MIXER_NAMES

if TYPE_CHECKING:
    from torchtitan.config import JobConfig

OP_BACKENDS = ("auto", "torch", "triton")


def parse_layer_pattern(
    pattern: str | list[str] | tuple[str, ...] | None, mixer: str, n_layers: int
) -> tuple[str, ...]:
    """Resolve ``layer_pattern`` (see module docstring) into one mixer name per layer."""
    if pattern is None:
        names = [mixer] * n_layers
    elif isinstance(pattern, str):
        period: list[str] = []
        for item in (p.strip() for p in pattern.split(",")):
            name, _, count = item.partition("*")
            if not count:
                period.append(name.strip())
                continue
            if not count.strip().isdigit() or int(count) < 1:
                raise ValueError(
                    f"layer_pattern item {item!r}: repeat count after '*' must be a positive int"
                )
            period.extend([name.strip()] * int(count))
        if n_layers % len(period) != 0:
            raise ValueError(
                f"layer_pattern {pattern!r} has a period of {len(period)} layers, which does not divide "
                f"n_layers={n_layers}"
            )
        names = period * (n_layers // len(period))
    elif isinstance(pattern, list | tuple):
        names = list(pattern)
        if len(names) != n_layers:
            raise ValueError(f"layer_pattern lists {len(names)} mixers but n_layers={n_layers}")
    else:
        raise TypeError(
            f"layer_pattern must be None, a str or a list of mixer names, got {type(pattern).__name__}"
        )
    for i, name in enumerate(names):
        if name not in MIXER_NAMES:
            raise ValueError(
                f"layer_pattern: layer {i} has unknown mixer {name!r}; expected one of {MIXER_NAMES}"
            )
    return tuple(names)


@dataclass
class ModelArgs(BaseModelArgs):
    """Every field has a default (torchtitan requirement); families differ by ``mixer``/``layer_pattern``."""

    dim: int = 256
    n_layers: int = 2
    vocab_size: int = 32000
    max_seq_len: int = 2048  # training context; set from job_config.training.seq_len
    mixer: str = "deltaformer"  # mixer of every layer unless layer_pattern says otherwise
    layer_pattern: Any = None  # None | str | list[str] (see module docstring)

    # softmax attention / SWA / DeltaFormer heads
    n_heads: int = 4
    n_kv_heads: int | None = None  # GQA; None = n_heads
    head_dim: int | None = None  # None = dim // n_heads
    qk_norm: bool = False
    rope_theta: float = 10000.0
    attn_rope: bool = True  # softmax attention and SWA: False = NoPE (no rotary embedding at all)
    window_size: int = 512  # SWA: each query attends to its last `window_size` tokens (itself included)
    attn_backend: str = "auto"  # "auto" (flex on CUDA, dense SDPA on CPU) | "flex" | "sdpa"

    # DeltaFormer
    deltaformer_kernel: str = "softmax"  # κ1: softmax | linear | relu | round | exp
    deltaformer_probe: str = "q"  # stage-1 probe w: "q" or "k"
    deltaformer_beta: str = "sigmoid"  # "sigmoid" (learned per head) | "one" | "linear" (W x + b, FLA's)
    deltaformer_rope: bool = True  # False = NoPE

    # Gated DeltaProduct
    gdp_n_heads: int | None = None  # None = n_heads
    gdp_head_dim: int | None = None  # key dim per head; None = dim // gdp_n_heads
    gdp_expand_v: float = 1.0  # value dim per head = gdp_expand_v · key dim
    gdp_num_householder: int = 2
    gdp_allow_neg_eigval: bool = False
    gdp_conv_size: int = 4
    gdp_forget_gate: bool = True  # False: no decay (g = None), as the DeltaProduct state-tracking runs
    gdp_short_conv: bool = True  # False: q, k, v = SiLU(projection)
    gdp_output_gate: bool = True  # False: plain RMSNorm of each head's output

    # MLP, norms, embeddings, init
    ffn_hidden_dim: int | None = None  # None = swiglu_hidden_dim(dim, ffn_hidden_ratio, multiple_of)
    ffn_hidden_ratio: float = 4.0
    multiple_of: int = 256
    norm_eps: float = 1e-6
    enable_weight_tying: bool = False  # LM head shares the embedding matrix
    init_std: float = 0.02
    depth_init: bool = True  # output projections of layer l get std init_std / sqrt(2(l+1)), else / sqrt(2L)
    op_backend: str = "auto"  # backend passed to the DeltaFormer / Gated DeltaProduct ops

    def __post_init__(self) -> None:
        if isinstance(self.layer_pattern, list):
            self.layer_pattern = tuple(self.layer_pattern)
        self.validate()

    # ----- derived sizes -----
    @property
    def kv_heads(self) -> int:
        return self.n_kv_heads if self.n_kv_heads is not None else self.n_heads

    @property
    def attn_head_dim(self) -> int:
        return self.head_dim if self.head_dim is not None else self.dim // self.n_heads

    @property
    def gdp_heads(self) -> int:
        return self.gdp_n_heads if self.gdp_n_heads is not None else self.n_heads

    @property
    def gdp_key_dim(self) -> int:
        return self.gdp_head_dim if self.gdp_head_dim is not None else self.dim // self.gdp_heads

    @property
    def gdp_value_dim(self) -> int:
        return int(self.gdp_key_dim * self.gdp_expand_v)

    @property
    def ffn_dim(self) -> int:
        if self.ffn_hidden_dim is not None:
            return self.ffn_hidden_dim
        return swiglu_hidden_dim(self.dim, self.ffn_hidden_ratio, self.multiple_of)

    def layer_mixers(self) -> tuple[str, ...]:
        return parse_layer_pattern(self.layer_pattern, self.mixer, self.n_layers)

    # ----- validation -----
    def validate(self) -> None:
        """Raise a ValueError naming the offending field."""
        for name in ("dim", "n_layers", "vocab_size", "max_seq_len", "n_heads", "multiple_of"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.mixer not in MIXER_NAMES:
            raise ValueError(f"mixer must be one of {MIXER_NAMES}, got {self.mixer!r}")
        mixers = set(self.layer_mixers())
        if self.n_kv_heads is not None and (self.n_kv_heads < 1 or self.n_heads % self.n_kv_heads != 0):
            raise ValueError(f"n_heads={self.n_heads} must be divisible by n_kv_heads={self.n_kv_heads}")
        if self.head_dim is None and self.dim % self.n_heads != 0:
            raise ValueError(f"dim={self.dim} must be divisible by n_heads={self.n_heads} (or set head_dim)")
        if self.head_dim is not None and self.head_dim < 1:
            raise ValueError(f"head_dim must be >= 1, got {self.head_dim}")
        if self.window_size < 1:
            raise ValueError(f"window_size must be >= 1, got {self.window_size}")
        if self.attn_backend not in ATTN_BACKENDS:
            raise ValueError(f"attn_backend must be one of {ATTN_BACKENDS}, got {self.attn_backend!r}")
        if self.op_backend not in OP_BACKENDS:
            raise ValueError(f"op_backend must be one of {OP_BACKENDS}, got {self.op_backend!r}")
        if not isinstance(self.attn_rope, bool):
            raise ValueError(f"attn_rope must be a bool (True = RoPE, False = NoPE), got {self.attn_rope!r}")
        uses_rope = (bool(mixers & {"attention", "swa"}) and self.attn_rope) or (
            "deltaformer" in mixers and self.deltaformer_rope
        )
        if uses_rope and self.attn_head_dim % 2 != 0:
            raise ValueError(f"head_dim={self.attn_head_dim} must be even for rotary embeddings")
        if self.deltaformer_kernel not in KAPPA_KERNELS:
            raise ValueError(
                f"deltaformer_kernel must be one of {KAPPA_KERNELS}, got {self.deltaformer_kernel!r}"
            )
        if self.deltaformer_probe not in PROBES:
            raise ValueError(f"deltaformer_probe must be one of {PROBES}, got {self.deltaformer_probe!r}")
        if self.deltaformer_beta not in BETA_MODES:
            raise ValueError(f"deltaformer_beta must be one of {BETA_MODES}, got {self.deltaformer_beta!r}")
        if self.gdp_heads < 1:
            raise ValueError(f"gdp_n_heads must be >= 1, got {self.gdp_n_heads}")
        if self.gdp_head_dim is None and self.dim % self.gdp_heads != 0:
            raise ValueError(
                f"dim={self.dim} must be divisible by gdp_n_heads={self.gdp_heads} (or set gdp_head_dim)"
            )
        if (
            self.gdp_key_dim < 1
            or self.gdp_value_dim < 1
            or self.gdp_key_dim * self.gdp_expand_v != self.gdp_value_dim
        ):
            raise ValueError(
                f"gdp_expand_v={self.gdp_expand_v} × gdp key dim {self.gdp_key_dim} must be a positive int"
            )
        if self.gdp_num_householder < 1:
            raise ValueError(f"gdp_num_householder must be >= 1, got {self.gdp_num_householder}")
        if self.gdp_conv_size < 1:
            raise ValueError(f"gdp_conv_size must be >= 1, got {self.gdp_conv_size}")
        for name in ("gdp_forget_gate", "gdp_short_conv", "gdp_output_gate"):
            if not isinstance(getattr(self, name), bool):
                raise ValueError(f"{name} must be a bool, got {getattr(self, name)!r}")
        if self.ffn_dim < 1:
            raise ValueError(f"ffn_hidden_dim must be >= 1, got {self.ffn_dim}")

    # ----- torchtitan hooks -----
    def update_from_config(self, job_config: JobConfig, **kwargs: Any) -> None:
        """vocab_size from kwargs["tokenizer"].get_vocab_size() when given; max_seq_len from the job."""
        tokenizer = kwargs.get("tokenizer")
        if tokenizer is not None:
            self.vocab_size = int(tokenizer.get_vocab_size())
        self.max_seq_len = int(job_config.training.seq_len)
        self.validate()

    def get_nparams_and_flops(self, model: nn.Module, seq_len: int) -> tuple[int, int]:
        """(all parameters, counted once if tied; TRAINING FLOPs per token) — see titan_delta.models.flops."""
        from titan_delta.models.flops import count_parameters, training_flops_per_token

        return count_parameters(model), int(training_flops_per_token(model, seq_len))
