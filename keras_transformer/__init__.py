"""keras_transformer: the Transformer of "Attention Is All You Need" as Keras 3 layers.

    import keras
    from keras_transformer import Transformer, TransformerConfig, LabelSmoothedCrossEntropy

TensorFlow and Keras are imported when a name that needs them is first used, so the
pure-Python parts (`TransformerConfig`, `PRESETS`, the special ids) load without them,
e.g. for a command line that checks its flags before starting TensorFlow. The first such
use imports every layer, so all of them are registered for `keras.saving.load_model`.
"""

import importlib

from keras_transformer.config import PRESETS, DecodeConfig, TransformerConfig
from keras_transformer.special_ids import BOS_ID, EOS_ID, PAD_ID, UNK_ID

__version__ = "0.1.0"

# Public names that need TensorFlow, by the module that defines them.
_LAZY = {
    "attention": ("MultiHeadAttention", "scaled_dot_product_attention"),
    "beam": ("beam_search",),
    "decoding": ("greedy_search", "search_single_path"),
    "decoder": ("Decoder", "DecoderLayer"),
    "dropout": ("Dropout",),
    "embedding": ("SharedEmbedding",),
    "encoder": ("Encoder", "EncoderLayer"),
    "feed_forward": ("PositionwiseFeedForward",),
    "losses": ("LabelSmoothedCrossEntropy", "correct_tokens", "label_smoothed_cross_entropy",
               "projected_label_smoothed_cross_entropy"),
    "masking": ("causal_mask", "padding_mask"),
    "normalization": ("LayerNormalization",),
    "packing": ("Packing",),
    "penalties": ("length_penalty",),
    "positional": ("PositionalEncoding", "positional_encoding"),
    "residual": ("Residual",),
    "sampling": ("sample_search",),
    "schedule": ("WarmupSchedule",),
    "search": ("DecodeResult", "Step", "TokenRules"),
    "stack": ("LayerStack",),
    "step": ("TransformerStep",),
    "transformer": ("Transformer", "sequence_log_probs", "shift_right"),
}
_MODULE_OF = {name: module for module, names in _LAZY.items() for name in names}

__all__ = ["PRESETS", "DecodeConfig", "TransformerConfig", "BOS_ID", "EOS_ID", "PAD_ID", "UNK_ID",
           *sorted(_MODULE_OF)]


def __getattr__(name):
    if name not in _MODULE_OF:
        raise AttributeError(f"module 'keras_transformer' has no attribute {name!r}")
    for module in _LAZY:  # all at once: every layer registers with Keras
        for public in _LAZY[module]:
            globals()[public] = getattr(importlib.import_module(f"{__name__}.{module}"), public)
    return globals()[name]


def __dir__():
    return sorted(set(globals()) | set(__all__))
