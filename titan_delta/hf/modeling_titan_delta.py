"""``TitanDeltaForCausalLM``: a titan-delta model behind transformers' ``PreTrainedModel`` API.

This file is copied into every export folder and loaded by transformers as remote code
(``AutoModelForCausalLM.from_pretrained(folder, trust_remote_code=True)``). It holds no model code of
its own: it builds the real ``titan_delta.models.TitanDeltaLM`` (so on a GPU the ops take the Triton
kernels, exactly as in training), which means the ``titan_delta`` package must be importable wherever
the export is loaded. There is deliberately no second, pure-PyTorch copy of the model here: it would
be a second implementation to keep in sync with every mixer.

Parameter names are TitanDeltaLM's own (``tok_embeddings.weight``, ``layers.0.mixer.wq.weight``, ...):
TitanDeltaLM's modules are registered directly on this model, so the same ``model.safetensors`` loads
here, in ``titan_delta.eval`` and in ``tools/import_checkpoint.py``, and ``save_pretrained`` keeps them.

Generation keeps titan-delta's decoding caches (KV, sliding-window KV, DeltaFormer K+U, Gated
DeltaProduct state) in the ``cache`` / ``past_key_values`` slot; a padded batch (``attention_mask`` with
zeros, as ``generate`` uses for prompts of different lengths) runs row by row with one cache per row.
"""

from __future__ import annotations

from typing import Any, ClassVar

import torch
import torch.nn.functional as F
from transformers import GenerationMixin, PreTrainedModel
from transformers.modeling_outputs import CausalLMOutputWithPast

from .configuration_titan_delta import TitanDeltaConfig

try:
    from titan_delta.hf.padded_batches import RowCaches, causal_lm_logits, new_cache
    from titan_delta.models import ModelArgs, TitanDeltaLM
    from titan_delta.models.cache import ModelCache
except ImportError as err:  # pragma: no cover - depends on the environment that loads the export
    raise ImportError(
        "This titan-delta export runs the titan_delta package's own model code, which is not importable "
        f"here ({err}). Install titan-delta (pip install -e . in its repository) into this environment."
    ) from err

# transformers 5 calls the decoding state `cache`; earlier releases call it `past_key_values`.
_CACHE_FIELD = "cache" if "cache" in CausalLMOutputWithPast.__dataclass_fields__ else "past_key_values"


class TitanDeltaPreTrainedModel(PreTrainedModel):
    config_class = TitanDeltaConfig
    base_model_prefix = ""
    main_input_name = "input_ids"
    _no_split_modules: ClassVar[list[str]] = ["DecoderBlock"]
    _is_stateful = True  # recurrent and DeltaFormer caches cannot be rolled back (no assisted decoding)

    def _init_weights(self, module: torch.nn.Module) -> None:
        """Nothing to do: every weight comes from the checkpoint, or from ``TitanDeltaLM.init_weights``
        (deterministic given the torch seed) when the model is built from a config."""


class TitanDeltaForCausalLM(TitanDeltaPreTrainedModel, GenerationMixin):
    _tied_weights_keys: ClassVar[dict[str, str]] = {"output.weight": "tok_embeddings.weight"}

    def __init__(self, config: TitanDeltaConfig) -> None:
        super().__init__(config)
        lm = TitanDeltaLM(ModelArgs(**config.model_args))
        self.model_args = lm.model_args
        self.attn_windows = lm.attn_windows
        self._rotary_modules = lm._rotary_modules
        self.tok_embeddings, self.layers, self.norm, self.output = (
            lm.tok_embeddings,
            lm.layers,
            lm.norm,
            lm.output,
        )
        self.post_init()

    def get_input_embeddings(self) -> torch.nn.Module:
        return self.tok_embeddings

    def set_input_embeddings(self, value: torch.nn.Module) -> None:
        self.tok_embeddings = value

    def get_output_embeddings(self) -> torch.nn.Module:
        return self.output

    def set_output_embeddings(self, value: torch.nn.Module) -> None:
        self.output = value

    @classmethod
    def _supports_default_dynamic_cache(cls) -> bool:
        return False  # our caches are made in prepare_inputs_for_generation, not transformers' DynamicCache

    def lm_forward(self, tokens: torch.Tensor, cache: ModelCache | None = None) -> torch.Tensor:
        """TitanDeltaLM's forward on this model: it reads only the modules and fields set in __init__."""
        return TitanDeltaLM.forward(self, tokens, cache=cache)  # type: ignore[arg-type]

    def forward(
        self,
        input_ids: torch.LongTensor | None = None,
        attention_mask: torch.Tensor | None = None,
        position_ids: torch.LongTensor | None = None,
        cache: Any = None,
        past_key_values: Any = None,
        inputs_embeds: torch.Tensor | None = None,
        labels: torch.LongTensor | None = None,
        use_cache: bool | None = None,
        return_dict: bool | None = None,
        **kwargs: Any,
    ) -> CausalLMOutputWithPast | tuple:
        """``position_ids`` are ignored: positions count each row's real tokens (what Hugging Face derives
        from the mask). A cache is made only when ``use_cache=True`` is passed explicitly: a plain scoring
        call keeps every mixer on its full-sequence path (the Triton kernels on a GPU)."""
        if inputs_embeds is not None or input_ids is None:
            raise ValueError("TitanDeltaForCausalLM takes input_ids (inputs_embeds are not supported)")
        state = cache if cache is not None else past_key_values
        if state is not None and not isinstance(state, ModelCache | RowCaches):
            raise TypeError(
                f"cache must come from this model's own forward/generate, got {type(state).__name__}"
            )
        if state is None and use_cache:
            state = new_cache(self, input_ids.shape[0], attention_mask)
        logits = causal_lm_logits(self.lm_forward, input_ids, attention_mask, state)
        loss = None
        if labels is not None:
            loss = F.cross_entropy(
                logits[:, :-1].float().reshape(-1, logits.shape[-1]),
                labels[:, 1:].reshape(-1),
                ignore_index=-100,
            )
        output = CausalLMOutputWithPast(loss=loss, logits=logits, **{_CACHE_FIELD: state})
        return output if return_dict is not False else output.to_tuple()

    def prepare_inputs_for_generation(
        self,
        input_ids: torch.LongTensor,
        cache: Any = None,
        past_key_values: Any = None,
        attention_mask: torch.Tensor | None = None,
        use_cache: bool | None = True,
        **kwargs: Any,
    ) -> dict[str, Any]:
        """Feeds only the tokens the cache has not seen; without a cache, the whole sequence every step."""
        state = cache if cache is not None else past_key_values
        inputs: dict[str, Any] = {"attention_mask": attention_mask, "use_cache": bool(use_cache)}
        if not use_cache:
            return {**inputs, "input_ids": input_ids}
        if state is None:
            state = new_cache(self, input_ids.shape[0], attention_mask)
        return {**inputs, "input_ids": input_ids[:, state.seen :], _CACHE_FIELD: state}
