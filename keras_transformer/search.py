"""What every search shares (paper section 6.1), below greedy search, beam search and
sampling, which import it and nothing of each other but greedy's loop: the step a search
runs, its results, the length penalty, the output's limits and a target prefix.

A search runs over a *step*, not over a model: the step turns the outputs so far into the
next token's log-probabilities, and knows how to reorder and drop the rows of its own
state. `keras_transformer.step.TransformerStep` is the Transformer's; a faster one (int8,
a shortlist of the vocabulary, fewer layers) or a scripted table (the tests) plugs into
the same searches:

    step(seqs, i, state) -> (log_probs, state)
      seqs int32 [rows, width + 1], the outputs so far (BOS in column 0, the token at
      position i the last one written); log_probs float32 [rows, vocab] of the token at
      position i + 1. A search of beam_size beams has beam_size adjacent rows per
      sentence.
    step.reorder(state, rows) -> state: row r of the new state is row rows[r] of the old
      (rows int32 [rows']: the beams kept, each from its parent).
    step.keep(state, sentences) -> state: the per-sentence part of the state for the
      sentences int32 [n'] that stay (the others have left the search); the reorder
      that follows takes the rows of their beams only.

The state is a nest of tensors whose every axis but the last may change from step to step
(`growing_shapes`).

Section 6.1: "beam search with a beam size of 4 and length penalty alpha = 0.6 ...
maximum output length during inference to input length + 50, but terminate early when
possible" (keras_transformer.config.DecodeConfig holds these values). A hypothesis scores
log P(Y | X) / lp(Y), with the paper's length penalty of Wu et al. (2016), lp(Y) =
((5 + |Y|) / 6)^alpha, or the "average" one of Hugging Face and Marian, |Y|^alpha
(`length_penalty`).

Ids are the project's (keras_transformer.special_ids): pad 0, BOS 2 (position 0 of every
target), EOS 3. Outputs never contain PAD or BOS before their EOS; every output ends with
EOS, which is forced at a sentence's maximum length.
"""

from typing import NamedTuple

import tensorflow as tf

from keras_transformer.config import LENGTH_PENALTIES
from keras_transformer.special_ids import BOS_ID, EOS_ID, PAD_ID


class DecodeResult(NamedTuple):
    """Hypotheses of `beam_search` (beam = beam size), `greedy_search` (beam = 1) or
    `sample_search` (beam = the number of samples).

    Attributes:
      ids: int32 [batch, beam, width], the output tokens without BOS: each row ends
        with EOS, then 0 padding. width = min(src_len + extra_length,
        config.max_length - 1), with src_len the (padded) width of source_ids.
      scores: float32 [batch, beam], log P(ids | source) / lp(lengths), sorted in
        decreasing order: beam 0 is the best hypothesis, the caller takes the first
        k <= beam for an n-best list. When fewer than beam outputs exist (a maximum
        length of 1, a vocabulary of fewer than beam + 3 tokens) the extra slots are
        empty: ids all 0, score and log-prob -inf, length 0.
      log_probs: float32 [batch, beam], the raw log P(ids | source) (natural log,
        EOS included, but for an EOS forced at the maximum length, which scores 0), what
        `sequence_log_probs` recomputes (without that EOS) and reranking needs.
      lengths: int32 [batch, beam], tokens in each hypothesis, EOS included.
    """

    ids: tf.Tensor
    scores: tf.Tensor
    log_probs: tf.Tensor
    lengths: tf.Tensor


def length_penalty(length, alpha, kind="gnmt"):
    """lp(Y), what a hypothesis' log-probability is divided by to score it.

    "gnmt": Wu et al. (2016), lp(Y) = ((5 + |Y|) / 6)^alpha, the paper's (section 6.1).
    "average": lp(Y) = |Y|^alpha, Hugging Face's, Marian's, CTranslate2's and fairseq's
    (alpha 1: the mean log-probability per token).
    Both grow with |Y| for alpha >= 0, which the searches' early exit relies on.

    Args:
      length: int or float tensor of any shape, |Y| (EOS included).
      alpha: float, 0 turns the penalty off (lp = 1).
      kind: one of LENGTH_PENALTIES.
    Returns:
      float32, the shape of `length`.

    Example:

    >>> from keras_transformer import length_penalty
    >>> round(float(length_penalty(7, 0.6)), 4)  # ((5 + 7) / 6)^0.6 = 2^0.6
    1.5157
    >>> round(float(length_penalty(4, 0.5, "average")), 4)  # 4^0.5
    2.0
    """
    length = tf.cast(length, tf.float32)
    if kind == "gnmt":
        return tf.pow((5.0 + length) / 6.0, alpha)
    if kind == "average":
        return tf.pow(length, alpha)
    raise ValueError(f"unknown length penalty {kind!r}; choose one of "
                     f"{', '.join(LENGTH_PENALTIES)}")


