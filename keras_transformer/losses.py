"""Label-smoothed cross-entropy over non-padding tokens (paper section 5.4)."""

import keras
import tensorflow as tf

from keras_transformer.gradients import custom_gradient
from keras_transformer.special_ids import PAD_ID


def _smoothed_terms(x, labels, label_smoothing):
    """The per-position loss and what its gradient needs, from float32 logits x [..., vocab]
    and int labels [...]: (loss [...], probs = softmax(x) [..., vocab], label_logits [...],
    max_logits [...]).

    The cross-entropy against q = (1 - eps) * one_hot(label) + eps / vocab is
    lse - (1 - eps) * x[label] - eps * mean(x), with lse = logsumexp(x) taken as
    max(x) - log(max(softmax(x))): max(softmax) >= 1 / vocab, so the log never underflows,
    however improbable the label. One softmax kernel (oneDNN's on CPU) gives both lse and
    the gradient's p, where a log-softmax and the exp of it in the gradient were the two
    slowest passes over [positions, vocab] (bench/performance-notes.md, "The loss over the
    vocabulary").
    """
    probs = tf.nn.softmax(x, axis=-1)
    max_logits = tf.reduce_max(x, axis=-1)
    log_sum_exp = max_logits - tf.math.log(tf.reduce_max(probs, axis=-1))
    label_logits = tf.gather(x, labels, batch_dims=labels.shape.rank)
    loss = (log_sum_exp - (1.0 - label_smoothing) * label_logits
            - label_smoothing * tf.reduce_mean(x, axis=-1))
    return loss, probs, label_logits, max_logits


def label_smoothed_cross_entropy(labels, logits, label_smoothing=0.1):
    """Summed cross-entropy against q = (1 - eps) * one_hot(label) + eps / vocab.

    Returns sums, not means, so that the caller can divide by the number of tokens of
    the whole (accumulated, all-replica) batch, as the paper's token-based batches imply.

    The gradient is written in closed form, softmax(logits) - q at every non-padding
    position: one pass over [batch, length, vocab] plus a scatter of one value per token.
    Autodiff of the same loss would scatter a [batch, length, vocab] gradient through the
    label gather and broadcast another through the mean, several passes more over the
    largest tensor of the step. Training goes one step further with
    `projected_label_smoothed_cross_entropy`.

    Args:
      labels: int [batch, length], PAD_ID where padded (or any shape, e.g. packed
        [tokens] from Transformer.packed_logits).
      logits: float [batch, length, vocab] (labels' shape + [vocab]; any float dtype;
        the loss is float32).
      label_smoothing: eps_ls (0.1 in the paper).
    Returns:
      (loss_sum float32 [], num_tokens float32 []) over non-padding positions.
    """
    labels = tf.cast(labels, tf.int32)
    mask = tf.cast(tf.not_equal(labels, PAD_ID), tf.float32)  # labels' shape

    @custom_gradient
    def loss_sum(logits):
        loss, probs, _, _ = _smoothed_terms(tf.cast(logits, tf.float32), labels,
                                            label_smoothing)

        def gradient(upstream):
            weight = upstream * mask  # labels' shape
            vocab = tf.shape(probs)[-1]
            grad = tf.reshape((probs - label_smoothing / tf.cast(vocab, tf.float32))
                              * weight[..., None], [-1, vocab])
            # [positions, 2] indices (position, label) of the one-hot part of q.
            indices = tf.stack([tf.range(tf.size(labels)), tf.reshape(labels, [-1])], axis=1)
            grad = tf.tensor_scatter_nd_sub(grad, indices,
                                            tf.reshape((1.0 - label_smoothing) * weight, [-1]))
            return tf.cast(tf.reshape(grad, tf.shape(logits)), logits.dtype)

        return tf.reduce_sum(loss * mask), gradient

    return loss_sum(logits), tf.reduce_sum(mask)


