"""keras_transformer: the Transformer of "Attention Is All You Need" as Keras 3 layers."""

from keras_transformer.attention import MultiHeadAttention, scaled_dot_product_attention
from keras_transformer.beam_search import (BOS_ID, EOS_ID, DecodeResult, beam_search,
                                           greedy_search, length_penalty, sequence_log_probs)
from keras_transformer.config import PRESETS, TransformerConfig
from keras_transformer.decoder import Decoder, DecoderLayer
from keras_transformer.embedding import SharedEmbedding
from keras_transformer.encoder import Encoder, EncoderLayer
from keras_transformer.feed_forward import PositionwiseFeedForward
from keras_transformer.losses import correct_tokens, label_smoothed_cross_entropy
from keras_transformer.masking import PAD_ID, causal_mask, padding_mask
from keras_transformer.positional import PositionalEncoding, positional_encoding
from keras_transformer.residual import Residual
from keras_transformer.stack import LayerStack
from keras_transformer.schedule import WarmupSchedule
from keras_transformer.transformer import Transformer

__version__ = "0.1.0"
