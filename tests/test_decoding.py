"""Decoding (paper section 6.1): beam search with a length penalty, greedy search and
the teacher-forced log-probability of given targets."""

import dataclasses

import keras
import numpy as np
import pytest
import tensorflow as tf

from conftest import ANY_IDS, CONFIG, copy_batch, decode, recomputed_log_probs
from reference_search import exhaustive_beam_search, next_log_probs_of
from keras_transformer import (EOS_ID, DecodeConfig, Transformer, TransformerStep, beam_search,
                               greedy_search, length_penalty, sequence_log_probs)

SEARCHES = {"beam": beam_search, "greedy": greedy_search}
# One worker runs this file (pytest-xdist --dist loadgroup): its models are trained once.
pytestmark = pytest.mark.xdist_group("decoding")


def random_model(config):
    """Untrained, with embeddings scaled up so that its softmax is peaked, and a zero
    EOS embedding: EOS's logit is 0 while the best other token's is about +5, so the
    model practically never ends a sentence and its outputs run to their limit."""
    keras.utils.set_random_seed(1)
    model = Transformer(config)
    model.build()
    embeddings = model.embedding.embeddings.numpy() * 3.0
    embeddings[EOS_ID] = 0.0
    model.embedding.embeddings.assign(embeddings)
    return model


@pytest.fixture(scope="module")
def decoded(copy_model, copy_sources):
    """Results of each search with the paper's settings on `copy_sources`, decoded once."""
    return {"beam": decode(beam_search, copy_model, copy_sources, beam_size=4, alpha=0.6),
            "greedy": decode(greedy_search, copy_model, copy_sources, alpha=0.6)}


@pytest.mark.parametrize("search", SEARCHES)
def test_cached_and_uncached_decoding_agree(copy_model, copy_sources, decoded, search):
    cached = decoded[search]
    uncached = decode(SEARCHES[search], copy_model, copy_sources, use_cache=False)
    np.testing.assert_array_equal(cached.ids, uncached.ids)
    np.testing.assert_allclose(cached.scores, uncached.scores, atol=1e-4)
    np.testing.assert_allclose(cached.log_probs, uncached.log_probs, atol=1e-4)


def test_beam_size_one_without_length_penalty_is_greedy(copy_model, copy_sources):
    beam = decode(beam_search, copy_model, copy_sources, beam_size=1, alpha=0.0)
    greedy = decode(greedy_search, copy_model, copy_sources, alpha=0.0)
    np.testing.assert_array_equal(beam.ids, greedy.ids)
    np.testing.assert_allclose(beam.scores, greedy.scores, atol=1e-5)


@pytest.mark.parametrize("search", SEARCHES)
def test_scores_are_log_probs_divided_by_the_length_penalty(copy_model, copy_sources, decoded,
                                                           search):
    result = decoded[search]  # alpha = 0.6
    np.testing.assert_allclose(recomputed_log_probs(copy_model, copy_sources, result),
                               result.log_probs, atol=1e-4)
    penalty = ((5.0 + result.lengths) / 6.0) ** 0.6
    np.testing.assert_allclose(result.scores, result.log_probs / penalty, rtol=1e-5)
    np.testing.assert_allclose(length_penalty(result.lengths, 0.6), penalty, rtol=1e-6)


def test_n_best_is_sorted_and_distinct(decoded):
    result = decoded["beam"]  # beam_size = 4
    assert result.scores.shape == (6, 4) and np.all(np.isfinite(result.scores))
    assert np.all(np.diff(result.scores, axis=1) <= 0)
    for hypotheses in result.ids:
        assert len({tuple(row) for row in hypotheses}) == 4
    # The half-trained model is unsure, so its beams are not all the same length.
    assert len(np.unique(result.lengths)) > 1


@pytest.mark.parametrize("search", SEARCHES)
def test_outputs_end_at_their_first_eos_then_padding(decoded, search):
    result = decoded[search]
    for row, length in zip(result.ids.reshape(-1, result.ids.shape[-1]),
                           result.lengths.reshape(-1)):
        assert list(row[length:]) == [0] * (len(row) - length)
        assert row[length - 1] == EOS_ID
        assert not np.isin(row[:length - 1], [0, 2, EOS_ID]).any(), "PAD, BOS or EOS inside"


def test_copy_model_copies_the_source(copy_sources, decoded):
    # The best hypothesis of a model that learned to copy is mostly the source itself.
    result = decoded["beam"]
    width = copy_sources.shape[1]
    assert np.mean(np.all(result.ids[:, 0, :width] == copy_sources, axis=1)) >= 0.5


@pytest.mark.slow
@pytest.mark.parametrize("search", SEARCHES)
def test_no_output_is_longer_than_its_input_plus_50(search):
    model = random_model(dataclasses.replace(CONFIG, max_length=128))
    sources = np.array([[5, 6, 7, 8, 9, 10, 3], [5, 6, 3, 0, 0, 0, 0]], "int32")
    result = decode(SEARCHES[search], model, sources)
    limits = np.array([[7 + 50], [3 + 50]])
    assert result.ids.shape[-1] == 7 + 50
    assert np.all(result.lengths <= limits)
    # The model never chooses EOS, so the limit (per sentence) forces it.
    np.testing.assert_array_equal(result.lengths.max(axis=1), limits[:, 0])


