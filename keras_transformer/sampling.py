"""Random sampling of translations (back-translation, diverse outputs): each token drawn
from the model's distribution at a temperature, restricted to the top-k most probable
tokens and to the top-p nucleus (Holtzman et al., 2020), with stateless seeds. Greedy
search's loop (keras_transformer.decoding.search_single_path) with a random choice in
place of the argmax, so it takes the same target prefix and settings: Python values, or
tensors (scalars, or one value per sentence).
"""

import tensorflow as tf

from keras_transformer import ranking
from keras_transformer.config import DecodeConfig
from keras_transformer.decoding import most_probable, search_single_path
from keras_transformer.search import DecodeResult, is_per_sentence, largest, per_beam


@tf.autograph.experimental.do_not_convert
def sample_search(step, config=DecodeConfig()):
    """Random sampling over any step (keras_transformer.search): config.num_hypotheses
    outputs per sentence (None: one), each token drawn until EOS.

    A token is drawn from the model's distribution at config.temperature, restricted to
    the config.top_k most probable tokens and to the nucleus of config.top_p probability
    (Holtzman et al., 2020); 0 temperature takes the most probable token (greedy search).

    The draws are stateless (tf.random.stateless_categorical, seeded by the sentence's
    seed, the sample's index and the step), so a sentence's seed gives the same samples
    in any process, thread or batch, and another seed other samples.

    Args:
      step: a step of keras_transformer.search, e.g. keras_transformer.TransformerStep.
      config: a DecodeConfig: the sampling settings, the output limits, and the length
        penalty of the scores. Each sampling setting may be a tensor of one value per
        sentence (a batch of requests' options); a batch then draws its largest number of
        samples and keeps each sentence's own. config.seed: int [batch], a seed per
        sentence; or an int (scalar) s, which seeds sentence b with s + b (its samples
        then depend on its place in the batch).
    Returns:
      DecodeResult with beam = num_hypotheses (the largest), each sentence's samples
      sorted by score (past its own num_hypotheses: -inf). log_probs are the model's
      (temperature 1, unrestricted) log P(output | source).

    Example: an untrained model, whose samples are arbitrary but repeat with their seed.

    >>> import numpy as np
    >>> import tensorflow as tf
    >>> from keras_transformer import (DecodeConfig, Transformer, TransformerConfig,
    ...                                TransformerStep, sample_search)
    >>> model = Transformer(TransformerConfig.tiny(vocab_size=20))
    >>> model.build()
    >>> source_ids = tf.constant([[5, 6, 7, 3]])
    >>> def samples():
    ...     return sample_search(TransformerStep(model, source_ids),
    ...                          DecodeConfig(max_extra_length=3, seed=7, num_hypotheses=3))
    >>> tuple(samples().ids.shape)  # [batch, num_samples, 4 source tokens + 3]
    (1, 3, 7)
    >>> np.array_equal(samples().ids, samples().ids)
    True
    """
    batch = tf.shape(step.source_ids)[0]
    wanted = 1 if config.num_hypotheses is None else config.num_hypotheses
    num_samples = largest(wanted)
    seed = tf.cast(config.seed, tf.int64)
    if seed.shape.rank == 0:
        seed += tf.range(tf.cast(batch, tf.int64))

    def per_row(setting):  # a sentence's setting for each of its samples' rows
        return tf.repeat(setting, num_samples) if is_per_sentence(setting) else setting

    # Row r = b * num_samples + k draws sample k of sentence b.
    sample = _sampler(tf.repeat(seed, num_samples),
                      tf.tile(tf.range(tf.cast(num_samples, tf.int64)), [batch]),
                      per_row(config.temperature), per_row(config.top_k),
                      per_row(config.top_p))
    result = search_single_path(step, config, sample, rows_per_sentence=num_samples)

    def per_sentence(t):  # [batch * num_samples, 1, ...] -> [batch, num_samples, ...]
        return tf.reshape(t, tf.concat([tf.stack([batch, num_samples]), tf.shape(t)[2:]], 0))

    ids, scores, log_probs, lengths = (per_sentence(t) for t in result)
    if is_per_sentence(wanted):  # only a sentence's own samples are ranked
        scores = tf.where(tf.range(num_samples)[None, :] < wanted[:, None], scores,
                          float("-inf"))
    scores, order = tf.math.top_k(scores, num_samples)
    return DecodeResult(tf.gather(ids, order, batch_dims=1), scores,
                        tf.gather(log_probs, order, batch_dims=1),
                        tf.gather(lengths, order, batch_dims=1))


