"""Layer normalization (Ba et al., 2016) around every sublayer (paper section 3.1), with its
gradient in closed form."""

from typing import NamedTuple

import keras
import tensorflow as tf
from tensorflow.python.framework import op_def_library

from keras_transformer.gradients import custom_gradient


@keras.saving.register_keras_serializable(package="keras_transformer")
class LayerNormalization(keras.layers.LayerNormalization):
    """keras.layers.LayerNormalization over the last axis, in float32, with a hand-written
    gradient.

    y = gamma * (x - mean) / sqrt(variance + epsilon) + beta, per position. Autodiff of
    Keras' formulation runs about 25 elementwise ops and reductions over [batch, length,
    d_model] per layer norm in the backward pass; the closed form,
    dx = (g - mean(g) - x_hat * mean(g * x_hat)) / sqrt(variance + epsilon) with
    g = gamma * dy, runs about a dozen. Same weights, names and configuration as Keras'
    layer; other axes or options run Keras' own call.

    Call: x [..., d_model] (any float dtype) -> [..., d_model] in x's dtype.

    Example:

    >>> import keras
    >>> from keras_transformer.normalization import LayerNormalization
    >>> y = LayerNormalization(epsilon=1e-6)(keras.random.normal((2, 5, 8)))
    >>> float(keras.ops.max(keras.ops.abs(keras.ops.mean(y, axis=-1)))) < 1e-5
    True
    """

    def call(self, inputs):
        rank = len(inputs.shape)
        if ([a % rank for a in self.axis] != [rank - 1] or self.rms_scaling
                or not (self.center and self.scale)):
            return super().call(inputs)
        epsilon = self.epsilon

        @custom_gradient
        def normalize(x, gamma, beta):
            x_hat, inv = _standardize(x, epsilon)

            def gradient(dy):
                dy = tf.cast(dy, tf.float32)
                positions = list(range(len(dy.shape) - 1))
                g = dy * gamma
                dx = inv * (g - tf.reduce_mean(g, -1, keepdims=True)
                            - x_hat * tf.reduce_mean(g * x_hat, -1, keepdims=True))
                return (tf.cast(dx, x.dtype), tf.reduce_sum(dy * x_hat, positions),
                        tf.reduce_sum(dy, positions))

            return tf.cast(x_hat * gamma + beta, x.dtype), gradient

        gamma, beta = (tf.cast(w, tf.float32) for w in (self.gamma, self.beta))
        return tf.cast(normalize(inputs, gamma, beta), self.compute_dtype)

    def step_weights(self):
        """(gamma, beta) float32 [d_model], read once per decoding search."""
        return tuple(tf.cast(tf.convert_to_tensor(w), tf.float32) for w in (self.gamma, self.beta))


class OneDnnNorm(NamedTuple):
    """A layer norm's step weights (gamma, beta float32 [d_model]) to be computed by
    oneDNN's fused kernel, `_MklLayerNorm` (x86 TensorFlow's): one op for `layer_norm`'s
    ten, twice as fast at 256 rows of 256 (43 against 91 us on one thread of an AVX-512
    EPYC), slower below about 48 rows (19 against 11 us at 4). The int8_bfloat16 step's
    (keras_transformer.quantization.static_step_weights), whose graph already needs
    oneDNN; a search that stays at 16 rows or fewer runs the plain ops
    (keras_transformer.step)."""

    gamma: tf.Tensor
    beta: tf.Tensor


def layer_norm(x, weights, epsilon):
    """LayerNormalization's forward pass for incremental decoding: x [..., d_model] (any
    float dtype), weights from `step_weights` (gamma, beta float32 [d_model]) or a
    OneDnnNorm -> [..., d_model] in x's dtype, computed in float32 as the layer computes
    it."""
    if isinstance(weights, OneDnnNorm):
        _, _, op, _ = op_def_library._apply_op_helper(
            "_MklLayerNorm", name="layer_norm", x=tf.cast(x, tf.float32),
            scale=weights.gamma, offset=weights.beta, epsilon=epsilon)
        return tf.cast(op.outputs[0], x.dtype)
    gamma, beta = weights
    x_hat, _ = _standardize(x, epsilon)
    return tf.cast(x_hat * gamma + beta, x.dtype)


def _standardize(x, epsilon):
    """(x_hat float32 [..., d], 1 / sqrt(variance + epsilon) [..., 1]) over the last axis."""
    x32 = tf.cast(x, tf.float32)
    mean, variance = tf.nn.moments(x32, axes=[-1], keepdims=True)  # [..., 1]
    inv = tf.math.rsqrt(variance + epsilon)
    return (x32 - mean) * inv, inv
