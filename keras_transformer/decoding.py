"""Beam search and greedy decoding in TensorFlow (paper section 6.1), and the
teacher-forced log-probability of given targets (sampling, which shares greedy search's
loop: keras_transformer/sampling.py).

Section 6.1: "beam search with a beam size of 4 and length penalty alpha = 0.6 ...
maximum output length during inference to input length + 50, but terminate early
when possible." The length penalty is that of Wu et al. (2016):
lp(Y) = ((5 + |Y|) / 6)^alpha, and a hypothesis scores log P(Y | X) / lp(Y).

Everything is plain TensorFlow: it traces inside a `tf.function` whose inputs have
unknown batch and length. The search is shaped for CPU serving cost rather than for
XLA's fixed shapes: the self-attention cache grows by one position per step (writing
a position costs O(1), attending costs O(position)), a sentence's beams share its
encoder-decoder keys and values (never copied per beam), and a sentence whose n-best
can no longer change leaves the batch. `beam_search(..., fixed_shapes=True)` is the same
search on shapes that never change, for XLA, which fuses a step's hundreds of small ops
(faster on one sentence, slower on large batches; see bench/README.md).

Every search takes its settings as Python values or as scalar tensors (a SavedModel
signature's inputs: one trace serves every beam size), and may be given a target prefix:
tokens every output starts with, as if a translator had typed them, scored by the model
(their log-probabilities are in the results) and followed by the search.

Ids are the project's (keras_transformer.special_ids): pad 0, BOS 2 (position 0 of
every target), EOS 3. Outputs never contain PAD or BOS before their EOS; every output ends with EOS,
which is forced at a sentence's maximum length.
"""

import functools
from typing import NamedTuple

import tensorflow as tf

from keras_transformer.attention import ELEMENTWISE_MAX_ROWS
from keras_transformer.masking import padding_mask
from keras_transformer.ranking import top_k
from keras_transformer.special_ids import BOS_ID, EOS_ID, PAD_ID
from keras_transformer.transformer import shift_right
# Section 6.1: outputs are at most input length + 50 tokens.
EXTRA_LENGTH = 50


class DecodeResult(NamedTuple):
    """Hypotheses of `beam_search` (beam = beam size) or `greedy_search` (beam = 1).

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
        EOS included), what `sequence_log_probs` recomputes and reranking needs.
      lengths: int32 [batch, beam], tokens in each hypothesis, EOS included.
    """

    ids: tf.Tensor
    scores: tf.Tensor
    log_probs: tf.Tensor
    lengths: tf.Tensor


def length_penalty(length, alpha):
    """Wu et al. (2016) length penalty lp(Y) = ((5 + |Y|) / 6)^alpha.

    Args:
      length: int or float tensor of any shape, |Y| (EOS included).
      alpha: float, 0 turns the penalty off (lp = 1).
    Returns:
      float32, the shape of `length`.
    """
    return tf.pow((5.0 + tf.cast(length, tf.float32)) / 6.0, alpha)


def sequence_log_probs(model, source_ids, target_ids):
    """log P(target | source) under teacher forcing: the sum of the log-softmax of
    each target token given BOS and the tokens before it.

    Args:
      model: a Transformer.
      source_ids: int [batch, src_len], 0-padded.
      target_ids: int [batch, tgt_len], the target without BOS, ending with EOS,
        then 0 padding (padding contributes nothing).
    Returns:
      float32 [batch], natural-log probabilities (divide by `length_penalty` of the
      non-pad length for the beam search score).
    """
    source_ids = tf.cast(source_ids, tf.int32)
    target_ids = tf.cast(target_ids, tf.int32)
    encoder_output = model.encode(source_ids, training=False)
    logits = model.decode(shift_right(target_ids), encoder_output, source_ids, training=False)
    log_probs = tf.nn.log_softmax(logits, axis=-1)  # [batch, tgt_len, vocab]
    token_log_probs = tf.gather(log_probs, target_ids, batch_dims=2)  # [batch, tgt_len]
    return tf.reduce_sum(tf.where(target_ids != PAD_ID, token_log_probs, 0.0), axis=1)


