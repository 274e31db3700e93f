"""Position-wise feed-forward network (paper section 3.3)."""

import keras
import tensorflow as tf

from keras_transformer.config import ACTIVATIONS
from keras_transformer.quantization import StaticInt8Kernel, dense, relu_feed_forward

# The function of each of ACTIVATIONS' names.
_FUNCTIONS = {"relu": tf.nn.relu, "swish": tf.nn.silu,
              "gelu": lambda x: tf.nn.gelu(x, approximate=False)}


@keras.saving.register_keras_serializable(package="keras_transformer")
class PositionwiseFeedForward(keras.layers.Layer):
    """FFN(x) = act(x W_1 + b_1) W_2 + b_2, applied to each position alike; act is the
    paper's max(0, .) by default.

    Args:
      d_model: input and output width (512 in the base model).
      d_ff: inner width (2048 in the base model).
      activation: "relu" (the paper's max(0, .)), "swish" or "gelu" (see ACTIVATIONS).

    Call: [batch, length, d_model] -> [batch, length, d_model].

    Example:

    >>> import keras
    >>> from keras_transformer import PositionwiseFeedForward
    >>> tuple(PositionwiseFeedForward(64, 256)(keras.random.normal((2, 5, 64))).shape)
    (2, 5, 64)
    """

    def __init__(self, d_model, d_ff, activation="relu", **kwargs):
        super().__init__(**kwargs)
        if activation not in ACTIVATIONS:
            raise ValueError(f"activation must be one of {ACTIVATIONS}, got {activation!r}")
        self.d_model = d_model
        self.d_ff = d_ff
        self.activation = activation
        self.inner = keras.layers.Dense(d_ff, name="inner", dtype=self.dtype_policy)
        self.outer = keras.layers.Dense(d_model, name="outer", dtype=self.dtype_policy)

    def build(self, input_shape):
        self.inner.build(input_shape)
        self.outer.build(tuple(input_shape[:-1]) + (self.d_ff,))
        self.built = True

    def call(self, x):
        return self.outer(_FUNCTIONS[self.activation](self.inner(x)))

    def step_weights(self):
        """(W_1, b_1, W_2, b_2) in the compute dtype, read once per decoding search."""
        return tuple(tf.cast(tf.convert_to_tensor(w), self.compute_dtype)
                     for w in (self.inner.kernel, self.inner.bias, self.outer.kernel,
                               self.outer.bias))

    def step(self, x, weights):
        """`call` in incremental decoding, on plain tensors: [rows, d_model] ->
        [rows, d_model] (one fused MatMul + BiasAdd (+ activation) per projection)."""
        w_1, b_1, w_2, b_2 = weights
        if self.activation == "relu" and isinstance(w_1, StaticInt8Kernel):
            return relu_feed_forward(x, w_1, w_2)  # int8 from one matmul to the next
        return dense(_FUNCTIONS[self.activation](dense(x, w_1, b_1)), w_2, b_2)

    def compute_output_shape(self, input_shape):
        return tuple(input_shape[:-1]) + (self.d_model,)

    def get_config(self):
        return {**super().get_config(), "d_model": self.d_model, "d_ff": self.d_ff,
                "activation": self.activation}
