"""Beam search with the length penalty of Wu et al. (2016), paper section 6.1.

Two searches take the same steps (`_beam_step`) on differently shaped tensors:

- the growing search, shaped for CPU serving cost: the self-attention cache grows by one
  position per step (writing a position costs O(1), attending costs O(position)), a
  sentence's beams share its encoder-decoder keys and values (never copied per beam),
  and a sentence whose n-best can no longer change leaves the batch;
- the fixed-shape search (`beam_search(..., fixed_shapes=True)`), on shapes that never
  change, for XLA, which fuses a step's hundreds of small ops (faster on one sentence,
  slower on large batches; see docs/performance-notes.md).

`search_beams` runs over any step (keras_transformer.search: a Transformer's, or a
faster one, or a scripted table); `beam_search` is the Transformer's.

Shapes: n sentences still searching (batch with fixed shapes), beam = beam_size, and
width the output width (keras_transformer.search.output_limits); sequences hold BOS in
column 0, so they are [..., width + 1].
"""

from typing import Any, NamedTuple, Optional

import tensorflow as tf

from keras_transformer.attention import ELEMENTWISE_MAX_ROWS
from keras_transformer.config import STOPPING_RULES, DecodeConfig
from keras_transformer.ranking import top_k
from keras_transformer.search import (DecodeResult, TargetPrefix, first_tokens,
                                      growing_shapes, output_limits, write_tokens)
from keras_transformer.search import length_penalty as lp
from keras_transformer.shortlist import from_candidates, to_candidates
from keras_transformer.special_ids import BOS_ID, EOS_ID, PAD_ID
from keras_transformer.step import TransformerStep


