"""When a beam search's sentence is done: the stopping rules, one class each
(keras_transformer.config.STOPPING_RULES names them, for the flags).

A rule has the two hooks the beam search's loop calls at every step:

    rule.finishing(ends, search) -> bool [n, 2 * beam]: which of the step's candidates
      that end in EOS (ends, best first) enter the sentence's finished hypotheses;
    rule.done(finished, live_log_probs, i, max_lengths, search) -> bool [n]: the
      sentence is done after step i (its live beams end at position i + 1).

`search` is the beam search's settings (keras_transformer.beam: beam_size, num_hypotheses,
patience and `score`, a log-prob over a length penalty); `finished` its finished
hypotheses (scores float32 [n, beam], best first, and count int32 [n], how many have
finished so far).

Every rule also ends a sentence once no live beam can still enter its first
num_hypotheses finished (`no_live_beam_can_enter`): from then on searching changes
nothing that is returned. Adding a rule is a class here, a line in RULES, and its name in
keras_transformer.config.STOPPING_RULES.
"""

import tensorflow as tf

from keras_transformer.config import STOPPING_RULES
from keras_transformer.search import is_per_sentence, of_sentences, per_beam


def no_live_beam_can_enter(finished, live_log_probs, i, max_lengths, search):
    """bool [n]: the first num_hypotheses finished hypotheses can no longer change.

    The bound, for either length penalty (keras_transformer.penalties): a
    live beam of log-prob p <= 0 ends, if ever, at some length L up to the sentence's
    maximum, with a log-prob p' <= p (each token adds a log-prob <= 0; the EOS forced at
    the maximum adds 0), so it scores p' / lp(L) <= p / lp(L) <= p / lp(max length),
    since lp is positive and grows with L for alpha >= 0. Once the num_hypotheses-th
    finished score is at least the best live beam's bound, no live beam can enter.
    live_log_probs float32 [n, beam], best first; max_lengths int32 [n]."""
    best_live = search.score(live_log_probs[:, 0], tf.maximum(i + 2, max_lengths))  # [n]
    return finished_score(finished, search.num_hypotheses - 1) >= best_live


def among_best(ends, search):
    """bool [n, 2 * beam]: the candidates that end in EOS among the beam_size best."""
    return ends & (tf.range(tf.shape(ends)[1])[None, :] < per_beam(search.beam_size))


def finished_score(finished, index):
    """float32 [n]: each sentence's finished score at `index` (an int, or int32 [n], one
    per sentence: a sentence's own beam or n-best)."""
    if is_per_sentence(index):
        return tf.gather(finished.scores, index, batch_dims=1)
    return finished.scores[:, index]


class Exact:
    """The paper's search: every candidate that ends in EOS is ranked into the finished
    hypotheses, and a sentence is done only when no live beam can enter its n-best, which
    is then the best the search can find."""

    def finishing(self, ends, search):
        del search
        return ends

    def done(self, finished, live_log_probs, i, max_lengths, search):
        return no_live_beam_can_enter(finished, live_log_probs, i, max_lengths, search)


class Transformers:
    """Hugging Face generate()'s default (early_stopping=False), which a converted
    checkpoint needs to translate as it does: a step's finished hypotheses come only from
    its beam_size best candidates, and a sentence is also done once its best live beam,
    scored at its current length, does not beat the worst of its beam_size finished. That
    is a guess, not a bound: a live beam may still end higher."""

    def finishing(self, ends, search):
        return among_best(ends, search)

    def done(self, finished, live_log_probs, i, max_lengths, search):
        worst = finished_score(finished, search.beam_size - 1
                               if is_per_sentence(search.beam_size) else -1)
        guess = worst >= search.score(live_log_probs[:, 0], i + 1)
        return guess | no_live_beam_can_enter(finished, live_log_probs, i, max_lengths,
                                              search)


class First:
    """CTranslate2's and fairseq's rule: a step's finished hypotheses come only from its
    beam_size best candidates, and a sentence is done once patience x beam_size of them
    have finished (rounded as CTranslate2 rounds it; Kasai et al., 2022, name patience).
    The n-best is then ranked among those."""

    def finishing(self, ends, search):
        return among_best(ends, search)

    def done(self, finished, live_log_probs, i, max_lengths, search):
        wanted = tf.floor(tf.cast(search.beam_size, tf.float32) *
                          tf.cast(search.patience, tf.float32) + 0.5)  # [n] or a scalar
        return (tf.cast(finished.count, tf.float32) >= wanted) | no_live_beam_can_enter(
            finished, live_log_probs, i, max_lengths, search)


RULES = {"exact": Exact(), "transformers": Transformers(), "first": First()}
assert tuple(RULES) == STOPPING_RULES, "name a new rule in config.STOPPING_RULES too"


class ChosenPerRequest:
    """One of RULES chosen in the graph by name (a tf.string scalar, or [batch], one per
    sentence: a request's option), each hook the chosen rule's."""

    def __init__(self, name=None, index=None):
        if index is None:
            index = tf.argmax(tf.cast(tf.equal(name[..., None], list(RULES)), tf.int32),
                              axis=-1, output_type=tf.int32)
        self.index = index

    def of(self, sentences):
        """The rules of the sentences int32 [n] still searching."""
        return ChosenPerRequest(index=of_sentences(self.index, sentences))

    def _chosen(self, hook, *args):
        results = [getattr(rule, hook)(*args) for rule in RULES.values()]
        chosen = results[0]
        for index, result in enumerate(results[1:], 1):
            chosen_here = self.index == index
            if is_per_sentence(self.index) and result.shape.rank == 2:
                chosen_here = chosen_here[:, None]
            chosen = tf.where(chosen_here, result, chosen)
        return chosen

    def finishing(self, ends, search):
        return self._chosen("finishing", ends, search)

    def done(self, finished, live_log_probs, i, max_lengths, search):
        return self._chosen("done", finished, live_log_probs, i, max_lengths, search)


def rule(name):
    """The rule named `name`: one of STOPPING_RULES, or a tf.string scalar holding one
    (the caller checks it is), chosen in the graph.

    Example: two finished hypotheses, the best at -1; the best live beam (-0.5) may still
    end above it, so the exact rule searches on, while CTranslate2's (beam 2, patience 1)
    has what it waits for.

    >>> import collections
    >>> import tensorflow as tf
    >>> Search = collections.namedtuple("Search", "beam_size num_hypotheses patience score")
    >>> search = Search(2, 1, 1.0, lambda log_probs, length: log_probs)  # alpha 0
    >>> Finished = collections.namedtuple("Finished", "scores count")
    >>> finished = Finished(tf.constant([[-1.0, -3.0]]), tf.constant([2]))
    >>> live = tf.constant([[-0.5, -2.0]])
    >>> [bool(rule(name).done(finished, live, 3, tf.constant([9]), search)[0])
    ...  for name in ("exact", "first")]
    [False, True]
    """
    if tf.is_tensor(name):
        return ChosenPerRequest(name)
    if name not in RULES:
        raise ValueError(f"unknown stopping {name!r}; choose one of {', '.join(RULES)}")
    return RULES[name]
