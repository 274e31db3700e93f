"""The training order: each epoch, every pair of a corpus once, in a seeded random
permutation of its own, drawn from the corpus held in memory.

A shuffle buffer (tf.data's `shuffle`) mixes only pairs that are near each other in the
file, and a checkpoint of the stream must hold the buffer's contents (tens of MB for
100,000 pairs). Here the corpus is read once into memory, and epoch e reads it in the
order

    permutation(n, seed, e) = stateless_shuffle(range(n), key=fold_in(seed, e))

a uniform permutation of the whole corpus drawn afresh each epoch: the key is mixed from
(seed, e) by Philox (`stateless_fold_in`), so the orders of consecutive epochs, and of
neighbouring seeds, are as unrelated as independent draws. (A keyed bijection,
`tf.random.experimental.index_shuffle`, would spare the n indices but not the quality:
its orders for keys (s, e) and (s, e + 1) correlate about 0.43, so each epoch repeated
much of the last one's order, and the Multi30k recipe lost about a BLEU point.) The
permutation is computed when its epoch starts (n int64s, 8 bytes a pair) and again when a
run resumes inside it, so the stream's position is its epoch and its place in it: a
checkpoint of it costs a few integers, whatever the corpus.

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

    @tf.autograph.experimental.do_not_convert
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


def permutation(size: int, seed: int, epoch: tf.Tensor) -> tf.Tensor:
    """int64 [size]: the order in which epoch `epoch` (int64 scalar) reads a corpus of
    `size` pairs under `seed`, a uniform random permutation of [0, size)."""
    key = tf.random.experimental.stateless_fold_in(
        tf.constant([seed, 0], tf.int64), tf.cast(epoch, tf.int64))
    return tf.random.experimental.stateless_shuffle(tf.range(size, dtype=tf.int64), key)


def shuffled(pairs: tf.data.Dataset, seed: Optional[int] = None,
             num_epochs: Optional[int] = None) -> tf.data.Dataset:
    """The pairs of `pairs` (tf.string scalar pairs, read into memory here), each epoch
    in a permutation of its own (`permutation`), for `num_epochs` epochs (None: forever).

    The order is a function of (seed, epoch, position) alone (seed None draws one), so
    the stream's checkpointed state is its position, and two streams of one seed agree.
    Yields (source, target) tf.string scalar pairs.
    """
    source, target = (tuple(tf.Variable(part, trainable=False) for part in side)
                      for side in _read(pairs))
    size = int(tf.size(source[1])) - 1
    seed = random.randrange(1 << 62) if seed is None else seed

    @tf.autograph.experimental.do_not_convert
    def blocks(epoch):  # int64 scalar -> a dataset of int64 [<= _BLOCK], the epoch's order
        return tf.data.Dataset.from_tensor_slices(permutation(size, seed, epoch)).batch(_BLOCK)

    @tf.autograph.experimental.do_not_convert
    def block(order):  # int64 [k] -> (tf.string [k],) * 2
        return _lines(source, order), _lines(target, order)

    epochs = (tf.data.Dataset.counter() if num_epochs is None and size
              else tf.data.Dataset.range((num_epochs or 0) if size else 0))
    options = tf.data.Options()  # the corpus' variables are not the stream's state
    options.experimental_external_state_policy = tf.data.experimental.ExternalStatePolicy.IGNORE
    return epochs.flat_map(blocks).map(block).unbatch().with_options(options)
