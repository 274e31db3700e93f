"""Training computes on the non-padding tokens alone (Transformer.packed_logits): the same
logits, loss and gradients as the padded model, nothing computed at padding."""

import dataclasses

import keras
import numpy as np
import pytest
import tensorflow as tf

from keras_transformer import (Packing, Transformer, TransformerConfig,
                               label_smoothed_cross_entropy)
from keras_transformer.transformer import shift_right

CONFIG = TransformerConfig.tiny(vocab_size=50, dropout=0.0)


def padded_batch(seed, vocab=CONFIG.vocab_size):
    """(source_ids, target_input_ids, target_ids) int32: rows of every padding amount,
    one row not padded at all on either side."""
    rng = np.random.default_rng(seed)
    source = rng.integers(4, vocab, size=(4, 9)).astype("int32")
    target = rng.integers(4, vocab, size=(4, 7)).astype("int32")
    for row, (src_len, tgt_len) in enumerate([(9, 7), (3, 5), (6, 1), (1, 4)]):
        source[row, src_len:] = 0
        target[row, tgt_len:] = 0
    return source, shift_right(target).numpy(), target


def test_pack_keeps_the_tokens_in_order_and_unpack_puts_zeros_at_padding():
    ids = np.array([[5, 0, 6, 3], [7, 3, 0, 0], [0, 0, 0, 0]], "int32")  # gaps, empty row
    x = np.random.default_rng(0).normal(size=(3, 4, 2)).astype("float32")
    packing = Packing(ids)
    packed = packing.pack(x)
    np.testing.assert_array_equal(packed, x[ids != 0])
    np.testing.assert_array_equal(packing.positions, np.nonzero(ids)[1])
    np.testing.assert_array_equal(packing.unpack(packed), np.where((ids != 0)[..., None], x, 0))

    # Each is the other's gradient: padding gets none.
    x, w = tf.constant(x), tf.constant(np.arange(1, 11, dtype="float32").reshape(5, 2))
    with tf.GradientTape(persistent=True) as tape:
        tape.watch([x, w])
        packed_sum = tf.reduce_sum(packing.pack(x) * w)
        unpacked_sum = tf.reduce_sum(packing.unpack(w) * x)
    np.testing.assert_array_equal(tape.gradient(packed_sum, x), packing.unpack(w))
    np.testing.assert_array_equal(tape.gradient(unpacked_sum, w), packing.pack(x))


@pytest.mark.parametrize("overrides", [
    dict(), dict(pre_norm=True), dict(positional="learned"),
    dict(share_embeddings=False, source_vocab_size=70),
])
def test_packed_logits_equal_the_padded_models_at_every_target_token(overrides):
    keras.utils.set_random_seed(1)
    model = Transformer(dataclasses.replace(CONFIG, **overrides))
    source, target_input, _ = padded_batch(2)
    padded = model((source, target_input), training=False).numpy()
    packed, packing = model.packed_logits((source, target_input), training=False)
    assert packed.dtype == "float32" and int(packing.num_tokens) == (target_input != 0).sum()
    np.testing.assert_allclose(packed, padded[target_input != 0], atol=2e-5)


@pytest.mark.parametrize("policy", ["float32", "mixed_bfloat16"])
def test_the_packed_loss_and_every_gradient_equal_the_padded_models(policy):
    """What the trainer minimises: label-smoothed cross-entropy over the target tokens, in
    training mode (dropout 0 so both draw nothing)."""
    keras.utils.set_random_seed(3)
    model = Transformer(CONFIG, dtype=policy)
    source, target_input, target = padded_batch(4)
    with tf.GradientTape(persistent=True) as tape:
        logits = model((source, target_input), training=True)
        padded_loss, padded_tokens = label_smoothed_cross_entropy(target, logits)
        logits, packing = model.packed_logits((source, target_input), training=True)
        packed_loss, packed_tokens = label_smoothed_cross_entropy(packing.pack(target), logits)
    assert float(packed_tokens) == float(padded_tokens) == (target != 0).sum()
    rtol = 1e-5 if policy == "float32" else 2e-2
    assert float(packed_loss) == pytest.approx(float(padded_loss), rel=rtol)
    variables = model.trainable_variables
    packed_grads, padded_grads = ([tf.convert_to_tensor(g).numpy() for g in grads]
                                  for grads in (tape.gradient(packed_loss, variables),
                                                tape.gradient(padded_loss, variables)))
    largest = max(np.abs(g).max() for g in padded_grads)
    assert largest > 0
    for variable, a, b in zip(variables, packed_grads, padded_grads):
        # Relative to the variable's own gradient, or to the largest for those that are
        # zero but for rounding (a key bias does not change a softmax).
        tolerance = 10 * rtol * max(np.abs(b).max(), 1e-3 * largest)
        assert np.abs(a - b).max() <= tolerance, variable.path