def greedy_search(model, source_ids, alpha=0.6, extra_length=EXTRA_LENGTH, use_cache=True,
                  target_prefix=None):
    """Greedy decoding: the most probable token at each step, until EOS.

    Args:
      model: a Transformer.
      source_ids: int [batch, src_len], 0-padded.
      alpha: length penalty of the reported scores (the search ignores it).
      extra_length: a sentence's output has at most (its non-pad source tokens +
        extra_length) tokens, and at most config.max_length - 1.
      use_cache: True decodes one position per step with `model.decode_step`; False
        recomputes `model.decode` over the whole prefix (for tests and benchmarks).
      target_prefix: None, or int [batch, prefix_len], 0-padded: each output starts with
        its row's tokens (see `beam_search`).
    Returns:
      DecodeResult with beam = 1.
    """
    return single_path_search(model, source_ids, most_probable, alpha, extra_length,
                              use_cache, target_prefix)


def single_path_search(model, source_ids, choose, alpha, extra_length, use_cache,
                       target_prefix):
    """One output per row, what greedy search and sampling (keras_transformer.sampling)
    share: at each step choose(log-probs [batch, vocab] with the tokens not allowed at
    -inf, step) -> int32 [batch] picks the next token, until EOS. Arguments as
    `greedy_search`; returns a DecodeResult with beam = 1."""
    source_ids = tf.cast(source_ids, tf.int32)
    batch = tf.shape(source_ids)[0]
    width, max_lengths = _decode_lengths(model, source_ids, extra_length)
    state, step = _step_function(model, source_ids, width, use_cache)
    prefix = _Prefix.of(target_prefix)

    def cond(i, seqs, log_probs, finished, state):
        return (i < width) & ~tf.reduce_all(finished)

    def body(i, seqs, log_probs, finished, state):
        token_log_probs, state = step(seqs, i, state)  # [batch, vocab]
        token_log_probs = _allowed(token_log_probs, i + 1, max_lengths[:, None])
        if prefix is not None:
            token_log_probs = prefix.force(token_log_probs, i, max_lengths)
        tokens = choose(token_log_probs, i)  # [batch]
        tokens = tf.where(finished, PAD_ID, tokens)
        log_probs += tf.where(finished, 0.0, tf.gather(token_log_probs, tokens, batch_dims=1))
        seqs = _write(seqs, i + 1, tokens)
        return i + 1, seqs, log_probs, finished | (tokens == EOS_ID), state

    seqs = _write(tf.zeros(tf.stack([batch, width + 1]), tf.int32), 0,
                  tf.fill(tf.stack([batch]), BOS_ID))  # [batch, width + 1]
    log_probs = tf.zeros(tf.stack([batch]))
    finished = tf.zeros(tf.stack([batch]), tf.bool)
    loop_vars = (tf.constant(0), seqs, log_probs, finished, state)
    _, seqs, log_probs, _, _ = tf.while_loop(cond, body, loop_vars,
                                             shape_invariants=_growing(loop_vars))
    ids = seqs[:, None, 1:]  # [batch, 1, width]
    lengths = tf.reduce_sum(tf.cast(ids != PAD_ID, tf.int32), axis=-1)  # [batch, 1]
    log_probs = log_probs[:, None]
    return DecodeResult(ids, log_probs / length_penalty(lengths, alpha), log_probs, lengths)


def most_probable(log_probs, step):
    """Greedy search's choice: int32 [batch], the argmax of log_probs [batch, vocab]."""
    del step
    return tf.argmax(log_probs, axis=-1, output_type=tf.int32)


class _Prefix(NamedTuple):
    """A target prefix: tokens int32 [batch, width >= 1] (0-padded) and lengths int32
    [batch] (0: none), which outputs must start with."""

    tokens: tf.Tensor
    lengths: tf.Tensor

    @classmethod
    def of(cls, target_prefix):
        """The prefix of int [batch, prefix_len] `target_prefix`, 0-padded; None for None
        (a search without a prefix has no forcing ops at all)."""
        if target_prefix is None:
            return None
        tokens = tf.cast(target_prefix, tf.int32)
        lengths = tf.reduce_sum(tf.cast(tokens != PAD_ID, tf.int32), axis=1)
        # A column of padding, so that the position after the longest prefix exists.
        return cls(tf.pad(tokens, [[0, 0], [0, 1]]), lengths)

    def force(self, log_probs, position, max_lengths, rows=None):
        """log_probs [rows, vocab] of the output token at `position` (0-based) with every
        token but the prefix's at -inf on rows still inside their prefix; a prefix is
        cut where only EOS fits (max_lengths [rows]). rows: int32 [rows], this prefix's
        row of each (default: the same row)."""
        tokens, lengths = self.tokens, self.lengths
        if rows is not None:
            tokens, lengths = tf.gather(tokens, rows), tf.gather(lengths, rows)
        column = tf.minimum(position, tf.shape(tokens)[1] - 1)
        forced = tf.gather(tokens, column, axis=1)  # [rows]
        forcing = (position < lengths) & (position + 1 < max_lengths)
        token = tf.range(tf.shape(log_probs)[-1])
        keep = ~forcing[:, None] | (token == forced[:, None])
        return tf.where(keep, log_probs, float("-inf"))


