"""The training order is a real shuffle: each epoch reads the corpus in a uniform random
permutation, drawn independently of the last epoch's and of a neighbouring seed's
(trainer/data/shuffling.py). A keyed bijection whose orders repeat each other (an index
at each position correlating 0.43 with the next epoch's) fails these."""

import collections

import numpy as np
import pytest
import tensorflow as tf

from trainer.data import shuffling


def orders(size, seed, num_epochs):
    """int [num_epochs, size]: the index of the pair read at each position of each epoch,
    as the stream yields it (pair i's source is the text of i)."""
    lines = tf.data.Dataset.range(size).map(lambda i: tf.strings.as_string(i))
    stream = shuffling.shuffled(tf.data.Dataset.zip(lines, lines), seed, num_epochs)
    indices = [int(source) for source, _ in stream.as_numpy_iterator()]
    return np.array(indices).reshape(num_epochs, size)


@pytest.mark.slow
def test_epochs_and_neighbouring_seeds_read_in_uncorrelated_orders():
    size = 20_000
    bound = 4 / np.sqrt(size)  # independent permutations: about +-1 / sqrt(size)
    seven, eight = orders(size, 7, 3), orders(size, 8, 1)
    for order in (*seven, *eight):
        assert sorted(order) == list(range(size))  # every pair once per epoch
    for a, b, what in ((seven[0], seven[1], "epochs 0 and 1"),
                       (seven[1], seven[2], "epochs 1 and 2"),
                       (seven[0], eight[0], "seeds 7 and 8")):
        correlation = np.corrcoef(a, b)[0, 1]
        assert abs(correlation) < bound, (what, correlation)
        # nor does one order carry the other's neighbours along
        assert abs(np.corrcoef(np.argsort(a), np.argsort(b))[0, 1]) < bound, what


@pytest.mark.slow
def test_every_position_is_equally_likely_for_a_pair():
    size, epochs = 5, 4_000
    counts = np.zeros([size, size])  # [pair, position]
    for order in orders(size, 3, epochs):
        counts[order, np.arange(size)] += 1
    expected = epochs / size
    chi_square = ((counts - expected) ** 2 / expected).sum()
    # 16 degrees of freedom: beyond 39.3 with probability 0.001
    assert chi_square < 39.3, counts
    # the orders themselves: all 120 permutations of 5 drawn, none far from 1/120
    drawn = collections.Counter(map(tuple, orders(size, 4, epochs)))
    assert len(drawn) == 120 and max(drawn.values()) < 2.5 * epochs / 120, drawn


def test_a_seed_and_an_epoch_fix_the_order():
    first, again = orders(1_000, 11, 2), orders(1_000, 11, 2)
    assert (first == again).all()
    assert (first[1] == shuffling.permutation(1_000, 11, 1).numpy()).all()
