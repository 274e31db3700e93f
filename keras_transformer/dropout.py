"""Dropout (paper section 5.4) with a keep mask drawn from 16 random bits per element."""

import keras
import tensorflow as tf

_LEVELS = 2 ** 16  # the values 16 random bits take


@keras.saving.register_keras_serializable(package="keras_transformer")
class Dropout(keras.layers.Dropout):
    """keras.layers.Dropout at a quarter of the random-number cost.

    Keras draws a float uniform per element (32 random bits; for bfloat16 inputs a
    bfloat16 uniform, slower still), about a tenth of a bfloat16 training step on a CPU.
    Here every 64-bit Philox draw gives four elements 16 bits each, and an element is
    dropped when its bits fall below round(rate * 2^16): the rate is exact to 2^-17
    (0.1 becomes 0.1000061) and the kept elements are scaled by 1 / (1 - that rate), so
    the expectation is exact. The mask is one multiply, forward and backward.

    Args:
      rate: the fraction of elements dropped, P_drop (0.1 in the base model).
      seed: as for keras.layers.Dropout. Defaults to None.
      noise_shape: as for keras.layers.Dropout; given, Keras' own dropout runs.

    Call: x [...] (training=True drops) -> [...] of the same dtype.

    `follow(rate)` makes the layer read its rate from a variable at every call from then
    on, so that a training run can change it (a dropout schedule) without tracing its
    update again; the mask is drawn as before, from the variable's value.

    Example:

    >>> import keras
    >>> from keras_transformer import Dropout
    >>> y = Dropout(0.5, seed=1)(keras.ops.ones((1000,)), training=True)
    >>> sorted(set(keras.ops.convert_to_numpy(y).tolist()))
    [0.0, 2.0]
    """

    def follow(self, rate: tf.Variable):
        """Reads the rate from `rate` (a float32 [] variable, in [0, 1)) at every call."""
        if self.noise_shape is not None or not hasattr(self, "seed_generator"):
            raise ValueError("only a Dropout built with a rate above 0 and no noise_shape "
                             "can follow a rate variable (its random numbers' state)")
        self.rate_variable = rate

    def call(self, inputs, training=False):
        rate = getattr(self, "rate_variable", None)
        if training and rate is not None:
            # round(rate * 2^16) and 2^16 / (2^16 - threshold) as the float rate's below
            # computes them, in float64, so that a constant variable draws the same masks.
            threshold = tf.round(tf.cast(rate, tf.float64) * _LEVELS)
            scale = tf.cast(_LEVELS / (_LEVELS - threshold), inputs.dtype)
            return self._dropped(inputs, tf.cast(threshold, tf.int32), scale)
        if not training or self.rate == 0 or self.noise_shape is not None:
            return super().call(inputs, training=training)
        threshold = round(self.rate * _LEVELS)
        if threshold >= _LEVELS:
            return tf.zeros_like(inputs)
        return self._dropped(inputs, threshold,
                             tf.constant(_LEVELS / (_LEVELS - threshold), inputs.dtype))

    def _dropped(self, inputs, threshold, scale):
        """inputs with the elements whose 16 random bits fall below `threshold` (an int
        or int32 []) zeroed and the others multiplied by `scale` (inputs' dtype [])."""
        # Seed state int64 -> the int32 pair stateless ops expect (as Keras does).
        seed = tf.cast(tf.math.floormod(self.seed_generator.next(), tf.int32.max - 1), tf.int32)
        size = tf.size(inputs)
        words = tf.random.stateless_uniform([(size + 3) // 4], seed, minval=None, maxval=None,
                                            dtype=tf.uint64)
        bits = tf.reshape(tf.bitcast(words, tf.uint16), [-1])[:size]
        if tf.is_tensor(threshold):
            bits = tf.cast(bits, tf.int32)
        keep = tf.reshape(bits, tf.shape(inputs)) >= threshold
        return inputs * tf.where(keep, scale, tf.zeros([], inputs.dtype))
