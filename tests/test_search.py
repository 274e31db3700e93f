"""The searches on scripted log-probability tables, without a model (the seam of
keras_transformer.search): ties, EOS, a target prefix, an exact n-best and its early exit,
each checked against reference_search's plain beam search that never stops early, and
the other stopping rules against plain copies of generate()'s and CTranslate2's searches.
Eager, in milliseconds."""

import numpy as np
import pytest
import tensorflow as tf

from conftest import VOCAB
from reference_search import (ctranslate2_beam_search, exhaustive_beam_search,
                              transformers_beam_search)
from keras_transformer import (BOS_ID, EOS_ID, PAD_ID, DecodeConfig, Step, beam_search,
                               greedy_search)

WIDTH = 6  # the outputs' width: every test's max_lengths are at most this


class TableStep(Step):
    """A step of keras_transformer.search whose log-probs are a table's row: table
    float32 [WIDTH + 1, VOCAB, VOCAB], the log-probs of the token after position i given
    the token there. It keeps no state, and counts its calls. `for_sentences` gives it
    its sentences."""

    max_positions = WIDTH + 1

    def __init__(self, table):
        self.table = tf.constant(table, tf.float32)
        self.calls = 0

    def for_sentences(self, max_lengths, target_prefix=None, fixed_shapes=False):
        """The step, over one sentence per max_lengths entry whose outputs may hold that
        many tokens: sources of that many tokens, searched with max_extra_length 0."""
        self.source_ids = tf.sequence_mask(max_lengths, WIDTH, tf.int32)
        self.target_prefix = (None if target_prefix is None
                              else tf.constant(target_prefix, tf.int32))
        self.fixed_shapes = fixed_shapes
        return self

    def __call__(self, seqs, i, state):
        self.calls += 1
        return tf.gather(self.table[i], seqs[:, i]), state

    def next_log_probs(self, prefixes, sources):
        """reference_search's next_log_probs: log-probs [n, t, vocab] after each prefix position."""
        del sources
        positions = np.arange(prefixes.shape[1])
        return tf.constant(self.table.numpy()[positions[None], prefixes])


def random_table(seed, sharpness=2.0):
    """Random log-softmax rows, as peaked as `sharpness` makes them."""
    logits = np.random.default_rng(seed).normal(size=(WIDTH + 1, VOCAB, VOCAB)) * sharpness
    return tf.nn.log_softmax(logits).numpy()


def table_favouring(rows):
    """A table uniform but for {(position, after token): {token: probability}} rows, whose
    other tokens share what is left."""
    table = np.full((WIDTH + 1, VOCAB, VOCAB), 1.0 / VOCAB)
    for (position, after), probabilities in rows.items():
        rest = (1.0 - sum(probabilities.values())) / (VOCAB - len(probabilities))
        table[position, after] = rest
        for token, probability in probabilities.items():
            table[position, after, token] = probability
    return np.log(table)


def beams(step, max_lengths, target_prefix=None, fixed_shapes=False, num_hypotheses=None,
          **settings):
    """beam_search over one sentence per max_lengths entry with the DecodeConfig of
    `settings`, as numpy."""
    step = step.for_sentences(max_lengths, target_prefix, fixed_shapes)
    settings.setdefault("stopping", "exact")  # the rule the reference searches are
    result = beam_search(step, DecodeConfig(max_extra_length=0, num_hypotheses=num_hypotheses,
                                            **settings))
    return tf.nest.map_structure(lambda t: t.numpy(), result)


def hypotheses(result, sentence=0):
    """[(ids up to EOS, score)] of a sentence, best first, empty slots left out."""
    return [(tuple(ids[:n]), score) for ids, n, score in
            zip(result.ids[sentence], result.lengths[sentence], result.scores[sentence])
            if n > 0]


# Both length penalties; alpha 2 and 3 favour long outputs so strongly that a live beam's
# bound must use the penalty of the longest output, not of the current length.
@pytest.mark.parametrize("fixed_shapes", [False, True], ids=["growing", "fixed_shapes"])
@pytest.mark.parametrize("length_penalty,alpha", [("gnmt", 0.0), ("gnmt", 0.6), ("gnmt", 2.0),
                                                  ("average", 1.0), ("average", 3.0)])
def test_the_n_best_is_the_plain_beam_searchs_on_random_tables(fixed_shapes, length_penalty,
                                                                alpha):
    for seed in range(4):
        step = TableStep(random_table(seed))
        max_lengths = [WIDTH, 4, 2]
        result = beams(step, max_lengths, beam_size=3, alpha=alpha, fixed_shapes=fixed_shapes,
                       length_penalty=length_penalty)
        for sentence, max_length in enumerate(max_lengths):
            expected = exhaustive_beam_search(step.next_log_probs, np.zeros(1), 3, alpha,
                                              max_length, length_penalty=length_penalty)
            found = hypotheses(result, sentence)
            assert [ids for ids, _ in found] == [ids for ids, _ in expected], (seed, sentence)
            np.testing.assert_allclose([s for _, s in found], [s for _, s in expected],
                                       rtol=1e-5)