def projected_label_smoothed_cross_entropy(labels, outputs, embeddings, label_smoothing=0.1,
                                           bias=None):
    """`label_smoothed_cross_entropy(labels, outputs embeddings^T + bias)` with the
    pre-softmax projection inside, for training: the gradient never builds [tokens, vocab].

    The logits' gradient is G = w (p - eps / vocab) - (1 - eps) w one_hot(label), w the
    upstream gradient at non-padding tokens. Its two products are taken term by term,

      d outputs    = w * (p E - eps / vocab * sum_v E_v - (1 - eps) * E[label]),
      d embeddings = p^T (w * outputs) - eps / vocab * sum_t w_t outputs_t
                     - (1 - eps) * (w * outputs) scattered to the label rows,
      d bias       = p^T w - eps / vocab * sum_t w_t - (1 - eps) * w scattered to the labels,

    so the only [tokens, vocab] tensors are the logits and p (kept from the forward pass,
    in the compute dtype): the passes that made G (the one-hot scatter, the products by w,
    the cast to the compute dtype) are gone, and so is the argmax of token accuracy.

    Args:
      labels: int [tokens] (PAD_ID positions count for nothing).
      outputs: [tokens, d_model], the decoder's output (Transformer.packed_logits(...,
        project=False)), in the compute dtype.
      embeddings: [vocab, d_model], the shared embedding matrix in the compute dtype.
      label_smoothing: eps_ls.
      bias: float32 [vocab], the output bias (SharedEmbedding.logits_bias()), or None.
    Returns:
      (loss_sum float32 [], num_tokens float32 [], correct_tokens float32 []): the last
      counts the non-padding tokens whose label has the highest logit, as
      `correct_tokens` would.
    """
    labels = tf.cast(labels, tf.int32)
    mask = tf.cast(tf.not_equal(labels, PAD_ID), tf.float32)  # [tokens]

    def forward(outputs, embeddings, bias):
        dtype = outputs.dtype
        x = tf.cast(tf.matmul(outputs, embeddings, transpose_b=True), tf.float32)
        if bias is not None:
            x = x + bias
        loss, probs, label_logits, max_logits = _smoothed_terms(x, labels, label_smoothing)
        probs = tf.cast(probs, dtype)
        correct = tf.reduce_sum(tf.where(label_logits >= max_logits, mask, 0.0))

        def gradient(upstream, _):
            # upstream: float32 [] (the loss scale, under float16); it multiplies float32
            # results only, never float16 operands of a matmul.
            uniform = label_smoothing / tf.cast(tf.shape(embeddings)[0], tf.float32)
            embeddings32 = tf.cast(embeddings, tf.float32)
            d_outputs = (tf.cast(tf.matmul(probs, embeddings), tf.float32)
                         - uniform * tf.reduce_sum(embeddings32, axis=0)
                         - (1.0 - label_smoothing) * tf.gather(embeddings32, labels))
            masked = outputs * tf.cast(mask, dtype)[:, None]  # [tokens, d_model]
            masked32 = tf.cast(masked, tf.float32)
            d_embeddings = (tf.cast(tf.matmul(probs, masked, transpose_a=True), tf.float32)
                            - uniform * tf.reduce_sum(masked32, axis=0))
            d_embeddings = tf.tensor_scatter_nd_sub(d_embeddings, labels[:, None],
                                                    (1.0 - label_smoothing) * masked32)
            grads = (tf.cast(d_outputs * (upstream * mask)[:, None], dtype),
                     tf.cast(d_embeddings * upstream, embeddings.dtype))
            if bias is None:
                return grads
            weight = upstream * mask  # [tokens]
            d_bias = (tf.cast(tf.linalg.matvec(probs, tf.cast(weight, dtype), transpose_a=True),
                              tf.float32) - uniform * tf.reduce_sum(weight))
            d_bias = tf.tensor_scatter_nd_sub(d_bias, labels[:, None],
                                              (1.0 - label_smoothing) * weight)
            return grads + (d_bias,)

        return (tf.reduce_sum(loss * mask), correct), gradient

    if bias is None:
        loss, correct = custom_gradient(lambda o, e: forward(o, e, None))(outputs, embeddings)
    else:
        loss, correct = custom_gradient(forward)(outputs, embeddings,
                                                    tf.cast(bias, tf.float32))
    return loss, tf.reduce_sum(mask), correct