def beam_search(model, source_ids, beam_size=DecodeConfig.beam_size, alpha=DecodeConfig.alpha,
                extra_length=DecodeConfig.max_extra_length, use_cache=True,
                num_hypotheses=None, target_prefix=None, fixed_shapes=False, step_weights=None,
                shortlist=None, length_penalty=DecodeConfig.length_penalty, max_length=None,
                stopping=DecodeConfig.stopping):
    """Beam search with a length penalty (section 6.1: Wu et al.'s, 2016).

    Each step extends every live beam by every token and keeps the 2 * beam_size
    best candidates: those ending in EOS enter the fixed-size set of finished
    hypotheses (ranked by log-prob / lp), the best beam_size others stay live (ranked
    by log-prob). A sentence is done when its first num_hypotheses finished are there
    and no live beam can still enter them (stopping="exact"). The bound, for either length penalty
    (keras_transformer.search.length_penalty): a live beam of log-prob p <= 0 ends, if
    ever, at some length L up to the sentence's maximum, with a log-prob p' <= p (each
    token adds a log-prob <= 0; the EOS forced at the maximum adds 0), so it scores
    p' / lp(L) <= p / lp(L) <= p / lp(max length), since both lp(L) = ((5 + L) / 6)^alpha
    and lp(L) = L^alpha are positive and grow with L for alpha >= 0. Once the
    num_hypotheses-th finished score is at least that, no live beam can enter the first
    num_hypotheses: the early exit never changes them. A done sentence leaves the batch (its
    rows are no longer computed), and the loop stops when no sentence is left.

    stopping="transformers" searches as Hugging Face's generate() does by default
    (early_stopping=False), which a converted checkpoint needs to translate as it does: a
    step's finished hypotheses come only from its beam_size best candidates, and a
    sentence is also done once its best live beam, scored at its current length, does not
    beat the worst of its beam_size finished. That guess is not a bound (a live beam may
    still end higher), so the n-best can be worse than the exact search's; the exact rule
    still ends a sentence when it applies first, which changes nothing, since then no later
    hypothesis could have entered the first num_hypotheses.

    With a target prefix, each sentence's search starts from the single hypothesis
    BOS + prefix, scored by teacher forcing: while a sentence is inside its prefix every
    token but the prefix's is excluded, so only that hypothesis stays live.

    Args:
      model: a Transformer.
      source_ids: int [batch, src_len], 0-padded.
      beam_size: number of live beams and of returned hypotheses per sentence.
      alpha: length penalty exponent (section 6.1: 0.6; 0 ranks by log-prob).
      length_penalty: the penalty's form, "gnmt" (the paper's, ((5 + |Y|) / 6)^alpha)
        or "average" (|Y|^alpha: Hugging Face, Marian, CTranslate2).
      stopping: "exact" or "transformers" (keras_transformer.config.STOPPING_RULES), above.
      max_length: None, or the outputs' positions, BOS included (DecodeConfig.max_length):
        at most max_length - 1 tokens, below the model's own limit.
      extra_length: a sentence's output has at most (its non-pad source tokens +
        extra_length) tokens, and at most config.max_length - 1.
      use_cache: True decodes one position per step with `model.decode_step`; False
        recomputes `model.decode` over the whole prefix (for tests and benchmarks).
      num_hypotheses: how many of the returned hypotheses must be exactly the best
        the search can find, 1 to beam_size (default): 1 when only the best
        translation is used stops as soon as it is certain, and the others are then
        finished hypotheses ranked as found, not necessarily the 2nd.. best.
      target_prefix: None, or int [batch, prefix_len], 0-padded (PAD, BOS and EOS are
        not tokens a prefix holds): each output starts with its row's tokens, cut where
        the sentence's maximum length leaves room only for EOS.
      fixed_shapes: no tensor changes shape from step to step, for XLA
        (`tf.function(jit_compile=True)`, given a source of fixed shape): the cache has
        every position the search may decode (written at each step, attended under a
        mask), and a done sentence stays in the batch with its results kept. Same
        results; without XLA it is slower (every step costs as much as the last).
      step_weights: what each step reads (`TransformerStep.start`'s weights), by default
        read from the model once per search; e.g. int8 ones made once.
      shortlist: None, or a keras_transformer.shortlist.Shortlist: every step ranks only
        the batch's candidates (its sources' and prefix's shortlisted pieces), whose
        softmax normalizes over them (needs use_cache, not fixed_shapes).
    beam_size, alpha, extra_length and num_hypotheses may be scalar tensors (the caller
    then keeps 1 <= num_hypotheses <= beam_size and extra_length >= 0).
    Returns:
      DecodeResult with beam = beam_size, hypotheses sorted by score.

    Example: an untrained model, whose tokens are arbitrary but whose n-best's form is not.

    >>> import tensorflow as tf
    >>> from keras_transformer import Transformer, TransformerConfig, beam_search
    >>> model = Transformer(TransformerConfig.tiny(vocab_size=20))
    >>> model.build()
    >>> result = beam_search(model, tf.constant([[5, 6, 7, 3]]), beam_size=2, extra_length=3)
    >>> tuple(result.ids.shape), tuple(result.scores.shape)  # [batch, beam, 4 + 3], [batch, beam]
    ((1, 2, 7), (1, 2))
    >>> bool(result.scores[0, 0] >= result.scores[0, 1])  # best first
    True
    """
    source_ids = tf.cast(source_ids, tf.int32)
    width, max_lengths = output_limits(source_ids, extra_length, model.config.max_length,
                                       max_length)
    vocabulary = None
    if shortlist is not None:
        if fixed_shapes:
            raise ValueError("a shortlist's candidates change from batch to batch: not "
                             "with fixed_shapes")
        # The search runs over the batch's candidates: the special ids keep their values
        # (keras_transformer.shortlist), the prefix and the outputs are mapped.
        vocabulary = shortlist.candidates(source_ids, target_prefix)
        if target_prefix is not None:
            target_prefix = to_candidates(target_prefix, vocabulary)
    step, state = TransformerStep.start(model, source_ids, width, use_cache, beam_size,
                                        fixed_shapes, step_weights, vocabulary)

    def search(step):
        return search_beams(step, state, max_lengths, width, beam_size, alpha,
                            num_hypotheses, target_prefix, fixed_shapes, length_penalty,
                            stopping)

    if not use_cache or fixed_shapes:
        return search(step)
    # Rows only leave: a search that starts with at most ELEMENTWISE_MAX_ROWS rows (a
    # request of up to 4 sentences of 4 beams) attends elementwise at every step, without
    # a `tf.cond` per attention per step (one sentence 2-8% faster,
    # docs/performance-notes.md); a larger one chooses at each step.
    result = tf.cond(tf.shape(source_ids)[0] * beam_size <= ELEMENTWISE_MAX_ROWS,
                     lambda: search(step.with_elementwise(True)), lambda: search(step))
    if vocabulary is None:
        return result
    return result._replace(ids=from_candidates(result.ids, vocabulary))


