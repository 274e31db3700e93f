"""The k largest entries of each row of a vocabulary-wide tensor, as tf.math.top_k gives
them, in two small passes instead of one over every entry: what sampling's top-k / top-p
(sampling.py) and beam search over plain log-probs (keras_transformer/beam.py) rank by;
LogProbs.best_extensions (log_probs.py) groups a vocabulary the same way (`group_size`).
TensorFlow's CPU top-k walks every entry of a row one at a time."""

import math

import tensorflow as tf


def top_k(x, k):
    """tf.math.top_k(x, k) for x float32 [rows, vocab]: the same values, indices and
    order (ties: lower index first), in two small passes: the vocabulary's groups of
    about sqrt(vocab) entries ranked by their largest, then the k best entries of the
    k best groups. The k best entries lie in those groups: a group outside them has k
    groups above it, whose largest entries all rank above any of its own. A k above half
    the number of groups, or a vocab with no divisor within 2x of its root (or unknown),
    takes tf.math.top_k itself: past that, two passes stop paying (docs/performance-
    notes.md, "Ranking the vocabulary in two passes", has the timings).

    Returns (values float32 [rows, k], indices int32 [rows, k]).

    Example: a vocabulary of 1,000 in 40 groups of 25.

    >>> import numpy as np
    >>> import tensorflow as tf
    >>> from keras_transformer.ranking import top_k
    >>> x = tf.random.stateless_normal([3, 1000], seed=[0, 1])
    >>> values, indices = top_k(x, 4)
    >>> expected = tf.math.top_k(x, 4)
    >>> np.array_equal(values, expected.values), np.array_equal(indices, expected.indices)
    (True, True)
    >>> top_k(tf.constant([[1.0, 7.0, 7.0, 0.0] * 4]), 2)[1].numpy().tolist()  # ties
    [[1, 2]]
    """
    vocab = x.shape[-1]
    size = group_size(vocab) if vocab is not None else None
    groups = vocab // size if size else 0
    if not size or (not tf.is_tensor(k) and 2 * k > groups):
        return tf.math.top_k(x, k)
    rows = tf.shape(x)[0]

    def two_passes():
        grouped = tf.reshape(x, [rows, groups, size])
        _, best_groups = tf.math.top_k(tf.reduce_max(grouped, axis=-1), k)
        # In index order, so that top-k's ties still go to the lower index.
        best_groups = tf.sort(best_groups, axis=-1)  # [rows, k]
        candidates = tf.reshape(tf.gather(grouped, best_groups, batch_dims=1),
                                tf.stack([rows, k * size]))
        values, position = tf.math.top_k(candidates, k)
        return values, tf.gather(best_groups, position // size, batch_dims=1) * size + (
            position % size)

    if tf.is_tensor(k):
        return tf.cond(2 * k <= groups, two_passes, lambda: tuple(tf.math.top_k(x, k)))
    return two_passes()


def group_size(vocab):
    """The divisor of vocab nearest sqrt(vocab) within a factor of 2, or None."""
    root = math.sqrt(vocab)
    sizes = [size for size in range(max(2, math.ceil(root / 2)), math.floor(2 * root) + 1)
             if vocab % size == 0]
    return min(sizes, key=lambda size: abs(size - root)) if sizes else None
