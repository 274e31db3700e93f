"""Decoding (paper section 6.1): what every search shares, and greedy search.

Also the teacher-forced log-probability of given targets. Beam search
(keras_transformer/beam.py) and sampling (keras_transformer/sampling.py) build on this
module.

Section 6.1: "beam search with a beam size of 4 and length penalty alpha = 0.6 ...
maximum output length during inference to input length + 50, but terminate early
when possible" (keras_transformer.config.DecodeConfig holds these values). The length
penalty is that of Wu et al. (2016): lp(Y) = ((5 + |Y|) / 6)^alpha, and a hypothesis
scores log P(Y | X) / lp(Y).

Everything is plain TensorFlow: it traces inside a `tf.function` whose inputs have
unknown batch and length. Every search takes its settings as Python values or as scalar
tensors (a SavedModel signature's inputs: one trace serves every beam size), and may be
given a target prefix: tokens every output starts with, as if a translator had typed
them, scored by the model (their log-probabilities are in the results) and followed by
the search.

Ids are the project's (keras_transformer.special_ids): pad 0, BOS 2 (position 0 of
every target), EOS 3. Outputs never contain PAD or BOS before their EOS; every output
ends with EOS, which is forced at a sentence's maximum length.
"""

from typing import NamedTuple

import tensorflow as tf

from keras_transformer.config import DecodeConfig
from keras_transformer.masking import padding_mask
from keras_transformer.special_ids import BOS_ID, EOS_ID, PAD_ID
from keras_transformer.transformer import shift_right


def __getattr__(name):
    """`beam_search`, from keras_transformer.beam, imported on first use.

    That module builds on this one, so neither imports the other while it loads."""
    if name == "beam_search":
        from keras_transformer.beam import beam_search
        return beam_search
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


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
        EOS included, but for an EOS forced at the maximum length, which scores 0), what
        `sequence_log_probs` recomputes (without that EOS) and reranking needs.
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

    Example:

    >>> from keras_transformer import length_penalty
    >>> round(float(length_penalty(7, 0.6)), 4)  # ((5 + 7) / 6)^0.6 = 2^0.6
    1.5157
    """
    return tf.pow((5.0 + tf.cast(length, tf.float32)) / 6.0, alpha)


def sequence_log_probs(model, source_ids, target_ids):
    """log P(target | source) under teacher forcing.

    The sum of the log-softmax of each target token given BOS and the tokens before it.

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


