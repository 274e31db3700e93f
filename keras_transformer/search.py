"""What every search shares (paper section 6.1), below greedy search, beam search and
sampling, which import it and nothing of each other but greedy's loop: the step a search
runs over, its results, the length penalty, the output's limits, and the token rules.

A search runs over a *step*, the model side of the seam: it turns the outputs so far into
the next token's log-probabilities and knows how to reorder and drop the rows of its own
state. The search never sees a model. `keras_transformer.step.TransformerStep` is the
Transformer's (the decoding cache, int8 weights, a shortlist's candidates); a wrapper of
it or a scripted table (the tests) plugs into the same searches. A step is built for one
batch of sentences and offers (`Step` has the defaults):

    step.source_ids   int32 [batch, src_len]: the sentences, whose lengths set the
                      outputs' limits (section 6.1: input length + max_extra_length)
    step.max_positions  the positions an output may take, BOS included
    step.target_prefix  None, or int32 [batch, prefix_len]: tokens outputs start with
    step.vocabulary   None, or int32 [C]: the only ids the step ranks (a shortlist's
                      candidates); its log-probs and the tokens it reads are then
                      indices into it
    step.fixed_shapes  whether the step's state keeps one shape (XLA)
    step.start(rows_per_sentence, width) -> state: the first state, for that many
      adjacent rows per sentence (a beam search's beams) and outputs of width tokens
    step(seqs, i, state) -> (log_probs, state)
      seqs int32 [rows, width + 1], the outputs so far (BOS in column 0, the token at
      position i the last one written); log_probs float32 [rows, vocab] of the token at
      position i + 1, or the same as a keras_transformer.log_probs.LogProbs (logits and
      their softmax; `as_log_probs` there makes either a tensor).
    step.reorder(state, rows) -> state: row r of the new state is row rows[r] of the old
      (rows int32 [rows']: the beams kept, each from its parent).
    step.keep(state, sentences) -> state: the per-sentence part of the state for the
      sentences int32 [n'] that stay (the others have left the search); the reorder
      that follows takes the rows of their beams only.
    step.run(search, rows) -> search(step), or search run on a variant of the step fixed
      for the whole search, chosen by its rows at the start (rows only ever leave).

The state is a nest of tensors whose every axis but the last may change from step to step
(`growing_shapes`).

Section 6.1: "beam search with a beam size of 4 and length penalty alpha = 0.6 ...
maximum output length during inference to input length + 50, but terminate early when
possible" (keras_transformer.config.DecodeConfig holds these values, and every search
takes one). A hypothesis scores log P(Y | X) / lp(Y), with the paper's length penalty of
Wu et al. (2016), lp(Y) = ((5 + |Y|) / 6)^alpha, or the "average" one of Hugging Face and
Marian, |Y|^alpha (keras_transformer.penalties).

Ids are the project's (keras_transformer.special_ids): pad 0, BOS 2 (position 0 of every
target), EOS 3. `TokenRules` holds every rule on which token an output may hold next,
for all the searches: never PAD or BOS, only EOS at a sentence's maximum length (so every
output ends with EOS), a target prefix's tokens first, and a shortlist's candidates only.
"""

import copy
from typing import NamedTuple, Optional

import tensorflow as tf

from keras_transformer.config import DecodeConfig
from keras_transformer.log_probs import LogProbs, is_any
from keras_transformer.shortlist import from_candidates, to_candidates
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