class _Hypotheses(NamedTuple):
    """Finished hypotheses of each sentence: seqs int32 [n, beam, width + 1] (BOS
    first), scores and log_probs float32 [n, beam], by decreasing score (-inf: empty)."""

    seqs: tf.Tensor
    scores: tf.Tensor
    log_probs: tf.Tensor


def beam_search(model, source_ids, beam_size=4, alpha=0.6, extra_length=EXTRA_LENGTH,
                use_cache=True, num_hypotheses=None, target_prefix=None, fixed_shapes=False):
    """Beam search with the length penalty of Wu et al. (2016), section 6.1.

    Each step extends every live beam by every token and keeps the 2 * beam_size
    best candidates: those ending in EOS enter the fixed-size set of finished
    hypotheses (ranked by log-prob / lp), the best beam_size others stay live (ranked
    by log-prob). A sentence is done when its first num_hypotheses finished are there
    and no live beam can still enter them: a live beam's score can reach at most its
    log-prob divided by the largest lp it can still have (lp(max length) for
    alpha >= 0), since log-probs only decrease. So the early exit never changes the
    first num_hypotheses of the returned n-best. A done sentence leaves the batch (its
    rows are no longer computed), and the loop stops when no sentence is left.

    With a target prefix, each sentence's search starts from the single hypothesis
    BOS + prefix, scored by teacher forcing: while a sentence is inside its prefix every
    token but the prefix's is excluded, so only that hypothesis stays live.

    Args:
      model: a Transformer.
      source_ids: int [batch, src_len], 0-padded.
      beam_size: number of live beams and of returned hypotheses per sentence.
      alpha: length penalty exponent (section 6.1: 0.6; 0 ranks by log-prob).
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
    beam_size, alpha, extra_length and num_hypotheses may be scalar tensors (the caller
    then keeps 1 <= num_hypotheses <= beam_size and extra_length >= 0).
    Returns:
      DecodeResult with beam = beam_size, hypotheses sorted by score.
    """
    num_hypotheses = beam_size if num_hypotheses is None else num_hypotheses
    if not any(map(tf.is_tensor, (beam_size, num_hypotheses))) and not (
            1 <= num_hypotheses <= beam_size):
        raise ValueError(f"num_hypotheses must be in 1..beam_size={beam_size}, "
                         f"got {num_hypotheses}")
    source_ids = tf.cast(source_ids, tf.int32)
    batch = tf.shape(source_ids)[0]
    vocab = model.config.vocab_size
    width, max_lengths = _decode_lengths(model, source_ids, extra_length)
    state, step = _step_function(model, source_ids, width, use_cache, beam_size,
                                 fixed_shapes)
    prefix = _Prefix.of(target_prefix)
    neg_inf = tf.constant(float("-inf"))

    # `sentences`: the batch indices of the n sentences still searching, int32 [n]; with
    # fixed shapes, bool [batch], True for those (n = batch: no sentence leaves).
    def cond(i, sentences, live_seqs, live_log_probs, finished, max_lengths, state,
             results):
        return (i < width) & (tf.reduce_any(sentences) if fixed_shapes
                              else tf.size(sentences) > 0)

    def body(i, sentences, live_seqs, live_log_probs, finished, max_lengths, state,
             results, elementwise=None):
        n = tf.shape(sentences)[0]  # beam rows each
        flat_seqs = tf.reshape(live_seqs, tf.stack([n * beam_size, width + 1]))
        token_log_probs, state = step(flat_seqs, i, state, elementwise)  # [n * beam, vocab]
        if prefix is not None:
            rows = tf.range(n) if fixed_shapes else sentences
            token_log_probs = prefix.force(token_log_probs, i, tf.repeat(max_lengths, beam_size),
                                           rows=tf.repeat(rows, beam_size))
        # 2 * beam candidates hold at least beam that do not end in EOS (at most one
        # EOS per live beam), so the live set never runs short.
        top_log_probs, top_beams, top_tokens = _best_extensions(
            token_log_probs, live_log_probs, i + 1, max_lengths, 2 * beam_size, vocab)
        top_seqs = _write(tf.gather(live_seqs, top_beams, batch_dims=1), i + 1, top_tokens)
        ends = top_tokens == EOS_ID

        live_log_probs, keep = tf.math.top_k(tf.where(ends, neg_inf, top_log_probs), beam_size)
        live_seqs = tf.gather(top_seqs, keep, batch_dims=1)
        # Rows of the step's state [n * beam, ...] that each new live beam extends.
        parents = tf.gather(top_beams, keep, batch_dims=1) + beam_size * tf.range(n)[:, None]

        new_log_probs = tf.where(ends, top_log_probs, neg_inf)
        scores = tf.concat([finished.scores, new_log_probs / length_penalty(i + 1, alpha)], 1)
        finished_scores, keep = tf.math.top_k(scores, beam_size)
        finished = _Hypotheses(
            tf.gather(tf.concat([finished.seqs, top_seqs], 1), keep, batch_dims=1),
            finished_scores,
            tf.gather(tf.concat([finished.log_probs, new_log_probs], 1), keep, batch_dims=1))

        # Best score a live beam can reach: later lengths only lower the log-prob, and
        # the penalty is monotonic in the length.
        largest_penalty = tf.maximum(length_penalty(i + 2, alpha),
                                     length_penalty(max_lengths, alpha))
        best_live = live_log_probs[:, 0] / largest_penalty  # [n]
        done = finished.scores[:, num_hypotheses - 1] >= best_live
        if fixed_shapes:
            results = _keep(results, finished, done & sentences)
            state = _gather_rows(state, tf.reshape(parents, [-1]))
            return (i + 1, sentences & ~done, live_seqs, live_log_probs, finished,
                    max_lengths, state, results)
        searching = (sentences, live_seqs, live_log_probs, finished, max_lengths, parents)

        def leave():  # the done sentences' results stored, the others' tensors kept
            kept = tf.cast(tf.where(~done)[:, 0], tf.int32)
            gone = tf.cast(tf.where(done)[:, 0], tf.int32)
            stored = _store(results, tf.gather(sentences, gone),
                            tf.nest.map_structure(lambda t: tf.gather(t, gone), finished))
            return (stored, tf.nest.map_structure(lambda t: tf.gather(t, kept), searching),
                    _gather_sentences(state, kept))

        # Most steps no sentence is done: skip those ops then (a step's kernel count
        # is what one sentence's latency pays for, bench/README.md).
        results, searching, state = tf.cond(tf.reduce_any(done), leave,
                                            lambda: (results, searching, state))
        sentences, live_seqs, live_log_probs, finished, max_lengths, parents = searching
        state = _gather_rows(state, tf.reshape(parents, [-1]))
        return (i + 1, sentences, live_seqs, live_log_probs, finished, max_lengths, state,
                results)

    seqs = _write(tf.zeros(tf.stack([batch, beam_size, width + 1]), tf.int32), 0,
                  tf.fill(tf.stack([batch, beam_size]), BOS_ID))  # [batch, beam, width + 1]
    # Only beam 0 is live at first, so the first step does not pick one token k times.
    live_log_probs = tf.tile(
        tf.concat([[0.0], tf.fill([beam_size - 1], neg_inf)], 0)[None, :], tf.stack([batch, 1]))
    empty = tf.fill(tf.stack([batch, beam_size]), neg_inf)
    none_finished = _Hypotheses(seqs, empty, empty)
    sentences = tf.fill([batch], True) if fixed_shapes else tf.range(batch)
    loop_vars = (tf.constant(0), sentences, seqs, live_log_probs, none_finished,
                 max_lengths, state, none_finished)

    def search(elementwise):
        return tf.while_loop(cond, functools.partial(body, elementwise=elementwise),
                             loop_vars, shape_invariants=_growing(loop_vars))

    if fixed_shapes or not use_cache:
        outputs = search(None)
    else:
        # Rows only leave: a search that starts with at most ELEMENTWISE_MAX_ROWS rows
        # (a request of up to 4 sentences of 4 beams) attends elementwise at every step,
        # without a `tf.cond` per attention per step (one sentence 2-8% faster,
        # bench/README.md); a larger one chooses at each step.
        outputs = tf.cond(batch * beam_size <= ELEMENTWISE_MAX_ROWS,
                          lambda: search(True), lambda: search(None))
    _, sentences, _, _, finished, _, _, results = outputs
    # Those still searching at width:
    results = (_keep(results, finished, sentences) if fixed_shapes
               else _store(results, sentences, finished))
    ids = results.seqs[:, :, 1:]  # [batch, beam, width]
    lengths = tf.reduce_sum(tf.cast(ids != PAD_ID, tf.int32), axis=-1)
    return DecodeResult(ids, results.scores, results.log_probs, lengths)


