"""Scaled dot-product attention and multi-head attention (paper section 3.2)."""

import math

import keras
import tensorflow as tf
from keras import ops

from keras_transformer.dropout import Dropout
from keras_transformer.masking import MASKED_LOGIT
from keras_transformer.quantization import dense


def _swap_length_and_heads(x):
    """[batch, a, b, depth] -> [batch, b, a, depth]: between [batch, len, heads, depth]
    and [batch, heads, len, depth].

    A reshape when a or b is statically 1 (nothing moves), else an einsum, not a
    transpose: with oneDNN on, TensorFlow runs tf.transpose as a oneDNN reorder built at
    every call, which costs a small decoding step more than the einsum's transpose, and
    training is no slower (bench/performance-notes.md, "The projection's copy and the
    head splits").
    """
    a, b, depth = x.shape[1], x.shape[2], x.shape[3]
    if 1 in (a, b) and None not in (a, b, depth):
        return ops.reshape(x, (-1, b, a, depth))
    return ops.einsum("xabd->xbad", x)


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


# A decoding step of at most this many rows (4 sentences of 4 beams) attends with
# elementwise ops: oneDNN splits each of its batched matmuls and softmaxes over the
# intra-op threads, and on small tensors waking the other thread costs more than the op
# (bench/performance-notes.md, "Attention without oneDNN for small steps"). Larger steps
# are faster with the matmuls, and so are small ones with a single thread.
ELEMENTWISE_MAX_ROWS = 16


def _step_attention(query, key, value, mask=None, elementwise=None):
    """softmax(Q K^T) V for a decoding step, the queries already scaled by 1 / sqrt(d_k)
    (MultiHeadAttention.step_weights): the ops of `scaled_dot_product_attention` in
    inference, without Keras' shape plumbing, as batched matmuls or, for a step of at most
    ELEMENTWISE_MAX_ROWS rows, as elementwise products and sums rounded as the matmuls
    round (the two agree up to the order of float32 sums).

    Args:
      query: [groups, queries, heads, d_k], the queries of a group sharing its keys (a
        row's one in self-attention, a sentence's beams in cross-attention).
      key: [groups, heads, k_len, d_k]; value: [groups, heads, k_len, d_v].
      mask: bool [groups, 1, 1, k_len] or [k_len], True may attend; or None.
      elementwise: None chooses by the step's rows; True or False is the choice made
        once for every step of a search known to have at most (or more than)
        ELEMENTWISE_MAX_ROWS rows throughout, which saves each step a `tf.cond` per
        attention (it rides in the step's weights: `MultiHeadAttention.step_weights`).
    Returns:
      [groups, queries, heads, d_v].
    """
    if elementwise is not None:
        return (_elementwise_attention if elementwise else _matmul_attention)(
            query, key, value, mask)
    rows = tf.shape(query)[0] * tf.shape(query)[1]
    return tf.cond(rows <= ELEMENTWISE_MAX_ROWS,
                   lambda: _elementwise_attention(query, key, value, mask),
                   lambda: _matmul_attention(query, key, value, mask))


def _matmul_attention(query, key, value, mask):
    """_step_attention as two batched matmuls around a softmax."""
    logits = tf.cast(tf.matmul(_swap_length_and_heads(query), key, transpose_b=True),
                     tf.float32)
    if mask is not None:
        logits = tf.where(mask, logits, MASKED_LOGIT)
    weights = tf.nn.softmax(logits, axis=-1)  # [groups, heads, queries, k_len]
    return _swap_length_and_heads(tf.matmul(tf.cast(weights, value.dtype), value))


