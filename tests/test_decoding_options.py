"""Decoding options as a SavedModel signature passes them (keras_transformer.decoding):
settings as scalar tensors, a forced target prefix, and sampling with temperature,
top-k, top-p and a seed."""

import numpy as np
import pytest
import tensorflow as tf

from conftest import ANY_IDS, CONFIG, copy_batch, decode, recomputed_log_probs
from reference_search import exhaustive_beam_search, next_log_probs_of
from keras_transformer import (EOS_ID, DecodeConfig, TransformerStep, beam_search,
                               greedy_search, sample_search, sequence_log_probs, sampling)

SETTINGS = [tf.TensorSpec([], tf.int32), tf.TensorSpec([], tf.float32),
            tf.TensorSpec([], tf.int32), tf.TensorSpec([], tf.int32)]
# Per source row of `copy_sources`: none, one token, a prefix the copy model would not
# choose (tokens of another source), and one longer than any output may be.
PREFIXES = [[], [7], [9, 9, 4], [5, 6], list(range(4, 16)) * 3, [12]]
# One worker runs this file (pytest-xdist --dist loadgroup): its models are trained once.
pytestmark = pytest.mark.xdist_group("decoding_options")


def padded(rows):
    width = max(map(len, rows))
    return np.array([row + [0] * (width - len(row)) for row in rows], "int32")


def decode_with_prefix(search, model, source_ids, prefix_rows, **kwargs):
    """`search` with target_prefix=padded(prefix_rows), in a tf.function with unknown
    batch and lengths (as `decode`)."""
    config = DecodeConfig(**{"stopping": "exact", **kwargs})
    function = tf.function(
        lambda ids, prefix: search(TransformerStep(model, ids, target_prefix=prefix), config),
        input_signature=ANY_IDS * 2)
    return tf.nest.map_structure(lambda t: t.numpy(), function(source_ids, padded(prefix_rows)))


def test_one_trace_takes_the_settings_as_tensors_and_gives_what_python_settings_give(
        copy_model, copy_sources):
    function = tf.function(
        lambda ids, beam, alpha, extra, n: beam_search(
            TransformerStep(copy_model, ids),
            DecodeConfig(beam_size=beam, alpha=alpha, max_extra_length=extra, stopping="exact",
                         num_hypotheses=n)),
        input_signature=ANY_IDS + SETTINGS)
    for beam, alpha, extra, n in [(1, 0.0, 50, 1), (4, 0.6, 50, 4), (3, 1.0, 2, 2)]:
        got = function(copy_sources, beam, alpha, extra, n)
        expected = decode(beam_search, copy_model, copy_sources, beam_size=beam, alpha=alpha,
                          max_extra_length=extra, num_hypotheses=n)
        np.testing.assert_array_equal(got.ids, expected.ids)
        np.testing.assert_allclose(got.scores, expected.scores, atol=1e-5)
        assert got.ids.shape[1] == beam
    assert function.experimental_get_tracing_count() == 1
    # max_extra_length 2: outputs of at most (source tokens + 2) tokens.
    lengths = function(copy_sources, 3, 1.0, 2, 2).lengths.numpy()
    assert np.all(lengths <= np.count_nonzero(copy_sources, axis=1)[:, None] + 2)


@pytest.mark.parametrize("alpha", [0.6, 0.0])
def test_a_prefix_starts_every_hypothesis_and_the_search_goes_on_as_from_teacher_forcing(
        copy_model, copy_sources, alpha):
    result = decode_with_prefix(beam_search, copy_model, copy_sources, PREFIXES, beam_size=4,
                                alpha=alpha)
    next_log_probs = next_log_probs_of(copy_model)
    for source, prefix, ids, scores, lengths in zip(copy_sources, PREFIXES, result.ids,
                                                    result.scores, result.lengths):
        max_length = min(np.count_nonzero(source) + 50, CONFIG.max_length - 1)
        expected = exhaustive_beam_search(next_log_probs, source, 4, alpha, max_length,
                                          prefix)
        # Fewer than 4 outputs exist when the prefix fills the output: empty slots follow.
        found = np.isfinite(scores)
        got = [tuple(row[:n]) for row, n in zip(ids[found], lengths[found])]
        assert got == [e[0] for e in expected]
        np.testing.assert_allclose(scores[found], [e[1] for e in expected], atol=1e-4)
        kept = prefix[:max_length - 1]  # a prefix too long for the output is cut
        assert all(list(hypothesis[:len(kept)]) == kept for hypothesis in got)
    # The prefix's own log-probabilities are part of every hypothesis' log-prob.
    found = np.isfinite(result.log_probs)
    np.testing.assert_allclose(recomputed_log_probs(copy_model, copy_sources, result)[found],
                               result.log_probs[found], atol=1e-4)
    assert result.lengths[4, 0] == CONFIG.max_length - 1  # the cut prefix, then EOS


