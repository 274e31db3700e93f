"""The hand-written training kernels equal what they replace: the label-smoothed loss and
layer norm against autodiff of their definitions, dropout against its definition."""

import keras
import numpy as np
import pytest
import tensorflow as tf

from keras_transformer import (Dropout, LayerNormalization, correct_tokens,
                               label_smoothed_cross_entropy,
                               projected_label_smoothed_cross_entropy)
from keras_transformer.special_ids import PAD_ID


def autodiff_smoothed_loss(labels, logits, eps):
    """Section 5.4's loss by its definition, for autodiff: sum over non-pad positions of
    the cross-entropy against (1 - eps) * one_hot + eps / vocab."""
    log_probs = tf.nn.log_softmax(tf.cast(logits, tf.float32), axis=-1)
    vocab = log_probs.shape[-1]
    q = (1 - eps) * tf.one_hot(labels, vocab) + eps / vocab
    mask = tf.cast(labels != PAD_ID, tf.float32)
    return tf.reduce_sum(-tf.reduce_sum(q * log_probs, axis=-1) * mask)


def loss_and_gradient(loss_fn, labels, logits):
    logits = tf.Variable(logits)
    with tf.GradientTape() as tape:
        loss = 3.0 * loss_fn(labels, logits)  # an upstream gradient other than 1
    return loss, tape.gradient(loss, logits)


@pytest.mark.parametrize("eps", [0.0, 0.1, 0.3])
def test_smoothed_loss_and_its_closed_form_gradient_equal_autodiff_of_the_definition(eps):
    rng = np.random.default_rng(0)
    labels = rng.integers(1, 40, size=(4, 9)).astype("int32")
    labels[1, 6:] = labels[2, 2:] = labels[3, :] = PAD_ID  # padded rows, one all padding
    logits = (4 * rng.normal(size=(4, 9, 40))).astype("float32")
    loss, gradient = loss_and_gradient(
        lambda y, z: label_smoothed_cross_entropy(y, z, eps)[0], labels, logits)
    expected_loss, expected_gradient = loss_and_gradient(
        lambda y, z: autodiff_smoothed_loss(y, z, eps), labels, logits)
    np.testing.assert_allclose(loss, expected_loss, rtol=1e-5)
    np.testing.assert_allclose(gradient, expected_gradient, atol=1e-5)
    assert not np.any(gradient.numpy()[3])  # padding gets no gradient
    # Each non-pad row of the gradient is 3 * (softmax - q): it sums to zero.
    np.testing.assert_allclose(gradient.numpy().sum(-1), 0, atol=1e-5)


def test_smoothed_loss_stays_exact_when_the_label_is_far_below_the_maximum():
    # The label's probability underflows float32 (exp(-300)): a loss taken from log(p)
    # at the label would be infinite; the log-sum-exp from the maximum is not.
    logits = np.array([[[300.0, 0.0, 5.0, -20.0], [1.0, 2.0, 3.0, 4.0]]], np.float32)
    labels = np.array([[1, 3]], np.int32)
    eps = 0.1
    x = logits.astype(np.float64)
    log_probs = x - (x.max(-1, keepdims=True)
                     + np.log(np.exp(x - x.max(-1, keepdims=True)).sum(-1, keepdims=True)))
    q = (1 - eps) * np.eye(4)[labels] + eps / 4
    loss, gradient = loss_and_gradient(
        lambda y, z: label_smoothed_cross_entropy(y, z, eps)[0], labels, logits)
    np.testing.assert_allclose(loss, 3.0 * -(q * log_probs).sum(), rtol=1e-6)
    np.testing.assert_allclose(gradient, 3.0 * (np.exp(log_probs) - q), atol=1e-5)


