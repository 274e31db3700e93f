"""Greedy search (paper section 6.1's decoding with a beam of one) and the loop every
one-output-per-row search shares (greedy, and sampling in keras_transformer.sampling);
also the teacher-forced log-probability of given targets.

The searches are plain TensorFlow: they trace inside a `tf.function` whose inputs have
unknown batch and length, take their settings as Python values or as scalar tensors (a
SavedModel signature's inputs: one trace serves every setting), and may be given a target
prefix: tokens every output starts with, as if a translator had typed them, scored by the
model (their log-probabilities are in the results) and followed by the search. What they
share with beam search is in keras_transformer.search.
"""

import tensorflow as tf

from keras_transformer.config import DecodeConfig
from keras_transformer.search import (DecodeResult, TargetPrefix, allowed, first_tokens,
                                      growing_shapes, output_limits, write_tokens)
from keras_transformer.search import length_penalty as lp
from keras_transformer.special_ids import EOS_ID, PAD_ID
from keras_transformer.step import TransformerStep
from keras_transformer.transformer import shift_right


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
                  target_prefix=None, step_weights=None,
                  length_penalty=DecodeConfig.length_penalty, max_length=None):
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
      step_weights: what each step reads (see `beam_search`).
      length_penalty: the form of the reported scores' penalty (see `beam_search`).
      max_length: None, or the outputs' positions, BOS included (see `beam_search`).
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
    return model_single_path_search(model, source_ids, most_probable, alpha, extra_length,
                                    use_cache, target_prefix, step_weights, length_penalty,
                                    max_length)


def model_single_path_search(model, source_ids, choose, alpha, extra_length, use_cache,
                             target_prefix, step_weights=None,
                             length_penalty=DecodeConfig.length_penalty, max_length=None):
    """`search_single_path` over a Transformer's step: what greedy search and sampling
    (keras_transformer.sampling) share. Arguments as `greedy_search`; choose as
    `search_single_path`'s."""
    source_ids = tf.cast(source_ids, tf.int32)
    width, max_lengths = output_limits(source_ids, extra_length, model.config.max_length,
                                       max_length)
    step, state = TransformerStep.start(model, source_ids, width, use_cache,
                                        weights=step_weights)
    return search_single_path(step, state, max_lengths, width, choose, alpha, target_prefix,
                              length_penalty)


def search_single_path(step, state, max_lengths, width, choose=None,
                       alpha=DecodeConfig.alpha, target_prefix=None,
                       length_penalty=DecodeConfig.length_penalty):
    """One output per row over any step (keras_transformer.search), until EOS.

    At each step choose(log-probs float32 [rows, vocab] with the tokens not allowed at
    -inf, step) -> int32 [rows] picks the next token (default: `most_probable`, greedy).

    Args:
      step, state: a step of keras_transformer.search over the rows, and its first state.
      max_lengths: int32 [rows], each output's limit (EOS counted); width >= all of them.
      alpha, length_penalty: the length penalty of the reported scores (the search
        ignores it; see `beam_search`).
      target_prefix: None, or int [rows, prefix_len], 0-padded (see `beam_search`).
    Returns:
      DecodeResult with beam = 1.
    """
    choose = most_probable if choose is None else choose
    rows = tf.shape(max_lengths)[0]
    prefix = TargetPrefix.of(target_prefix)

    def cond(i, seqs, log_probs, finished, state):
        return (i < width) & ~tf.reduce_all(finished)

    def body(i, seqs, log_probs, finished, state):
        token_log_probs, state = step(seqs, i, state)  # [rows, vocab]
        token_log_probs = allowed(token_log_probs, i + 1, max_lengths[:, None])
        if prefix is not None:
            token_log_probs = prefix.force(token_log_probs, i, max_lengths)
        tokens = choose(token_log_probs, i)  # [rows]
        tokens = tf.where(finished, PAD_ID, tokens)
        log_probs += tf.where(finished, 0.0, tf.gather(token_log_probs, tokens, batch_dims=1))
        seqs = write_tokens(seqs, i + 1, tokens)
        return i + 1, seqs, log_probs, finished | (tokens == EOS_ID), state

    loop_vars = (tf.constant(0), first_tokens(tf.stack([rows]), width),
                 tf.zeros(tf.stack([rows])), tf.zeros(tf.stack([rows]), tf.bool), state)
    _, seqs, log_probs, _, _ = tf.while_loop(cond, body, loop_vars,
                                             shape_invariants=growing_shapes(loop_vars))
    ids = seqs[:, None, 1:]  # [rows, 1, width]
    lengths = tf.reduce_sum(tf.cast(ids != PAD_ID, tf.int32), axis=-1)  # [rows, 1]
    log_probs = log_probs[:, None]
    return DecodeResult(ids, log_probs / lp(lengths, alpha, length_penalty), log_probs, lengths)


def most_probable(log_probs, step):
    """Greedy search's choice: int32 [batch], the argmax of log_probs [batch, vocab]."""
    del step
    return tf.argmax(log_probs, axis=-1, output_type=tf.int32)