@pytest.mark.slow
@pytest.mark.parametrize("search", SEARCHES)
def test_model_max_length_caps_the_output(search):
    model = random_model(dataclasses.replace(CONFIG, max_length=9))
    sources = np.array([[5, 6, 7, 3], [8, 3, 0, 0]], "int32")
    result = decode(SEARCHES[search], model, sources, max_extra_length=50)
    # Position 0 is BOS, so 8 of the model's 9 positions hold output.
    assert result.ids.shape[-1] == 8 and result.lengths.max() == 8
    np.testing.assert_allclose(recomputed_log_probs(model, sources, result),
                               result.log_probs, atol=1e-4)
    # A search's own limit (DecodeConfig.max_length, Transformers' max_length) below the
    # model's: every output, long source or short, ends by 5 - 1 tokens, EOS forced there.
    capped = decode(SEARCHES[search], model, sources, max_extra_length=50, max_length=5)
    assert capped.ids.shape[-1] == 4 and capped.lengths.max() == 4
    ends = capped.ids[np.arange(2), 0, capped.lengths[:, 0] - 1]
    assert np.all(ends == 3)


@pytest.mark.parametrize("alpha", [0.0, 0.6])
@pytest.mark.parametrize("beam_size", [1, 4])
def test_beam_search_is_never_worse_than_greedy(copy_model, beam_size, alpha):
    # Not a theorem for beam_size > 1 (a beam can prune the greedy prefix), but a
    # search that loses good hypotheses, or ranks them wrongly, fails it. 64 sentences:
    # how often greedy misses the best output depends on the trained copy model, which
    # differs by CPU (oneDNN kernels); the beam improved 6-11 of 64 on an AMD EPYC, where
    # on 16 it improved none.
    sources = copy_batch(np.random.default_rng(2), batch=64)
    beam = decode(beam_search, copy_model, sources, beam_size=beam_size, alpha=alpha)
    greedy = decode(greedy_search, copy_model, sources, alpha=alpha)
    assert np.all(beam.scores[:, 0] >= greedy.scores[:, 0] - 1e-5)
    if beam_size > 1:
        assert np.any(beam.scores[:, 0] > greedy.scores[:, 0] + 1e-3), "the beam never helped"


# alpha = 3 favours long outputs so strongly that a live beam's bound must use the
# penalty of the longest output, not of the current length; "average" is Hugging Face's.
@pytest.mark.parametrize("length_penalty,alpha", [("gnmt", 0.6), ("gnmt", 3.0),
                                                  ("average", 1.0)])
def test_early_exit_returns_the_n_best_of_a_search_that_never_stops_early(
        copy_model, copy_sources, length_penalty, alpha):
    result = decode(beam_search, copy_model, copy_sources, beam_size=4, alpha=alpha,
                    length_penalty=length_penalty)
    next_log_probs = next_log_probs_of(copy_model)
    for source, ids, scores, lengths in zip(copy_sources, result.ids, result.scores,
                                            result.lengths):
        max_length = min(np.count_nonzero(source) + 50, CONFIG.max_length - 1)
        expected = exhaustive_beam_search(next_log_probs, source, 4, alpha, max_length,
                                          length_penalty=length_penalty)
        assert [tuple(row[:n]) for row, n in zip(ids, lengths)] == [e[0] for e in expected]
        np.testing.assert_allclose(scores, [e[1] for e in expected], atol=1e-4)


class StepCountingTransformer(Transformer):
    """A Transformer that counts its incremental decoding steps (`steps`, a variable,
    so that the count survives tracing into a tf.while_loop)."""

    def decode_step(self, *args):
        self.steps.assign_add(1)
        return super().decode_step(*args)


def test_search_stops_once_no_live_beam_can_improve_the_n_best(copy_model, copy_sources,
                                                                decoded):
    model = StepCountingTransformer(CONFIG)
    model.build()
    model.set_weights(copy_model.get_weights())
    model.steps = tf.Variable(0)
    result = decode(beam_search, model, copy_sources)
    np.testing.assert_array_equal(result.ids, decoded["beam"].ids)
    width = result.ids.shape[-1]
    assert result.lengths.max() <= model.steps.numpy() < width


def test_one_exact_hypothesis_stops_sooner_with_the_same_best(copy_model, copy_sources,
                                                              decoded):
    model = StepCountingTransformer(CONFIG)
    model.build()
    model.set_weights(copy_model.get_weights())
    model.steps = tf.Variable(0)
    decode(beam_search, model, copy_sources)
    all_exact = model.steps.numpy()
    model.steps.assign(0)
    best_only = decode(beam_search, model, copy_sources, num_hypotheses=1)
    np.testing.assert_array_equal(best_only.ids[:, 0], decoded["beam"].ids[:, 0])
    np.testing.assert_allclose(best_only.scores[:, 0], decoded["beam"].scores[:, 0], atol=1e-5)
    assert model.steps.numpy() < all_exact  # 9 steps against 10 on these sources
    with pytest.raises(ValueError, match="num_hypotheses"):
        beam_search(TransformerStep(copy_model, copy_sources),
                    DecodeConfig(beam_size=2, num_hypotheses=3))