def output_limits(source_ids, extra_length, max_length, limit=None):
    """(width, max_lengths int32 [batch]): the output buffer's width and each output's
    limit, EOS counted (section 6.1: input length + extra_length), both at most
    max_length - 1 (BOS takes one of a model's max_length positions), and at most
    limit - 1 when a search's own limit is given (DecodeConfig.max_length). extra_length:
    an int, a scalar tensor, or int32 [batch], one per sentence.

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
    if is_per_sentence(extra_length):  # the widest of the batch (0 for an empty one)
        width = tf.minimum(tf.shape(source_ids)[1] +
                           tf.reduce_max(tf.concat([extra_length, [0]], 0)), cap)
    elif src_len is None or tf.is_tensor(extra_length):
        width = tf.minimum(tf.shape(source_ids)[1] + extra_length, cap)
    else:
        width = min(src_len + extra_length, cap)
    source_lengths = tf.reduce_sum(tf.cast(source_ids != PAD_ID, tf.int32), axis=1)
    return width, tf.minimum(source_lengths + extra_length, cap)


def is_per_sentence(value) -> bool:
    """A setting holds one value per sentence: a tensor [batch] (a request's options), not
    a Python value or a scalar shared by every sentence."""
    return tf.is_tensor(value) and value.shape.rank == 1


def of_sentences(value, sentences):
    """A setting for the n sentences `sentences` int32 [n] still searching: a tensor
    [batch] gathered to [n], a shared value as it is."""
    return tf.gather(value, sentences) if is_per_sentence(value) else value


def per_beam(value):
    """A setting [n] as [n, 1], to broadcast over each sentence's beams or candidates; a
    shared value as it is."""
    return value[:, None] if is_per_sentence(value) else value


def largest(value, least=1):
    """The largest of a setting's values (at least `least`: a batch may be empty): the
    batch's beam or number of samples, what its tensors are shaped by."""
    if is_per_sentence(value):
        return tf.reduce_max(tf.concat([value, [least]], 0))
    return value


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


class TokenRules(NamedTuple):
    """Which token an output may hold next, the same for every search: never PAD or BOS;
    only EOS, forced, at a sentence's maximum length; a target prefix's tokens while an
    output is inside it; and, over a shortlist, its candidates only.

    The forced EOS scores 0, not the model's log-prob: it is the limit's choice, as Hugging
    Face's generation (forced_eos_token_id) and CTranslate2 (which ends there without EOS)
    score it, so a search ranks the outputs cut at the limit as they do. The other tokens
    keep the model's log-probs, so scores stay true log-probabilities.

    Attributes:
      max_lengths: int32 [n], each sentence's output limit, EOS counted.
      prefix: None, or the TargetPrefix of the n sentences, in the step's token space.
      vocabulary: None, or int32 [C], the ids the step's tokens index (a shortlist's
        candidates: the special ids 0-3 keep their values, keras_transformer.shortlist).
      min_lengths: None (no minimum), or int32 [n], the tokens each sentence's output has
        before its EOS at least (DecodeConfig.min_length): EOS is excluded before, but
        for the EOS forced at the maximum length.
    """

    max_lengths: tf.Tensor
    prefix: Optional[TargetPrefix] = None
    vocabulary: Optional[tf.Tensor] = None
    min_lengths: Optional[tf.Tensor] = None

    NEVER = (PAD_ID, BOS_ID)  # the tokens no output holds

    @classmethod
    def of(cls, step, config: DecodeConfig):
        """(the rules of a step's sentences under `config`, the outputs' width): the
        limits of section 6.1 (`output_limits`), the step's prefix and candidates."""
        width, max_lengths = output_limits(step.source_ids, config.max_extra_length,
                                           step.max_positions, config.max_length)
        prefix = step.target_prefix
        if prefix is not None and step.vocabulary is not None:
            prefix = to_candidates(prefix, step.vocabulary)
        min_lengths = None
        if tf.is_tensor(config.min_length) or config.min_length > 0:
            min_lengths = tf.broadcast_to(tf.cast(config.min_length, tf.int32),
                                          tf.shape(max_lengths))
        return cls(max_lengths, TargetPrefix.of(prefix), step.vocabulary, min_lengths), width

    def per_row(self, rows_per_sentence):
        """The rules of each of rows_per_sentence adjacent rows per sentence."""
        prefix = self.prefix
        if prefix is not None:
            prefix = TargetPrefix(*(tf.repeat(t, rows_per_sentence, axis=0) for t in prefix))
        min_lengths = self.min_lengths
        if min_lengths is not None:
            min_lengths = tf.repeat(min_lengths, rows_per_sentence)
        return TokenRules(tf.repeat(self.max_lengths, rows_per_sentence), prefix,
                          self.vocabulary, min_lengths)

    def apply(self, log_probs, position, rows=None):
        """log_probs float32 [rows, vocab] of the token at `position` + 1, with -inf for
        the tokens the rules exclude and 0 for a forced EOS. rows: int32 [rows], each
        row's sentence (default: row r is sentence r)."""
        log_probs = self.force_prefix(log_probs, position, rows)
        token = tf.range(tf.shape(log_probs)[-1])
        may = ~is_any(token, self.NEVER)
        if self.min_lengths is not None:
            may &= ~((token == EOS_ID) & self.too_short(position, rows)[:, None])
        at_max = self.at_max(position + 1, rows)[:, None]
        may = tf.where(at_max, token == EOS_ID, may)
        return tf.where(may, tf.where(at_max, 0.0, log_probs), float("-inf"))

    def force_prefix(self, log_probs, position, rows=None):
        """log_probs [rows, vocab] with only the prefix's token allowed on the rows still
        inside their prefix (the one rule that needs the whole row of log-probs)."""
        if self.prefix is None:
            return log_probs
        max_lengths = self.max_lengths if rows is None else tf.gather(self.max_lengths, rows)
        return self.prefix.force(log_probs, position, max_lengths, rows)

    def too_short(self, position, rows=None):
        """bool [rows]: an EOS at `position` + 1 would end an output before its minimum."""
        min_lengths = self.min_lengths if rows is None else tf.gather(self.min_lengths, rows)
        return position < min_lengths

    def exclude_early_eos(self, log_probs, position, sentences, beam):
        """A step's log-probs (a tensor float32 [n * beam, vocab] or a LogProbs) with EOS
        excluded on the rows whose output is still below its minimum length, for a search
        that ranks a few tokens of each row (beam search): a LogProbs keeps its form, EOS
        at logit -inf and probability 0 (the other tokens' log-probs unchanged). The ops
        run only at the steps where some row is still short. sentences: int32 [n], each
        sentence's index, beam adjacent rows each."""
        if self.min_lengths is None:
            return log_probs
        short = self.too_short(position, tf.repeat(sentences, beam))

        def excluded():
            def without_eos(t, value):
                eos = tf.range(tf.shape(t)[-1]) == EOS_ID
                return tf.where(eos[None, :] & short[:, None], tf.cast(value, t.dtype), t)
            if isinstance(log_probs, LogProbs):
                return LogProbs(without_eos(log_probs.logits, float("-inf")),
                                without_eos(log_probs.probabilities, 0.0))
            return without_eos(log_probs, float("-inf"))

        return tf.cond(tf.reduce_any(short), excluded, lambda: log_probs)

    def apply_to_best(self, best, tokens, length, rows):
        """The other rules on each row's best candidates, for a search that ranks a few of
        each row first (beam search): best float32 [rows, k >= 3] and their tokens int32
        [rows, k], best first, of outputs of `length` tokens; rows int32 [rows], each
        row's sentence. PAD and BOS go to -inf (so k - 2 candidates stay), and at the
        maximum length EOS, scoring 0, is each row's one candidate. Returns (best, tokens),
        the same shapes."""
        best = tf.where(is_any(tokens, self.NEVER), float("-inf"), best)
        at_max = self.at_max(length, rows)[:, None]  # [rows, 1]
        first = tf.range(tf.shape(best)[-1]) == 0
        best = tf.where(at_max, tf.where(first, 0.0, float("-inf")), best)
        tokens = tf.where(at_max, tf.where(first, EOS_ID, PAD_ID), tokens)
        return best, tokens

    def apply_to_extensions(self, log_probs, beams, tokens, live, length, sentences):
        """The maximum length's rule on each sentence's best extensions, for a search that
        ranks a sentence's beams at once (LogProbs.best_extensions, which leaves out
        NEVER): at the maximum length each live beam's one extension is EOS, scoring 0.

        log_probs float32 [n, k >= beam] (live + token), beams and tokens int32 [n, k]:
        the extensions, best first, of outputs of `length` tokens; live float32 [n, beam]:
        the beams' log-probs, best first; sentences int32 [n]: each sentence's index.
        Returns (log_probs, beams, tokens), the same shapes."""
        n, beam = tf.shape(live)[0], tf.shape(live)[1]
        rest = tf.stack([n, tf.shape(log_probs)[1] - beam])
        at_max = self.at_max(length, sentences)[:, None]  # [n, 1]
        return (tf.where(at_max, tf.concat([live, tf.fill(rest, float("-inf"))], 1),
                         log_probs),
                tf.where(at_max, tf.concat([tf.tile(tf.range(beam)[None], tf.stack([n, 1])),
                                            tf.zeros(rest, tf.int32)], 1), beams),
                tf.where(at_max, tf.concat([tf.fill(tf.stack([n, beam]), EOS_ID),
                                            tf.fill(rest, PAD_ID)], 1), tokens))

    def at_max(self, length, rows=None):
        """bool [rows]: outputs of `length` tokens (EOS counted) are at their maximum."""
        max_lengths = self.max_lengths if rows is None else tf.gather(self.max_lengths, rows)
        return length >= max_lengths

    def output_ids(self, ids):
        """A search's output ids int32 [...] in the step's token space -> vocabulary ids."""
        return ids if self.vocabulary is None else from_candidates(ids, self.vocabulary)


class Step:
    """The defaults of the step protocol (the module's docstring): a stateless step over
    the whole vocabulary, no prefix, growing shapes. A step sets source_ids and
    max_positions and defines __call__; one with state overrides start, reorder and keep.
    """

    target_prefix = None
    vocabulary = None
    fixed_shapes = False

    def start(self, rows_per_sentence, width):
        del rows_per_sentence, width
        return {}

    def __call__(self, seqs, i, state):
        raise NotImplementedError

    def reorder(self, state, rows):
        del rows
        return state

    def keep(self, state, sentences):
        del sentences
        return state

    def run(self, search, rows):
        del rows
        return search(self)


class WrappedStep(Step):
    """A step around another, `inner`, whose log-probs it changes (`log_probs`; or
    override __call__): its sentences, state, rows and variants are the inner step's, so
    that a wrapper (a benchmark's, a test's) copies none of the inner step's setup."""

    def __init__(self, inner):
        self.inner = inner

    source_ids = property(lambda self: self.inner.source_ids)
    max_positions = property(lambda self: self.inner.max_positions)
    target_prefix = property(lambda self: self.inner.target_prefix)
    vocabulary = property(lambda self: self.inner.vocabulary)
    fixed_shapes = property(lambda self: self.inner.fixed_shapes)

    def log_probs(self, log_probs, seqs, i):
        """The wrapper's log-probs from the inner step's (a tensor float32 [rows, vocab]
        or a keras_transformer.log_probs.LogProbs: its `as_log_probs` makes either a
        tensor)."""
        del seqs, i
        return log_probs

    def start(self, rows_per_sentence, width):
        return self.inner.start(rows_per_sentence, width)

    def __call__(self, seqs, i, state):
        log_probs, state = self.inner(seqs, i, state)
        return self.log_probs(log_probs, seqs, i), state

    def reorder(self, state, rows):
        return self.inner.reorder(state, rows)

    def keep(self, state, sentences):
        return self.inner.keep(state, sentences)

    def run(self, search, rows):
        return self.inner.run(lambda inner: search(self.around(inner)), rows)

    def around(self, inner):
        """This wrapper around another inner step (one of its variants)."""
        wrapper = copy.copy(self)
        wrapper.inner = inner
        return wrapper


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
