"""The mixer names a layer pattern may use, apart from their builders, so that the model args can check a
pattern without importing the mixers (which need the args to build)."""

MIXER_NAMES = ("attention", "swa", "deltaformer", "gated_deltaproduct")
