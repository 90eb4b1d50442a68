"""The language model: embeddings → decoder blocks (any mix of mixers) → RMSNorm → LM head."""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
from torch import nn
from torchtitan.protocols.model import ModelProtocol

from titan_delta.models.args import ModelArgs
from titan_delta.models.block import DecoderBlock
from titan_delta.models.components.norms import RMSNorm
from titan_delta.models.components.rope import rotary_tables
from titan_delta.models.context import MixerContext, document_ids, positions_in_documents
from titan_delta.models.mixers.attention import SoftmaxAttention
from titan_delta.models.mixers.attention_masks import build_attention_masks

if TYPE_CHECKING:
    from titan_delta.models.cache import ModelCache


class TitanDeltaLM(ModelProtocol):
    """``model(tokens, cu_seqlens=None, position_ids=None) -> logits [B, T, vocab]``.

    With ``cu_seqlens`` (offsets into the flattened B·T stream, every row start a boundary) all mixers run
    on the packed [1, B·T] view and no token sees another document; RoPE positions restart at each
    document unless ``position_ids`` [B, T] are given.

    With ``cache`` (a ``titan_delta.models.cache.ModelCache``) the call continues the sequences the cache
    has seen: positions start at ``cache.seen`` and every mixer reads and extends its layer's state.
    """

    def __init__(self, model_args: ModelArgs) -> None:
        super().__init__(model_args)
        self.model_args = model_args
        args = model_args
        self.tok_embeddings = nn.Embedding(args.vocab_size, args.dim)
        self.layers = nn.ModuleDict(
            {str(i): DecoderBlock(i, name, args) for i, name in enumerate(args.layer_mixers())}
        )
        self.norm = RMSNorm(args.dim, args.norm_eps)
        self.output = nn.Linear(args.dim, args.vocab_size, bias=False)
        if args.enable_weight_tying:
            self.output.weight = self.tok_embeddings.weight
        mixers = [block.mixer for block in self.layers.values()]
        self.attn_windows = {m.window for m in mixers if isinstance(m, SoftmaxAttention)}
        # a plain list, not registered: the modules already belong to their mixers
        self._rotary_modules = [m.rope for m in mixers if getattr(m, "rope", None) is not None]
        self.init_weights()

    def init_weights(self, buffer_device: torch.device | None = None) -> None:
        """Deterministic given the torch RNG state. The model holds no buffers (RoPE angles are computed
        per forward), so ``buffer_device`` is accepted for torchtitan's interface and unused.

        Linear weights: truncated normal(init_std); projections into the residual stream scaled by depth;
        embedding N(0, 1) when untied (torchtitan), N(0, 1/dim) when tied so initial logits have unit scale;
        untied LM head truncated normal(dim^-0.5); Gated DeltaProduct A_log/dt_bias as in Mamba2."""
        args = self.model_args
        if args.enable_weight_tying:
            if self.output.weight is not self.tok_embeddings.weight:  # to_empty() from meta unties them
                self.output.weight = self.tok_embeddings.weight
            nn.init.normal_(self.tok_embeddings.weight, std=args.dim**-0.5)
        else:
            nn.init.normal_(self.tok_embeddings.weight)
            std = args.dim**-0.5
            nn.init.trunc_normal_(self.output.weight, std=std, a=-3 * std, b=3 * std)
        for block in self.layers.values():
            block.init_weights()
        self.norm.reset_parameters()

    def forward(
        self,
        tokens: torch.Tensor,
        cu_seqlens: torch.Tensor | None = None,
        position_ids: torch.Tensor | None = None,
        cache: ModelCache | None = None,
    ) -> torch.Tensor:
        if tokens.dim() != 2:
            raise ValueError(f"tokens must have shape [B, T], got {tuple(tokens.shape)}")
        B, T = tokens.shape
        if position_ids is not None and tuple(position_ids.shape) != (B, T):
            raise ValueError(
                f"position_ids must have shape [B, T] = {(B, T)}, got {tuple(position_ids.shape)}"
            )
        if cu_seqlens is not None and (
            cu_seqlens.dim() != 1 or cu_seqlens.dtype not in (torch.int32, torch.int64)
        ):
            raise ValueError(
                f"cu_seqlens must be a 1-D int32/int64 tensor of offsets into the B·T stream, got "
                f"dtype {cu_seqlens.dtype} shape {tuple(cu_seqlens.shape)}"
            )
        if cache is not None and cu_seqlens is not None:
            raise ValueError("cu_seqlens cannot be combined with cache: decoding keeps one sequence per row")
        h = self.tok_embeddings(tokens)
        seq_pos = doc_ids = None
        if cu_seqlens is not None:
            h = h.reshape(1, B * T, h.shape[-1])
            doc_ids = document_ids(cu_seqlens, B * T)
            seq_pos = positions_in_documents(cu_seqlens, B * T).unsqueeze(0)
        if position_ids is not None:
            positions = position_ids.reshape(h.shape[0], h.shape[1])
        elif seq_pos is not None:
            positions = seq_pos
        elif cache is not None:
            start = cache.seen
            positions = torch.arange(start, start + T, device=tokens.device).unsqueeze(0).expand(B, T)
        else:
            positions = torch.arange(T, device=tokens.device).unsqueeze(0).expand(B, T)
        ctx = MixerContext(
            cu_seqlens=cu_seqlens,
            seq_pos=seq_pos,
            positions=positions,
            rotary=rotary_tables(self._rotary_modules, positions),
            attn_masks={}
            if cache is not None  # each attention cache masks its own keys
            else build_attention_masks(
                self.attn_windows, h.shape[1], doc_ids, self.model_args.attn_backend, h.device
            ),
            cache=cache,
        )
        for block in self.layers.values():
            h = block(h, ctx)
        if cache is not None:
            cache.seen += T
        return self.output(self.norm(h)).reshape(B, T, -1)