@pytest.mark.parametrize("search", SEARCHES)
def test_an_empty_batch_returns_empty_tensors(copy_model, search):
    result = decode(SEARCHES[search], copy_model, np.zeros((0, 5), "int32"))
    beam = 4 if search == "beam" else 1
    # Width min(5 + 50, max_length - 1): fixed by the shapes, not by the data.
    assert result.ids.shape == (0, beam, CONFIG.max_length - 1)
    assert result.scores.shape == result.log_probs.shape == result.lengths.shape == (0, beam)
    assert result.ids.dtype == np.int32 and result.scores.dtype == np.float32


@pytest.mark.parametrize("search", SEARCHES)
def test_an_all_padding_source_still_decodes(copy_model, search):
    result = decode(SEARCHES[search], copy_model, np.zeros((2, 4), "int32"))
    assert np.all(np.isfinite(result.scores)) and np.all(result.lengths >= 1)
    last = np.take_along_axis(result.ids, result.lengths[..., None] - 1, axis=-1)
    assert np.all(last == EOS_ID)


def test_sequence_log_probs_is_the_teacher_forced_log_likelihood(copy_model, copy_sources):
    targets = copy_batch(np.random.default_rng(3), batch=6)
    inputs = np.concatenate([np.full((6, 1), 2, "int32"), targets[:, :-1]], axis=1)
    log_softmax = tf.nn.log_softmax(copy_model((copy_sources, inputs), training=False)).numpy()
    expected = [sum(log_softmax[b, t, targets[b, t]] for t in range(targets.shape[1])
                    if targets[b, t] != 0) for b in range(6)]
    got = sequence_log_probs(copy_model, copy_sources, targets).numpy()
    np.testing.assert_allclose(got, expected, atol=1e-4)
    padded = sequence_log_probs(copy_model, copy_sources,
                                np.pad(targets, ((0, 0), (0, 5)))).numpy()
    np.testing.assert_allclose(padded, got, atol=1e-5)
    assert sequence_log_probs(copy_model, copy_sources[:0], targets[:0]).shape == (0,)


def test_one_trace_serves_any_batch_and_length(copy_model):
    def search(ids):
        return beam_search(TransformerStep(copy_model, ids))

    function = tf.function(search, input_signature=ANY_IDS)
    rng = np.random.default_rng(4)
    for batch, max_tokens in [(3, 5), (1, 8)]:
        sources = copy_batch(rng, batch, max_tokens)
        traced = function(sources)
        exact = tf.function(search)(sources)
        np.testing.assert_array_equal(traced.ids, exact.ids)
        np.testing.assert_allclose(traced.scores, exact.scores, atol=1e-5)
    assert function.experimental_get_tracing_count() == 1


def test_mixed_bfloat16_keeps_float32_scores(copy_model, copy_sources):
    model = Transformer(CONFIG, dtype="mixed_bfloat16")
    model.build()
    model.set_weights(copy_model.get_weights())
    result = decode(beam_search, model, copy_sources)
    assert result.scores.dtype == result.log_probs.dtype == np.float32
    assert np.all(np.isfinite(result.scores))
    # bfloat16 activations: the cached steps and teacher forcing agree only roughly.
    np.testing.assert_allclose(recomputed_log_probs(model, copy_sources, result),
                               result.log_probs, rtol=0.05, atol=0.05)


@pytest.mark.parametrize("num_hypotheses", [4, 1])
def test_fixed_shapes_compile_with_xla_and_give_the_searchs_results(copy_model, num_hypotheses):
    """fixed_shapes=True under XLA (jit_compile=True fails on any op XLA cannot compile;
    one compile per source shape) returns what the growing, shrinking search returns:
    sentences of different lengths finish at different steps, and each keeps the n-best
    it had when it finished."""
    sources = copy_batch(np.random.default_rng(5), batch=8)
    config = DecodeConfig(beam_size=4, alpha=0.6, stopping="exact",
                          num_hypotheses=num_hypotheses)
    xla = tf.function(lambda ids: beam_search(TransformerStep(copy_model, ids, fixed_shapes=True),
                                              config),
                      jit_compile=True, input_signature=ANY_IDS)
    fixed = tf.nest.map_structure(lambda t: t.numpy(), xla(sources))
    expected = decode(beam_search, copy_model, sources, num_hypotheses=num_hypotheses,
                      beam_size=4, alpha=0.6)
    assert len(set(expected.lengths[:, 0])) > 2  # sentences finish at different steps
    np.testing.assert_array_equal(fixed.ids, expected.ids)
    np.testing.assert_array_equal(fixed.lengths, expected.lengths)
    np.testing.assert_allclose(fixed.scores, expected.scores, atol=1e-5)
    np.testing.assert_allclose(fixed.log_probs, expected.log_probs, atol=1e-5)