def test_ties_go_to_the_lower_token_then_the_lower_beam():
    # After BOS, tokens 5 and 4 are equally likely; after either, EOS.
    step = TableStep(table_favouring({(0, BOS_ID): {4: 0.4, 5: 0.4},
                                      (1, 4): {EOS_ID: 0.9}, (1, 5): {EOS_ID: 0.9}}))
    best = hypotheses(beams(step, [3], beam_size=1, alpha=0.0))
    assert best[0][0] == (4, EOS_ID)
    both = hypotheses(beams(step, [3], beam_size=2, alpha=0.0))
    assert [ids for ids, _ in both] == [(4, EOS_ID), (5, EOS_ID)]
    assert both[0][1] == both[1][1]


def test_pad_and_bos_are_never_output_and_eos_is_forced_at_the_limit_scoring_zero():
    # PAD and BOS are the likeliest tokens everywhere; EOS never is.
    step = TableStep(table_favouring({(i, t): {PAD_ID: 0.45, BOS_ID: 0.45, EOS_ID: 1e-6}
                                      for i in range(WIDTH + 1) for t in range(VOCAB)}))
    result = beams(step, [3, 1], beam_size=2, alpha=0.0)
    for sentence, max_length in enumerate((3, 1)):
        for ids, _ in hypotheses(result, sentence):
            assert PAD_ID not in ids and BOS_ID not in ids
            assert len(ids) == max_length and ids[-1] == EOS_ID  # forced at the limit
    # A limit of one token: EOS alone, forced, log-prob 0; the other slot stays empty.
    assert hypotheses(result, 1) == [((EOS_ID,), 0.0)]
    assert result.lengths[1].tolist() == [1, 0] and result.scores[1, 1] == -np.inf
    # The forced EOS adds nothing: each hypothesis' log-prob is its two tokens'.
    table = step.table.numpy()
    for ids, log_prob in zip(result.ids[0], result.log_probs[0]):
        assert log_prob == pytest.approx(table[0, BOS_ID, ids[0]] + table[1, ids[0], ids[1]])


def test_a_finished_hypothesis_leaves_the_beam_and_the_live_ones_go_on():
    # After BOS: EOS 0.5 (finished at length 1) or 4 (0.4), then 4 EOS.
    step = TableStep(table_favouring({(0, BOS_ID): {EOS_ID: 0.5, 4: 0.4},
                                      (1, 4): {EOS_ID: 0.95}}))
    found = hypotheses(beams(step, [WIDTH], beam_size=2, alpha=0.0))
    assert [ids for ids, _ in found] == [(EOS_ID,), (4, EOS_ID)]
    np.testing.assert_allclose([s for _, s in found], np.log([0.5, 0.4 * 0.95]), rtol=1e-5)


def test_the_length_penalty_decides_between_a_short_and_a_long_output():
    # EOS at once (0.45), or 4 then EOS (0.5 x 0.8 = 0.4): the shorter output is likelier
    # and wins at alpha 0; the penalty, ((5 + 2) / 6)^alpha over ((5 + 1) / 6)^alpha,
    # lifts the longer above it from alpha 1 on (-0.785 against -0.799).
    step = TableStep(table_favouring({(0, BOS_ID): {EOS_ID: 0.45, 4: 0.5},
                                      (1, 4): {EOS_ID: 0.8}}))
    at = {alpha: [ids for ids, _ in hypotheses(beams(step, [WIDTH], beam_size=2, alpha=alpha))]
          for alpha in (0.0, 1.0, 2.0)}
    assert at[0.0] == [(EOS_ID,), (4, EOS_ID)]
    assert at[1.0] == at[2.0] == [(4, EOS_ID), (EOS_ID,)]


@pytest.mark.parametrize("length_penalty,alpha,lp", [
    ("gnmt", 2.0, lambda n: ((5 + n) / 6) ** 2.0), ("average", 0.5, lambda n: n ** 0.5)],
    ids=["gnmt", "average"])
