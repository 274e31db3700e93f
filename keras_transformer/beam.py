"""Beam search with a length penalty (paper section 6.1: Wu et al.'s, 2016), over any step
(keras_transformer.search): the Transformer's, a faster one, or a scripted table.

Each step extends every live beam by every token and keeps the 2 * beam_size best
candidates: those ending in EOS may enter the fixed-size set of finished hypotheses
(ranked by log-prob / lp), the best beam_size others stay live (ranked by log-prob). When
a sentence is done is its stopping rule's call (keras_transformer.stopping: "exact", the
paper's search, which never stops before its n-best is certain; "transformers",
generate()'s; "first", CTranslate2's and fairseq's). A done sentence leaves the batch (its
rows are no longer computed), and the loop stops when no sentence is left.

Two loops take the same steps (`_beam_step`) on differently shaped tensors:

- the growing search, shaped for CPU serving cost: a step's state (a Transformer's cache)
  may grow, and a done sentence's rows leave it (the step's `keep`);
- the fixed-shape search, for a step whose state keeps one shape (`step.fixed_shapes`:
  XLA, which fuses a step's hundreds of small ops; see bench/performance-notes.md): a done
  sentence stays in the batch with its results kept.

Shapes: n sentences still searching (batch with fixed shapes), beam = beam_size, and
width the output width (keras_transformer.search.output_limits); sequences hold BOS in
column 0, so they are [..., width + 1].
"""

from typing import Any, NamedTuple

import tensorflow as tf

from keras_transformer import stopping
from keras_transformer.config import OPTIONS, DecodeConfig
from keras_transformer.log_probs import (LogProbs, as_log_probs, best_of_beams,
                                         candidates_per_row)
from keras_transformer.ranking import top_k
from keras_transformer.search import (DecodeResult, TokenRules, first_tokens, growing_shapes,
                                      is_per_sentence, largest, of_sentences, per_beam,
                                      write_tokens)
from keras_transformer.penalties import length_penalty as lp
from keras_transformer.special_ids import EOS_ID, PAD_ID

NUM_HYPOTHESES = next(o for o in OPTIONS if o.name == "num_hypotheses")


@tf.autograph.experimental.do_not_convert
def beam_search(step, config=DecodeConfig()):
    """Beam search over `step` with `config`'s beam size, length penalty, stopping rule
    and output limits (section 6.1).

    With a target prefix (the step's), each sentence's search starts from the single
    hypothesis BOS + prefix, scored by teacher forcing: while a sentence is inside its
    prefix every token but the prefix's is excluded, so only that hypothesis stays live.

    Args:
      step: a step of keras_transformer.search, e.g. keras_transformer.TransformerStep.
      config: a DecodeConfig. Its beam_size, alpha, max_extra_length, min_length,
        num_hypotheses, stopping and patience may be tensors: scalars, or [batch], one
        per sentence (a batch of requests' options: the caller checks their range). The
        batch then searches with its largest beam, each sentence kept to its own: its
        beam_size best candidates live, its 2 x beam_size best ranked, as its search
        alone would. config.num_hypotheses: how many of the returned hypotheses must be
        exactly what the rule finds, 1 to beam_size (None: beam_size): 1, when only the
        best translation is used, stops the exact rule as soon as it is certain, and the
        others are then finished hypotheses ranked as found, not necessarily the 2nd..
        best.
    Returns:
      DecodeResult with beam = beam_size (the largest), hypotheses sorted by score, ids in
      the vocabulary's; a sentence's hypotheses past its own beam_size are not its
      search's.

    Example: a scripted step whose log-probs depend only on the last token (vocabulary:
    PAD, UNK, BOS, EOS, "a", "b"): after BOS "a" is likelier, after "a" EOS.

    >>> import math
    >>> import tensorflow as tf
    >>> from keras_transformer import DecodeConfig
    >>> from keras_transformer.search import Step
    >>> table = tf.math.log(tf.constant([[.2, .2, .2, .2, .1, .1],    # after PAD (unused)
    ...                                  [.2, .2, .2, .2, .1, .1],    # after UNK (unused)
    ...                                  [0., 0., 0., .1, .6, .3],    # after BOS
    ...                                  [.2, .2, .2, .2, .1, .1],    # after EOS (unused)
    ...                                  [0., 0., 0., .9, .05, .05],  # after "a"
    ...                                  [0., 0., 0., .5, .25, .25]]))  # after "b"
    >>> class Bigram(Step):
    ...     source_ids, max_positions = tf.constant([[4, 3]]), 4  # outputs of 3 at most
    ...     def __call__(self, seqs, i, state):
    ...         return tf.gather(table, seqs[:, i]), state
    >>> result = beam_search(Bigram(), DecodeConfig(beam_size=2, alpha=0.0))
    >>> result.ids.numpy().tolist()  # ["a", EOS] (.6 x .9), then ["b", EOS] (.3 x .5)
    [[[4, 3, 0], [5, 3, 0]]]
    >>> [round(math.exp(p), 2) for p in result.log_probs.numpy()[0]]
    [0.54, 0.15]
    """
    beam_size = config.beam_size
    num_hypotheses = beam_size if config.num_hypotheses is None else config.num_hypotheses
    NUM_HYPOTHESES.check(num_hypotheses, {"beam_size": beam_size}, named=("beam_size",))
    rules, width = TokenRules.of(step, config)
    beams = largest(beam_size)
    search = _Search(rules, width, beams, beam_size, config.alpha, num_hypotheses,
                     config.length_penalty, stopping.rule(config.stopping), config.patience)
    state = step.start(beams, width)
    loop = _fixed_shape_beam_search if step.fixed_shapes else _growing_beam_search
    results = step.run(lambda step: loop(search._replace(step=step), state),
                       tf.shape(step.source_ids)[0] * beams)
    ids = results.seqs[:, :, 1:]  # [batch, beam, width]
    lengths = tf.reduce_sum(tf.cast(ids != PAD_ID, tf.int32), axis=-1)
    return DecodeResult(rules.output_ids(ids), results.scores, results.log_probs, lengths)