def _elementwise_attention(query, key, value, mask):
    """_step_attention as float32 products and sums: each query against its group's keys
    by broadcasting, [groups, queries, heads, k_len, d]."""
    dtype = query.dtype

    def rounded(x):  # to what a matmul in the compute dtype returns
        return tf.cast(tf.cast(x, dtype), tf.float32)

    query, key, value = (tf.cast(x, tf.float32) for x in (query, key, value))
    logits = rounded(tf.reduce_sum(query[:, :, :, None] * key[:, None], axis=-1))
    if mask is not None:
        logits = tf.where(mask, logits, MASKED_LOGIT)  # [groups, queries, heads, k_len]
    weights = tf.exp(logits - tf.reduce_max(logits, axis=-1, keepdims=True))
    weights = rounded(weights / tf.reduce_sum(weights, axis=-1, keepdims=True))
    return tf.cast(tf.reduce_sum(weights[..., None] * value[:, None], axis=-2), dtype)


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
      dropout: the dropout rate on the attention weights (not in the paper; 0.0).

    Call:
      query [batch, q_len, d_model], value [batch, k_len, d_model],
      attention_mask bool broadcastable to [batch, heads, q_len, k_len]
      -> [batch, q_len, d_model] (and float32 weights [batch, heads, q_len, k_len]
      with return_attention_scores=True). Self-attention also runs on packed tokens:
      query and value [tokens, d_model] with their `packing` -> [tokens, d_model].

    Incremental decoding uses `step_weights` (read once per search), then
    `self_attention_step` and `cross_attention_step` (keys and values of the source
    from `project_key_value`, once per sentence) at every step.

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
        self.num_heads, self.d_model = num_heads, d_model
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

    def _split_heads(self, x, depth, packing=None):
        """[batch, len, heads * depth] (or packed [tokens, heads * depth] and its
        `Packing`) -> [batch, heads, len, depth]."""
        if packing is not None:
            x = packing.unpack(x)
        batch, length = ops.shape(x)[0], ops.shape(x)[1]
        return _swap_length_and_heads(ops.reshape(x, (batch, length, self.num_heads, depth)))

    def project_key_value(self, value, packing=None):
        """Per-head keys and values of `value` [batch, k_len, d_model] (or packed
        [tokens, d_model] and its `Packing`: projected before unpacking):
        ([batch, heads, k_len, d_k], [batch, heads, k_len, d_v])."""
        return (self._split_heads(self.key_dense(value), self.key_dim, packing),
                self._split_heads(self.value_dense(value), self.value_dim, packing))

    def attend(self, query, key_value, attention_mask=None, training=None, packing=None):
        """Attention of `query` [batch, q_len, d_model] over projected `key_value`
        ([batch, heads, k_len, d_k], [..., d_v]) from `project_key_value`, with
        attention_mask bool broadcastable to [batch, heads, q_len, k_len].

        With the `Packing` of the queries, `query` is packed, [tokens, d_model], and so is
        the output: the projections skip the padding.

        Returns ([batch, q_len, d_model] (or [tokens, d_model]), float32 weights
        [batch, heads, q_len, k_len]).
        """
        key, value = key_value
        heads, weights = scaled_dot_product_attention(
            self._split_heads(self.query_dense(query), self.key_dim, packing), key, value,
            mask=attention_mask, dropout_layer=self.dropout_layer, training=training)
        batch, q_len = ops.shape(heads)[0], ops.shape(heads)[2]
        # [batch, heads, q_len, d_v] -> [batch, q_len, heads * d_v]
        heads = ops.reshape(_swap_length_and_heads(heads),
                            (batch, q_len, self.num_heads * self.value_dim))
        if packing is not None:
            heads = packing.pack(heads)  # [tokens, heads * d_v]
        return self.output_dense(heads), weights

    def step_weights(self, self_attention, elementwise=None):
        """The projections incremental decoding uses, as tensors read once per search,
        and how its steps attend.

        The query projection carries 1 / sqrt(d_k) (exact when d_k is a power of 4, so
        outputs do not change), and for self-attention it is fused with the key and
        value projections: one [d_model, h * (2 d_k + d_v)] matmul per step, not three.
        Cross-attention's keys and values come from `project_key_value` once per sentence.

        Returns a dict: "input_kernel" [d_model, h * d_k] (self-attention:
        [d_model, h * (2 d_k + d_v)]), "input_bias", "output_kernel"
        [h * d_v, d_model], "output_bias", in the compute dtype; and "elementwise", the
        choice a search makes once (see `_step_attention`), None to choose at each step.
        """
        def weight(dense, scale=None):
            # Read here, outside the decoding loop, not at every step.
            kernel, bias = (tf.cast(tf.convert_to_tensor(w), self.compute_dtype)
                            for w in (dense.kernel, dense.bias))
            if scale is None:
                return kernel, bias
            return kernel * tf.cast(scale, kernel.dtype), bias * tf.cast(scale, bias.dtype)

        kernels, biases = zip(weight(self.query_dense, 1.0 / math.sqrt(self.key_dim)),
                              *((weight(self.key_dense), weight(self.value_dense))
                                if self_attention else ()))
        output_kernel, output_bias = weight(self.output_dense)
        return {"input_kernel": tf.concat(kernels, axis=1), "input_bias": tf.concat(biases, 0),
                "output_kernel": output_kernel, "output_bias": output_bias,
                "elementwise": elementwise}

    def self_attention_step(self, x, key, value, weights, index=None):
        """Self-attention of one new position per row over the cached ones and itself.

        Args:
          x: [rows, d_model], the position being decoded (its sublayer input).
          key, value: [rows, heads, position, d_k or d_v], the cached earlier positions;
            with `index`, [rows, heads, width, d]: every position the search may decode.
          weights: `step_weights(self_attention=True)`.
          index: None (the cache grows), or the scalar position of x in a fixed-width
            cache (XLA's fixed shapes): x's key and value are written there, and the
            positions after it are masked.
        Returns:
          (output [rows, d_model], key and value with x's: [rows, heads, position + 1, d],
          or the fixed-width cache with position `index` written).
        """
        h, d_k, d_v = self.num_heads, self.key_dim, self.value_dim
        projected = dense(x, weights["input_kernel"], weights["input_bias"],
                          key.dtype)  # [rows, h * (2 d_k + d_v)]
        query, new_key, new_value = tf.split(projected, [h * d_k, h * d_k, h * d_v], axis=1)
        # Static shapes with -1 for rows: no shape ops at every step.
        new_key = tf.reshape(new_key, [-1, h, 1, d_k])
        new_value = tf.reshape(new_value, [-1, h, 1, d_v])
        mask = None  # growing: every cached position precedes this one
        if index is None:
            key = tf.concat([key, new_key], axis=2)
            value = tf.concat([value, new_value], axis=2)
        else:
            position = tf.range(tf.shape(key)[2])
            written = (position == index)[:, None]  # [width, 1]
            key, value = tf.where(written, new_key, key), tf.where(written, new_value, value)
            mask = position <= index
        heads = _step_attention(tf.reshape(query, [-1, 1, h, d_k]), key, value, mask,
                                weights["elementwise"])
        return _step_output(tf.reshape(heads, [-1, h * d_v]), weights), key, value

    def cross_attention_step(self, x, key, value, mask, weights):
        """Encoder-decoder attention of one position per row, the rows / groups
        adjacent rows of a group (a sentence's beams) querying the same keys.

        Args:
          x: [rows, d_model], the sublayer input.
          key, value: [groups, heads, src_len, d_k or d_v] from `project_key_value`.
          mask: bool [groups, 1, 1, src_len], True for real source tokens.
          weights: `step_weights(self_attention=False)`.
        Returns:
          [rows, d_model].
        """
        h, d_k, d_v = self.num_heads, self.key_dim, self.value_dim
        query = dense(x, weights["input_kernel"], weights["input_bias"],
                      key.dtype)  # [rows, h * d_k]
        query = tf.reshape(query, [tf.shape(key)[0], -1, h, d_k])  # [groups, beams, h, d_k]
        heads = _step_attention(query, key, value, mask,
                                weights["elementwise"])  # [groups, beams, h, d_v]
        return _step_output(tf.reshape(heads, [-1, h * d_v]), weights)

    def call(self, query, value, attention_mask=None, training=None,
             return_attention_scores=False, packing=None):
        output, weights = self.attend(query, self.project_key_value(value, packing),
                                      attention_mask=attention_mask, training=training,
                                      packing=packing)
        return (output, weights) if return_attention_scores else output

    def compute_output_shape(self, query_shape, value_shape=None):
        return tuple(query_shape[:-1]) + (self.d_model,)

    def get_config(self):
        return {**super().get_config(), "num_heads": self.num_heads, "d_model": self.d_model,
                "key_dim": self.key_dim, "value_dim": self.value_dim, "dropout": self.dropout}