def test_the_early_exit_waits_for_a_live_beam_the_length_penalty_can_still_lift(
        length_penalty, alpha, lp):
    # EOS at once (0.3) scores log 0.3 / lp(1) = -1.20. The live beam "4" (log-prob -2)
    # scores at most -2 / lp(2) (-1.47 for gnmt, -1.41 for average) if it ended next,
    # which a bound taken at the next length would call beaten; but it goes on almost
    # surely to the limit, where -2 / lp(6) (-0.60, -0.82) beats the short output.
    assert -2 / lp(2) < np.log(0.3) / lp(1) < -2 / lp(WIDTH)
    step = TableStep(table_favouring({(0, BOS_ID): {EOS_ID: 0.3, 4: np.exp(-2.0)},
                                      **{(i, 4): {4: 0.999} for i in range(1, WIDTH + 1)}}))
    found = hypotheses(beams(step, [WIDTH], beam_size=2, alpha=alpha, num_hypotheses=1,
                             length_penalty=length_penalty))
    assert found[0][0] == (4,) * (WIDTH - 1) + (EOS_ID,)
    assert found[0][1] == pytest.approx((-2.0 + (WIDTH - 2) * np.log(0.999)) / lp(WIDTH),
                                        rel=1e-5)


def differs_from_exact(fixed_shapes, penalties, stopping, reference, **settings):
    """Checks that `stopping` gives the hypotheses of reference_search's `reference` (a
    plain copy of the search that rule is another engine's) on random tables, for each
    (length penalty, alpha) of `penalties`; returns how many of those n-bests are not the
    exact search's."""
    differ = 0
    for length_penalty, alpha in penalties:
        for seed in range(4):
            step = TableStep(random_table(seed, sharpness=1.0))
            max_lengths = [WIDTH, 4]
            result = beams(step, max_lengths, beam_size=3, alpha=alpha,
                           fixed_shapes=fixed_shapes, length_penalty=length_penalty,
                           stopping=stopping, **settings)
            for sentence, max_length in enumerate(max_lengths):
                expected = reference(step.next_log_probs, np.zeros(1), 3, alpha, max_length,
                                     length_penalty, **settings)
                found = hypotheses(result, sentence)
                assert [ids for ids, _ in found] == [ids for ids, _ in expected], (
                    length_penalty, seed, sentence)
                np.testing.assert_allclose([s for _, s in found], [s for _, s in expected],
                                           rtol=1e-5)
                exact = exhaustive_beam_search(step.next_log_probs, np.zeros(1), 3, alpha,
                                               max_length, length_penalty=length_penalty)
                differ += [ids for ids, _ in exact] != [ids for ids, _ in expected]
    return differ


@pytest.mark.parametrize("fixed_shapes", [False, True], ids=["growing", "fixed_shapes"])
def test_the_transformers_stopping_rule_searches_as_generate_on_random_tables(fixed_shapes):
    """stopping="transformers" gives the hypotheses of reference_search's plain copy of
    generate()'s beam search, which are not always the exact search's."""
    assert differs_from_exact(fixed_shapes, (("average", 1.0), ("average", 0.0), ("gnmt", 0.6)),
                              "transformers", transformers_beam_search) > 0


def test_the_transformers_stopping_rule_stops_on_a_guess_the_exact_one_does_not_take():
    # After BOS: EOS 0.5, or 4 (0.4) then almost surely EOS. With length^1, EOS at once
    # scores log 0.5 = -0.69; the live "4" scores log 0.4 = -0.92 at its length 1, which
    # generate()'s guess takes as its best and stops, but it ends at -0.46 at length 2.
    step = TableStep(table_favouring({(0, BOS_ID): {EOS_ID: 0.5, 4: 0.4},
                                      (1, 4): {EOS_ID: 0.999}}))
    found = {stopping: hypotheses(beams(step, [WIDTH], beam_size=1, alpha=1.0,
                                        length_penalty="average", stopping=stopping))
             for stopping in ("exact", "transformers")}
    assert found["exact"] == [((4, EOS_ID), pytest.approx(np.log(0.4 * 0.999) / 2))]
    assert found["transformers"] == [((EOS_ID,), pytest.approx(np.log(0.5)))]
    with pytest.raises(ValueError, match="stopping must be one of exact, "
                       "transformers"):
        beams(step, [WIDTH], beam_size=1, stopping="never")


def test_a_target_prefix_is_forced_scored_and_then_searched_on():
    table = random_table(7)
    step = TableStep(table)
    prefix = [[9, 11], [0, 0]]  # the second sentence has none
    result = beams(step, [WIDTH, WIDTH], beam_size=2, alpha=0.6, target_prefix=prefix)
    for sentence, row in enumerate(prefix):
        tokens = tuple(t for t in row if t)
        expected = exhaustive_beam_search(step.next_log_probs, np.zeros(1), 2, 0.6, WIDTH,
                                          prefix=tokens)
        found = hypotheses(result, sentence)
        assert all(ids[:len(tokens)] == tokens for ids, _ in found)
        assert [ids for ids, _ in found] == [ids for ids, _ in expected]
        np.testing.assert_allclose([s for _, s in found], [s for _, s in expected], rtol=1e-5)
    # A prefix as long as the limit is cut where only EOS fits.
    cut = beams(step, [3], beam_size=2, alpha=0.0, target_prefix=[[9, 11, 12, 13]])
    assert hypotheses(cut)[0][0] == (9, 11, EOS_ID)