def correct_tokens(labels, logits):
    """Number of non-padding positions whose label has the highest logit (a tie at the
    top counts as correct): float32 []. labels int [...], logits [..., vocab].

    Compares the label's logit with the maximum rather than taking an argmax: a max is
    one cheap reduction (on CPU, argmax over [positions, vocab] costs two to three times
    as much, and a training step computes the maximum for its loss anyway)."""
    labels = tf.cast(labels, tf.int32)
    hit = tf.greater_equal(tf.gather(logits, labels, batch_dims=labels.shape.rank),
                           tf.reduce_max(logits, axis=-1))
    return tf.reduce_sum(tf.cast(tf.logical_and(hit, tf.not_equal(labels, PAD_ID)), tf.float32))


@keras.saving.register_keras_serializable(package="keras_transformer")
class LabelSmoothedCrossEntropy(keras.losses.Loss):
    """The paper's training loss for `model.compile`: label-smoothed cross-entropy
    summed over the batch's non-padding target tokens and divided by their number
    (section 5.4; batches are counted in tokens, so every token weighs the same).

    Args:
      label_smoothing: eps_ls. Defaults to 0.1, the paper's.

    Call: y_true int [batch, length] (target ids, then EOS, then PAD_ID padding),
      y_pred float logits [batch, length, vocab] -> float32 [], the mean over tokens.
      Sample weights are not used: padding is what the loss leaves out.

    Example: the Keras way to train the Transformer, on batches of
    ((source_ids, target_input_ids), target_output_ids). (100 warm-up steps hold the
    rate at 5e-3 or less here: the second epoch's loss was lower by 1.2-1.7 in 8 of 8
    draws of the initial weights; at 10, the rate peaks at 0.04 and the two can tie.)

    >>> import keras
    >>> import tensorflow as tf
    >>> from keras_transformer import (LabelSmoothedCrossEntropy, Transformer,
    ...                                TransformerConfig, WarmupSchedule, shift_right)
    >>> config = TransformerConfig.tiny(vocab_size=50)
    >>> model = Transformer(config)
    >>> model.compile(
    ...     optimizer=keras.optimizers.Adam(WarmupSchedule(config.d_model, warmup_steps=100),
    ...                                     0.9, 0.98, 1e-9),
    ...     loss=LabelSmoothedCrossEntropy(config.label_smoothing))
    >>> source_ids, target_ids = tf.constant([[5, 6, 3]] * 8), tf.constant([[7, 8, 9, 3]] * 8)
    >>> batches = tf.data.Dataset.from_tensors(
    ...     ((source_ids, shift_right(target_ids)), target_ids)).repeat(20)
    >>> losses = model.fit(batches, epochs=2, verbose=0).history["loss"]
    >>> losses[1] < losses[0]
    True
    """

    def __init__(self, label_smoothing=0.1, name="label_smoothed_cross_entropy", **kwargs):
        # The mean over tokens is computed in `call`: "sum" keeps Keras from dividing again.
        kwargs["reduction"] = "sum"
        super().__init__(name=name, **kwargs)
        self.label_smoothing = label_smoothing

    def call(self, y_true, y_pred):
        loss_sum, tokens = label_smoothed_cross_entropy(y_true, y_pred, self.label_smoothing)
        return loss_sum / tf.maximum(tokens, 1.0)

    def get_config(self):
        config = super().get_config()
        config.pop("reduction", None)
        return {**config, "label_smoothing": self.label_smoothing}
