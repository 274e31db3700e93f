"""The encoder stack (paper section 3.1, Figure 1 left)."""

import keras

from keras_transformer.attention import MultiHeadAttention, packed_self_attention
from keras_transformer.feed_forward import PositionwiseFeedForward
from keras_transformer.residual import Residual
from keras_transformer.stack import LayerStack


@keras.saving.register_keras_serializable(package="keras_transformer")
class EncoderLayer(keras.layers.Layer):
    """Multi-head self-attention then a position-wise feed-forward network, each
    wrapped in a residual connection with layer normalisation (section 3.1).

    Args:
      d_model: width of the input, of every sublayer output and of the output.
      num_heads: h, the attention heads.
      d_ff: inner width of the feed-forward network.
      key_dim: d_k per head. Defaults to None, d_model / h.
      value_dim: d_v per head. Defaults to None, d_model / h.
      dropout: P_drop, the dropout rate on each sublayer output. Defaults to 0.1.
      attention_dropout: the dropout rate on the attention weights (not in the paper).
        Defaults to 0.0.
      pre_norm: pre-norm residual blocks instead of the paper's post-norm. Defaults to
        False.
      activation: the feed-forward network's, "relu" (the paper's), "swish" or "gelu".
      epsilon: every layer norm's epsilon. Defaults to 1e-6.

    Call: x [batch, src_len, d_model], attention_mask bool [batch, 1, 1, src_len]
      -> [batch, src_len, d_model] (plus self-attention weights
      [batch, heads, src_len, src_len] with return_attention_scores=True). With the
      source's `packing` (keras_transformer.packing), x and the output are packed,
      [tokens, d_model].

    Example:

    >>> import keras
    >>> from keras_transformer import EncoderLayer, padding_mask
    >>> layer = EncoderLayer(d_model=64, num_heads=4, d_ff=256)
    >>> source_ids = keras.ops.convert_to_tensor([[5, 6, 3, 0]])
    >>> x = keras.random.normal((1, 4, 64))
    >>> tuple(layer(x, padding_mask(source_ids)).shape)
    (1, 4, 64)
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
        self.feed_forward = PositionwiseFeedForward(d_model, d_ff, activation,
                                                    name="feed_forward", **policy)
        self.feed_forward_residual = Residual(dropout, pre_norm, epsilon, **policy)

    def build(self, x_shape, attention_mask_shape=None):
        for layer in (self.self_attention, self.self_attention_residual, self.feed_forward,
                      self.feed_forward_residual):
            layer.build(x_shape)
        self.built = True

    def call(self, x, attention_mask=None, training=None, return_attention_scores=False,
             packing=None):
        y = self.self_attention_residual.sublayer_input(x)
        y, weights = self.self_attention(y, y, attention_mask=attention_mask, training=training,
                                         return_attention_scores=True, packing=packing)
        x = self.self_attention_residual(x, y, training=training)
        y = self.feed_forward(self.feed_forward_residual.sublayer_input(x))
        x = self.feed_forward_residual(x, y, training=training)
        return (x, weights) if return_attention_scores else x

    def step_weights(self):
        """What `with_weights` reads, as tensors: the self-attention's fused, pre-scaled
        projections (MultiHeadAttention.step_weights), the feed-forward's and the layer
        norms' weights; a dict."""
        return {"self_attention": self.self_attention.step_weights(True),
                "feed_forward": self.feed_forward.step_weights(),
                **{name: getattr(self, name).step_weights()
                   for name in ("self_attention_residual", "feed_forward_residual")}}

    def with_weights(self, x, attention_mask, weights, packing):
        """`call` in inference on plain tensors and given weights (`step_weights`, or
        int8 ones made from them): x [tokens, d_model], packed by the source's `packing`
        -> [tokens, d_model] in x's dtype."""
        residual, norm = self.self_attention_residual, weights["self_attention_residual"]
        y = packed_self_attention(self.self_attention, residual.step_sublayer_input(x, norm),
                                  attention_mask, weights["self_attention"], packing)
        x = residual.step(x, y, norm)
        residual, norm = self.feed_forward_residual, weights["feed_forward_residual"]
        y = self.feed_forward.step(residual.step_sublayer_input(x, norm), weights["feed_forward"])
        return residual.step(x, y, norm)

    def compute_output_shape(self, x_shape, attention_mask_shape=None):
        return x_shape

    def get_config(self):
        return {**super().get_config(), "d_model": self.d_model, "num_heads": self.num_heads,
                "d_ff": self.d_ff, "key_dim": self.key_dim, "value_dim": self.value_dim,
                "dropout": self.dropout, "attention_dropout": self.attention_dropout,
                "pre_norm": self.pre_norm, "activation": self.activation, "epsilon": self.epsilon}


@keras.saving.register_keras_serializable(package="keras_transformer")
class Encoder(LayerStack):
    """N encoder layers (and a final LayerNorm when pre_norm), section 3.1.

    Args:
      num_layers: N, 6 in the paper. The others are EncoderLayer's.

    Call: x [batch, src_len, d_model] (embedded, with positions),
      attention_mask bool [batch, 1, 1, src_len] -> [batch, src_len, d_model]
      (plus a list of N self-attention weight tensors with return_attention_scores=True);
      packed [tokens, d_model] in and out with the source's `packing`.

    Example:

    >>> import keras
    >>> from keras_transformer import Encoder
    >>> encoder = Encoder(num_layers=2, d_model=64, num_heads=4, d_ff=256)
    >>> tuple(encoder(keras.random.normal((3, 7, 64))).shape)
    (3, 7, 64)
    """

    layer_class = EncoderLayer

    def build(self, x_shape, attention_mask_shape=None):
        self.build_stack(x_shape)

    def call(self, x, attention_mask=None, training=None, return_attention_scores=False,
             packing=None):
        all_weights = []
        for layer in self.layers:
            x, weights = layer(x, attention_mask, training=training,
                               return_attention_scores=True, packing=packing)
            all_weights.append(weights)
        x = self.finish(x)
        return (x, all_weights) if return_attention_scores else x

    def step_weights(self):
        """What `with_weights` reads: the N layers' EncoderLayer.step_weights and the
        final norm's; a dict."""
        return {"layers": [layer.step_weights() for layer in self.layers],
                "final_norm": self.final_norm_weights()}

    def with_weights(self, x, attention_mask, weights, packing):
        """`call` in inference on given weights (EncoderLayer.with_weights): packed x
        [tokens, d_model] -> [tokens, d_model]."""
        for layer, layer_weights in zip(self.layers, weights["layers"]):
            x = layer.with_weights(x, attention_mask, layer_weights, packing)
        return self.finish_step(x, weights["final_norm"])
