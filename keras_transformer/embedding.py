"""Token embeddings shared with the pre-softmax projection (paper section 3.4)."""

import math

import keras
from keras import ops
import tensorflow as tf

from keras_transformer.quantization import Int8Kernel, StaticInt8Kernel, dense


@keras.saving.register_keras_serializable(package="keras_transformer")
class SharedEmbedding(keras.layers.Layer):
    """One [vocab_size, d_model] matrix used as an embedding (scaled by sqrt(d_model))
    and, transposed, as the pre-softmax linear transformation.

    Call: ids int [batch, length] -> [batch, length, d_model].
    `logits`: [batch, length, d_model] -> float32 [batch, length, vocab_size].

    Args:
      vocab_size: rows of the matrix (about 37000 shared BPE pieces for WMT en-de).
      d_model: columns of the matrix.
      output_bias: add a trained bias [vocab_size] to the logits (Marian's models have
        one; the paper's projection has none). Defaults to False.

    Example:

    >>> import keras
    >>> from keras_transformer import SharedEmbedding
    >>> embedding = SharedEmbedding(vocab_size=100, d_model=16)
    >>> x = embedding(keras.ops.convert_to_tensor([[5, 6, 3]]))
    >>> tuple(x.shape), tuple(embedding.logits(x).shape)
    ((1, 3, 16), (1, 3, 100))
    """

    def __init__(self, vocab_size, d_model, output_bias=False, **kwargs):
        super().__init__(**kwargs)
        self.vocab_size = vocab_size
        self.d_model = d_model
        self.output_bias = output_bias

    def build(self, input_shape=None):
        # N(0, d_model^-1/2) makes the scaled embeddings unit-variance, like the
        # positional encodings they are added to.
        self.embeddings = self.add_weight(
            name="embeddings", shape=(self.vocab_size, self.d_model),
            initializer=keras.initializers.RandomNormal(stddev=self.d_model ** -0.5))
        if self.output_bias:
            self.bias = self.add_weight(name="bias", shape=(self.vocab_size,),
                                        initializer="zeros")
        self.built = True

    def call(self, ids):
        return ops.take(self.matrix(), ids, axis=0) * ops.cast(math.sqrt(self.d_model),
                                                               self.compute_dtype)

    def logits(self, x):
        """Pre-softmax projection x W^T (+ the output bias); float32 logits
        [..., vocab_size]."""
        logits = ops.cast(ops.matmul(x, ops.transpose(self.matrix())), "float32")
        return logits if not self.output_bias else logits + self.logits_bias()

    def logits_bias(self):
        """The output bias, float32 [vocab_size], or None without one."""
        return ops.cast(self.bias, "float32") if self.output_bias else None

    def matrix(self):
        """W [vocab_size, d_model] in the compute dtype (the embedding's rows; what
        `logits` projects on, e.g. for projected_label_smoothed_cross_entropy)."""
        return ops.cast(self.embeddings, self.compute_dtype)

    def step_weights(self):
        """What incremental decoding reads, read once per search: "matrix" [vocab_size,
        d_model] in the compute dtype (the embedding's rows) and either

        - in float32, "projection", its transpose [d_model, vocab_size], made once: in
          float32 a matmul with it is faster at every step than one with transpose_b
          (bench/performance-notes.md, "Ranking the vocabulary in two passes"), and
          "bias" [vocab_size] when there is an output bias; or
        - in other compute dtypes, "output_matrix", the same matrix as the projection's
          rows (a shortlist keeps a few of them: `restrict_step_weights`), and "bias"
          [vocab_size], the output bias or, without one, zeros. The paper's projection has no
          bias (section 3.4), but a matmul followed by a bias is what TensorFlow hands to
          oneDNN's fused matmul, and that kernel keeps the matrix in its own bfloat16 layout
          from one step to the next when serving runs with TF_ONEDNN_ASSUME_FROZEN_WEIGHTS=1;
          the plain matmul lays it out again at every step (bench/performance-notes.md, "The
          projection's copy and the head splits"). The matrix is read with transpose_b: in
          bfloat16 oneDNN does that as fast, and it skips the transposed copy.
        """
        matrix = tf.cast(tf.convert_to_tensor(self.embeddings), self.compute_dtype)
        bias = (tf.cast(tf.convert_to_tensor(self.bias), self.compute_dtype)
                if self.output_bias else None)
        if matrix.dtype == tf.float32:
            weights = {"matrix": matrix, "projection": tf.transpose(matrix)}
            return weights if bias is None else {**weights, "bias": bias}
        return {"matrix": matrix, "output_matrix": matrix,
                "bias": tf.zeros_like(matrix[:, 0]) if bias is None else bias}

    @staticmethod
    def restrict_step_weights(weights, ids):
        """Step weights whose logits are those of the pieces ids int32 [C] only
        (keras_transformer.shortlist): the projection's columns (or the output matrix's
        rows) and the bias's entries gathered once per search, "candidates" ids; the
        embedding rows stay whole.

        Their matmul is one that keeps no copy of its right-hand side from one call to
        the next: the plain matmul, the bias added after it. A fused matmul + bias would
        keep the first batch's rows under TF_ONEDNN_ASSUME_FROZEN_WEIGHTS=1 and compute
        every later batch's logits with them (docs/serving.md). An int8 projection's
        candidates are multiplied in the step's dtype, by the embedding's rows (the
        projection is their transpose): oneDNN's int8 matmul reorders a weight that is not
        constant at every call, some 600 times slower (3.8 s for 256 x 512 x 2,000)."""
        weights = {**weights, "candidates": ids}
        projection = weights.get("projection")
        if isinstance(projection, (Int8Kernel, StaticInt8Kernel)):
            del weights["projection"]
            weights["output_matrix"] = tf.gather(weights["matrix"], ids)
            if isinstance(projection, StaticInt8Kernel):  # it carries the bias
                weights["bias"] = projection.bias
        elif projection is not None:
            weights["projection"] = tf.gather(projection, ids, axis=1)
        else:
            weights["output_matrix"] = tf.gather(weights["output_matrix"], ids)
        if "bias" in weights:
            weights["bias"] = tf.cast(tf.gather(weights["bias"], ids), tf.float32)
        return weights

    def step(self, ids, weights):
        """`call` in incremental decoding: ids int [rows] -> [rows, d_model]."""
        return tf.gather(weights["matrix"], ids) * tf.cast(math.sqrt(self.d_model),
                                                           weights["matrix"].dtype)

    def step_logits(self, x, weights):
        """`logits` in incremental decoding: [rows, d_model] -> float32 [rows, vocab_size]
        (or [rows, C] of restricted weights, `restrict_step_weights`)."""
        if "candidates" in weights:  # a batch's own rows: no kernel may keep them
            if "projection" in weights:
                logits = dense(x, weights["projection"])
            else:  # in the matrix's dtype (a float32 stream of int8_bfloat16 weights)
                matrix = weights["output_matrix"]
                logits = tf.matmul(tf.cast(x, matrix.dtype), matrix, transpose_b=True)
            logits = tf.cast(logits, tf.float32)
            return logits + weights["bias"] if "bias" in weights else logits
        if "projection" in weights:
            logits = dense(x, weights["projection"], weights.get("bias"))
        else:
            logits = tf.matmul(x, weights["output_matrix"], transpose_b=True)
            if "bias" in weights:
                logits = tf.nn.bias_add(logits, weights["bias"])
        return tf.cast(logits, tf.float32)

    def compute_output_shape(self, input_shape):
        return tuple(input_shape) + (self.d_model,)

    def get_config(self):
        return {**super().get_config(), "vocab_size": self.vocab_size, "d_model": self.d_model,
                "output_bias": self.output_bias}
