"""Scaled dot-product attention and multi-head attention (paper section 3.2)."""

import math

import keras
import tensorflow as tf
from keras import ops

from keras_transformer.dropout import Dropout
from keras_transformer.masking import MASKED_LOGIT


def scaled_dot_product_attention(query, key, value, mask=None, dropout_layer=None,
                                 training=None):
    """softmax(Q K^T / sqrt(d_k)) V, section 3.2.1, with the softmax in float32.

    Args:
      query: [batch, heads, q_len, d_k].
      key: [batch, heads, k_len, d_k].
      value: [batch, heads, k_len, d_v].
      mask: bool, broadcastable to [batch, heads, q_len, k_len]; True may attend.
      dropout_layer: optional keras Dropout layer applied to the attention weights.
    Returns:
      (output [batch, heads, q_len, d_v], weights float32 [batch, heads, q_len, k_len]).
    """
    d_k = ops.shape(query)[-1]
    query = query * ops.cast(1.0 / math.sqrt(d_k), query.dtype)
    # float16 logits can overflow and bfloat16 ones are coarse: normalise in float32.
    logits = ops.cast(ops.einsum("bhqd,bhkd->bhqk", query, key), "float32")
    if mask is not None:
        logits = ops.where(mask, logits, MASKED_LOGIT)
    # tf.nn.softmax: keras.ops warns on the legitimate one-key case (a 1-token source).
    weights = tf.nn.softmax(logits, axis=-1)  # [batch, heads, q_len, k_len]
    attended = ops.cast(weights, value.dtype)
    if dropout_layer is not None:
        attended = dropout_layer(attended, training=training)
    return ops.einsum("bhqk,bhkd->bhqd", attended, value), weights


