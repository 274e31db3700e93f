"""The decoding options a serving client sends, on the loaded SavedModel:
`translate_with_options` (beam size, length penalty, maximum length, n-best, target
prefix) and `sample` (temperature, top-k, top-p, seed)."""

import re

import numpy as np
import pytest
import tensorflow as tf

from conftest import sources
from trainer.config import TRAINED_DECODE
from trainer.serving.options import request_inputs

# Each test uses the model the session's `python -m trainer.task` trained and exported.
pytestmark = pytest.mark.slow

MAX_LENGTH = 128  # the tiny preset's positions: outputs have at most 127 tokens


def with_options(loaded, texts, prefixes=None, **options):
    """The signature's answer to scalar options, as a client of a server without batching
    sends them; the options a client leaves out are the main job's search (trainer.task's
    defaults, which its export's serving_default runs)."""
    prefixes = [""] * len(texts) if prefixes is None else prefixes
    return loaded.signatures["translate_with_options"](
        inputs=tf.constant(texts, tf.string), target_prefix=tf.constant(prefixes, tf.string),
        **request_inputs("translate_with_options", TRAINED_DECODE, **options))


def sample(loaded, texts, prefixes=None, **options):
    prefixes = [""] * len(texts) if prefixes is None else prefixes
    return loaded.signatures["sample"](
        inputs=tf.constant(texts, tf.string), target_prefix=tf.constant(prefixes, tf.string),
        **request_inputs("sample", TRAINED_DECODE, **options))


def test_the_default_options_give_serving_default_and_nbest(loaded):
    texts = sources(6) + [""]
    best = loaded.signatures["serving_default"](inputs=tf.constant(texts))
    got = with_options(loaded, texts)
    assert got["translations"].shape == (7, 1)
    np.testing.assert_array_equal(got["translations"][:, 0], best["translations"])
    np.testing.assert_allclose(got["scores"][:, 0], best["scores"], rtol=1e-5)
    nbest = loaded.signatures["nbest"](inputs=tf.constant(texts))
    got = with_options(loaded, texts, num_hypotheses=4)
    for key in ("translations", "scores", "log_probs"):
        assert got[key].shape == (7, 4)
    np.testing.assert_array_equal(got["translations"], nbest["translations"])
    np.testing.assert_allclose(got["log_probs"], nbest["log_probs"], rtol=1e-5, atol=1e-5)


