"""Hugging Face interop: exported folders that load with stock transformers, and imports into DCP."""
