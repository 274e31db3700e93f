"""A step's next-token log-probabilities in the form beam search ranks cheaply: the logits
and their softmax, normalized only for the tokens a search keeps (keras_transformer.search's
step protocol allows either this or a plain tensor of log-probs)."""

import functools
from typing import NamedTuple

import tensorflow as tf

from keras_transformer.ranking import group_size, top_k


class LogProbs(NamedTuple):
    """A step's next-token log-probabilities as its logits and their softmax, for a search
    that keeps only a few tokens per sentence (beam search): it ranks the probabilities and
    normalizes only the logits it keeps (`best_extensions`). A log-softmax writes every
    row's vocabulary of log-probs in several passes, where oneDNN's softmax takes one:
    the log-softmax was a fifth of a 64-sentence batch's step (bench/performance-notes.md,
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

    def best_extensions(self, live, k, never=()):
        """The k best one-token extensions of n sentences' live beams, best first: what
        one top-k over each sentence's beam * vocab candidates, scored live + log-prob,
        gives (ties: lower beam, then lower token), among the tokens not in `never`.

        These LogProbs hold the beams' rows, beam adjacent rows per sentence. Each
        candidate's log-prob is its logit minus its row's log-sum-exp (`_norms`). The
        ranking takes two small passes, as ranking.top_k's: each row's groups of about
        sqrt(vocab) tokens, scored by live + the log of their largest probability, and
        the candidates of each sentence's k best groups. Candidates whose log-probs are
        within float32 rounding of the k-th group's best may rank in another order. A
        vocabulary of unknown size (a shortlist's), or with fewer than 4 such groups,
        ranks each row's k + len(never) most probable tokens first, then those of the
        sentence's beams.

        Args:
          live: float32 [n, beam], the live beams' log-probs (-inf: none).
          k: at most 2 * beam, a Python int or a scalar tensor.
          never: the token ids that are never candidates (Python ints).
        Returns:
          (log-probs float32 [n, k] (live + token), beams int32 [n, k], tokens int32
          [n, k]).

        Example: two beams of one sentence over 4 tokens.

        >>> import tensorflow as tf
        >>> logits = tf.constant([[2.0, 0.5, -1.0, 3.0], [0.0, 4.0, 0.0, 0.0]])
        >>> live = tf.math.log([[0.5, 0.25]])
        >>> _, beams, tokens = LogProbs.of(logits).best_extensions(live, 3, never=(0,))
        >>> expected = tf.math.top_k(tf.reshape(
        ...     tf.transpose(live) + tf.nn.log_softmax(logits), [1, 8]) - [[1e9, 0, 0, 0] * 2], 3)
        >>> beams.numpy().tolist(), tokens.numpy().tolist(), expected.indices.numpy().tolist()
        ([[0, 1, 0]], [[3, 1, 1]], [[3, 5, 1]])
        """
        vocab = self.logits.shape[-1]
        size = group_size(vocab) if vocab is not None else None
        if not size or vocab // size < 4:
            return self._best_per_row(live, k, never)
        return self._best_of_groups(live, k, never, size)

    def _best_per_row(self, live, k, never):
        """best_extensions from each row's k + len(never) most probable tokens: a
        sentence's k best hold at most k of one beam."""
        probabilities, tokens = top_k(self.probabilities,
                                      candidates_per_row(k, never, self.logits))
        logits = tf.gather(self.logits, tokens, batch_dims=1)  # [n * beam, per row]
        log_probs = logits - _norms(logits[:, :1], probabilities[:, :1])
        return best_of_beams(live, tf.where(is_any(tokens, never), float("-inf"), log_probs),
                             tokens, k)

    def _best_of_groups(self, live, k, never, size):
        """best_extensions by groups of `size` tokens (a divisor of the vocabulary)."""
        n, beam = tf.shape(live)[0], tf.shape(live)[1]
        groups = self.logits.shape[-1] // size
        grouped = tf.reshape(self.probabilities, [-1, groups, size])  # [n * beam, ...]
        maxima = tf.reduce_max(grouped, axis=-1)  # [n * beam, groups]
        best_group = tf.argmax(maxima, axis=-1, output_type=tf.int32)  # ties: the lower
        best_in_group = tf.argmax(tf.gather(grouped, best_group, batch_dims=1), axis=-1,
                                  output_type=tf.int32)
        best = (best_group * size + best_in_group)[:, None]
        norms = _norms(tf.gather(self.logits, best, batch_dims=1),
                       tf.gather(self.probabilities, best, batch_dims=1))[:, 0]  # [n * beam]
        live = tf.reshape(live, [-1])
        scores = live[:, None] + tf.math.log(_without(maxima, grouped, never, size))
        _, chosen = tf.math.top_k(tf.reshape(scores, tf.stack([n, beam * groups])), k)
        chosen = tf.sort(chosen, axis=-1)  # [n, k], in (beam, group) order for the ties
        rows = chosen // groups + beam * tf.range(n)[:, None]
        group = chosen % groups
        tokens = group[:, :, None] * size + tf.range(size)  # [n, k, size]
        # Each chosen group's logits as one slice of `size` [n, k, size]: a gather_nd by
        # (row, token) pairs walks them one at a time. Through int32 bitcasts, which
        # TensorFlow's arithmetic optimizer does not see past: it would move a cast of the
        # logits (a bfloat16 model's) after the reshape, a second cast of them all.
        logits = tf.bitcast(tf.gather(tf.reshape(tf.bitcast(self.logits, tf.int32), [-1, size]),
                                      rows * groups + group), tf.float32)
        values = tf.gather(live, rows)[:, :, None] + tf.where(
            is_any(tokens, never), float("-inf"), logits - tf.gather(norms, rows)[:, :, None])
        top, position = tf.math.top_k(tf.reshape(values, tf.stack([n, k * size])), k)
        return (top, tf.gather(chosen // groups, position // size, batch_dims=1),
                tf.gather(tf.reshape(tokens, tf.stack([n, k * size])), position,
                          batch_dims=1))

    def normalized(self):
        """The log-probs float32 [rows, vocab]."""
        return tf.nn.log_softmax(self.logits, axis=-1)


def candidates_per_row(k, never, rows):
    """How many of each row's best tokens hold a sentence's k best extensions that are
    not in `never`: k + len(never), at most the vocabulary of rows [rows, vocab]."""
    per_row, vocab = k + len(never), rows.shape[-1] or tf.shape(rows)[-1]
    if tf.is_tensor(per_row) or tf.is_tensor(vocab):
        return tf.minimum(per_row, vocab)
    return min(per_row, vocab)


def best_of_beams(live, log_probs, tokens, k):
    """The k best of n sentences' candidate extensions, best first, ranked by live +
    log-prob (ties: lower beam, then the candidate's column).

    Args:
      live: float32 [n, beam], the live beams' log-probs.
      log_probs, tokens: float32 and int32 [n * beam, m], each beam's m candidates (beam
        adjacent rows per sentence).
    Returns:
      (log-probs float32 [n, k] (live + token), beams int32 [n, k], tokens int32 [n, k]).
    """
    n, beam = tf.shape(live)[0], tf.shape(live)[1]
    m = tokens.shape[-1] or tf.shape(tokens)[-1]
    values = live[:, :, None] + tf.reshape(log_probs, tf.stack([n, beam, m]))
    top, position = tf.math.top_k(tf.reshape(values, tf.stack([n, beam * m])), k)
    return top, position // m, tf.gather(tf.reshape(tokens, tf.stack([n, beam * m])),
                                         position, batch_dims=1)


def _norms(logits, probabilities):
    """Each row's log-sum-exp, read off its most probable token's logits and
    probabilities float32 [rows, 1]: the logit minus the log of the probability, which
    is at least 1 / vocab and never underflows."""
    return logits - tf.math.log(probabilities)


def is_any(tokens, ids):
    """bool, tokens' shape: each token is one of ids (Python ints)."""
    found = [tokens == id_ for id_ in ids]
    return functools.reduce(tf.logical_or, found) if found else tf.zeros_like(tokens, tf.bool)


def _without(maxima, grouped, ids, size):
    """maxima float32 [rows, groups] of probabilities grouped [rows, groups, size], with
    the groups holding any of ids (Python ints) taken again without those."""
    for group in sorted({id_ // size for id_ in ids}):
        tokens = group * size + tf.range(size)
        again = tf.reduce_max(tf.where(is_any(tokens, ids), 0.0, grouped[:, group]), axis=-1)
        maxima = tf.concat([maxima[:, :group], again[:, None], maxima[:, group + 1:]], 1)
    return maxima


def as_log_probs(log_probs):
    """A step's log-probs, a tensor float32 [rows, vocab] or a LogProbs, as a tensor."""
    return log_probs.normalized() if isinstance(log_probs, LogProbs) else log_probs