def output_limits(source_ids, extra_length, max_length, limit=None):
    """(width, max_lengths int32 [batch]): the output buffer's width and each output's
    limit, EOS counted (section 6.1: input length + extra_length), both at most
    max_length - 1 (BOS takes one of a model's max_length positions), and at most
    limit - 1 when a search's own limit is given (DecodeConfig.max_length).

    width is a Python int when the source's width is static and extra_length a Python
    int, so that XLA sees fixed shapes.

    Example:

    >>> import tensorflow as tf
    >>> width, max_lengths = output_limits(tf.constant([[5, 6, 3], [7, 3, 0]]), 50, 256)
    >>> width, max_lengths.numpy().tolist()
    (53, [53, 52])
    """
    cap = (max_length if limit is None else min(max_length, limit)) - 1
    src_len = source_ids.shape[1]
    if src_len is None or tf.is_tensor(extra_length):
        width = tf.minimum(tf.shape(source_ids)[1] + extra_length, cap)
    else:
        width = min(src_len + extra_length, cap)
    source_lengths = tf.reduce_sum(tf.cast(source_ids != PAD_ID, tf.int32), axis=1)
    return width, tf.minimum(source_lengths + extra_length, cap)


class TargetPrefix(NamedTuple):
    """A target prefix, the tokens outputs must start with.

    tokens: int32 [batch, width >= 1], 0-padded; lengths: int32 [batch] (0: none)."""

    tokens: tf.Tensor
    lengths: tf.Tensor

    @classmethod
    def of(cls, target_prefix):
        """The prefix of int [batch, prefix_len] `target_prefix`, 0-padded, or None.

        None for None: a search without a prefix has no forcing ops at all."""
        if target_prefix is None:
            return None
        tokens = tf.cast(target_prefix, tf.int32)
        lengths = tf.reduce_sum(tf.cast(tokens != PAD_ID, tf.int32), axis=1)
        # A column of padding, so that the position after the longest prefix exists.
        return cls(tf.pad(tokens, [[0, 0], [0, 1]]), lengths)

    def force(self, log_probs, position, max_lengths, rows=None):
        """log_probs [rows, vocab] with only the prefix's token allowed inside the prefix.

        The output token is at `position` (0-based); every token but the prefix's goes to
        -inf on rows still inside their prefix, and a prefix is cut where only EOS fits
        (max_lengths [rows]). rows: int32 [rows], this prefix's row of each (default:
        the same row)."""
        tokens, lengths = self.tokens, self.lengths
        if rows is not None:
            tokens, lengths = tf.gather(tokens, rows), tf.gather(lengths, rows)
        column = tf.minimum(position, tf.shape(tokens)[1] - 1)
        forced = tf.gather(tokens, column, axis=1)  # [rows]
        forcing = (position < lengths) & (position + 1 < max_lengths)
        token = tf.range(tf.shape(log_probs)[-1])
        keep = ~forcing[:, None] | (token == forced[:, None])
        return tf.where(keep, log_probs, float("-inf"))


def allowed(log_probs, length, max_lengths):
    """Log-probs [..., vocab] with -inf for the tokens an output may not hold at `length`.

    length counts EOS. Never PAD or BOS, and only EOS once a sentence reaches its
    max_lengths (broadcast to log_probs[..., :1]): that EOS is forced, not the model's
    choice, so it scores 0, as Hugging Face's generation (forced_eos_token_id) and
    CTranslate2 (which ends there without EOS) score it, and a search ranks the outputs cut
    at the limit as they do. The other tokens keep the model's log-probs, so scores stay
    true log-probabilities."""
    token = tf.range(tf.shape(log_probs)[-1])
    may = (token != PAD_ID) & (token != BOS_ID)
    at_max = length >= max_lengths
    may = tf.where(at_max, token == EOS_ID, may)
    return tf.where(may, tf.where(at_max, 0.0, log_probs), float("-inf"))


def first_tokens(shape, width):
    """int32 [*shape, width + 1] outputs before the first step: BOS, then 0 padding."""
    return write_tokens(tf.zeros(tf.concat([shape, [width + 1]], 0), tf.int32), 0,
                        tf.fill(shape, BOS_ID))


def write_tokens(seqs, position, tokens):
    """seqs int32 [..., width + 1] with tokens [...] at `position`.

    A select keeps the shape static (no scatter with a dynamic index)."""
    at_position = tf.range(tf.shape(seqs)[-1]) == position
    return tf.where(at_position, tokens[..., None], seqs)


def growing_shapes(loop_vars):
    """Shape invariants of tf.while_loop variables: every axis may change but the last.

    Sentences leave the batch and the cache grows; the last axis of a matrix or higher
    (widths, heads' depths) stays known, since the layers need it."""
    def invariant(t):
        if t.shape.rank < 2:
            return tf.TensorShape([None] * t.shape.rank)
        return tf.TensorShape([None] * (t.shape.rank - 1) + [t.shape[-1]])
    return tf.nest.map_structure(invariant, loop_vars)