def test_each_option_changes_what_it_should(loaded, translator):
    from keras_transformer import DecodeConfig, greedy_search
    texts = sources(8)
    greedy = greedy_search(translator.step(translator.source_ids(tf.constant(texts))),
                           DecodeConfig(alpha=0.0))
    # A beam of 1 follows greedy search's path, and returns the most probable of the
    # translations ended on it: greedy's own, or one of its prefixes ended by EOS.
    beam_1 = with_options(loaded, texts, beam_size=1, alpha=0.0)
    assert np.all(beam_1["log_probs"][:, 0] >= greedy.log_probs[:, 0] - 1e-4)
    greedy_texts = translator.target_tokenizer.detokenize(greedy.ids[:, 0]).numpy()
    for beam, path in zip(beam_1["translations"][:, 0].numpy(), greedy_texts):
        assert path.split()[:len(beam.split())] == beam.split(), (beam, path)
    # A larger beam: as many hypotheses as asked, sorted, never a worse best than the
    # export's beam of 4.
    beam_4 = with_options(loaded, texts)
    beam_8 = with_options(loaded, texts, beam_size=8, num_hypotheses=8)
    assert beam_8["translations"].shape == (8, 8)
    scores = beam_8["scores"].numpy()
    assert np.all(scores[:, :-1] >= scores[:, 1:])
    assert np.all(scores[:, 0] >= beam_4["scores"].numpy()[:, 0] - 1e-5)
    # Scores differ with alpha; log-probs of the same translations do not.
    plain = with_options(loaded, texts, alpha=0.0)
    np.testing.assert_allclose(plain["scores"], plain["log_probs"], rtol=1e-6)
    # CTranslate2's stopping rule (a request's option) finishes hypotheses only from the
    # beam_size best candidates and stops once beam_size have: its n-best is the exact
    # rule's or below it, and on these inputs below (each 4th, by 0.85 nats).
    exact, first = (with_options(loaded, texts, stopping=rule, num_hypotheses=4)["scores"]
                    .numpy() for rule in ("exact", "first"))
    assert np.all(first <= exact + 1e-5)
    assert np.any(first < exact - 0.1), (first, exact)
    # Its patience: a sentence waits for patience x beam_size finished hypotheses (rounded,
    # and a step may finish several), so 0.25 (1) returns fewer than the 4 asked and 0.5
    # (2) at least 2; waiting longer (2: 8) never gives a worse n-best.
    patient = {patience: with_options(loaded, texts, stopping="first", num_hypotheses=4,
                                      patience=patience)["scores"].numpy()
               for patience in (0.25, 0.5, 1.0, 2.0)}
    finished = {patience: np.isfinite(scores).sum(1) for patience, scores in patient.items()}
    assert np.all((1 <= finished[0.25]) & (finished[0.25] < 4)), finished
    assert np.all(finished[0.5] >= 2), finished
    assert np.all(finished[1.0] == 4), finished
    np.testing.assert_allclose(patient[1.0], first, rtol=1e-6)  # the default patience
    assert np.all(patient[2.0] >= patient[1.0] - 1e-5)
    # A non-zero alpha divides a hypothesis' log-prob by the paper's penalty,
    # ((5 + |Y|) / 6)^alpha (section 6.1), |Y| its tokens with EOS: the |Y| each score
    # implies is a whole number, 1 for the empty translation (EOS alone), and the same
    # at every alpha for the same translation, whose log-prob alpha does not change.
    implied = {}
    for alpha in (0.6, 1.0):
        got = with_options(loaded, texts, alpha=alpha, num_hypotheses=4)
        lengths = 6.0 * (got["log_probs"].numpy() / got["scores"].numpy()) ** (1 / alpha) - 5
        np.testing.assert_allclose(lengths, np.round(lengths), atol=1e-2)
        for i, (row, log_probs, length) in enumerate(zip(
                got["translations"].numpy(), got["log_probs"].numpy(), np.round(lengths))):
            for translation, log_prob, n in zip(row, log_probs, length):
                implied.setdefault((i, translation), []).append((n, log_prob))
    assert all(n == 1 for i in range(len(texts)) for n, _ in implied[i, b""]), implied
    for translation, seen in implied.items():
        lengths, log_probs = np.array(seen).T
        assert np.all(lengths == lengths[0]), (translation, seen)
        np.testing.assert_allclose(log_probs, log_probs[0], atol=1e-4,
                                   err_msg=str(translation))
    # ... so that a large alpha ranks first a longer, less probable translation than
    # alpha 0's best (here "", which scores its log-prob at any alpha), once the search
    # looks on for it (the exact rule; Hugging Face's stops at "" here).
    long = with_options(loaded, texts, alpha=2.0, stopping="exact")
    assert np.all(long["scores"][:, 0] > plain["scores"][:, 0])
    assert np.all(long["log_probs"][:, 0] < plain["log_probs"][:, 0])
    # max_extra_length 0: no output longer than its source (pieces + EOS).
    short = with_options(loaded, ["seventy seven thousand three hundred"], max_extra_length=0,
                         beam_size=2)
    pieces = translator.source_ids(tf.constant(["seventy seven thousand three hundred"]))
    length = translator.target_ids(short["translations"][:, 0]).shape[1]
    assert length <= int(tf.math.count_nonzero(pieces))


@pytest.mark.parametrize("signature,option,value,message", [
    ("translate_with_options", "beam_size", 0, r"beam_size must be in \[1, 8\], got 0"),
    ("translate_with_options", "beam_size", 9, r"beam_size must be in \[1, 8\], got 9"),
    ("translate_with_options", "num_hypotheses", 5,
     r"num_hypotheses must be in \[1, beam_size=4\], got 5"),
    ("translate_with_options", "alpha", float("nan"), r"alpha must be in \[0.0, inf\)"),
    ("translate_with_options", "max_extra_length", -1, r"max_extra_length must be in \[0"),
    ("translate_with_options", "patience", 0.0, r"patience must be in \(0.0, inf\), got 0"),
    ("translate_with_options", "stopping", "never",
     r"stopping must be one of exact, transformers, first, got never"),
    ("sample", "num_hypotheses", 100, r"num_hypotheses must be in \[1, 8\], got 100"),
    ("sample", "temperature", -1.0, r"temperature must be in \[0.0, inf\), got -1"),
    ("sample", "top_k", -3, r"top_k must be in \[0, inf\), got -3"),
    ("sample", "top_p", 0.0, r"top_p must be in \(0.0, 1\], got 0"),
    ("sample", "top_p", 1.5, r"top_p must be in \(0.0, 1\], got 1.5"),
])
def test_an_option_out_of_range_is_its_rows_error_naming_it(loaded, signature, option,
                                                            value, message):
    call = with_options if signature == "translate_with_options" else sample
    got = call(loaded, ["seven", "eight"], **{option: value})  # a scalar: every row's
    for error in got["error"].numpy():
        assert re.match(message, error.decode()), error
    assert np.all(got["translations"].numpy() == b"")
    assert np.all(got["scores"].numpy() == -np.inf)


