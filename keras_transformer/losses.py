"""Label-smoothed cross-entropy over non-padding tokens (paper section 5.4)."""

import tensorflow as tf

from keras_transformer.masking import PAD_ID


def label_smoothed_cross_entropy(labels, logits, label_smoothing=0.1):
    """Summed cross-entropy against q = (1 - eps) * one_hot(label) + eps / vocab.

    Returns sums, not means, so that the caller can divide by the number of tokens of
    the whole (accumulated, all-replica) batch, as the paper's token-based batches imply.

    Args:
      labels: int [batch, length], PAD_ID where padded.
      logits: float32 [batch, length, vocab].
      label_smoothing: eps_ls (0.1 in the paper).
    Returns:
      (loss_sum float32 [], num_tokens float32 []) over non-padding positions.
    """
    log_probs = tf.nn.log_softmax(tf.cast(logits, tf.float32), axis=-1)
    labels = tf.cast(labels, tf.int32)
    nll = -tf.gather(log_probs, labels, batch_dims=2)  # [batch, length]
    uniform = -tf.reduce_mean(log_probs, axis=-1)  # cross-entropy with eps/vocab everywhere
    loss = (1.0 - label_smoothing) * nll + label_smoothing * uniform
    mask = tf.cast(tf.not_equal(labels, PAD_ID), tf.float32)
    return tf.reduce_sum(loss * mask), tf.reduce_sum(mask)


def correct_tokens(labels, logits):
    """Number of non-padding positions whose argmax equals the label: float32 []."""
    labels = tf.cast(labels, tf.int32)
    hit = tf.equal(tf.argmax(logits, axis=-1, output_type=tf.int32), labels)
    return tf.reduce_sum(tf.cast(tf.logical_and(hit, tf.not_equal(labels, PAD_ID)), tf.float32))
