"""What each exported signature promises, on the loaded SavedModel: agreement between
signatures and with the in-process decoder, and one bounded result per input for any input
a client can send, also under concurrent calls."""

import threading

import numpy as np
import pytest
import tensorflow as tf

from keras_transformer import DecodeConfig
from trainer.serving.options import request_inputs
from conftest import sources

# Each test runs the programs in subprocesses, or uses the model they trained.
pytestmark = pytest.mark.slow

MAX_LENGTH = 128  # the tiny preset's positions: outputs have at most 127 tokens
BAD_TEXTS = [b"", b"   \t  ", b"\n", ("seventy " * 1250).encode(), b"x" * 10000,
             b"\xff\xfe\xfa invalid \xc3", "fünf – ✓ 漢字".encode()]


def options_call(signature, texts, prefixes):
    """Keyword inputs of the options signatures: the batch and scalar settings."""
    settings = {
        "translate_with_options": dict(beam_size=3, num_hypotheses=2, stopping="first"),
        "sample": dict(num_hypotheses=2, top_k=10, top_p=0.9, seed=7)}[signature]
    settings = request_inputs(signature, DecodeConfig(), **settings)
    return {"inputs": texts, "target_prefix": prefixes, **settings}


def test_nbest_is_the_beam_sorted_and_its_first_is_the_translation(loaded):
    texts = tf.constant(sources(6))
    nbest = loaded.signatures["nbest"](inputs=texts)
    best = loaded.signatures["serving_default"](inputs=texts)
    assert nbest["translations"].shape == (6, 4)
    np.testing.assert_array_equal(nbest["translations"][:, 0], best["translations"])
    np.testing.assert_allclose(nbest["scores"][:, 0], best["scores"], rtol=1e-5)
    scores = nbest["scores"].numpy()
    assert np.all(scores[:, :-1] >= scores[:, 1:])
    # A score is the log-probability over the length penalty, which is >= 1.
    assert np.all(nbest["log_probs"].numpy() <= scores + 1e-5)


def test_translate_ids_is_translate_for_clients_that_tokenize(loaded, sentencepiece):
    texts = sources(5)
    ids = [sentencepiece.encode(t) + [3] for t in texts]
    width = max(map(len, ids))
    padded = tf.constant([row + [0] * (width - len(row)) for row in ids], tf.int32)
    out = loaded.signatures["translate_ids"](source_ids=padded)
    best = loaded.signatures["serving_default"](inputs=tf.constant(texts))
    for row, length, text in zip(out["ids"].numpy(), out["lengths"].numpy(),
                                 best["translations"].numpy()):
        assert row[length - 1] == 3 and not row[length:].any() and row[:length - 1].all()
        assert sentencepiece.decode(row[:length - 1].tolist()) == text.decode()
    np.testing.assert_allclose(out["scores"], best["scores"], rtol=1e-5)


def test_score_of_a_beam_hypothesis_is_its_beam_log_probability(loaded, translator,
                                                                 sentencepiece):
    """Teacher-forced log P(target | source) equals what beam search accumulated, for the
    hypotheses whose text tokenizes back to the same pieces."""
    from keras_transformer import DecodeConfig, beam_search
    texts = sources(8)
    result = beam_search(translator.step(translator.source_ids(tf.constant(texts))),
                         DecodeConfig(beam_size=4, alpha=0.6))
    pairs, expected, lengths = [], [], []
    for i, text in enumerate(texts):
        for k in range(4):
            n = int(result.lengths[i, k])
            pieces = result.ids[i, k, :n - 1].numpy().tolist()
            target = sentencepiece.decode(pieces)
            if sentencepiece.encode(target) == pieces:
                pairs.append((text, target))
                expected.append(float(result.log_probs[i, k]))
                lengths.append(n)
    assert len(pairs) >= 8
    out = loaded.signatures["score"](inputs=tf.constant([p[0] for p in pairs]),
                                     targets=tf.constant([p[1] for p in pairs]))
    np.testing.assert_allclose(out["log_probs"], expected, rtol=1e-4, atol=1e-4)
    np.testing.assert_array_equal(out["lengths"], lengths)
    penalty = ((5.0 + np.array(lengths)) / 6.0) ** 0.6
    np.testing.assert_allclose(out["scores"], np.array(expected) / penalty, rtol=1e-4,
                               atol=1e-4)


