"""The decoder stack (paper section 3.1, Figure 1 right), with the incremental
decoding used by beam search: a self-attention key/value cache that grows by one
position per step, and encoder-decoder keys and values computed once per sentence and
shared by its beams."""

import keras
from keras import ops
import tensorflow as tf

from keras_transformer.attention import MultiHeadAttention, packed_key_value
from keras_transformer.feed_forward import PositionwiseFeedForward
from keras_transformer.residual import Residual
from keras_transformer.stack import LayerStack


@keras.saving.register_keras_serializable(package="keras_transformer")
class DecoderLayer(keras.layers.Layer):
    """Masked self-attention, encoder-decoder attention and a feed-forward network,
    each wrapped in a residual connection with layer normalisation (section 3.1).

    Args: as EncoderLayer (d_model, num_heads, d_ff, key_dim, value_dim, dropout,
      attention_dropout, pre_norm, activation, epsilon).

    Call: x [batch, tgt_len, d_model], encoder_output [batch, src_len, d_model],
      self_attention_mask bool [1, 1, tgt_len, tgt_len] (causal),
      cross_attention_mask bool [batch, 1, 1, src_len] (source padding)
      -> [batch, tgt_len, d_model] (plus encoder-decoder attention weights
      [batch, heads, tgt_len, src_len] with return_attention_scores=True). With the
      target's `packing` and the source's `source_packing` (keras_transformer.packing),
      x, encoder_output and the output are packed, [tokens, d_model].

    Example:

    >>> import keras
    >>> from keras_transformer import DecoderLayer, causal_mask
    >>> layer = DecoderLayer(d_model=64, num_heads=4, d_ff=256)
    >>> x, encoder_output = keras.random.normal((2, 5, 64)), keras.random.normal((2, 9, 64))
    >>> tuple(layer(x, encoder_output, causal_mask(5)).shape)
    (2, 5, 64)
    """

    def __init__(self, d_model, num_heads, d_ff, key_dim=None, value_dim=None, dropout=0.1,
                 attention_dropout=0.0, pre_norm=False, activation="relu", epsilon=1e-6,
                 **kwargs):
        super().__init__(**kwargs)
        self.d_model, self.num_heads, self.d_ff = d_model, num_heads, d_ff
        self.key_dim, self.value_dim = key_dim, value_dim
        self.dropout, self.attention_dropout = dropout, attention_dropout
        self.pre_norm = pre_norm
        self.activation, self.epsilon = activation, epsilon
        policy = dict(dtype=self.dtype_policy)
        self.self_attention = MultiHeadAttention(num_heads, d_model, key_dim, value_dim,
                                                 attention_dropout, name="self_attention",
                                                 **policy)
        self.self_attention_residual = Residual(dropout, pre_norm, epsilon, **policy)
        self.cross_attention = MultiHeadAttention(num_heads, d_model, key_dim, value_dim,
                                                  attention_dropout, name="cross_attention",
                                                  **policy)
        self.cross_attention_residual = Residual(dropout, pre_norm, epsilon, **policy)
        self.feed_forward = PositionwiseFeedForward(d_model, d_ff, activation,
                                                    name="feed_forward", **policy)
        self.feed_forward_residual = Residual(dropout, pre_norm, epsilon, **policy)

    def build(self, x_shape, encoder_output_shape, self_attention_mask_shape=None,
              cross_attention_mask_shape=None):
        self.self_attention.build(x_shape)
        self.cross_attention.build(x_shape, encoder_output_shape)
        for layer in (self.self_attention_residual, self.cross_attention_residual,
                      self.feed_forward, self.feed_forward_residual):
            layer.build(x_shape)
        self.built = True

    def call(self, x, encoder_output, self_attention_mask=None, cross_attention_mask=None,
             training=None, return_attention_scores=False, packing=None,
             source_packing=None):
        y = self.self_attention_residual.sublayer_input(x)
        y = self.self_attention(y, y, attention_mask=self_attention_mask, training=training,
                                packing=packing)
        x = self.self_attention_residual(x, y, training=training)
        y = self.cross_attention_residual.sublayer_input(x)
        y, weights = self.cross_attention.attend(
            y, self.cross_attention.project_key_value(encoder_output, source_packing),
            cross_attention_mask, training=training, packing=packing)
        x = self.cross_attention_residual(x, y, training=training)
        y = self.feed_forward(self.feed_forward_residual.sublayer_input(x))
        x = self.feed_forward_residual(x, y, training=training)
        return (x, weights) if return_attention_scores else x

    def initial_cache(self, encoder_output, beam_size=1, width=0, source_packing=None,
                      key_value=None):
        """The cache before the first step: no self-attention keys and values yet, and
        the encoder-decoder keys and values, once per sentence (its beams share them).

        Args:
          encoder_output: [batch, src_len, d_model], or with `source_packing` (the
            source's Packing) packed, [src_tokens, d_model].
          beam_size: rows decoded per sentence (its beams).
          width: 0, a cache that every step extends by one position; or the positions
            a search may decode, a fixed-width cache (XLA's fixed shapes) that step
            `index` writes.
          key_value: None, or the encoder-decoder attention's fused key and value
            projections (attention.key_value_weights, or int8 ones made from them) to
            project the packed encoder_output with.
        Returns a dict: "key" [batch * beam_size, heads, width, d_k] and "value"
        [batch * beam_size, heads, width, d_v], zeros; "cross_key"
        [batch, heads, src_len, d_k] and "cross_value" [batch, heads, src_len, d_v].
        """
        cross_key, cross_value = (
            self.cross_attention.project_key_value(encoder_output, source_packing)
            if key_value is None else
            packed_key_value(self.cross_attention, encoder_output, key_value, source_packing))
        rows = ops.shape(cross_key)[0] * beam_size
        attention = self.self_attention
        return {
            "key": ops.zeros((rows, self.num_heads, width, attention.key_dim), cross_key.dtype),
            "value": ops.zeros((rows, self.num_heads, width, attention.value_dim),
                               cross_value.dtype),
            "cross_key": cross_key,
            "cross_value": cross_value,
        }

    def step_weights(self, elementwise=None):
        """What `step` reads, as tensors read once per decoding search (fused and
        pre-scaled projections, and how the attentions attend: see
        MultiHeadAttention.step_weights): a dict."""
        return {"self_attention": self.self_attention.step_weights(True, elementwise),
                "cross_attention": self.cross_attention.step_weights(False, elementwise),
                "feed_forward": self.feed_forward.step_weights(),
                **{name: getattr(self, name).step_weights()
                   for name in ("self_attention_residual", "cross_attention_residual",
                                "feed_forward_residual")}}

    def step(self, x, cache, cross_attention_mask, weights, index=None):
        """Decode the next position given the cache of the positions before it: the
        layer's `call` in inference, one position per row, on plain tensors.

        Args:
          x: [batch * beams, d_model], the embedded tokens at the position being
            decoded, the beams of a sentence in adjacent rows.
          cache: dict from `initial_cache` (or a previous step): "key", "value"
            [batch * beams, heads, position, d] and "cross_key", "cross_value"
            [batch, heads, src_len, d].
          cross_attention_mask: bool [batch, 1, 1, src_len].
          weights: from `step_weights`.
          index: None for a growing cache; the position being decoded for a fixed-width
            one (`initial_cache(..., width)`).
        Returns:
          ([batch * beams, d_model], the cache with this position's keys and values
          appended (or, fixed-width, written at `index`): one position written per step).
        """
        # The name scopes label a step's ops by sublayer in a profile
        # (bench/profiling.py --decoding); they cost nothing at run time. A sublayer's
        # residual is in its scope, since Grappler fuses the last matmul with the add.
        residual, norm = self.self_attention_residual, weights["self_attention_residual"]
        with tf.name_scope("self_attention"):
            y, key, value = self.self_attention.self_attention_step(
                _sublayer_input(residual, x, norm), cache["key"], cache["value"],
                weights["self_attention"], index)
            x = _residual(residual, x, y, norm)
        # The encoder keys and values have a row per sentence: a sentence's beams are
        # its queries of them.
        residual, norm = self.cross_attention_residual, weights["cross_attention_residual"]
        with tf.name_scope("cross_attention"):
            y = self.cross_attention.cross_attention_step(
                _sublayer_input(residual, x, norm), cache["cross_key"],
                cache["cross_value"], cross_attention_mask, weights["cross_attention"])
            x = _residual(residual, x, y, norm)
        residual, norm = self.feed_forward_residual, weights["feed_forward_residual"]
        with tf.name_scope("feed_forward"):
            y = self.feed_forward.step(_sublayer_input(residual, x, norm),
                                       weights["feed_forward"])
            x = _residual(residual, x, y, norm)
        return x, {**cache, "key": key, "value": value}

    def compute_output_shape(self, x_shape, *args, **kwargs):
        return x_shape

    def get_config(self):
        return {**super().get_config(), "d_model": self.d_model, "num_heads": self.num_heads,
                "d_ff": self.d_ff, "key_dim": self.key_dim, "value_dim": self.value_dim,
                "dropout": self.dropout, "attention_dropout": self.attention_dropout,
                "pre_norm": self.pre_norm, "activation": self.activation, "epsilon": self.epsilon}


