"""Reference searches the tests hold the library's searches to, written plainly over a
`next_log_probs` function (a model's, `next_log_probs_of`, or a scripted table's): the
paper's beam search that never stops early, Hugging Face generate()'s default one, and
CTranslate2's."""

import math

import numpy as np
import tensorflow as tf

from conftest import ANY_IDS, VOCAB
from keras_transformer import EOS_ID


def exhaustive_beam_search(next_log_probs, source, beam_size, alpha, max_length, prefix=(),
                           length_penalty="gnmt"):
    """A plain beam search of one sentence that never stops early: live beams are
    extended up to max_length (where only EOS is allowed), every finished hypothesis
    is kept. next_log_probs: `next_log_probs_of(model)`. With a target prefix (cut to
    max_length - 1 tokens) the search starts from BOS + prefix, scored by teacher
    forcing. A hypothesis of n tokens scores log-prob / ((5 + n) / 6)^alpha ("gnmt") or
    log-prob / n^alpha ("average"). Returns the best beam_size (ids, score) pairs."""
    penalty = _penalty(alpha, length_penalty)
    prefix = tuple(prefix[:max_length - 1])
    ids = (2,) + prefix
    log_softmax = next_log_probs(np.array([ids], "int32"), source[None]).numpy()[0]
    forced = sum(log_softmax[t, token] for t, token in enumerate(prefix))
    live, finished = [(ids, forced)], []
    for length in range(len(prefix) + 1, max_length + 1):
        candidates = _candidates(next_log_probs, source, live, length, max_length, beam_size)
        finished += [(ids[1:], log_prob / penalty(length))
                     for ids, log_prob in candidates if ids[-1] == EOS_ID]
        live = [(ids, log_prob) for ids, log_prob in candidates if ids[-1] != EOS_ID]
        live = live[:beam_size]
    return sorted(finished, key=lambda f: -f[1])[:beam_size]


def transformers_beam_search(next_log_probs, source, beam_size, alpha, max_length,
                             length_penalty="average"):
    """Hugging Face Transformers' beam search of one sentence as generate() runs it by
    default (early_stopping=False; transformers 5's GenerationMixin._beam_search), written
    plainly: each step keeps the 2 * beam_size best candidates; of those ending in EOS,
    only the beam_size best may enter the beam_size finished hypotheses; the best
    beam_size others stay live; the sentence is done once beam_size are finished and the
    best live beam's log-prob over the penalty of its own length does not beat the worst
    finished score, or at max_length (where only EOS is allowed, scoring 0). Arguments
    and result as `exhaustive_beam_search`'s."""
    penalty = _penalty(alpha, length_penalty)
    live, finished = [((2,), 0.0)], []
    for length in range(1, max_length + 1):
        candidates = _candidates(next_log_probs, source, live, length, max_length, beam_size)
        finished += [(ids[1:], log_prob / penalty(length))
                     for ids, log_prob in candidates[:beam_size] if ids[-1] == EOS_ID]
        finished = sorted(finished, key=lambda f: -f[1])[:beam_size]
        live = [(ids, log_prob) for ids, log_prob in candidates if ids[-1] != EOS_ID]
        live = live[:beam_size]
        if not live or (len(finished) == beam_size and
                        finished[-1][1] >= live[0][1] / penalty(length)):
            break
    return finished


def ctranslate2_beam_search(next_log_probs, source, beam_size, alpha, max_length,
                            length_penalty="average", patience=1.0):
    """CTranslate2's beam search of one sentence with a length penalty (src/decoding.cc,
    BeamSearch::search, 4.8), written plainly: each step keeps the 2 * beam_size best
    candidates; those among the beam_size best that end in EOS finish (at max_length all
    of them, ending there); the best beam_size others stay live; the sentence is done once
    round(beam_size x patience) have finished, or at max_length; the finished are ranked
    by log-prob over the penalty. Arguments and result as `exhaustive_beam_search`'s."""
    penalty = _penalty(alpha, length_penalty)
    wanted = math.floor(beam_size * patience + 0.5)  # std::round, for positive numbers
    live, finished = [((2,), 0.0)], []
    for length in range(1, max_length + 1):
        candidates = _candidates(next_log_probs, source, live, length, max_length, beam_size)
        finished += [(ids[1:], log_prob / penalty(length))
                     for ids, log_prob in candidates[:beam_size] if ids[-1] == EOS_ID]
        live = [(ids, log_prob) for ids, log_prob in candidates if ids[-1] != EOS_ID]
        live = live[:beam_size]
        if not live or len(finished) >= wanted:
            break
    return sorted(finished, key=lambda f: -f[1])[:beam_size]


def _penalty(alpha, kind):
    return {"gnmt": lambda n: ((5 + n) / 6) ** alpha, "average": lambda n: n ** alpha}[kind]


def _candidates(next_log_probs, source, live, length, max_length, beam_size):
    """The 2 * beam_size best one-token extensions [(ids, log-prob)] of the live ones, of
    `length` tokens: never PAD or BOS, and at max_length only EOS, forced, scoring 0."""
    prefixes = np.array([ids for ids, _ in live], "int32")
    log_softmax = next_log_probs(prefixes, np.repeat(source[None], len(live), 0))
    log_softmax = log_softmax.numpy()[:, -1]
    allowed = [EOS_ID] if length == max_length else [1] + list(range(EOS_ID, VOCAB))
    return sorted(((ids + (token,), log_prob + (row[token] if length < max_length else 0.0))
                   for (ids, log_prob), row in zip(live, log_softmax) for token in allowed),
                  key=lambda c: -c[1])[:2 * beam_size]


def next_log_probs_of(model):
    """(prefixes with BOS [n, t], sources [n, s]) -> log-softmax [n, t, vocab] of the
    token after each prefix position, by teacher forcing (`model.decode`)."""
    return tf.function(lambda prefixes, sources: tf.nn.log_softmax(model((sources, prefixes))),
                       input_signature=ANY_IDS * 2)


# The training tests' data and trainers (test_training.py, test_validation.py,
# test_moving_average.py).