def _sampler(seeds, sample_index, temperature, top_k, top_p):
    """sample_search's choice: (log_probs [rows, vocab], step) -> int32 [rows].

    Row r is drawn with the stateless seed (seeds[r], sample_index[r] * 2^16 + step).
    temperature, top_k, top_p: Python values, scalars, or tensors [rows]."""
    temperature = tf.cast(temperature, tf.float32)

    def draw(args):
        logits, seed = args
        return tf.random.stateless_categorical(logits[None], 1, seed, dtype=tf.int32)[0, 0]

    def sample(log_probs, step):
        logits = _nucleus(log_probs / per_beam(tf.maximum(temperature, 1e-6)), top_k, top_p)
        row_seeds = tf.stack([seeds, sample_index * 2**16 + tf.cast(step, tf.int64)], axis=1)
        # One seed per row (vectorized, not a loop): a row's draws do not depend on the
        # other rows.
        drawn = tf.vectorized_map(draw, (logits, row_seeds), fallback_to_while_loop=False)
        return tf.where(temperature > 0, drawn, most_probable(log_probs, step))  # [rows]

    return sample


# Tokens ranked first for a top-p nucleus: a row they fall short of ranks all of its own.
NUCLEUS_WIDTH = 64


def _nucleus(logits, top_k=0, top_p=1.0):
    """logits float32 [batch, vocab] with -inf outside each row's top-k and top-p tokens.

    The top-k tokens: ties with the k-th kept; k <= 0: all. The top-p nucleus: the fewest
    most probable tokens whose softmax probability sums to at least top_p (the most
    probable token always kept; top_p >= 1: all). top_k and top_p: Python numbers,
    scalar tensors, or tensors [batch], one per row.

    Ranking is the cost (a sort of [64, 8,000] takes about as long as a decoder step),
    so it ranks no more than it must: nothing with top_k 0 and top_p 1, the k best with
    top_p 1, and with top_p < 1 the best min(k, NUCLEUS_WIDTH) of each row, then all k
    of the rows whose nucleus those do not hold.
    """
    vocab, n = tf.shape(logits)[-1], tf.shape(logits)[0]
    top_k = tf.broadcast_to(tf.cast(top_k, tf.int32), [n])  # [n]: a setting per row
    top_p = tf.broadcast_to(tf.cast(top_p, tf.float32), [n])
    k = tf.where(top_k > 0, tf.minimum(top_k, vocab), vocab)
    unrestricted = (k >= vocab) & (top_p >= 1)

    def keep_best(rows, width, k, top_p):
        """(rows [m, vocab] restricted by ranking their `width` best, those tokens'
        probability [m]): exact for a row when width >= its k or that probability
        reaches its top_p; k, top_p [m]."""
        descending, _ = ranking.top_k(rows, width)  # [m, width]
        probs = tf.exp(descending - tf.reduce_logsumexp(rows, axis=-1, keepdims=True))
        # Probability of the tokens ranked before each one: a token is in the nucleus
        # when those fall short of top_p.
        before = tf.cumsum(probs, axis=-1, exclusive=True)
        rank = tf.range(width)[None, :]
        kept = (rank < k[:, None]) & ((before < top_p[:, None]) | (top_p[:, None] >= 1) |
                                      (rank == 0))
        threshold = tf.reduce_min(tf.where(kept, descending, float("inf")), axis=-1,
                                  keepdims=True)
        return (tf.where(rows >= threshold, rows, float("-inf")),
                before[:, -1] + probs[:, -1])

    def restricted():
        widths = tf.where(unrestricted, 1, tf.where(top_p < 1, tf.minimum(k, NUCLEUS_WIDTH), k))
        width = tf.reduce_max(widths)
        narrow, probability = keep_best(logits, width, k, top_p)
        short = tf.where((width < k) & (probability < top_p) & ~unrestricted)  # int64 [m, 1]
        short_k = tf.gather_nd(k, short)
        wide, _ = keep_best(tf.gather_nd(logits, short),
                            tf.reduce_max(tf.concat([short_k, [1]], 0)), short_k,
                            tf.gather_nd(top_p, short))
        narrow = tf.tensor_scatter_nd_update(narrow, short, wide)
        return tf.where(unrestricted[:, None], logits, narrow)

    return tf.cond(tf.reduce_all(unrestricted), lambda: logits, restricted)
