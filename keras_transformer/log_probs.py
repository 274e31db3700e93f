"""A step's next-token log-probabilities in the form beam search ranks cheaply: the logits
and their softmax, normalized only for the tokens a search keeps (keras_transformer.search's
step protocol allows either this or a plain tensor of log-probs)."""

from typing import NamedTuple

import tensorflow as tf

from keras_transformer.ranking import top_k


class LogProbs(NamedTuple):
    """A step's next-token log-probabilities as its logits and their softmax, for a search
    that keeps only a few tokens per row (beam search): it ranks the probabilities and
    normalizes only the logits it keeps (`most_probable`). A log-softmax writes every
    row's vocabulary of log-probs in several passes, where oneDNN's softmax takes one:
    the log-softmax was a fifth of a 64-sentence batch's step (docs/performance-notes.md,
    "The log-softmax left out").

    logits: float32 [rows, vocab]; probabilities: float32 [rows, vocab], their softmax (a
    search that normalizes every row, `normalized`, never computes it: the graph prunes
    it)."""

    logits: tf.Tensor
    probabilities: tf.Tensor

    @classmethod
    def of(cls, logits):
        """The LogProbs of logits float32 [rows, vocab]."""
        return cls(logits, tf.nn.softmax(logits, axis=-1))

    def most_probable(self, k):
        """(log-probs float32 [rows, k], tokens int32 [rows, k]): each row's k most
        probable tokens, most probable first, ties to the lower token.

        Each log-prob is its logit minus the row's log-sum-exp, read off the most
        probable token: its logit minus the log of its probability, 1 / sum(exp(logits -
        max)) >= 1 / vocab, which never underflows. The tokens are a top-k's over the
        log-probs but where two probabilities round to the same float32 (their log-probs
        differ by an ulp or so) or underflow to 0 (more than 103 nats below the row's
        best): there the lower token comes first, not the larger log-prob.

        Example:

        >>> import tensorflow as tf
        >>> logits = tf.constant([[2.0, 0.5, -1.0, 3.0]])
        >>> log_probs, tokens = LogProbs.of(logits).most_probable(2)
        >>> expected = tf.math.top_k(tf.nn.log_softmax(logits), 2)
        >>> tokens.numpy().tolist(), bool(tf.reduce_all(
        ...     tf.abs(log_probs - expected.values) < 1e-6))
        ([[3, 0]], True)
        """
        probabilities, tokens = top_k(self.probabilities, k)
        logits = tf.gather(self.logits, tokens, batch_dims=1)
        return logits - (logits[:, :1] - tf.math.log(probabilities[:, :1])), tokens

    def normalized(self):
        """The log-probs float32 [rows, vocab]."""
        return tf.nn.log_softmax(self.logits, axis=-1)


def as_log_probs(log_probs):
    """A step's log-probs, a tensor float32 [rows, vocab] or a LogProbs, as a tensor."""
    return log_probs.normalized() if isinstance(log_probs, LogProbs) else log_probs