class _Search(NamedTuple):
    """What every step of one search reads and no step changes.

    rules: the TokenRules of its sentences; width: the output width; beams: the beams of
    each sentence's tensors (the batch's largest beam_size); beam_size, alpha,
    num_hypotheses, length_penalty and patience: as DecodeConfig has them (a Python value,
    a scalar, or a tensor of one per sentence); stopping: a rule of
    keras_transformer.stopping; step: the step the loop runs."""

    rules: TokenRules
    width: Any
    beams: Any
    beam_size: Any
    alpha: Any
    num_hypotheses: Any
    length_penalty: str
    stopping: Any
    patience: Any
    step: Any = None

    @property
    def per_sentence(self) -> bool:
        """The sentences' beams differ: a sentence's own beam_size must be enforced."""
        return is_per_sentence(self.beam_size)

    def of(self, sentences):
        """This search's settings for the sentences int32 [n] still searching."""
        stopping = self.stopping
        if hasattr(stopping, "of"):  # chosen per sentence
            stopping = stopping.of(sentences)
        return self._replace(stopping=stopping, **{
            name: of_sentences(getattr(self, name), sentences)
            for name in ("beam_size", "alpha", "num_hypotheses", "patience")})

    def score(self, log_probs, length):
        """log_probs / lp(length): a finished hypothesis' score (section 6.1), of
        log_probs float32 [n] or [n, k]."""
        alpha = self.alpha
        if is_per_sentence(alpha) and log_probs.shape.rank == 2:
            alpha = alpha[:, None]
        return log_probs / lp(length, alpha, self.length_penalty)

    def within(self, values, count):
        """values float32 [n, k] with -inf past each sentence's first `count` [n] columns
        (a per-sentence beam's: its search ranks no more); as they are otherwise."""
        if not self.per_sentence:
            return values
        rank = tf.range(tf.shape(values)[1])[None, :]
        return tf.where(rank < per_beam(count), values, float("-inf"))


class _Beams(NamedTuple):
    """The live hypotheses of n sentences, best first.

    seqs int32 [n, beam, width + 1] (BOS first); log_probs float32 [n, beam] (-inf: no
    hypothesis)."""

    seqs: tf.Tensor
    log_probs: tf.Tensor


class _Hypotheses(NamedTuple):
    """The finished hypotheses of n sentences, by decreasing score.

    seqs int32 [n, beam, width + 1] (BOS first); scores and log_probs float32 [n, beam]
    (-inf: empty); count int32 [n], how many have finished so far (those that fell out
    of the beam best too)."""

    seqs: tf.Tensor
    scores: tf.Tensor
    log_probs: tf.Tensor
    count: tf.Tensor