def test_a_prefix_for_each_input_or_an_invalid_argument(loaded):
    with pytest.raises(tf.errors.InvalidArgumentError, match="one entry per input"):
        with_options(loaded, ["seven", "eight"], prefixes=[""])


def test_a_prefix_starts_the_translation_and_its_log_prob_counts(loaded, translator,
                                                                 sentencepiece):
    texts = sources(6)
    free = with_options(loaded, texts)["translations"][:, 0].numpy()
    # Another input's translation as a prefix: not what the model would choose.
    prefixes = [""] + [t.decode().split(" ")[0] + " " + t.decode().split(" ")[-1]
                       for t in free[::-1][:5]]
    got = with_options(loaded, texts, prefixes=prefixes, num_hypotheses=2)
    for prefix, row in zip(prefixes, got["translations"].numpy()):
        for translation in row:
            pieces = sentencepiece.encode(translation.decode())
            assert pieces[:len(sentencepiece.encode(prefix))] == sentencepiece.encode(prefix)
    assert got["translations"][0, 0] == free[0]  # "" is no prefix
    # log_probs include the forced pieces: the teacher-forced score of the whole output.
    best = [t.decode() for t in got["translations"][:, 0].numpy()]
    scored = loaded.signatures["score"](inputs=tf.constant(texts), targets=tf.constant(best))
    round_trip = [sentencepiece.decode(sentencepiece.encode(t)) == t for t in best]
    np.testing.assert_allclose(scored["log_probs"].numpy()[round_trip],
                               got["log_probs"][:, 0].numpy()[round_trip], rtol=1e-4,
                               atol=1e-4)
    # A prefix longer than the output may be is cut where only EOS fits, not an error:
    # outputs have at most (source pieces + EOS + max_extra_length) tokens with EOS.
    for extra in (50, 500):
        long = with_options(loaded, ["seven"], prefixes=["neun " * 400],
                            max_extra_length=extra)
        pieces = sentencepiece.encode(long["translations"][0, 0].numpy().decode())
        source = int(tf.math.count_nonzero(translator.source_ids(tf.constant(["seven"]))))
        assert len(pieces) == min(source + extra, MAX_LENGTH - 1) - 1
        assert pieces == sentencepiece.encode("neun " * 400)[:len(pieces)]


def test_top_k_1_samples_the_greedy_translation(loaded, translator):
    from keras_transformer import greedy_search
    texts = sources(6)
    greedy = greedy_search(translator.step(translator.source_ids(tf.constant(texts))))
    expected = translator.target_tokenizer.detokenize(greedy.ids[:, 0]).numpy()
    for seed in (0, 1):
        sampled = sample(loaded, texts, num_hypotheses=2, top_k=1, seed=seed,
                         temperature=2.0)
        for k in range(2):
            np.testing.assert_array_equal(sampled["translations"][:, k], expected)


def test_a_seed_gives_the_same_samples_and_another_seed_others(loaded):
    texts = sources(8)
    first, again, other = (sample(loaded, texts, num_hypotheses=3, temperature=1.5, seed=s)
                           for s in (5, 5, 6))
    np.testing.assert_array_equal(first["translations"], again["translations"])
    np.testing.assert_array_equal(first["log_probs"], again["log_probs"])
    assert not np.array_equal(first["translations"], other["translations"])
    scores = first["scores"].numpy()
    assert np.all(scores[:, :-1] >= scores[:, 1:])
    # Samples of one input differ, and are not all the beam's best.
    assert len(set(first["translations"].numpy().ravel())) > len(texts)
    # An input's samples do not depend on the others in its batch (server-side batching).
    part = sample(loaded, texts[5:1:-1], num_hypotheses=3, temperature=1.5, seed=5)
    np.testing.assert_array_equal(part["translations"], first["translations"][5:1:-1])


@pytest.mark.parametrize("signature", ["translate_with_options", "sample"])
def test_min_length_keeps_eos_out_until_the_output_has_that_many_pieces(
        loaded, sentencepiece, signature):
    texts = sources(6)
    call = with_options if signature == "translate_with_options" else sample
    free = call(loaded, texts, num_hypotheses=2)
    shortest = min(len(sentencepiece.encode(t.decode()))
                   for t in free["translations"].numpy().ravel())
    wanted = shortest + 4
    got = call(loaded, texts, num_hypotheses=2, min_length=wanted)
    assert np.all(got["error"].numpy() == b"")
    for translation in got["translations"].numpy().ravel():
        assert len(sentencepiece.encode(translation.decode())) >= wanted - 1, translation
    # The maximum length still ends an output: max_extra_length 0 allows source + 1.
    capped = call(loaded, ["seven"], min_length=100, max_extra_length=0)
    assert capped["error"].numpy()[0] == b""