def test_score_gives_the_empty_source_only_the_empty_translation(loaded):
    out = loaded.signatures["score"](inputs=tf.constant(["", "  ", "seven"]),
                                     targets=tf.constant(["", "sieben", ""]))
    log_probs = out["log_probs"].numpy()
    assert log_probs[0] == 0.0 and log_probs[1] == -np.inf
    assert np.isfinite(log_probs[2]) and log_probs[2] < 0


def test_score_rejects_targets_that_do_not_pair_with_the_inputs(loaded):
    with pytest.raises(tf.errors.InvalidArgumentError, match="one target per input"):
        loaded.signatures["score"](inputs=tf.constant(["seven", "eight"]),
                                   targets=tf.constant(["sieben"]))


def test_attention_rows_are_distributions_over_the_real_source_pieces(loaded):
    texts = ["seven", sources(4)[-1], ""]
    out = loaded.signatures["attention"](inputs=tf.constant(texts))
    best = loaded.signatures["serving_default"](inputs=tf.constant(texts))
    np.testing.assert_array_equal(out["translations"], best["translations"])
    src_lengths, out_lengths = out["source_lengths"].numpy(), out["output_lengths"].numpy()
    assert src_lengths[0] < src_lengths[1] and src_lengths[2] == 0 and out_lengths[2] == 0
    for i, text in enumerate(texts[:2]):
        pieces = [p.decode() for p in out["source_pieces"][i, :src_lengths[i]].numpy()]
        assert pieces[-1] == "</s>" and "".join(pieces[:-1]).replace("\u2581", " ").strip() \
            == text
        outputs = [p.decode() for p in out["output_pieces"][i, :out_lengths[i]].numpy()]
        assert outputs[-1] == "</s>"
        assert "".join(outputs[:-1]).replace("\u2581", " ").strip() \
            == best["translations"][i].numpy().decode()
        for key, queries in (("encoder_self_attention", src_lengths[i]),
                             ("encoder_decoder_attention", out_lengths[i])):
            weights = out[key][i].numpy()  # [layers, heads, queries, keys]
            valid = weights[:, :, :queries, :src_lengths[i]]
            np.testing.assert_allclose(valid.sum(-1), 1.0, rtol=1e-5)
            # Padding keys (the shorter sentence) get no attention.
            assert np.all(weights[:, :, :queries, src_lengths[i]:] < 1e-6)


def _check_texts_outputs(out, n, sentencepiece, max_pieces=MAX_LENGTH - 1):
    """A text signature's outputs `out`: one entry per input of the n, texts valid UTF-8,
    numbers never NaN, and no output over max_pieces pieces with its EOS: the lengths the
    signature returns, its pieces, and each translation's text, which holds no EOS, so one
    piece fewer (its pieces counted by encoding it again: SentencePiece's segmentation of
    the pieces searched here, which are a prefix's or the model's few)."""
    for key, value in out.items():
        assert value.shape[0] == n, key
        if value.dtype == tf.string:
            for text in value.numpy().ravel():
                text.decode("utf-8")  # valid UTF-8
        else:
            assert not np.isnan(value.numpy()).any(), key
    for key in ("lengths", "output_lengths"):
        if key in out:
            assert np.all(out[key].numpy() <= max_pieces), (key, out[key])
    if "output_pieces" in out:
        assert out["output_pieces"].shape[1] <= max_pieces
    if "translations" in out:
        pieces = [len(sentencepiece.encode(t.decode()))
                  for t in out["translations"].numpy().ravel()]
        assert max(pieces, default=0) <= max_pieces - 1, pieces


