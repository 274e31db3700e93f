"""keras_transformer.ranking: tf.math.top_k's results in two passes."""

import numpy as np
import pytest
import tensorflow as tf

from keras_transformer.ranking import top_k


@pytest.mark.parametrize("vocab", [8000, 400, 97])
def test_top_k_in_two_passes_is_top_k(vocab):
    """The per-row top-k (groups of about sqrt(vocab), then the best groups'
    entries) returns tf.math.top_k's values and indices in its order, ties going to the
    lower index, with k fixed or a tensor, in a graph and under XLA; 97 has no divisor
    near its root, and 400's 20 groups are too few for k = 18: both take tf.math.top_k
    itself."""
    rng = np.random.default_rng(6)
    x = rng.integers(-4, 4, size=(40, vocab)).astype("float32")  # ties everywhere
    x[1] = rng.normal(size=vocab)
    x[2] = -np.inf  # a row with nothing allowed
    x[3] = -np.inf
    x[3, [vocab - 1, 5]] = 0.0  # one forced token and a tie at the ends
    x[4, :] = x[4, ::-1]
    for row in (5, 6):  # groups with different maxima, ties across groups
        x[row] = -(np.arange(vocab) % 7)
        x[row, rng.choice(vocab, 30, replace=False)] = rng.integers(1, 4, size=30)
    any_rows = [tf.TensorSpec([None, vocab], tf.float32)]
    for k in (1, 10, 18):
        expected = tf.math.top_k(x, k)
        for function in (
                tf.function(lambda x: top_k(x, k), input_signature=any_rows),
                tf.function(lambda x: top_k(x, tf.constant(k)),
                            input_signature=any_rows),
                tf.function(lambda x: top_k(x, k), jit_compile=True)):
            values, indices = function(x)
            np.testing.assert_array_equal(indices, expected.indices)
            np.testing.assert_array_equal(values, expected.values)
