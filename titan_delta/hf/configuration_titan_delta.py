"""``TitanDeltaConfig``: the Hugging Face config of a titan-delta model (``model_type = "titan_delta"``).

This file is copied into every export folder and loaded by transformers as remote code
(``trust_remote_code=True``), so it imports nothing but transformers. The config is the export's
``config.json`` itself: titan-delta's own keys (``model_args`` — every ``ModelArgs`` field —, the
tokenizer spec, ``add_bos``, ``step``, ...) are kept as they are, and the standard Hugging Face keys
(``vocab_size``, ``hidden_size``, ``max_position_embeddings``, ...) are derived from ``model_args``.
"""

from __future__ import annotations

from typing import Any

from transformers import PretrainedConfig


class TitanDeltaConfig(PretrainedConfig):
    model_type = "titan_delta"

    def __init__(
        self,
        model_args: dict[str, Any] | None = None,
        model_name: str = "deltaformer",
        flavor: str = "debug",
        tokenizer: str = "default",
        tokenizer_pattern: str = "",
        add_bos: bool = False,
        **kwargs: Any,
    ) -> None:
        self.model_args = dict(model_args or {})
        self.model_name = model_name
        self.flavor = flavor
        self.tokenizer = tokenizer
        self.tokenizer_pattern = tokenizer_pattern
        self.add_bos = add_bos
        args = self.model_args
        # Standard names that generic tools read (lm-eval's max length, generation, parameter counts).
        self.vocab_size = int(args.get("vocab_size", kwargs.pop("vocab_size", 32000)))
        self.hidden_size = int(args.get("dim", kwargs.pop("hidden_size", 256)))
        self.num_hidden_layers = int(args.get("n_layers", kwargs.pop("num_hidden_layers", 2)))
        self.max_position_embeddings = int(
            args.get("max_seq_len", kwargs.pop("max_position_embeddings", 2048))
        )
        kwargs["tie_word_embeddings"] = bool(args.get("enable_weight_tying", False))
        super().__init__(**kwargs)