def search_beams(step, state, max_lengths, width, beam_size=DecodeConfig.beam_size,
                 alpha=DecodeConfig.alpha, num_hypotheses=None, target_prefix=None,
                 fixed_shapes=False, length_penalty=DecodeConfig.length_penalty,
                 stopping=DecodeConfig.stopping):
    """Beam search over any step (keras_transformer.search): `beam_search`'s search, the
    seam a faster step (int8, a vocabulary shortlist, fewer layers) plugs into.

    Args:
      step, state: a step of keras_transformer.search over batch * beam_size rows (a
        sentence's beams adjacent), and its first state.
      max_lengths: int32 [batch], each output's limit (EOS counted).
      width: the outputs' width, at least every max_lengths (a Python int for XLA).
      beam_size, alpha, num_hypotheses, target_prefix, fixed_shapes, length_penalty,
        stopping: as `beam_search`.
    Returns:
      DecodeResult with beam = beam_size, hypotheses sorted by score.

    Example: a scripted step whose log-probs depend only on the last token (vocabulary:
    PAD, UNK, BOS, EOS, "a", "b"): after BOS "a" is likelier, after "a" EOS.

    >>> import math
    >>> import tensorflow as tf
    >>> table = tf.math.log(tf.constant([[.2, .2, .2, .2, .1, .1],    # after PAD (unused)
    ...                                  [.2, .2, .2, .2, .1, .1],    # after UNK (unused)
    ...                                  [0., 0., 0., .1, .6, .3],    # after BOS
    ...                                  [.2, .2, .2, .2, .1, .1],    # after EOS (unused)
    ...                                  [0., 0., 0., .9, .05, .05],  # after "a"
    ...                                  [0., 0., 0., .5, .25, .25]]))  # after "b"
    >>> class Bigram:
    ...     def __call__(self, seqs, i, state):
    ...         return tf.gather(table, seqs[:, i]), state
    ...     reorder = keep = staticmethod(lambda state, rows: state)
    >>> result = search_beams(Bigram(), {}, max_lengths=tf.constant([3]), width=3,
    ...                       beam_size=2, alpha=0.0)
    >>> result.ids.numpy().tolist()  # ["a", EOS] (.6 x .9), then ["b", EOS] (.3 x .5)
    [[[4, 3, 0], [5, 3, 0]]]
    >>> [round(math.exp(p), 2) for p in result.log_probs.numpy()[0]]
    [0.54, 0.15]
    """
    num_hypotheses = beam_size if num_hypotheses is None else num_hypotheses
    if not any(map(tf.is_tensor, (beam_size, num_hypotheses))) and not (
            1 <= num_hypotheses <= beam_size):
        raise ValueError(f"num_hypotheses must be in 1..beam_size={beam_size}, "
                         f"got {num_hypotheses}")
    if stopping not in STOPPING_RULES:
        raise ValueError(f"unknown stopping {stopping!r}; choose one of "
                         f"{', '.join(STOPPING_RULES)}")
    search = _Search(step, TargetPrefix.of(target_prefix), width, beam_size, alpha,
                     num_hypotheses, length_penalty, stopping)
    if fixed_shapes:
        results = _fixed_shape_beam_search(search, max_lengths, state)
    else:
        results = _growing_beam_search(search, max_lengths, state)
    ids = results.seqs[:, :, 1:]  # [batch, beam, width]
    lengths = tf.reduce_sum(tf.cast(ids != PAD_ID, tf.int32), axis=-1)
    return DecodeResult(ids, results.scores, results.log_probs, lengths)


