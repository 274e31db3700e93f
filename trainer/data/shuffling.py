"""The training order: each epoch, every pair of a corpus once, in a seeded random
permutation of its own, drawn by index from the corpus held in memory.

A shuffle buffer (tf.data's `shuffle`) mixes only pairs that are near each other in the
file, and a checkpoint of the stream must hold the buffer's contents (tens of MB for
100,000 pairs). Here the corpus is read once into memory, and the pair at position p of
epoch e is

    pair[index_shuffle(p, seed=(seed, e), max_index=n - 1)]

(`tf.random.experimental.index_shuffle`: a keyed bijection of [0, n)), so the order is
a permutation of the whole corpus, a new one each epoch, and the stream's position is
the count of blocks read: a checkpoint of it costs a few integers, whatever the corpus,
and restoring it reads nothing.

Each side of a corpus is kept as one string of all its lines and their offsets (about
the text's size plus 8 bytes a line; a tensor of one string per line costs four times
the text), in variables: a tensor captured by a tf.data function is copied into the
dataset's graph (500 MB of text cost 2.9 GB at the peak and 0.5 GB after), a variable is
read by reference. The stream's checkpoint leaves the variables out (their contents are
read from the corpus again at every start), so it holds the position alone.
"""

import random
from typing import Optional, Tuple

import tensorflow as tf

# Pairs gathered per tf.data call (a call per pair costs more than gathering it).
_BLOCK = 1024
# Pairs per batch while the corpus is read into memory.
_READ_BATCH = 1 << 16


# One side of a corpus in memory, (text, offsets): a tf.string scalar of all its lines
# and int64 [lines + 1], line i being text[offsets[i]:offsets[i + 1]].
Side = Tuple[tf.Tensor, tf.Tensor]


def _lines(side: Side, indices: tf.Tensor) -> tf.Tensor:
    """int64 [k] -> tf.string [k]: the side's lines at these indices."""
    text, offsets = side
    starts = tf.gather(offsets, indices)
    return tf.strings.substr(text, starts, tf.gather(offsets, indices + 1) - starts)


def _read(pairs: tf.data.Dataset) -> Tuple[Side, Side]:
    """The (source, target) sides of a dataset of tf.string scalar pairs, in memory."""

    def joined(*sides):  # tf.string [batch] each -> (its lines joined, their lengths) each
        return tuple((tf.strings.reduce_join(lines), tf.strings.length(lines)) for lines in sides)

    parts = ([], []), ([], [])
    for sides in pairs.batch(_READ_BATCH).map(joined, num_parallel_calls=tf.data.AUTOTUNE):
        for (texts, lengths), (text, length) in zip(parts, sides):
            texts.append(text)
            lengths.append(length)
    sides = []
    for texts, lengths in parts:
        lengths = tf.cast(tf.concat(lengths or [tf.zeros([0], tf.int32)], 0), tf.int64)
        text = tf.strings.join(texts) if texts else tf.constant(b"")
        texts.clear()  # the parts' memory, before the other side is joined
        sides.append((text, tf.concat([[0], tf.cumsum(lengths)], 0)))
    return sides[0], sides[1]


def shuffled(pairs: tf.data.Dataset, seed: Optional[int] = None,
             num_epochs: Optional[int] = None) -> tf.data.Dataset:
    """The pairs of `pairs` (tf.string scalar pairs, read into memory here), each epoch
    in a permutation of its own, for `num_epochs` epochs (None: forever).

    The order is a function of (seed, epoch, position) alone (seed None draws one), so
    the stream's checkpointed state is its position, and two streams of one seed agree.
    Yields (source, target) tf.string scalar pairs.
    """
    source, target = (tuple(tf.Variable(part, trainable=False) for part in side)
                      for side in _read(pairs))
    size = int(tf.size(source[1])) - 1
    blocks = -(-size // _BLOCK)  # per epoch
    seed = random.randrange(1 << 62) if seed is None else seed

    def block(index):  # int64 scalar -> (tf.string [<= _BLOCK],) * 2
        epoch, first = index // blocks, index % blocks * _BLOCK
        positions = tf.range(first, tf.minimum(first + _BLOCK, size))
        order = tf.random.experimental.index_shuffle(
            positions, tf.stack([tf.constant(seed, tf.int64), epoch]),
            tf.constant(size - 1, tf.int64))
        return _lines(source, order), _lines(target, order)

    indices = (tf.data.Dataset.counter() if num_epochs is None and blocks
               else tf.data.Dataset.range(blocks * (num_epochs or 0)))
    options = tf.data.Options()  # the corpus' variables are not the stream's state
    options.experimental_external_state_policy = tf.data.experimental.ExternalStatePolicy.IGNORE
    return indices.map(block).unbatch().with_options(options)