def _store(results, sentences, hypotheses):
    """results (_Hypotheses over the batch) with rows `sentences` int32 [m] replaced by
    `hypotheses` (_Hypotheses of m sentences)."""
    return tf.nest.map_structure(
        lambda r, h: tf.tensor_scatter_nd_update(r, sentences[:, None], h), results,
        hypotheses)


def _keep(results, hypotheses, sentences):
    """results (_Hypotheses over the batch) with `hypotheses`' (the same shapes) in the
    rows where sentences, bool [batch], is True."""
    return tf.nest.map_structure(
        lambda r, h: tf.where(tf.reshape(sentences, [-1] + [1] * (r.shape.rank - 1)), h, r),
        results, hypotheses)


def _decode_lengths(model, source_ids, extra_length):
    """(width, max_lengths int32 [batch]): the output buffer width and each
    sentence's maximum output length, EOS included. width is a Python int when the
    source width is static, so XLA sees fixed shapes."""
    cap = model.config.max_length - 1  # BOS takes one of the model's positions
    src_len = source_ids.shape[1]
    if src_len is None or tf.is_tensor(extra_length):
        width = tf.minimum(tf.shape(source_ids)[1] + extra_length, cap)
    else:
        width = min(src_len + extra_length, cap)
    source_lengths = tf.reduce_sum(tf.cast(source_ids != PAD_ID, tf.int32), axis=1)
    return width, tf.minimum(source_lengths + extra_length, cap)