@pytest.mark.parametrize("search", ["greedy", "sample"])
def test_greedy_and_sampled_outputs_start_with_the_prefix_and_score_it(copy_model,
                                                                       copy_sources, search):
    if search == "greedy":
        result = decode_with_prefix(greedy_search, copy_model, copy_sources, PREFIXES)
    else:
        result = decode_with_prefix(sample_search, copy_model, copy_sources, PREFIXES, seed=3,
                                    num_hypotheses=2, temperature=2.0)
    for row, rows in zip(PREFIXES, result.ids):
        kept = row[:CONFIG.max_length - 2]
        assert all(list(ids[:len(kept)]) == kept for ids in rows)
    np.testing.assert_allclose(recomputed_log_probs(copy_model, copy_sources, result),
                               result.log_probs, atol=1e-4)


def test_top_k_1_and_temperature_0_sample_the_greedy_output(copy_model, copy_sources):
    greedy = decode(greedy_search, copy_model, copy_sources)
    for seed, settings in [(0, dict(top_k=1)), (1, dict(top_k=1, temperature=5.0)),
                           (2, dict(temperature=0.0))]:
        sampled = decode(sample_search, copy_model, copy_sources, seed=seed, num_hypotheses=3,
                         **settings)
        assert sampled.ids.shape[:2] == (len(copy_sources), 3)
        for k in range(3):
            np.testing.assert_array_equal(sampled.ids[:, k], greedy.ids[:, 0])
            np.testing.assert_allclose(sampled.log_probs[:, k], greedy.log_probs[:, 0],
                                       atol=1e-5)


def test_a_seed_gives_the_same_samples_and_another_seed_others(copy_model):
    batch = copy_batch(np.random.default_rng(5), batch=8)
    first, again, other = (decode(sample_search, copy_model, batch, seed=seed, num_hypotheses=2,
                                  temperature=3.0) for seed in (11, 11, 12))
    np.testing.assert_array_equal(first.ids, again.ids)
    assert not np.array_equal(first.ids, other.ids)
    # A sentence's samples are sorted by score, and they differ from each other.
    assert np.all(np.diff(first.scores, axis=1) <= 0)
    assert not np.array_equal(first.ids[:, 0], first.ids[:, 1])


def restricted_sets(model, source_ids, result, temperature):
    """For every sampled token (EOS included): (its rank among the tokens the search
    allows at its position, the probability at `temperature` of the tokens ranked before
    it), recomputed by teacher forcing."""
    batch, samples, width = result.ids.shape
    ids = result.ids.reshape(batch * samples, width)
    inputs = np.concatenate([np.full((len(ids), 1), 2, "int32"), ids[:, :-1]], axis=1)
    log_softmax = tf.nn.log_softmax(model((np.repeat(source_ids, samples, 0), inputs)))
    logits = log_softmax.numpy() / temperature
    logits[:, :, :EOS_ID] = -np.inf
    logits[:, :, 1] = log_softmax.numpy()[:, :, 1] / temperature  # UNK is allowed
    probs = np.exp(logits - logits.max(-1, keepdims=True))
    probs /= probs.sum(-1, keepdims=True)
    ranks, before = [], []
    for row, length in zip(range(len(ids)), result.lengths.reshape(-1)):
        for t in range(length):
            chosen = logits[row, t, ids[row, t]]
            higher = logits[row, t] > chosen + 1e-4
            ranks.append(higher.sum())
            before.append(probs[row, t][higher].sum())
    return np.array(ranks), np.array(before)


def test_every_sampled_token_lies_in_the_top_k_and_top_p_sets(copy_model):
    batch = copy_batch(np.random.default_rng(6), batch=16)
    temperature = 3.0
    unrestricted = decode(sample_search, copy_model, batch, seed=7, num_hypotheses=4,
                          temperature=temperature)
    ranks, _ = restricted_sets(copy_model, batch, unrestricted, temperature)
    assert np.any(ranks >= 3), "the test needs samples outside the top 3 when unrestricted"
    top_k = decode(sample_search, copy_model, batch, seed=7, num_hypotheses=4,
                   temperature=temperature, top_k=3)
    ranks, _ = restricted_sets(copy_model, batch, top_k, temperature)
    assert np.all(ranks < 3) and np.any(ranks > 0)
    top_p = decode(sample_search, copy_model, batch, seed=7, num_hypotheses=4,
                   temperature=temperature, top_p=0.5)
    ranks, before = restricted_sets(copy_model, batch, top_p, temperature)
    # Inside the nucleus: the tokens ranked before it fall short of top_p.
    assert np.all((before < 0.5 + 1e-4) | (ranks == 0)) and np.any(ranks > 0)
    both = decode(sample_search, copy_model, batch, seed=7, num_hypotheses=4,
                  temperature=temperature, top_k=2, top_p=0.9)
    ranks, before = restricted_sets(copy_model, batch, both, temperature)
    assert np.all(ranks < 2) and np.all((before < 0.9 + 1e-4) | (ranks == 0))