def _sublayer_input(residual, x, norm):
    """Residual.step_sublayer_input in a "residual" name scope (a profile's label)."""
    with tf.name_scope("residual"):
        return residual.step_sublayer_input(x, norm)


def _residual(residual, x, y, norm):
    """Residual.step in a "residual" name scope (a profile's label)."""
    with tf.name_scope("residual"):
        return residual.step(x, y, norm)


@keras.saving.register_keras_serializable(package="keras_transformer")
class Decoder(LayerStack):
    """N decoder layers (and a final LayerNorm when pre_norm), section 3.1.

    Args:
      num_layers: N, 6 in the paper. The others are DecoderLayer's.

    Call: x [batch, tgt_len, d_model] (embedded, with positions),
      encoder_output [batch, src_len, d_model], self_attention_mask, cross_attention_mask
      (see DecoderLayer) -> [batch, tgt_len, d_model] (plus a list of N encoder-decoder
      attention weight tensors with return_attention_scores=True); packed with the
      `packing` and `source_packing` of DecoderLayer.

    Example:

    >>> import keras
    >>> from keras_transformer import Decoder, causal_mask
    >>> decoder = Decoder(num_layers=2, d_model=64, num_heads=4, d_ff=256)
    >>> x, encoder_output = keras.random.normal((2, 5, 64)), keras.random.normal((2, 9, 64))
    >>> tuple(decoder(x, encoder_output, causal_mask(5)).shape)
    (2, 5, 64)
    """

    layer_class = DecoderLayer

    def build(self, x_shape, encoder_output_shape, self_attention_mask_shape=None,
              cross_attention_mask_shape=None):
        self.build_stack(x_shape, encoder_output_shape)

    def call(self, x, encoder_output, self_attention_mask=None, cross_attention_mask=None,
             training=None, return_attention_scores=False, packing=None,
             source_packing=None):
        all_weights = []
        for layer in self.layers:
            x, weights = layer(x, encoder_output, self_attention_mask, cross_attention_mask,
                               training=training, return_attention_scores=True,
                               packing=packing, source_packing=source_packing)
            all_weights.append(weights)
        x = self.finish(x)
        return (x, all_weights) if return_attention_scores else x

    def initial_cache(self, encoder_output, beam_size=1, width=0, source_packing=None,
                      key_value=None):
        """A list of N per-layer caches (see DecoderLayer.initial_cache); key_value: None,
        or a list of each layer's."""
        key_value = key_value or [None] * self.num_layers
        return [layer.initial_cache(encoder_output, beam_size, width, source_packing, weights)
                for layer, weights in zip(self.layers, key_value)]

    def step_weights(self, elementwise=None):
        """What `step` reads, read once per decoding search: a dict of the N layers'
        `DecoderLayer.step_weights` and the final norm's."""
        return {"layers": [layer.step_weights(elementwise) for layer in self.layers],
                "final_norm": self.final_norm_weights()}

    def step(self, x, cache, cross_attention_mask, weights, index=None):
        """x [batch * beams, d_model] at the next position -> ([batch * beams, d_model],
        new cache); see DecoderLayer.step. weights: from `step_weights`."""
        new_cache = []
        for layer, layer_cache, layer_weights in zip(self.layers, cache, weights["layers"]):
            x, layer_cache = layer.step(x, layer_cache, cross_attention_mask, layer_weights,
                                        index)
            new_cache.append(layer_cache)
        return self.finish_step(x, weights["final_norm"]), new_cache