def greedy_search(model, source_ids, alpha=DecodeConfig.alpha,
                  extra_length=DecodeConfig.max_extra_length, use_cache=True,
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

    Example: an untrained model, whose tokens are arbitrary but whose output's form is not.

    >>> import tensorflow as tf
    >>> from keras_transformer import Transformer, TransformerConfig, greedy_search
    >>> model = Transformer(TransformerConfig.tiny(vocab_size=20))
    >>> model.build()
    >>> result = greedy_search(model, tf.constant([[5, 6, 7, 3]]), extra_length=3)
    >>> tuple(result.ids.shape)  # [batch, 1, 4 source tokens + extra_length]
    (1, 1, 7)
    >>> int(result.ids[0, 0, int(result.lengths[0, 0]) - 1])  # the last token: EOS
    3
    """
    return single_path_search(model, source_ids, most_probable, alpha, extra_length,
                              use_cache, target_prefix)


def single_path_search(model, source_ids, choose, alpha, extra_length, use_cache,
                       target_prefix):
    """One output per row: what greedy search and sampling (keras_transformer.sampling) share.

    At each step choose(log-probs [batch, vocab] with the tokens not allowed at -inf,
    step) -> int32 [batch] picks the next token, until EOS. Arguments as
    `greedy_search`; returns a DecodeResult with beam = 1."""
    source_ids = tf.cast(source_ids, tf.int32)
    batch = tf.shape(source_ids)[0]
    width, max_lengths = decode_lengths(model, source_ids, extra_length)
    state, step = step_function(model, source_ids, width, use_cache)
    prefix = TargetPrefix.of(target_prefix)

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
        seqs = write_tokens(seqs, i + 1, tokens)
        return i + 1, seqs, log_probs, finished | (tokens == EOS_ID), state

    seqs = write_tokens(tf.zeros(tf.stack([batch, width + 1]), tf.int32), 0,
                        tf.fill(tf.stack([batch]), BOS_ID))  # [batch, width + 1]
    log_probs = tf.zeros(tf.stack([batch]))
    finished = tf.zeros(tf.stack([batch]), tf.bool)
    loop_vars = (tf.constant(0), seqs, log_probs, finished, state)
    _, seqs, log_probs, _, _ = tf.while_loop(cond, body, loop_vars,
                                             shape_invariants=growing_shapes(loop_vars))
    ids = seqs[:, None, 1:]  # [batch, 1, width]
    lengths = tf.reduce_sum(tf.cast(ids != PAD_ID, tf.int32), axis=-1)  # [batch, 1]
    log_probs = log_probs[:, None]
    return DecodeResult(ids, log_probs / length_penalty(lengths, alpha), log_probs, lengths)


def most_probable(log_probs, step):
    """Greedy search's choice: int32 [batch], the argmax of log_probs [batch, vocab]."""
    del step
    return tf.argmax(log_probs, axis=-1, output_type=tf.int32)


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


def decode_lengths(model, source_ids, extra_length):
    """(width, max_lengths int32 [batch]): the output buffer width, each output's limit.

    max_lengths count EOS (section 6.1: input length + extra_length). width is a Python
    int when the source width is static, so XLA sees fixed shapes."""
    cap = model.config.max_length - 1  # BOS takes one of the model's positions
    src_len = source_ids.shape[1]
    if src_len is None or tf.is_tensor(extra_length):
        width = tf.minimum(tf.shape(source_ids)[1] + extra_length, cap)
    else:
        width = min(src_len + extra_length, cap)
    source_lengths = tf.reduce_sum(tf.cast(source_ids != PAD_ID, tf.int32), axis=1)
    return width, tf.minimum(source_lengths + extra_length, cap)


def step_function(model, source_ids, width, use_cache, beam_size=1, fixed_shapes=False):
    """(initial state, step) of a search over batch * beam_size rows, beams adjacent.

    step(seqs int32 [rows, width + 1], i, state, elementwise=None) -> (float32 log-probs
    [rows, vocab] of the token after position i, new state); elementwise: see
    Transformer.decode_step.

    The state is a dict. With the cache: "source_mask" bool [batch, 1, 1, src_len] and
    "cache" (see Transformer.initial_cache), whose self-attention keys and values have a
    row per beam and encoder-decoder ones a row per sentence; the weights the step reads
    (Transformer.step_weights) are read once, outside the loop. Without it:
    "source_ids" [batch, src_len] and "encoder_output" [batch, src_len, d_model].
    `gather_rows` reorders the beams' rows, `gather_sentences` keeps some sentences.
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


def gather_rows(state, rows):
    """The state with the self-attention cache's rows reordered: rows int32 [rows']."""
    cache = [{**layer, "key": tf.gather(layer["key"], rows),
              "value": tf.gather(layer["value"], rows)} for layer in state.get("cache", [])]
    return {**state, "cache": cache} if "cache" in state else state


def gather_sentences(state, sentences):
    """The state of the sentences int32 [n'] only (the per-sentence tensors)."""
    state = {**state, **{name: tf.gather(state[name], sentences)
                         for name in ("source_ids", "source_mask", "encoder_output")
                         if name in state}}
    if "cache" in state:
        state["cache"] = [{**layer, "cross_key": tf.gather(layer["cross_key"], sentences),
                           "cross_value": tf.gather(layer["cross_value"], sentences)}
                          for layer in state["cache"]]
    return state


def growing_shapes(loop_vars):
    """Shape invariants of tf.while_loop variables: every axis may change but the last.

    Sentences leave the batch and the cache grows; the last axis of a matrix or higher
    (widths, heads' depths) stays known, since the layers need it."""
    def invariant(t):
        if t.shape.rank < 2:
            return tf.TensorShape([None] * t.shape.rank)
        return tf.TensorShape([None] * (t.shape.rank - 1) + [t.shape[-1]])
    return tf.nest.map_structure(invariant, loop_vars)


def _allowed(log_probs, length, max_lengths):
    """Log-probs [..., vocab] with -inf for the tokens an output may not hold at `length`.

    length counts EOS. Never PAD or BOS, and only EOS once a sentence reaches its
    max_lengths (broadcast to log_probs[..., :1]): that EOS is forced, not the model's
    choice, so it scores 0, as Hugging Face's generation (forced_eos_token_id) and
    CTranslate2 (which ends there without EOS) score it, and a search ranks the outputs cut
    at the limit as they do. The other tokens keep the model's log-probs, so scores stay
    true log-probabilities."""
    token = tf.range(tf.shape(log_probs)[-1])
    allowed = (token != PAD_ID) & (token != BOS_ID)
    at_max = length >= max_lengths
    allowed = tf.where(at_max, token == EOS_ID, allowed)
    return tf.where(allowed, tf.where(at_max, 0.0, log_probs), float("-inf"))


def write_tokens(seqs, position, tokens):
    """seqs int32 [..., width + 1] with tokens [...] at `position`.

    A select keeps the shape static (no scatter with a dynamic index)."""
    at_position = tf.range(tf.shape(seqs)[-1]) == position
    return tf.where(at_position, tokens[..., None], seqs)


def _tile(x, beam_size):
    """[batch, ...] -> [batch * beam, ...], the beams of a sentence adjacent."""
    return tf.repeat(x, beam_size, axis=0)