def _growing_beam_search(search, state):
    """The search on shapes that shrink and grow: _Hypotheses [batch, beam, ...].

    A done sentence's results are stored and its rows leave every tensor (the step's
    `keep`); a Transformer's cache grows by a position per step."""
    batch = tf.shape(search.rules.max_lengths)[0]
    beams, none_finished = _first_beams(search, batch)

    # `sentences`: the batch indices of the n sentences still searching, int32 [n].
    def cond(i, sentences, beams, finished, state, results):
        return (i < search.width) & (tf.size(sentences) > 0)

    def body(i, sentences, beams, finished, state, results):
        beams, finished, parents, done, state = _beam_step(
            search, i, sentences, beams, finished, state)
        searching = (sentences, beams, finished, parents)

        def leave():  # the done sentences' results stored, the others' tensors kept
            kept = tf.cast(tf.where(~done)[:, 0], tf.int32)
            gone = tf.cast(tf.where(done)[:, 0], tf.int32)
            stored = _store(results, tf.gather(sentences, gone),
                            tf.nest.map_structure(lambda t: tf.gather(t, gone), finished))
            return (stored, tf.nest.map_structure(lambda t: tf.gather(t, kept), searching),
                    search.step.keep(state, kept))

        # Most steps no sentence is done: skip those ops then (a step's kernel count
        # is what one sentence's latency pays for, bench/performance-notes.md).
        results, searching, state = tf.cond(tf.reduce_any(done), leave,
                                            lambda: (results, searching, state))
        sentences, beams, finished, parents = searching
        state = search.step.reorder(state, tf.reshape(parents, [-1]))
        return i + 1, sentences, beams, finished, state, results

    loop_vars = (tf.constant(0), tf.range(batch), beams, none_finished, state, none_finished)
    _, sentences, _, finished, _, results = tf.while_loop(
        cond, body, loop_vars, shape_invariants=growing_shapes(loop_vars))
    return _store(results, sentences, finished)  # those still searching at width


def _fixed_shape_beam_search(search, state):
    """The search on shapes that never change, for XLA: _Hypotheses [batch, beam, ...].

    A done sentence stays in the batch, its results kept while its rows compute on; a
    Transformer's cache (TransformerStep with fixed_shapes) has every position from the
    start."""
    batch = tf.shape(search.rules.max_lengths)[0]
    beams, none_finished = _first_beams(search, batch)

    # `searching`: bool [batch], True for the sentences still searching.
    def cond(i, searching, beams, finished, state, results):
        return (i < search.width) & tf.reduce_any(searching)

    def body(i, searching, beams, finished, state, results):
        sentences = tf.range(tf.shape(searching)[0])  # no sentence leaves
        beams, finished, parents, done, state = _beam_step(
            search, i, sentences, beams, finished, state)
        results = _keep(results, finished, done & searching)
        state = search.step.reorder(state, tf.reshape(parents, [-1]))
        return i + 1, searching & ~done, beams, finished, state, results

    loop_vars = (tf.constant(0), tf.fill([batch], True), beams, none_finished, state,
                 none_finished)
    # No shape changes, yet the invariants are the growing search's: the step then traces
    # with the same static shapes in both searches.
    _, searching, _, finished, _, results = tf.while_loop(
        cond, body, loop_vars, shape_invariants=growing_shapes(loop_vars))
    return _keep(results, finished, searching)  # those still searching at width


def _first_beams(search, batch):
    """(_Beams, _Hypotheses) of batch sentences before the first step: BOS, none finished."""
    beam_size = search.beams
    seqs = first_tokens(tf.stack([batch, beam_size]), search.width)  # [batch, beam, width + 1]
    # Only beam 0 is live at first, so the first step does not pick one token k times.
    log_probs = tf.tile(tf.concat([[0.0], tf.fill([beam_size - 1], float("-inf"))], 0)[None, :],
                        tf.stack([batch, 1]))  # [batch, beam]
    empty = tf.fill(tf.stack([batch, beam_size]), float("-inf"))
    return (_Beams(seqs, log_probs),
            _Hypotheses(seqs, empty, empty, tf.zeros(tf.stack([batch]), tf.int32)))