def _step_function(model, source_ids, width, use_cache, beam_size=1, fixed_shapes=False):
    """(initial state, step) for batch * beam_size rows, the beams of a sentence
    adjacent: step(seqs int32 [rows, width + 1], i, state, elementwise=None) -> (float32
    log-probs [rows, vocab] of the token after position i, new state); elementwise: see
    Transformer.decode_step.

    The state is a dict. With the cache: "source_mask" bool [batch, 1, 1, src_len] and
    "cache" (see Transformer.initial_cache), whose self-attention keys and values have a
    row per beam and encoder-decoder ones a row per sentence; the weights the step reads
    (Transformer.step_weights) are read once, outside the loop. Without it:
    "source_ids" [batch, src_len] and "encoder_output" [batch, src_len, d_model].
    `_gather_rows` reorders the beams' rows, `_gather_sentences` keeps some sentences.
    fixed_shapes: the cache has width + 1 positions from the start (see beam_search)."""
    encoder_output = model.encode(source_ids, training=False)
    if use_cache:
        weights = model.step_weights(width + 1)

        def step(seqs, i, state, elementwise=None):
            logits, cache = model.decode_step(seqs[:, i], i, state["cache"],
                                              state["source_mask"], weights, fixed_shapes,
                                              elementwise)
            return tf.nn.log_softmax(logits, axis=-1), {**state, "cache": cache}

        # Encoder-decoder keys and values are projected once per sentence.
        cache = model.initial_cache(encoder_output, beam_size,
                                    width + 1 if fixed_shapes else 0)
        return {"source_mask": padding_mask(source_ids), "cache": cache}, step

    def step(seqs, i, state, elementwise=None):  # (the attentions choose their own way)
        logits = model.decode(seqs[:, :i + 1], _tile(state["encoder_output"], beam_size),
                              _tile(state["source_ids"], beam_size), training=False)
        return tf.nn.log_softmax(logits[:, -1, :], axis=-1), state

    return {"source_ids": source_ids, "encoder_output": encoder_output}, step


