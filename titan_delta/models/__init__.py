"""The model zoo: DeltaFormer, Gated DeltaProduct, sliding-window / full attention and their hybrids."""

from titan_delta.models.args import ModelArgs, parse_layer_pattern
from titan_delta.models.block import DecoderBlock
from titan_delta.models.context import MixerContext
from titan_delta.models.flavors import FAMILIES, MODEL_FLAVORS, SIZES, build_model, get_model_args
from titan_delta.models.flops import count_parameters, forward_flops_per_token, training_flops_per_token
from titan_delta.models.mixers import MIXER_NAMES, build_mixer
from titan_delta.models.model import TitanDeltaLM

__all__ = [
    "FAMILIES",
    "MIXER_NAMES",
    "MODEL_FLAVORS",
    "SIZES",
    "DecoderBlock",
    "MixerContext",
    "ModelArgs",
    "TitanDeltaLM",
    "build_mixer",
    "build_model",
    "count_parameters",
    "forward_flops_per_token",
    "get_model_args",
    "parse_layer_pattern",
    "training_flops_per_token",
]