class _Search(NamedTuple):
    """What every step of one search reads and no step changes.

    step: the step of keras_transformer.search over the batch; prefix: a TargetPrefix
    or None; width: the output width; beam_size, alpha, num_hypotheses, length_penalty
    and stopping: as `beam_search` takes them."""

    step: Any
    prefix: Optional[TargetPrefix]
    width: Any
    beam_size: Any
    alpha: Any
    num_hypotheses: Any
    length_penalty: str
    stopping: str

    def score(self, log_probs, length):
        """log_probs / lp(length): a finished hypothesis' score (section 6.1)."""
        return log_probs / lp(length, self.alpha, self.length_penalty)


class _Beams(NamedTuple):
    """The live hypotheses of n sentences, best first.

    seqs int32 [n, beam, width + 1] (BOS first); log_probs float32 [n, beam] (-inf: no
    hypothesis)."""

    seqs: tf.Tensor
    log_probs: tf.Tensor


class _Hypotheses(NamedTuple):
    """The finished hypotheses of n sentences, by decreasing score.

    seqs int32 [n, beam, width + 1] (BOS first); scores and log_probs float32 [n, beam]
    (-inf: empty)."""

    seqs: tf.Tensor
    scores: tf.Tensor
    log_probs: tf.Tensor


def _growing_beam_search(search, max_lengths, state):
    """The search on shapes that shrink and grow: _Hypotheses [batch, beam, ...].

    A done sentence's results are stored and its rows leave every tensor (the step's
    `keep`); a Transformer's cache grows by a position per step."""
    batch = tf.shape(max_lengths)[0]
    beams, none_finished = _first_beams(search, batch)

    # `sentences`: the batch indices of the n sentences still searching, int32 [n].
    def cond(i, sentences, beams, finished, max_lengths, state, results):
        return (i < search.width) & (tf.size(sentences) > 0)

    def body(i, sentences, beams, finished, max_lengths, state, results):
        beams, finished, parents, done, state = _beam_step(
            search, i, sentences, beams, finished, max_lengths, state)
        searching = (sentences, beams, finished, max_lengths, parents)

        def leave():  # the done sentences' results stored, the others' tensors kept
            kept = tf.cast(tf.where(~done)[:, 0], tf.int32)
            gone = tf.cast(tf.where(done)[:, 0], tf.int32)
            stored = _store(results, tf.gather(sentences, gone),
                            tf.nest.map_structure(lambda t: tf.gather(t, gone), finished))
            return (stored, tf.nest.map_structure(lambda t: tf.gather(t, kept), searching),
                    search.step.keep(state, kept))

        # Most steps no sentence is done: skip those ops then (a step's kernel count
        # is what one sentence's latency pays for, docs/performance-notes.md).
        results, searching, state = tf.cond(tf.reduce_any(done), leave,
                                            lambda: (results, searching, state))
        sentences, beams, finished, max_lengths, parents = searching
        state = search.step.reorder(state, tf.reshape(parents, [-1]))
        return i + 1, sentences, beams, finished, max_lengths, state, results

    loop_vars = (tf.constant(0), tf.range(batch), beams, none_finished, max_lengths, state,
                 none_finished)
    _, sentences, _, finished, _, _, results = tf.while_loop(
        cond, body, loop_vars, shape_invariants=growing_shapes(loop_vars))
    return _store(results, sentences, finished)  # those still searching at width


