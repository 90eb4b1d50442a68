"""titan-delta: pretraining DeltaFormer and Gated DeltaProduct language models on torchtitan."""

__version__ = "0.1.0"