def test_one_exact_hypothesis_stops_as_soon_as_it_is_certain():
    # EOS at once with 0.9: no live beam (at most 0.1) can beat it, so the best is known
    # after one step; the second best needs the search to go on.
    step = TableStep(table_favouring({(0, BOS_ID): {EOS_ID: 0.9}}))
    all_exact = beams(step, [WIDTH], beam_size=2, alpha=0.0)
    calls_all = step.calls
    step.calls = 0
    best_only = beams(step, [WIDTH], beam_size=2, alpha=0.0, num_hypotheses=1)
    assert step.calls == 1 < calls_all
    assert hypotheses(best_only)[0] == hypotheses(all_exact)[0] == \
        ((EOS_ID,), pytest.approx(np.log(0.9)))
    with pytest.raises(ValueError, match=r"num_hypotheses must be in \[1, beam_size=2\], got 3"):
        beams(step, [WIDTH], beam_size=2, num_hypotheses=3)


def test_greedy_search_follows_the_likeliest_token_until_eos():
    table = random_table(3, sharpness=4.0)
    step = TableStep(table)
    result = greedy_search(step.for_sentences([WIDTH, 3]),
                           DecodeConfig(alpha=0.0, max_extra_length=0))
    for sentence, max_length in enumerate((WIDTH, 3)):
        ids, token, expected = result.ids.numpy()[sentence, 0], BOS_ID, []
        for position in range(max_length):
            allowed = [t for t in range(VOCAB) if t not in (PAD_ID, BOS_ID)]
            token = (EOS_ID if position == max_length - 1 else
                     max(allowed, key=lambda t: table[position, token, t]))
            expected.append(token)
            if token == EOS_ID:
                break
        assert ids[:len(expected)].tolist() == expected and not ids[len(expected):].any()


@pytest.mark.slow
@pytest.mark.parametrize("fixed_shapes", [False, True], ids=["growing", "fixed_shapes"])
@pytest.mark.parametrize("patience", [1.0, 2.0])
def test_the_first_stopping_rule_searches_as_ctranslate2_on_random_tables(fixed_shapes,
                                                                          patience):
    """stopping="first" gives the hypotheses of reference_search's plain copy of
    CTranslate2's beam search, patience included, which are not always the exact
    search's."""
    assert differs_from_exact(fixed_shapes, (("average", 1.0), ("average", 0.0), ("gnmt", 1.4)),
                              "first", ctranslate2_beam_search, patience=patience) > 0


def test_patience_waits_for_more_finished_hypotheses():
    # After BOS: EOS 0.5 (finished at once), or 4 (0.4) then EOS 0.9. With a beam of 1 and
    # patience 1 the first finished hypothesis ends the search; with patience 2 it waits
    # for a second, the longer one, which scores higher at alpha 1.
    step = TableStep(table_favouring({(0, BOS_ID): {EOS_ID: 0.5, 4: 0.4},
                                      (1, 4): {EOS_ID: 0.9}}))
    found, calls = {}, {}
    for stopping, patience in (("first", 1.0), ("first", 2.0), ("exact", 1.0)):
        step.calls = 0
        found[stopping, patience] = hypotheses(beams(
            step, [WIDTH], beam_size=1, alpha=1.0, length_penalty="average",
            stopping=stopping, patience=patience))
        calls[stopping, patience] = step.calls
    assert found["first", 1.0] == [((EOS_ID,), pytest.approx(np.log(0.5)))]
    assert found["first", 2.0] == found["exact", 1.0] == [
        ((4, EOS_ID), pytest.approx(np.log(0.4 * 0.9) / 2))]
    # Patience 1 ends after one step, where the exact rule waits for "4" to finish.
    assert calls["first", 1.0] == 1 < calls["first", 2.0] == calls["exact", 1.0] == 2


def test_a_stopping_rule_chosen_in_the_graph_searches_as_the_rule_named():
    """A request's rule (a tf.string scalar) gives what the rule of that name gives."""
    step = TableStep(random_table(5, sharpness=1.0))
    for stopping in ("exact", "transformers", "first"):
        settings = dict(beam_size=3, alpha=1.0, length_penalty="average")
        named = beams(step, [WIDTH, 4], stopping=stopping, **settings)
        chosen = beams(step, [WIDTH, 4], stopping=tf.constant(stopping), **settings)
        for sentence in range(2):
            assert hypotheses(chosen, sentence) == hypotheses(named, sentence), stopping