def _fixed_shape_beam_search(search, max_lengths, state):
    """The search on shapes that never change, for XLA: _Hypotheses [batch, beam, ...].

    A done sentence stays in the batch, its results kept while its rows compute on; a
    Transformer's cache (TransformerStep with fixed_shapes) has every position from the
    start."""
    batch = tf.shape(max_lengths)[0]
    beams, none_finished = _first_beams(search, batch)

    # `searching`: bool [batch], True for the sentences still searching.
    def cond(i, searching, beams, finished, state, results):
        return (i < search.width) & tf.reduce_any(searching)

    def body(i, searching, beams, finished, state, results):
        rows = tf.range(tf.shape(searching)[0])  # no sentence leaves: sentence k is row k
        beams, finished, parents, done, state = _beam_step(
            search, i, rows, beams, finished, max_lengths, state)
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
    beam_size = search.beam_size
    seqs = first_tokens(tf.stack([batch, beam_size]), search.width)  # [batch, beam, width + 1]
    # Only beam 0 is live at first, so the first step does not pick one token k times.
    log_probs = tf.tile(tf.concat([[0.0], tf.fill([beam_size - 1], float("-inf"))], 0)[None, :],
                        tf.stack([batch, 1]))  # [batch, beam]
    empty = tf.fill(tf.stack([batch, beam_size]), float("-inf"))
    return _Beams(seqs, log_probs), _Hypotheses(seqs, empty, empty)


def _beam_step(search, i, rows, beams, finished, max_lengths, state):
    """One step of the search for n sentences (section 6.1).

    Every live beam is extended by every token: the best beam_size extensions that do
    not end in EOS stay live, those that end in EOS are ranked into the finished ones.

    Args:
      search: _Search. i: the step; the beams' last token is at position i.
      rows: int32 [n], each sentence's row of the batch (of the target prefix).
      beams: _Beams [n, beam, ...]; finished: _Hypotheses [n, beam, ...].
      max_lengths: int32 [n]. state: `search.step`'s, of n * beam rows.
    Returns:
      (beams, finished, parents int32 [n, beam]: the row of the step's state [n * beam,
      ...] each new live beam extends, done bool [n]: the sentence's first
      num_hypotheses finished can no longer change, the step's state).
    """
    n = tf.shape(rows)[0]  # beam rows each
    beam_size = search.beam_size
    flat_seqs = tf.reshape(beams.seqs, tf.stack([n * beam_size, search.width + 1]))
    token_log_probs, state = search.step(flat_seqs, i, state)  # [n * beam, vocab]
    if search.prefix is not None:
        token_log_probs = search.prefix.force(token_log_probs, i,
                                              tf.repeat(max_lengths, beam_size),
                                              rows=tf.repeat(rows, beam_size))
    # 2 * beam candidates hold at least beam that do not end in EOS (at most one
    # EOS per live beam), so the live set never runs short.
    top_log_probs, top_beams, top_tokens = _best_extensions(
        token_log_probs, beams.log_probs, i + 1, max_lengths, 2 * beam_size)
    top_seqs = write_tokens(tf.gather(beams.seqs, top_beams, batch_dims=1), i + 1,
                            top_tokens)  # [n, 2 * beam, width + 1]
    ends = top_tokens == EOS_ID

    live_log_probs, keep = tf.math.top_k(tf.where(ends, float("-inf"), top_log_probs),
                                         beam_size)
    beams = _Beams(tf.gather(top_seqs, keep, batch_dims=1), live_log_probs)
    parents = tf.gather(top_beams, keep, batch_dims=1) + beam_size * tf.range(n)[:, None]
    finishing = ends
    if search.stopping == "transformers":  # only the beam_size best candidates finish
        finishing &= tf.range(2 * beam_size)[None, :] < beam_size
    finished = _add_finished(finished, top_seqs,
                             tf.where(finishing, top_log_probs, float("-inf")), i + 1, search)
    return beams, finished, parents, _done(finished, beams, i, max_lengths, search), state