def _beam_step(search, i, sentences, beams, finished, state):
    """One step of the search for n sentences (section 6.1).

    Every live beam is extended by every token: the best beam_size extensions that do
    not end in EOS stay live, those that end in EOS and the stopping rule lets finish are
    ranked into the finished ones.

    Args:
      search: _Search. i: the step; the beams' last token is at position i.
      sentences: int32 [n], each sentence's index in the batch (of the token rules).
      beams: _Beams [n, beam, ...]; finished: _Hypotheses [n, beam, ...].
      state: `search.step`'s, of n * beam rows.
    Returns:
      (beams, finished, parents int32 [n, beam]: the row of the step's state [n * beam,
      ...] each new live beam extends, done bool [n]: the stopping rule's, the step's
      state).
    """
    n = tf.shape(sentences)[0]  # beam rows each
    search = search.of(sentences)
    beam_size = search.beams
    flat_seqs = tf.reshape(beams.seqs, tf.stack([n * beam_size, search.width + 1]))
    token_log_probs, state = search.step(flat_seqs, i, state)
    if search.rules.prefix is not None:  # the prefix's forcing needs every log-prob
        token_log_probs = search.rules.force_prefix(as_log_probs(token_log_probs), i,
                                                    tf.repeat(sentences, beam_size))
    token_log_probs = search.rules.exclude_early_eos(token_log_probs, i, sentences, beam_size)
    # 2 * beam candidates hold at least beam that do not end in EOS (at most one
    # EOS per live beam), so the live set never runs short.
    top_log_probs, top_beams, top_tokens = _best_extensions(
        search.rules, token_log_probs, beams.log_probs, i + 1, sentences, 2 * beam_size)
    top_log_probs = search.within(top_log_probs, 2 * search.beam_size)
    top_seqs = write_tokens(tf.gather(beams.seqs, top_beams, batch_dims=1), i + 1,
                            top_tokens)  # [n, 2 * beam, width + 1]
    ends = top_tokens == EOS_ID

    live_log_probs, keep = tf.math.top_k(tf.where(ends, float("-inf"), top_log_probs),
                                         beam_size)
    live_log_probs = search.within(live_log_probs, search.beam_size)
    beams = _Beams(tf.gather(top_seqs, keep, batch_dims=1), live_log_probs)
    parents = tf.gather(top_beams, keep, batch_dims=1) + beam_size * tf.range(n)[:, None]
    finishing = search.stopping.finishing(ends, search)
    finished = _add_finished(finished, top_seqs,
                             tf.where(finishing, top_log_probs, float("-inf")), i + 1, search)
    done = search.stopping.done(finished, beams.log_probs, i,
                                tf.gather(search.rules.max_lengths, sentences), search)
    return beams, finished, parents, done, state


def _add_finished(finished, seqs, log_probs, length, search):
    """The beam best of finished and of new hypotheses of `length` tokens, by score, and
    the count of all that have finished.

    seqs int32 [n, k, width + 1] and log_probs float32 [n, k] (-inf: not finished) are
    the new ones; a hypothesis scores log-prob / lp(length) (section 6.1)."""
    scores = tf.concat([finished.scores, search.score(log_probs, length)], 1)
    scores, keep = tf.math.top_k(scores, search.beams)  # [n, beam]
    count = finished.count + tf.reduce_sum(tf.cast(log_probs > float("-inf"), tf.int32), 1)
    return _Hypotheses(
        tf.gather(tf.concat([finished.seqs, seqs], 1), keep, batch_dims=1),
        scores,
        tf.gather(tf.concat([finished.log_probs, log_probs], 1), keep, batch_dims=1),
        count)


def _best_extensions(rules, log_probs, live_log_probs, length, sentences, k):
    """The k best one-token extensions of each sentence's live beams, best first.

    Ranked as one top-k over all beam * vocab candidates would rank them (ties: lower
    beam, then lower token), among the tokens the rules allow (TokenRules).

    Args:
      rules: TokenRules. log_probs: float32 [n * beam, vocab], each live beam's
        next-token log-probs, or their keras_transformer.log_probs.LogProbs (ranked a
        sentence at a time, only the candidates kept normalized). live_log_probs: float32
        [n, beam].
      length: the extended outputs' length; sentences: int32 [n], each sentence's index.
    Returns:
      (log-probs float32 [n, k] (live + token), beams int32 [n, k], tokens int32 [n, k]).
    """
    if isinstance(log_probs, LogProbs):
        return rules.apply_to_extensions(
            *log_probs.best_extensions(live_log_probs, k, rules.NEVER), live_log_probs,
            length, sentences)
    # A sentence's k best hold at most k of one beam, so each beam's k best tokens
    # suffice, plus 2 for PAD and BOS: two small top-ks instead of masking, adding to
    # and ranking all beam * vocab candidates.
    best, tokens = rules.apply_to_best(
        *top_k(log_probs, candidates_per_row(k, rules.NEVER, log_probs)), length,
        tf.repeat(sentences, tf.shape(live_log_probs)[1]))  # [n * beam, per row]
    return best_of_beams(live_log_probs, best, tokens, k)


def _store(results, sentences, hypotheses):
    """results (_Hypotheses [batch, ...]) with rows `sentences` int32 [m] replaced.

    hypotheses: _Hypotheses [m, ...], those sentences' new rows."""
    return tf.nest.map_structure(
        lambda r, h: tf.tensor_scatter_nd_update(r, sentences[:, None], h), results,
        hypotheses)


def _keep(results, hypotheses, sentences):
    """results (_Hypotheses [batch, ...]) with hypotheses' rows where sentences is True.

    hypotheses: _Hypotheses of the same shapes; sentences: bool [batch]."""
    return tf.nest.map_structure(
        lambda r, h: tf.where(tf.reshape(sentences, [-1] + [1] * (r.shape.rank - 1)), h, r),
        results, hypotheses)