def _gather_rows(state, rows):
    """The state with the self-attention cache's rows reordered: rows int32 [rows']."""
    cache = [{**layer, "key": tf.gather(layer["key"], rows),
              "value": tf.gather(layer["value"], rows)} for layer in state.get("cache", [])]
    return {**state, "cache": cache} if "cache" in state else state


def _gather_sentences(state, sentences):
    """The state of the sentences int32 [n'] only (the per-sentence tensors)."""
    state = {**state, **{name: tf.gather(state[name], sentences)
                         for name in ("source_ids", "source_mask", "encoder_output")
                         if name in state}}
    if "cache" in state:
        state["cache"] = [{**layer, "cross_key": tf.gather(layer["cross_key"], sentences),
                           "cross_value": tf.gather(layer["cross_value"], sentences)}
                          for layer in state["cache"]]
    return state


def _growing(loop_vars):
    """Shape invariants of tf.while_loop variables: any axis may change between steps
    (sentences leave the batch, the cache grows) but the last of a matrix or higher
    (widths, heads' depths), which the layers need to know."""
    def invariant(t):
        if t.shape.rank < 2:
            return tf.TensorShape([None] * t.shape.rank)
        return tf.TensorShape([None] * (t.shape.rank - 1) + [t.shape[-1]])
    return tf.nest.map_structure(invariant, loop_vars)


def _best_extensions(log_probs, live_log_probs, length, max_lengths, k, vocab):
    """The k best one-token extensions of each sentence's live beams, best first, as
    one top-k over all beam * vocab candidates would rank them (ties: lower beam, then
    lower token), with the tokens `_allowed` allows.

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
    per_beam = tf.minimum(k + 2, vocab) if tf.is_tensor(k) else min(k + 2, vocab)
    best, tokens = top_k(log_probs, per_beam)  # [n * beam, per_beam]
    best = tf.where((tokens == PAD_ID) | (tokens == BOS_ID), float("-inf"), best)
    # At its maximum length a sentence may only end: EOS is each beam's one candidate.
    at_max = tf.repeat(length >= max_lengths, beam)[:, None]  # [n * beam, 1]
    first = tf.range(per_beam) == 0
    best = tf.where(at_max, tf.where(first, log_probs[:, EOS_ID:EOS_ID + 1], float("-inf")),
                    best)
    tokens = tf.where(at_max, tf.where(first, EOS_ID, PAD_ID), tokens)
    candidates = live_log_probs[:, :, None] + tf.reshape(best, tf.stack([n, beam, per_beam]))
    top_log_probs, top = tf.math.top_k(tf.reshape(candidates, tf.stack([n, beam * per_beam])),
                                       k)
    tokens = tf.gather(tf.reshape(tokens, tf.stack([n, beam * per_beam])), top, batch_dims=1)
    return top_log_probs, top // per_beam, tokens


def _allowed(log_probs, length, max_lengths):
    """Log-probs [..., vocab] with -inf for tokens an output may not hold at `length`
    (EOS included): never PAD or BOS, and only EOS once a sentence reaches its
    max_lengths (broadcast to log_probs[..., :1]). The other tokens keep the model's
    log-probs, so scores stay true log-probabilities."""
    token = tf.range(tf.shape(log_probs)[-1])
    allowed = (token != PAD_ID) & (token != BOS_ID)
    allowed = tf.where(length >= max_lengths, token == EOS_ID, allowed)
    return tf.where(allowed, log_probs, float("-inf"))


def _write(seqs, position, tokens):
    """seqs int32 [..., width + 1] with tokens [...] at `position`; a select keeps
    the shape static (no scatter with a dynamic index)."""
    at_position = tf.range(tf.shape(seqs)[-1]) == position
    return tf.where(at_position, tokens[..., None], seqs)


def _tile(x, beam_size):
    """[batch, ...] -> [batch * beam, ...], the beams of a sentence adjacent."""
    return tf.repeat(x, beam_size, axis=0)
