"""Random sampling of translations (back-translation, diverse outputs): each token drawn
from the model's distribution at a temperature, restricted to the top-k most probable
tokens and to the top-p nucleus (Holtzman et al., 2020), with stateless seeds. Greedy
search's loop (keras_transformer.decoding.search_single_path) with a random choice in
place of the argmax, so it takes the same target prefix and settings as scalar tensors.
"""

import tensorflow as tf

from keras_transformer import ranking
from keras_transformer.config import DecodeConfig
from keras_transformer.decoding import most_probable, search_single_path
from keras_transformer.search import DecodeResult


@tf.autograph.experimental.do_not_convert
def sample_search(step, config=DecodeConfig(), seed=0, num_samples=1, temperature=1.0,
                  top_k=0, top_p=1.0):
    """Random sampling over any step (keras_transformer.search): num_samples outputs per
    sentence, each token drawn until EOS.

    A token is drawn from the model's distribution at `temperature`, restricted to the
    top_k most probable tokens and to the nucleus of top_p probability (Holtzman et al.,
    2020).

    The draws are stateless (tf.random.stateless_categorical, seeded by the sentence's
    seed, the sample's index and the step), so a sentence's seed gives the same samples
    in any process, thread or batch, and another seed other samples.

    Args:
      step: a step of keras_transformer.search, e.g. keras_transformer.TransformerStep.
      config: a DecodeConfig: the output limits, and the length penalty of the scores.
      seed: int [batch], a seed per sentence; or an int scalar s, which seeds sentence b
        with s + b (its samples then depend on its place in the batch).
      num_samples: outputs per sentence.
      temperature: the logits are divided by it before the top-k/top-p restriction; 0
        (or less) takes the most probable token, i.e. greedy search.
      top_k: keep the k most probable tokens (ties with the k-th kept too); 0 keeps all.
      top_p: keep the smallest set of most probable tokens whose probability (at the
        temperature) reaches top_p; 1 keeps all. The most probable token is always kept.
    Returns:
      DecodeResult with beam = num_samples, each sentence's samples sorted by score.
      log_probs are the model's (temperature 1, unrestricted) log P(output | source).

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
    ...                          DecodeConfig(max_extra_length=3), seed=7, num_samples=3)
    >>> tuple(samples().ids.shape)  # [batch, num_samples, 4 source tokens + 3]
    (1, 3, 7)
    >>> np.array_equal(samples().ids, samples().ids)
    True
    """
    batch = tf.shape(step.source_ids)[0]
    seed = tf.cast(seed, tf.int64)
    if seed.shape.rank == 0:
        seed += tf.range(tf.cast(batch, tf.int64))
    # Row r = b * num_samples + k draws sample k of sentence b.
    sample = _sampler(tf.repeat(seed, num_samples),
                      tf.tile(tf.range(tf.cast(num_samples, tf.int64)), [batch]),
                      temperature, top_k, top_p)
    result = search_single_path(step, config, sample, rows_per_sentence=num_samples)

    def per_sentence(t):  # [batch * num_samples, 1, ...] -> [batch, num_samples, ...]
        return tf.reshape(t, tf.concat([tf.stack([batch, num_samples]), tf.shape(t)[2:]], 0))

    ids, scores, log_probs, lengths = (per_sentence(t) for t in result)
    scores, order = tf.math.top_k(scores, num_samples)
    return DecodeResult(tf.gather(ids, order, batch_dims=1), scores,
                        tf.gather(log_probs, order, batch_dims=1),
                        tf.gather(lengths, order, batch_dims=1))


def _sampler(seeds, sample_index, temperature, top_k, top_p):
    """sample_search's choice: (log_probs [rows, vocab], step) -> int32 [rows].

    Row r is drawn with the stateless seed (seeds[r], sample_index[r] * 2^16 + step)."""
    temperature = tf.cast(temperature, tf.float32)

    def draw(args):
        logits, seed = args
        return tf.random.stateless_categorical(logits[None], 1, seed, dtype=tf.int32)[0, 0]

    def sample(log_probs, step):
        logits = _nucleus(log_probs / tf.maximum(temperature, 1e-6), top_k, top_p)
        row_seeds = tf.stack([seeds, sample_index * 2**16 + tf.cast(step, tf.int64)], axis=1)
        # One seed per row (vectorized, not a loop): a row's draws do not depend on the
        # other rows.
        drawn = tf.vectorized_map(draw, (logits, row_seeds), fallback_to_while_loop=False)
        return tf.where(temperature > 0, drawn, most_probable(log_probs, step))

    return sample


# Tokens ranked first for a top-p nucleus: a row they fall short of ranks all of its own.
NUCLEUS_WIDTH = 64


def _nucleus(logits, top_k=0, top_p=1.0):
    """logits float32 [batch, vocab] with -inf outside each row's top-k and top-p tokens.

    The top-k tokens: ties with the k-th kept; k <= 0: all. The top-p nucleus: the fewest
    most probable tokens whose softmax probability sums to at least top_p (the most
    probable token always kept; top_p >= 1: all). top_k and top_p: Python numbers or
    scalar tensors.

    Ranking is the cost (a sort of [64, 8,000] takes about as long as a decoder step),
    so it ranks no more than it must: nothing with top_k 0 and top_p 1, the k best with
    top_p 1, and with top_p < 1 the best min(k, NUCLEUS_WIDTH) of each row, then all k
    of the rows whose nucleus those do not hold.
    """
    vocab = tf.shape(logits)[-1]
    top_k = tf.cast(top_k, tf.int32)
    top_p = tf.cast(top_p, tf.float32)
    k = tf.where(top_k > 0, tf.minimum(top_k, vocab), vocab)

    def keep_best(rows, width):
        """(rows [n, vocab] restricted by ranking their `width` best, those tokens'
        probability [n]): exact when width >= k or that probability reaches top_p."""
        descending, _ = ranking.top_k(rows, width)  # [n, width]
        probs = tf.exp(descending - tf.reduce_logsumexp(rows, axis=-1, keepdims=True))
        # Probability of the tokens ranked before each one: a token is in the nucleus
        # when those fall short of top_p.
        before = tf.cumsum(probs, axis=-1, exclusive=True)
        rank = tf.range(width)
        kept = (rank < k) & ((before < top_p) | (top_p >= 1) | (rank == 0))
        threshold = tf.reduce_min(tf.where(kept, descending, float("inf")), axis=-1,
                                  keepdims=True)
        return (tf.where(rows >= threshold, rows, float("-inf")),
                before[:, -1] + probs[:, -1])

    def restricted():
        width = tf.where(top_p < 1, tf.minimum(k, NUCLEUS_WIDTH), k)
        narrow, probability = keep_best(logits, width)
        short = tf.where((width < k) & (probability < top_p))  # int64 [n, 1]
        wide, _ = keep_best(tf.gather_nd(logits, short), k)
        return tf.tensor_scatter_nd_update(narrow, short, wide)

    return tf.cond((k >= vocab) & (top_p >= 1), lambda: logits, restricted)