def test_correct_tokens_counts_non_padding_positions_whose_label_scores_highest():
    rng = np.random.default_rng(4)
    logits = rng.normal(size=(3, 7, 12)).astype("float32")
    logits[..., PAD_ID] = -10.0  # no real label is PAD_ID
    labels = rng.integers(1, 12, size=(3, 7)).astype("int32")
    labels[0, :4] = logits[0, :4].argmax(-1)  # four certain hits
    labels[2, 5:] = PAD_ID  # padding never counts, whatever its logits
    logits[2, 5:, PAD_ID] = 100.0
    logits[1, 0, labels[1, 0]] = logits[1, 0].max()  # a tie at the top counts
    logits[1, 0, 0] = logits[1, 0].max()
    expected = np.sum((np.take_along_axis(logits, labels[..., None], -1)[..., 0]
                       == logits.max(-1)) & (labels != PAD_ID))
    assert expected >= 5
    assert float(correct_tokens(labels, logits)) == expected


def test_smoothed_loss_gradient_reaches_bfloat16_logits_in_their_dtype():
    labels = tf.constant([[5, 6, PAD_ID]])
    logits = tf.Variable(tf.cast(tf.random.normal([1, 3, 10], seed=1), tf.bfloat16))
    with tf.GradientTape() as tape:
        loss, tokens = label_smoothed_cross_entropy(labels, logits, 0.1)
    gradient = tape.gradient(loss, logits)
    assert gradient.dtype == tf.bfloat16 and float(tokens) == 2.0
    _, expected = loss_and_gradient(lambda y, z: autodiff_smoothed_loss(y, z, 0.1), labels,
                                    tf.cast(logits, tf.float32))
    np.testing.assert_allclose(3 * tf.cast(gradient, tf.float32), expected, atol=3e-2)