@keras.saving.register_keras_serializable(package="keras_transformer")
class MultiHeadAttention(keras.layers.Layer):
    """Multi-head attention, section 3.2.2: Concat(head_1..head_h) W^O,
    head_i = Attention(Q W_i^Q, K W_i^K, V W_i^V).

    Serves as self-attention (`value` is `query`) and as encoder-decoder attention
    (queries from the decoder, keys and values from the encoder: lengths may differ).
    Keys are computed from `value`, as in the paper's encoder-decoder attention.

    Args:
      num_heads: h, 8 in the base model.
      d_model: width of the queries, values and the output.
      key_dim: d_k per head. Defaults to None, d_model / h.
      value_dim: d_v per head. Defaults to None, d_model / h.
      dropout: the dropout rate on the attention weights (not in the paper). Defaults
        to 0.0.

    Call:
      query [batch, q_len, d_model], value [batch, k_len, d_model],
      attention_mask bool broadcastable to [batch, heads, q_len, k_len]
      -> [batch, q_len, d_model] (and float32 weights [batch, heads, q_len, k_len]
      with return_attention_scores=True).

    Decoding reuses the pieces: `project_key_value` once per source sentence or per
    step, then `attend` with a (cached) key/value pair.

    Example:

    >>> import keras
    >>> from keras_transformer import MultiHeadAttention, causal_mask
    >>> mha = MultiHeadAttention(num_heads=8, d_model=512)
    >>> x = keras.random.normal((2, 10, 512))
    >>> tuple(mha(x, x, attention_mask=causal_mask(10)).shape)
    (2, 10, 512)
    """

    def __init__(self, num_heads, d_model, key_dim=None, value_dim=None, dropout=0.0,
                 **kwargs):
        super().__init__(**kwargs)
        if (key_dim is None or value_dim is None) and d_model % num_heads:
            raise ValueError(f"d_model={d_model} is not divisible by num_heads={num_heads}")
        self.num_heads = num_heads
        self.d_model = d_model
        self.key_dim = key_dim or d_model // num_heads
        self.value_dim = value_dim or d_model // num_heads
        self.dropout = dropout
        dense = dict(dtype=self.dtype_policy)
        self.query_dense = keras.layers.Dense(num_heads * self.key_dim, name="query", **dense)
        self.key_dense = keras.layers.Dense(num_heads * self.key_dim, name="key", **dense)
        self.value_dense = keras.layers.Dense(num_heads * self.value_dim, name="value", **dense)
        self.output_dense = keras.layers.Dense(d_model, name="output", **dense)
        self.dropout_layer = Dropout(dropout, dtype=self.dtype_policy)

    def build(self, query_shape, value_shape=None):
        value_shape = query_shape if value_shape is None else value_shape
        self.query_dense.build(query_shape)
        self.key_dense.build(value_shape)
        self.value_dense.build(value_shape)
        self.output_dense.build(tuple(query_shape[:-1]) + (self.num_heads * self.value_dim,))
        self.built = True

    def _split_heads(self, x, depth):
        """[batch, len, heads * depth] -> [batch, heads, len, depth]; a matrix
        [rows, heads * depth] (one position per row) -> [rows, heads, 1, depth]."""
        if len(x.shape) == 2:
            return ops.reshape(x, (ops.shape(x)[0], self.num_heads, 1, depth))
        batch, length = ops.shape(x)[0], ops.shape(x)[1]
        return ops.transpose(ops.reshape(x, (batch, length, self.num_heads, depth)), (0, 2, 1, 3))

    def project_key_value(self, value):
        """Per-head keys and values of `value` [batch, k_len, d_model]:
        ([batch, heads, k_len, d_k], [batch, heads, k_len, d_v]); of `value`
        [rows, d_model] (one position per row, in decoding): k_len = 1."""
        return (self._split_heads(self.key_dense(value), self.key_dim),
                self._split_heads(self.value_dense(value), self.value_dim))

    def attend(self, query, key_value, attention_mask=None, training=None):
        """Attention of `query` over projected `key_value` (from `project_key_value`).

        Args:
          query: [batch, q_len, d_model]; or, in decoding, [rows, d_model] with one
            position per row: the keys then have `groups` rows, a divisor of rows, and
            the rows / groups adjacent rows of a group (a sentence's beams) are its
            queries of the same keys.
          key_value: ([batch or groups, heads, k_len, d_k], [..., d_v]).
          attention_mask: bool broadcastable to [batch or groups, heads, q_len, k_len].
        Returns:
          ([batch, q_len, d_model] or [rows, d_model], float32 weights
          [batch or groups, heads, q_len, k_len]).
        """
        key, value = key_value
        queries = self.query_dense(query)
        one_position = len(query.shape) == 2
        if one_position:  # [rows, h * d_k] -> [groups, rows / groups, h * d_k]
            queries = ops.reshape(queries, (ops.shape(key)[0], -1, self.num_heads * self.key_dim))
        heads, weights = scaled_dot_product_attention(
            self._split_heads(queries, self.key_dim), key, value, mask=attention_mask,
            dropout_layer=self.dropout_layer, training=training)
        batch, q_len = ops.shape(heads)[0], ops.shape(heads)[2]
        # [batch, heads, q_len, d_v] -> [batch, q_len, heads * d_v]
        heads = ops.reshape(ops.transpose(heads, (0, 2, 1, 3)),
                            (batch, q_len, self.num_heads * self.value_dim))
        if one_position:  # a matrix again: the output projection is one matmul
            heads = ops.reshape(heads, (-1, self.num_heads * self.value_dim))
        return self.output_dense(heads), weights

    def call(self, query, value, attention_mask=None, training=None,
             return_attention_scores=False):
        output, weights = self.attend(query, self.project_key_value(value),
                                      attention_mask=attention_mask, training=training)
        return (output, weights) if return_attention_scores else output

    def compute_output_shape(self, query_shape, value_shape=None):
        return tuple(query_shape[:-1]) + (self.d_model,)

    def get_config(self):
        return {**super().get_config(), "num_heads": self.num_heads, "d_model": self.d_model,
                "key_dim": self.key_dim, "value_dim": self.value_dim, "dropout": self.dropout}
