"""keras_transformer.gradients.custom_gradient: the tape takes the given gradient, and a
traced graph dies with its tf.function (tf.custom_gradient's registry kept every one)."""

import gc

import numpy as np
import pytest
import tensorflow as tf

from conftest import CONFIG
from keras_transformer import Transformer
from keras_transformer.gradients import custom_gradient
from keras_transformer.losses import label_smoothed_cross_entropy
from keras_transformer.normalization import LayerNormalization


@custom_gradient
def _wrong(x, y):
    """x * y with the gradient (2, 3): a tape that autodiffs would give (y, x)."""
    return x * y, lambda dz: (2.0 * dz, 3.0 * dz)


def test_a_tape_takes_the_given_gradient_in_eager_and_in_a_function():
    x, y = tf.constant([1.0, 5.0]), tf.constant([7.0, 9.0])

    def gradients(x, y):
        with tf.GradientTape() as tape:
            tape.watch([x, y])
            z = tf.reduce_sum(_wrong(x, y))
        return tape.gradient(z, [x, y])

    for dx, dy in (gradients(x, y), tf.function(gradients)(x, y)):
        np.testing.assert_array_equal(dx, [2.0, 2.0])
        np.testing.assert_array_equal(dy, [3.0, 3.0])


def test_tf_gradients_without_a_tape_differentiates_the_forward_ops():
    @tf.function
    def symbolic(x, y):
        return tf.gradients(tf.reduce_sum(_wrong(x, y)), [x, y])

    dx, dy = symbolic(tf.constant([1.0, 5.0]), tf.constant([7.0, 9.0]))
    np.testing.assert_array_equal(dx, [7.0, 9.0])
    np.testing.assert_array_equal(dy, [1.0, 5.0])


def _func_graphs():
    gc.collect()
    return sum(type(o).__name__.endswith("FuncGraph") for o in gc.get_objects())


@pytest.mark.slow
def test_a_traced_model_and_its_training_gradient_leave_no_graph_behind():
    """The layer norms and the loss have closed-form gradients; every trace of a model's
    forward and backward pass is freed with its function."""
    model = Transformer(CONFIG)
    model.build()
    ids = tf.constant([[5, 6, 7, 3], [8, 9, 3, 0]])
    spec = [tf.TensorSpec([None, None], tf.int32)]

    def loss_and_gradients(ids):
        with tf.GradientTape() as tape:
            loss, tokens = label_smoothed_cross_entropy(ids, model((ids, ids), training=True))
        return loss / tokens, tape.gradient(loss, model.trainable_variables)

    before = _func_graphs()
    for _ in range(3):
        function = tf.function(loss_and_gradients, input_signature=spec)
        loss, grads = function(ids)
        assert np.isfinite(loss.numpy()) and all(g is not None for g in grads)
        del function, loss, grads
    assert _func_graphs() == before


def test_layer_normalization_in_a_function_gives_the_autodiff_gradient():
    layer = LayerNormalization(epsilon=1e-6)
    x = tf.random.stateless_normal([3, 5, 8], seed=[1, 2])
    layer.build(x.shape)

    @tf.function
    def closed_form(x):
        with tf.GradientTape() as tape:
            tape.watch(x)
            y = tf.reduce_sum(layer(x) * tf.range(8.0))
        return tape.gradient(y, [x, layer.gamma, layer.beta])

    def autodiff(x):
        with tf.GradientTape() as tape:
            tape.watch(x)
            mean, variance = tf.nn.moments(x, axes=[-1], keepdims=True)
            y = (x - mean) * tf.math.rsqrt(variance + 1e-6) * layer.gamma + layer.beta
            y = tf.reduce_sum(y * tf.range(8.0))
        return tape.gradient(y, [x, layer.gamma, layer.beta])

    for got, want in zip(closed_form(x), autodiff(x)):
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)