@pytest.mark.parametrize("policy", ["float32", "mixed_bfloat16"])
def test_layer_norm_and_its_closed_form_gradient_equal_keras_layer_norm(policy):
    x = tf.Variable(3 * tf.random.normal([3, 5, 16], seed=2) + 1)
    upstream = tf.random.normal([3, 5, 16], seed=3)
    rng = np.random.default_rng(1)
    gamma, beta = rng.normal(size=16).astype("float32"), rng.normal(size=16).astype("float32")
    results = []
    for layer_class in (LayerNormalization, keras.layers.LayerNormalization):
        layer = layer_class(epsilon=1e-6, dtype=policy)
        layer.build(x.shape)
        layer.gamma.assign(gamma)
        layer.beta.assign(beta)
        with tf.GradientTape() as tape:
            y = layer(x)
            loss = tf.reduce_sum(tf.cast(y, tf.float32) * upstream)
        results.append((y, *tape.gradient(loss, [x, layer.gamma, layer.beta])))
    (y, *grads), (expected_y, *expected_grads) = results
    assert y.dtype == expected_y.dtype == layer.compute_dtype
    tolerance = 1e-5 if policy == "float32" else 2e-2  # bfloat16 output, float32 gradients
    np.testing.assert_allclose(tf.cast(y, tf.float32), tf.cast(expected_y, tf.float32),
                               atol=tolerance)
    for grad, expected in zip(grads, expected_grads):
        np.testing.assert_allclose(grad, expected, atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_dropout_drops_the_rate_and_keeps_the_expectation(dtype):
    layer = Dropout(0.1, seed=4, dtype=dtype)
    x = tf.ones([256, 64, 64], dtype)  # a million elements
    y = layer(x, training=True).numpy().astype("float32")
    kept = y != 0
    # Binomial(1M, 0.1): the standard deviation of the dropped share is 0.0003.
    assert abs(1 - kept.mean() - 0.1) < 0.0015
    np.testing.assert_allclose(np.unique(y[kept]), [1 / (1 - 6554 / 65536)], rtol=1e-2)
    assert abs(y.mean() - 1) < 0.005
    second = layer(x, training=True).numpy()
    assert (second != 0).mean() > 0.85 and np.mean(kept != (second != 0)) > 0.1  # new masks
    np.testing.assert_array_equal(layer(x, training=False), x)


def test_dropout_gradient_is_its_mask_times_the_scale():
    layer = Dropout(0.3, seed=5)
    x = tf.random.normal([64, 33], seed=6)
    with tf.GradientTape() as tape:
        tape.watch(x)
        y = layer(x, training=True)
        total = tf.reduce_sum(y)
    gradient = tape.gradient(total, x).numpy()
    scale = gradient.max()
    assert scale == pytest.approx(1 / (1 - 0.3), rel=1e-3)
    np.testing.assert_allclose(y.numpy(), x.numpy() * gradient, rtol=1e-6)
    assert set(np.unique(gradient)) == {0.0, scale}


@pytest.mark.parametrize("eps, with_bias", [(0.0, False), (0.1, False), (0.1, True)])
def test_projected_loss_and_its_gradients_equal_the_loss_of_the_projection(eps, with_bias):
    # The trainer's loss takes the decoder output, the embedding matrix and the output
    # bias (if any); its loss, token count, correct tokens and gradients are those of the
    # logits' loss.
    rng = np.random.default_rng(5)
    outputs = tf.Variable(rng.normal(size=(30, 16)).astype("float32"))
    embeddings = tf.Variable((rng.normal(size=(40, 16)) / 2).astype("float32"))
    bias = tf.Variable(rng.normal(size=40).astype("float32") if with_bias
                       else np.zeros(40, "float32"))
    labels = rng.integers(1, 40, size=30).astype("int32")
    labels[[3, 11, 29]] = PAD_ID
    labels[7] = labels[8] = labels[9]  # repeated labels: the embedding gradient adds up
    top = tf.argmax(tf.matmul(outputs, embeddings, transpose_b=True) + bias, -1).numpy()
    hits = [t for t in (0, 1, 2, 4, 5, 6) if top[t] != PAD_ID]
    labels[hits] = top[hits]  # certain hits
    variables = [outputs, embeddings] + ([bias] if with_bias else [])
    results = []
    for projected in (True, False):
        with tf.GradientTape() as tape:
            if projected:
                loss, tokens, correct = projected_label_smoothed_cross_entropy(
                    labels, outputs, embeddings, eps, bias=bias if with_bias else None)
            else:
                logits = tf.matmul(outputs, embeddings, transpose_b=True) + bias
                loss, tokens = label_smoothed_cross_entropy(labels, logits, eps)
                correct = correct_tokens(labels, logits)
            scaled = 3.0 * loss  # an upstream gradient other than 1
        results.append((loss, tokens, correct, *tape.gradient(scaled, variables)))
    (loss, tokens, correct, *gradients), (expected_loss, expected_tokens, expected_correct,
                                          *expected_gradients) = results
    np.testing.assert_allclose(loss, expected_loss, rtol=1e-5)
    assert float(tokens) == float(expected_tokens) == 27
    assert float(correct) == float(expected_correct) >= len(hits) >= 3
    for got, expected in zip(gradients, expected_gradients):
        np.testing.assert_allclose(got, expected, atol=1e-5)
    assert not np.any(gradients[0].numpy()[[3, 11, 29]])  # padding gets no gradient


def test_projected_loss_gradients_come_in_the_compute_dtype_under_a_loss_scale():
    # Mixed precision: the matmuls run in float16 / bfloat16 and the gradients come back
    # in that dtype, near float32's, with a float16 loss scale of 2^10 multiplying them.
    rng = np.random.default_rng(6)
    outputs32 = (2 * rng.normal(size=(12, 8))).astype("float32")
    embeddings32 = (rng.normal(size=(20, 8)) / 4).astype("float32")
    labels = rng.integers(1, 20, size=12).astype("int32")
    scale, grads = 2.0 ** 10, {}
    for dtype in (tf.float32, tf.float16, tf.bfloat16):
        outputs, embeddings = (tf.Variable(tf.cast(x, dtype)) for x in (outputs32, embeddings32))
        with tf.GradientTape() as tape:
            loss, _, _ = projected_label_smoothed_cross_entropy(labels, outputs, embeddings)
            scaled = loss * scale
        grads[dtype] = tape.gradient(scaled, [outputs, embeddings])
        assert [g.dtype for g in grads[dtype]] == [dtype, dtype]
    for dtype, tolerance in ((tf.float16, 1e-2), (tf.bfloat16, 5e-2)):
        for got, want in zip(grads[dtype], grads[tf.float32]):
            np.testing.assert_allclose(tf.cast(got, tf.float32) / scale, want / scale,
                                       atol=tolerance * float(tf.reduce_max(tf.abs(want))) / scale)
