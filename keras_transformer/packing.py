"""The non-padding tokens of a batch, packed: training computes on these alone."""

import tensorflow as tf

from keras_transformer.gradients import custom_gradient
from keras_transformer.special_ids import PAD_ID


class Packing:
    """Where the tokens of a padded batch of sequences are, to compute on them alone.

    Everything in the Transformer except attention is position-wise (section 3.3: "applied
    to each position separately and identically"): embeddings, projections, feed-forward
    networks, residuals, layer norms, dropout and the pre-softmax projection. On packed
    tokens [tokens, d_model] those skip the padding, a fifth of the positions of a
    length-bucketed batch; attention unpacks its projections into [batch, length, ...]
    (zeros at padding, which the masks hide) and packs its output again.

    Args:
      ids: int [batch, length], PAD_ID where padded (after each row's tokens or between
        them: any mask works).
      custom_gradient: pack and unpack take each other as their gradients (gathers both
        ways); False for inference: a custom gradient saved into a SavedModel makes every
        load of it warn. Without it, gradients still flow, through tf.gather's own.

    Attributes:
      num_tokens: int32 [], the non-padding positions.
      positions: int32 [tokens], each token's position in its row, row-major.

    Example:

    >>> import tensorflow as tf
    >>> from keras_transformer import Packing
    >>> packing = Packing(tf.constant([[5, 6, 3], [7, 3, 0]]))
    >>> packing.pack(tf.constant([[5, 6, 3], [7, 3, 0]])).numpy().tolist()
    [5, 6, 3, 7, 3]
    >>> packing.unpack(tf.constant([1, 2, 3, 4, 5])).numpy().tolist()
    [[1, 2, 3], [4, 5, 0]]
    """

    def __init__(self, ids, custom_gradient=True):
        self.custom_gradient = custom_gradient
        self.shape = tf.shape(ids)  # [2]: batch, length
        real = tf.reshape(tf.not_equal(ids, PAD_ID), [-1])  # [batch * length]
        # Both directions are gathers, forward and backward: unpacking with tf.scatter_nd
        # cost a CPU step as much as the padding saved (bench/performance-notes.md). `_rows` picks
        # the tokens out of the flattened batch, `_slots` every position's token, or for
        # padding the zero row after the last token.
        self._rows = tf.cast(tf.where(real)[:, 0], tf.int32)  # [tokens]
        self.num_tokens = tf.size(self._rows)
        self._slots = tf.where(real, tf.cumsum(tf.cast(real, tf.int32)) - 1,
                               self.num_tokens)  # [batch * length]
        self.positions = self._rows % self.shape[1]  # [tokens]

    def pack(self, x):
        """[batch, length, ...] -> [tokens, ...], the non-padding positions in order."""

        def pack(x):
            rows = tf.reshape(x, tf.concat([[-1], tf.shape(x)[2:]], 0))  # [batch * length, ...]
            return tf.gather(rows, self._rows), self.unpack

        return self._apply(pack, x)

    def unpack(self, x):
        """[tokens, ...] -> [batch, length, ...], zeros at padding (`pack`'s inverse)."""

        def unpack(x):
            # Then the zero row, for padding (x may have no rows: a batch of empty sources).
            rows = tf.concat([x, tf.zeros(tf.concat([[1], tf.shape(x)[1:]], 0), x.dtype)], 0)
            return (tf.reshape(tf.gather(rows, self._slots),
                               tf.concat([self.shape, tf.shape(x)[1:]], 0)), self.pack)

        return self._apply(unpack, x)

    def _apply(self, function, x):
        """function(x) -> (y, its gradient function): y, with that gradient unless the
        packing was made with custom_gradient=False."""
        if self.custom_gradient:
            return custom_gradient(function)(x)
        return function(x)[0]
