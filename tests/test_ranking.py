"""keras_transformer.ranking and LogProbs.best_extensions: tf.math.top_k's results in two
passes."""

import numpy as np
import pytest
import tensorflow as tf

from keras_transformer.log_probs import LogProbs
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


@pytest.mark.parametrize("vocab", [8000, 400, 97, None])
def test_best_extensions_are_one_top_k_over_every_beams_candidates(vocab):
    """A sentence's k best extensions, ranked a sentence at a time in two passes (groups
    of each beam's tokens, then the best groups' tokens), are what one top-k over its
    beam * vocab candidates of live + log_softmax gives, PAD and BOS left out: the same
    beams and tokens in the same order, ties going to the lower beam then token, and the
    same log-probs. Rows where PAD or BOS is the most probable token, where ties span
    groups and beams, and sentences with dead beams (-inf) included; k fixed and a
    tensor. 97 tokens have no group size and an unknown vocabulary (a shortlist's) none:
    both rank each row's most probable tokens first, with the same results."""
    size = vocab or 300
    n, beam, never = 6, 4, (0, 2)
    rng = np.random.default_rng(7)
    logits = rng.normal(size=(n * beam, size)).astype("float32") * 3
    logits[0, 0] = logits[1, 2] = 30.0  # PAD, BOS the most probable
    logits[4:8] = rng.integers(-3, 3, size=size)  # ties within rows and across beams
    # Sentence 3, one beam: the best token in the last group, and ties with a token of
    # that group in tokens before it, which the lower ones win.
    logits[12] = -10.0
    logits[12, [size - 1, size - 2, *range(10, 10 * 9, 9)]] = [5.0] + [3.0] * 10
    live = np.sort(rng.normal(size=(n, beam)).astype("float32") - 3)[:, ::-1].copy()
    live[1] = live[1, 0]  # sentence 1: four equal beams
    live[2:4, 1:] = -np.inf  # only beam 0 live (the first step)
    log_probs = live.reshape(-1, 1) + tf.nn.log_softmax(logits).numpy()
    log_probs[:, list(never)] = -np.inf
    spec = [tf.TensorSpec([None, vocab], tf.float32), tf.TensorSpec([None, beam], tf.float32)]
    for k in (2 * beam, beam + 1):
        expected = tf.math.top_k(log_probs.reshape(n, beam * size), k)
        for kept in (k, tf.constant(k)):
            function = tf.function(
                lambda x, live: LogProbs.of(x).best_extensions(live, kept, never),
                input_signature=spec)
            values, beams, tokens = function(logits, live)
            finite = np.isfinite(expected.values)
            np.testing.assert_array_equal(np.isfinite(values), finite)
            np.testing.assert_array_equal((beams * size + tokens)[finite],
                                          expected.indices.numpy()[finite])
            np.testing.assert_allclose(values.numpy()[finite], expected.values.numpy()[finite],
                                       rtol=0, atol=1e-5)