def packed_self_attention(attention, x, mask, weights, packing):
    """Self-attention over a packed source's tokens in inference, on plain tensors and
    given weights: the encoder's `call` for weights other than its layers' own (an int8
    export's, keras_transformer.quantization), as a decoding step reads them, with the
    step's batched matmuls (`_matmul_attention`).

    Args:
      attention: the MultiHeadAttention (its heads and depths).
      x: [tokens, d_model], the sublayer input, packed by the source's `packing`.
      mask: bool [batch, 1, 1, src_len], True for real tokens.
      weights: attention.step_weights(self_attention=True) (queries pre-scaled, one
        fused projection), or int8 ones made from them.
    Returns:
      [tokens, d_model], in the compute dtype (float32 from an int8 projection).
    """
    d_k, d_v = attention.key_dim, attention.value_dim
    query, key, value = _packed_heads(attention, dense(
        x, weights["input_kernel"], weights["input_bias"], attention.compute_dtype),
        (d_k, d_k, d_v), packing)  # [batch, src_len, heads, depth] each
    heads = _matmul_attention(query, _swap_length_and_heads(key),
                              _swap_length_and_heads(value), mask)
    heads = tf.reshape(heads, tf.concat([tf.shape(heads)[:2], [attention.num_heads * d_v]], 0))
    return _step_output(packing.pack(heads), weights)