def _add_finished(finished, seqs, log_probs, length, search):
    """The beam best of finished and of new hypotheses of `length` tokens, by score.

    seqs int32 [n, k, width + 1] and log_probs float32 [n, k] (-inf: not finished) are
    the new ones; a hypothesis scores log-prob / lp(length) (section 6.1)."""
    scores = tf.concat([finished.scores, search.score(log_probs, length)], 1)
    scores, keep = tf.math.top_k(scores, search.beam_size)  # [n, beam]
    return _Hypotheses(
        tf.gather(tf.concat([finished.seqs, seqs], 1), keep, batch_dims=1),
        scores,
        tf.gather(tf.concat([finished.log_probs, log_probs], 1), keep, batch_dims=1))


def _done(finished, beams, i, max_lengths, search):
    """bool [n]: no live beam can enter a sentence's first num_hypotheses finished.

    The live beams end at position i + 1, so they can still reach lengths i + 2 up to
    max_lengths int32 [n]."""
    # Best score a live beam can reach (the bound in beam_search's docstring): later
    # lengths only lower the log-prob, and the penalty grows with the length.
    best_live = search.score(beams.log_probs[:, 0], tf.maximum(i + 2, max_lengths))  # [n]
    done = finished.scores[:, search.num_hypotheses - 1] >= best_live
    if search.stopping == "transformers":
        # generate()'s guess (early_stopping=False): the best live beam, of i + 1 tokens,
        # scored at that length, against the worst of all beam_size finished.
        done |= finished.scores[:, -1] >= search.score(beams.log_probs[:, 0], i + 1)
    return done


def _best_extensions(log_probs, live_log_probs, length, max_lengths, k):
    """The k best one-token extensions of each sentence's live beams, best first.

    Ranked as one top-k over all beam * vocab candidates would rank them (ties: lower
    beam, then lower token), among the tokens an output may hold: never PAD or BOS, and
    only EOS, scoring 0, at a sentence's maximum length.

    Args:
      log_probs: float32 [n * beam, vocab], each live beam's next-token log-probs.
      live_log_probs: float32 [n, beam].
      length: the extended outputs' length; max_lengths: int32 [n].
    Returns:
      (log-probs float32 [n, k] (live + token), beams int32 [n, k], tokens int32 [n, k]).
    """
    n, beam = tf.shape(live_log_probs)[0], tf.shape(live_log_probs)[1]
    # A sentence's k best hold at most k of one beam, so each beam's k best tokens
    # suffice, plus 2 for PAD and BOS: two small top-ks instead of masking, adding to
    # and ranking all beam * vocab candidates.
    vocab = log_probs.shape[-1] or tf.shape(log_probs)[-1]
    per_beam = (tf.minimum(k + 2, vocab) if tf.is_tensor(k) or tf.is_tensor(vocab)
                else min(k + 2, vocab))
    best, tokens = top_k(log_probs, per_beam)  # [n * beam, per_beam]
    best = tf.where((tokens == PAD_ID) | (tokens == BOS_ID), float("-inf"), best)
    # At its maximum length a sentence may only end: EOS is each beam's one candidate,
    # forced, so it scores 0 (see search.allowed).
    at_max = tf.repeat(length >= max_lengths, beam)[:, None]  # [n * beam, 1]
    first = tf.range(per_beam) == 0
    best = tf.where(at_max, tf.where(first, 0.0, float("-inf")), best)
    tokens = tf.where(at_max, tf.where(first, EOS_ID, PAD_ID), tokens)
    candidates = live_log_probs[:, :, None] + tf.reshape(best, tf.stack([n, beam, per_beam]))
    top_log_probs, top = tf.math.top_k(tf.reshape(candidates, tf.stack([n, beam * per_beam])),
                                       k)
    tokens = tf.gather(tf.reshape(tokens, tf.stack([n, beam * per_beam])), top, batch_dims=1)
    return top_log_probs, top // per_beam, tokens


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