def nucleus_of_a_sort(logits, top_k, top_p):
    """_nucleus's kept tokens, bool [vocab], for one float64 row by a stable numpy sort;
    None if a token's probability before it lies within 1e-5 of top_p (float32 may
    round either way there)."""
    order = np.argsort(-logits, kind="stable")
    probs = np.exp(logits[order] - logits.max())
    probs /= probs.sum()
    before = np.cumsum(probs) - probs
    if top_p < 1 and np.any(np.abs(before - top_p) < 1e-5):
        return None
    rank = np.arange(logits.size)
    kept = (rank < (top_k if top_k > 0 else logits.size)) & (
        (before < top_p) | (top_p >= 1) | (rank == 0))
    return logits >= logits[order][kept].min()


@pytest.mark.parametrize("rows", ["peaked", "peaked and flat"])
@pytest.mark.parametrize("top_k, top_p", [(0, 1.0), (10, 1.0), (100, 1.0), (0, 0.9),
                                          (3, 0.5), (100, 0.99), (0, 0.999)])
def test_nucleus_keeps_the_sets_a_full_sort_gives(rows, top_k, top_p):
    """Peaked rows: their nucleus lies in their NUCLEUS_WIDTH best tokens, all that
    _nucleus ranks of them; a flat row's does not, and it must rank all of that row's."""
    rng = np.random.default_rng(top_k)
    scales = [8, 16, 30, 100] + ([0.5, 1] if rows == "peaked and flat" else [])
    logits = rng.normal(size=(len(scales), 2000)) * np.array(scales)[:, None]
    logits[0, :4] = logits[0].max()  # ties at the top
    logits = logits.astype("float32")
    kept = np.isfinite(sampling._nucleus(tf.constant(logits), tf.constant(top_k),
                                         tf.constant(top_p)).numpy())
    compared = 0
    for row, expected in enumerate(nucleus_of_a_sort(x, top_k, top_p)
                                   for x in logits.astype("float64")):
        if expected is not None:
            np.testing.assert_array_equal(kept[row], expected, err_msg=f"row {row}")
            compared += 1
    assert compared >= len(scales) - 1
    if top_k == 0 and top_p == 1.0:
        assert kept.all(), "1 keeps every token, however small its probability"


def test_sampled_log_probs_are_the_models_at_temperature_1(copy_model, copy_sources):
    result = decode(sample_search, copy_model, copy_sources, seed=4, num_hypotheses=2,
                    temperature=2.0)
    np.testing.assert_allclose(recomputed_log_probs(copy_model, copy_sources, result),
                               result.log_probs, atol=1e-4)
    np.testing.assert_allclose(
        result.log_probs, sequence_log_probs(
            copy_model, np.repeat(copy_sources, 2, 0),
            result.ids.reshape(-1, result.ids.shape[-1])).numpy().reshape(-1, 2), atol=1e-4)


def test_a_sentences_samples_depend_on_its_seed_not_on_the_rest_of_the_batch(copy_model):
    batch = copy_batch(np.random.default_rng(8), batch=6)
    seeds = np.arange(100, 106)
    function = tf.function(
        lambda ids, seeds: sample_search(TransformerStep(copy_model, ids), DecodeConfig(
            seed=seeds, num_hypotheses=2, temperature=3.0)),
        input_signature=ANY_IDS + [tf.TensorSpec([None], tf.int64)])
    whole = function(batch, seeds)
    order = [4, 1, 5]
    part = function(batch[order], seeds[order])
    np.testing.assert_array_equal(part.ids, whole.ids.numpy()[order])
    assert function(batch[:0], seeds[:0]).ids.shape[:2] == (0, 2)


