"""Data pipeline: sources → tokenizer (tiktoken or Hugging Face) → document-aware packing → resumable,
world-size-free loader."""

from titan_delta.data.config import DataConfig, DataConfigError, JobConfig, data_config_from
from titan_delta.data.hf_tokenizer import HFTokenizer
from titan_delta.data.hub import DataSourceError
from titan_delta.data.loader import TitanDataLoader, build_dataloader, build_dataset
from titan_delta.data.packing import position_ids_from_cu_seqlens
from titan_delta.data.tokenizer import DataTokenizer, TiktokenTokenizer, build_tokenizer, load_tokenizer

__all__ = [
    "DataConfig",
    "DataConfigError",
    "DataSourceError",
    "DataTokenizer",
    "HFTokenizer",
    "JobConfig",
    "TiktokenTokenizer",
    "TitanDataLoader",
    "build_dataloader",
    "build_dataset",
    "build_tokenizer",
    "data_config_from",
    "load_tokenizer",
    "position_ids_from_cu_seqlens",
]