def key_value_weights(attention):
    """A MultiHeadAttention's key and value projections fused, (kernel [d_model,
    h * (d_k + d_v)], bias), in its compute dtype: what `packed_key_value` reads."""
    kernels, biases = zip(*((tf.cast(tf.convert_to_tensor(w), attention.compute_dtype)
                             for w in (dense.kernel, dense.bias))
                            for dense in (attention.key_dense, attention.value_dense)))
    return tf.concat(kernels, axis=1), tf.concat(biases, 0)


def packed_key_value(attention, value, weights, packing):
    """attention.project_key_value of a packed source's tokens value [tokens, d_model] on
    given weights (`key_value_weights`, or int8 ones made from them): ([batch, heads,
    src_len, d_k], [batch, heads, src_len, d_v]) in the compute dtype."""
    keys, values = _packed_heads(attention, dense(value, *weights, dtype=attention.compute_dtype),
                                 (attention.key_dim, attention.value_dim), packing)
    return _swap_length_and_heads(keys), _swap_length_and_heads(values)


def _packed_heads(attention, projected, depths, packing):
    """A fused projection of a packed source's tokens, [tokens, heads * sum(depths)],
    unpacked once and split: one [batch, src_len, heads, depth] per depth."""
    projected = packing.unpack(projected)  # [batch, src_len, heads * sum(depths)]
    shape = tf.shape(projected)[:2]
    h = attention.num_heads
    return [tf.reshape(part, tf.concat([shape, [h, depth]], 0)) for part, depth in zip(
        tf.split(projected, [h * depth for depth in depths], axis=-1), depths)]


def _step_output(heads, weights):
    """W^O of a step's concatenated heads [rows, h * d_v] -> [rows, d_model]
    (MultiHeadAttention.step_weights' output kernel and bias)."""
    return dense(heads, weights["output_kernel"], weights["output_bias"])