# Each sentence's own settings, as a batch of requests with different options brings them.
ROWS = [dict(beam_size=1, alpha=0.0, max_extra_length=50, min_length=0, num_hypotheses=1,
             stopping="exact", patience=1.0),
        dict(beam_size=4, alpha=0.6, max_extra_length=2, min_length=0, num_hypotheses=3,
             stopping="first", patience=1.0),
        dict(beam_size=3, alpha=1.0, max_extra_length=50, min_length=6, num_hypotheses=2,
             stopping="transformers", patience=1.0),
        dict(beam_size=5, alpha=0.6, max_extra_length=50, min_length=0, num_hypotheses=5,
             stopping="first", patience=2.0),
        dict(beam_size=2, alpha=0.2, max_extra_length=1, min_length=3, num_hypotheses=1,
             stopping="exact", patience=1.0),
        dict(beam_size=4, alpha=0.6, max_extra_length=50, min_length=0, num_hypotheses=4,
             stopping="exact", patience=1.0)]
SAMPLE_ROWS = [dict(num_hypotheses=n, temperature=t, top_k=k, top_p=p, seed=s,
                    max_extra_length=e, min_length=m)
               for n, t, k, p, s, e, m in [(1, 1.0, 0, 1.0, 3, 50, 0), (3, 2.0, 5, 1.0, 4, 50, 0),
                                           (2, 0.0, 0, 1.0, 5, 2, 0), (4, 1.5, 0, 0.6, 6, 50, 4),
                                           (1, 1.0, 3, 0.9, 7, 50, 0), (2, 0.7, 1, 1.0, 8, 1, 2)]]
DTYPES = {int: tf.int32, float: tf.float32, str: tf.string}


def per_sentence(search, model, source_ids, rows):
    """`search` with each setting a tensor [batch] of the rows' values, in one trace."""
    names = sorted(rows[0])
    specs = [tf.TensorSpec([None], tf.int64 if name == "seed" else DTYPES[type(rows[0][name])])
             for name in names]
    function = tf.function(
        lambda ids, *values: search(TransformerStep(model, ids), DecodeConfig(
            **{"stopping": "exact", **dict(zip(names, values))})),
        input_signature=ANY_IDS + specs)
    return tf.nest.map_structure(lambda t: t.numpy(), function(
        source_ids, *[[row[name] for row in rows] for name in names]))


def assert_each_sentence_as_alone(got, alone, i, n):
    """Sentence i's first n hypotheses of `got` (a batch's) are alone's (its own search)."""
    width = alone.ids.shape[2]
    np.testing.assert_array_equal(got.ids[i, :n, :width], alone.ids[0, :n])
    assert not got.ids[i, :n, width:].any()
    np.testing.assert_array_equal(got.lengths[i, :n], alone.lengths[0, :n])
    np.testing.assert_allclose(got.scores[i, :n], alone.scores[0, :n], atol=1e-5)
    np.testing.assert_allclose(got.log_probs[i, :n], alone.log_probs[0, :n], atol=1e-5)


def test_a_batch_of_per_sentence_settings_beam_searches_each_as_alone(copy_model,
                                                                      copy_sources):
    got = per_sentence(beam_search, copy_model, copy_sources, ROWS)
    assert got.ids.shape[1] == max(row["beam_size"] for row in ROWS)
    for i, row in enumerate(ROWS):
        alone = decode(beam_search, copy_model, copy_sources[i:i + 1], **row)
        assert_each_sentence_as_alone(got, alone, i, row["num_hypotheses"])
    # min_length: the rows that have one end no sooner (EOS counted, a forced one aside).
    for i, row in enumerate(ROWS):
        limit = np.count_nonzero(copy_sources[i]) + row["max_extra_length"]
        assert np.all(np.minimum(got.lengths[i, :row["num_hypotheses"]], limit) >=
                      min(row["min_length"] + 1, limit))


def test_a_batch_of_per_sentence_settings_samples_each_as_alone(copy_model, copy_sources):
    got = per_sentence(sample_search, copy_model, copy_sources, SAMPLE_ROWS)
    for i, row in enumerate(SAMPLE_ROWS):
        alone = decode(sample_search, copy_model, copy_sources[i:i + 1], **row)
        assert_each_sentence_as_alone(got, alone, i, row["num_hypotheses"])
        assert np.all(got.scores[i, row["num_hypotheses"]:] == -np.inf)


def test_min_length_keeps_eos_out_of_every_search_until_that_many_tokens(copy_model,
                                                                          copy_sources):
    for search in (greedy_search, beam_search, sample_search):
        free = decode(search, copy_model, copy_sources)
        wanted = int(free.lengths[:, 0].min()) + 3
        got = decode(search, copy_model, copy_sources, min_length=wanted)
        limits = np.count_nonzero(copy_sources, axis=1) + 50
        live = got.scores > -np.inf
        assert np.all(got.lengths[live] >= np.minimum(wanted + 1, limits[:, None].repeat(
            got.lengths.shape[1], 1)[live])), search.__name__
        assert got.lengths.min() > free.lengths.min()