@pytest.mark.parametrize("texts", [BAD_TEXTS, []], ids=["bad_texts", "empty_batch"])
def test_text_signatures_give_one_bounded_result_per_input_for_any_text(loaded, sentencepiece,
                                                                        texts):
    inputs = tf.constant(texts, tf.string)
    n = len(texts)
    best = loaded.signatures["serving_default"](inputs=inputs)
    _check_texts_outputs(best, n, sentencepiece)
    nbest = loaded.signatures["nbest"](inputs=inputs)
    _check_texts_outputs(nbest, n, sentencepiece)
    scored = loaded.signatures["score"](inputs=inputs, targets=tf.constant(texts[::-1],
                                                                          tf.string))
    _check_texts_outputs(scored, n, sentencepiece)
    attention = loaded.signatures["attention"](inputs=inputs)
    _check_texts_outputs(attention, n, sentencepiece)
    # The bad texts as target prefixes too.
    for signature in ("translate_with_options", "sample"):
        out = loaded.signatures[signature](**options_call(signature, inputs,
                                                          tf.reverse(inputs, [0])))
        _check_texts_outputs(out, n, sentencepiece)
        assert out["translations"].shape == (n, 2)
    assert attention["source_pieces"].shape[1] <= MAX_LENGTH
    if n:
        translations = best["translations"].numpy()
        # Nothing to translate (empty, whitespace) gives "" scoring 0; the rest a translation.
        assert list(translations[:3]) == [b"", b"", b""]
        assert list(best["scores"].numpy()[:3]) == [0.0, 0.0, 0.0]
        assert all(nbest["translations"].numpy()[:3].ravel() == b"")
        assert all(attention["output_lengths"].numpy()[3:] > 0)
        # The 10,000-character inputs were truncated to the model's positions.
        assert attention["source_lengths"].numpy().max() == MAX_LENGTH


def test_translate_ids_gives_one_bounded_result_per_row_for_any_ids(loaded):
    cases = {
        "empty batch": np.zeros([0, 0], np.int32),
        "no columns": np.zeros([3, 0], np.int32),
        "all padding": np.zeros([2, 5], np.int32),
        "out of vocabulary": np.array([[-7, 10**9, 2**31 - 1, 3], [5, 6, 3, 0]], np.int32),
        "longer than the model": np.tile(np.arange(4, 300, dtype=np.int32), [2, 34]),
    }
    for name, ids in cases.items():
        out = loaded.signatures["translate_ids"](source_ids=tf.constant(ids))
        assert out["ids"].shape[0] == ids.shape[0], name
        assert out["ids"].shape[1] <= MAX_LENGTH - 1, name
        lengths = out["lengths"].numpy()
        assert np.all(lengths <= out["ids"].shape[1]), name
        assert np.isfinite(out["scores"].numpy()).all(), name
        empty = ~(ids != 0).any(axis=1) if ids.shape[1] else np.ones(ids.shape[0], bool)
        assert np.all(lengths[empty] == 0) and np.all(lengths[~empty] > 0), name


def test_eight_threads_get_what_sequential_calls_get(loaded):
    texts = sources(16) + [""]
    calls = []
    for i in range(8):
        batch = tf.constant(texts[i:i + 2 + i % 3])
        name = ("translate_with_options", "sample", "serving_default", "nbest", "score",
                "attention")[i % 6]
        if name in ("translate_with_options", "sample"):
            calls.append((name, options_call(name, batch, tf.reverse(batch, [0]))))
        elif name == "score":
            calls.append((name, {"inputs": batch, "targets": tf.reverse(batch, [0])}))
        else:
            calls.append((name, {"inputs": batch}))
    sequential = [loaded.signatures[name](**kwargs) for name, kwargs in calls]
    concurrent = [None] * len(calls)
    start = threading.Barrier(len(calls))

    def call(i):
        start.wait()
        name, kwargs = calls[i]
        concurrent[i] = loaded.signatures[name](**kwargs)

    threads = [threading.Thread(target=call, args=(i,)) for i in range(len(calls))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    for expected, got in zip(sequential, concurrent):
        assert got is not None and set(got) == set(expected)
        for key in expected:
            if expected[key].dtype == tf.string:
                np.testing.assert_array_equal(got[key], expected[key])
            else:
                np.testing.assert_allclose(got[key], expected[key], rtol=1e-5, atol=1e-6)
