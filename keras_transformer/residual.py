"""The residual connection around every sublayer (paper section 3.1 and 5.4)."""

import keras
import tensorflow as tf

from keras_transformer.dropout import Dropout
from keras_transformer.normalization import LayerNormalization, layer_norm


@keras.saving.register_keras_serializable(package="keras_transformer")
class Residual(keras.layers.Layer):
    """LayerNorm(x + Dropout(Sublayer(x))) (post-norm, the paper), or
    x + Dropout(Sublayer(LayerNorm(x))) with pre_norm=True.

    Usage around a sublayer f:  y = f(residual.sublayer_input(x));  x = residual(x, y)

    Args:
      dropout: P_drop, the dropout rate on the sublayer output (section 5.4). Defaults
        to 0.1, the base model's.
      pre_norm: normalise the sublayer's input instead of the sum. Defaults to False,
        the paper's post-norm.
      epsilon: the layer norm's epsilon, added to the variance. Defaults to 1e-6.

    Call: x, sublayer_output [batch, length, d_model] -> [batch, length, d_model].

    Example:

    >>> import keras
    >>> from keras_transformer import PositionwiseFeedForward, Residual
    >>> feed_forward, residual = PositionwiseFeedForward(64, 256), Residual(dropout=0.1)
    >>> x = keras.random.normal((2, 5, 64))
    >>> tuple(residual(x, feed_forward(residual.sublayer_input(x))).shape)
    (2, 5, 64)
    """

    def __init__(self, dropout=0.1, pre_norm=False, epsilon=1e-6, **kwargs):
        super().__init__(**kwargs)
        self.dropout = dropout
        self.pre_norm = pre_norm
        self.dropout_layer = Dropout(dropout, dtype=self.dtype_policy)
        self.layer_norm = LayerNormalization(epsilon=epsilon, name="layer_norm",
                                                          dtype=self.dtype_policy)

    def build(self, x_shape, sublayer_output_shape=None):
        self.layer_norm.build(x_shape)
        self.built = True

    def sublayer_input(self, x):
        """What the sublayer sees: x [batch, length, d_model], normalised when pre_norm."""
        return self.layer_norm(x) if self.pre_norm else x

    def call(self, x, sublayer_output, training=None):
        """x, sublayer_output [batch, length, d_model] -> [batch, length, d_model]."""
        total = x + self.dropout_layer(sublayer_output, training=training)
        return total if self.pre_norm else self.layer_norm(total)

    def step_weights(self):
        """The layer norm's (gamma, beta), read once per decoding search."""
        return self.layer_norm.step_weights()

    def step_sublayer_input(self, x, weights):
        """`sublayer_input` in incremental decoding: x [rows, d_model], weights from
        `step_weights`."""
        return layer_norm(x, weights, self.layer_norm.epsilon) if self.pre_norm else x

    def step(self, x, sublayer_output, weights):
        """`call` in incremental decoding (inference: no dropout): [rows, d_model] in x's
        dtype (an int8 matmul's float32 output added to a float32 stream as it is)."""
        total = x + tf.cast(sublayer_output, x.dtype)
        return total if self.pre_norm else layer_norm(total, weights, self.layer_norm.epsilon)

    def compute_output_shape(self, x_shape, sublayer_output_shape=None):
        return x_shape

    def get_config(self):
        return {**super().get_config(), "dropout": self.dropout, "pre_norm": self.pre_norm,
                "epsilon": self.layer_norm.epsilon}
