"""The ``[data]`` TOML section: sources, mixture, tokenizer, packing and loader settings.

The trainer merges :class:`JobConfig` (whose only field is ``data``) into torchtitan's JobConfig through
``--job.custom_config_module``; the builders read ``job_config.data`` and fall back to defaults when absent.
Sequence length and batch size stay in torchtitan's ``[training]`` section (``seq_len``,
``local_batch_size``) so the model and the loader can never disagree on them.
"""

from dataclasses import dataclass, field
from typing import Any


class DataConfigError(ValueError):
    """A data setting, file, dataset or encoding that cannot be used; the message names it."""


@dataclass
class DataConfig:
    sources: list[str] = field(default_factory=lambda: ["default"])
    """Document sources. ``default`` = the embedded corpus; ``parquet:GLOB``, ``jsonl:GLOB`` (also .jsonl.gz),
    ``txt:GLOB`` (one document per file), a bare glob (type from the extension), or
    ``hf:OWNER/NAME?name=CONFIG&split=train`` for Hugging Face hub streaming. Any source may add
    ``?field=NAME`` (``&`` between options) to read another text column."""

    weights: list[float] = field(default_factory=list)
    """Mixture weights, one per source (normalised); empty = equal weights."""

    seed: int = 0
    """Seeds the mixture draws; the document order depends only on (sources, weights, seed)."""

    text_field: str = "text"
    """Default text column / JSON key (FineWeb-edu's is ``text``)."""

    document_masking: bool = False
    """Emit ``cu_seqlens`` and ignore (-100) labels that cross a document boundary."""

    tokenizer: str = "default"
    """``default`` = the shipped BPE, a tiktoken encoding name (``o200k_base``, ``cl100k_base``,
    ``r50k_base``), a ranks file (``.tiktoken`` or Llama-3 ``tokenizer.model``), or a Hugging Face
    ``tokenizer.json`` (any ``*.json`` file, or a folder holding ``tokenizer.json``)."""

    tokenizer_pattern: str = ""
    """For a ranks file without a ``.json`` sidecar: ``llama3``, ``cl100k``, ``o200k`` or a regex."""

    eos_token: str = ""
    """Hugging Face tokenizer only: the token that ends every document. Empty = ``eos_token`` of a
    ``tokenizer_config.json`` beside it, else the one well-known EOS among its special tokens
    (``<|endoftext|>``, ``<|end_of_text|>``, ``</s>``, ``<eos>``, ...)."""

    bos_token: str = ""
    """Hugging Face tokenizer only: the token ``add_bos`` puts before documents; ``none`` = no BOS. Empty =
    ``bos_token`` of ``tokenizer_config.json``, else the one well-known BOS among its special tokens
    (``<|begin_of_text|>``, ``<s>``, ``<bos>``, ...), else none."""

    add_bos: bool = False
    """Prefix every document with BOS (EOS always ends a document)."""

    tokenize_threads: int = 2
    """Threads per loader worker for batch encoding (tiktoken releases the GIL; a Hugging Face tokenizer
    sizes its own Rust thread pool from it unless ``RAYON_NUM_THREADS`` is set)."""

    num_workers: int = 2
    """Loader worker processes per data-parallel rank (0 = tokenise in the training process)."""

    prefetch_factor: int = 4
    """Batches prefetched per worker."""

    lanes: int = 256
    """Independent packing streams; the resumable cursor is one position per lane, so it does not depend
    on the data-parallel world size. Must be >= dp_world_size * max(num_workers, 1); keep it fixed for a
    run's lifetime."""

    max_doc_chars: int = 1_000_000
    """Longer documents are tokenised in pieces of at most this many characters (still one document)."""

    encode_batch_docs: int = 64
    """Documents per batched (threaded) tokeniser call in each worker."""

    pretokenized: str = ""
    """Folder written by ``tools/pretokenize.py``; when set, ``sources``/``tokenizer`` files are not read."""

    hub_retries: int = 5
    """Network failures tolerated per position before one clear error (exponential backoff)."""

    hub_backoff_s: float = 2.0
    """First retry delay in seconds (doubles each retry)."""

    def validate(self) -> None:
        if not self.pretokenized and not self.sources:
            raise DataConfigError("data.sources must name at least one source (or set data.pretokenized)")
        if self.weights and len(self.weights) != len(self.sources):
            raise DataConfigError(
                f"data.weights has {len(self.weights)} entries but data.sources has {len(self.sources)}"
            )
        if any(w < 0 for w in self.weights) or (self.weights and sum(self.weights) <= 0):
            raise DataConfigError(f"data.weights must be >= 0 with a positive sum, got {self.weights}")
        for name in ("lanes", "max_doc_chars", "encode_batch_docs", "tokenize_threads", "prefetch_factor"):
            if getattr(self, name) < 1:
                raise DataConfigError(f"data.{name} must be >= 1, got {getattr(self, name)}")
        if self.num_workers < 0 or self.hub_retries < 0:
            raise DataConfigError("data.num_workers and data.hub_retries must be >= 0")


@dataclass
class JobConfig:
    """Extension for ``--job.custom_config_module=titan_delta.data.config`` (or merged by the trainer)."""

    data: DataConfig = field(default_factory=DataConfig)


def data_config_from(job_config: Any) -> DataConfig:
    """``job_config.data`` if the custom section is merged in, else the defaults; validated."""
    config = getattr(job_config, "data", None)
    if config is None:
        config = DataConfig()
    elif isinstance(config, dict):
        config = DataConfig(**config)
    config.validate()
    return config
