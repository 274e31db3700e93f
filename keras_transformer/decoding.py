"""Greedy search (paper section 6.1's decoding with a beam of one) and the loop every
one-output-per-row search shares (greedy, and sampling in keras_transformer.sampling).

The searches are plain TensorFlow over any step (keras_transformer.search): they trace
inside a `tf.function` whose inputs have unknown batch and length, take their settings as
a DecodeConfig of Python values or tensors, scalars or one value per sentence (a
SavedModel signature's inputs: one trace serves every setting), and follow the step's target prefix: tokens every output
starts with, as if a translator had typed them, scored by the model (their
log-probabilities are in the results) and followed by the search.
"""

import tensorflow as tf

from keras_transformer.config import DecodeConfig
from keras_transformer.log_probs import as_log_probs
from keras_transformer.search import (DecodeResult, TokenRules, first_tokens, growing_shapes,
                                      is_per_sentence, write_tokens)
from keras_transformer.penalties import length_penalty as lp
from keras_transformer.special_ids import EOS_ID, PAD_ID


@tf.autograph.experimental.do_not_convert
def greedy_search(step, config=DecodeConfig()):
    """Greedy decoding: the most probable token at each step, until EOS.

    Args:
      step: a step of keras_transformer.search, e.g. keras_transformer.TransformerStep.
      config: a DecodeConfig: its output limits, and the length penalty of the reported
        scores (the search ignores it).
    Returns:
      DecodeResult with beam = 1, ids in the vocabulary's.

    Example: an untrained model, whose tokens are arbitrary but whose output's form is not.

    >>> import tensorflow as tf
    >>> from keras_transformer import (DecodeConfig, Transformer, TransformerConfig,
    ...                                TransformerStep, greedy_search)
    >>> model = Transformer(TransformerConfig.tiny(vocab_size=20))
    >>> model.build()
    >>> step = TransformerStep(model, tf.constant([[5, 6, 7, 3]]))
    >>> result = greedy_search(step, DecodeConfig(max_extra_length=3))
    >>> tuple(result.ids.shape)  # [batch, 1, 4 source tokens + max_extra_length]
    (1, 1, 7)
    >>> int(result.ids[0, 0, int(result.lengths[0, 0]) - 1])  # the last token: EOS
    3
    """
    return search_single_path(step, config, most_probable)


@tf.autograph.experimental.do_not_convert
def search_single_path(step, config=DecodeConfig(), choose=None, rows_per_sentence=1):
    """One output per row over any step (keras_transformer.search), until EOS: what greedy
    search and sampling share.

    At each step choose(log-probs float32 [rows, vocab] with the tokens the rules exclude
    at -inf, step) -> int32 [rows] picks the next token (default: `most_probable`).

    Args:
      step: a step of keras_transformer.search.
      config: a DecodeConfig: the output limits, and the length penalty of the reported
        scores (the search ignores it).
      rows_per_sentence: adjacent rows each sentence of the step has (samples of one
        sentence), each searched on its own.
    Returns:
      DecodeResult [batch * rows_per_sentence, 1, ...], ids in the vocabulary's.
    """
    choose = most_probable if choose is None else choose
    rules, width = TokenRules.of(step, config)
    state = step.start(rows_per_sentence, width)
    rows = tf.shape(step.source_ids)[0] * rows_per_sentence
    row_rules = rules.per_row(rows_per_sentence)

    def search(step):
        def cond(i, seqs, log_probs, finished, state):
            return (i < width) & ~tf.reduce_all(finished)

        def body(i, seqs, log_probs, finished, state):
            token_log_probs, state = step(seqs, i, state)
            token_log_probs = row_rules.apply(as_log_probs(token_log_probs), i)  # [rows, vocab]
            tokens = choose(token_log_probs, i)  # [rows]
            tokens = tf.where(finished, PAD_ID, tokens)
            log_probs += tf.where(finished, 0.0,
                                  tf.gather(token_log_probs, tokens, batch_dims=1))
            seqs = write_tokens(seqs, i + 1, tokens)
            return i + 1, seqs, log_probs, finished | (tokens == EOS_ID), state

        loop_vars = (tf.constant(0), first_tokens(tf.stack([rows]), width),
                     tf.zeros(tf.stack([rows])), tf.zeros(tf.stack([rows]), tf.bool), state)
        _, seqs, log_probs, _, _ = tf.while_loop(cond, body, loop_vars,
                                                 shape_invariants=growing_shapes(loop_vars))
        return seqs, log_probs

    seqs, log_probs = step.run(search, rows)
    ids = seqs[:, None, 1:]  # [rows, 1, width]
    lengths = tf.reduce_sum(tf.cast(ids != PAD_ID, tf.int32), axis=-1)  # [rows, 1]
    log_probs = log_probs[:, None]
    alpha = config.alpha
    if is_per_sentence(alpha):
        alpha = tf.repeat(alpha, rows_per_sentence)[:, None]
    scores = log_probs / lp(lengths, alpha, config.length_penalty)
    return DecodeResult(rules.output_ids(ids), scores, log_probs, lengths)


def most_probable(log_probs, step):
    """Greedy search's choice: int32 [batch], the argmax of log_probs [batch, vocab]."""
    del step
    return tf.argmax(log_probs, axis=-1, output_type=tf.int32)
