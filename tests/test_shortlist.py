"""The vocabulary shortlist (keras_transformer.shortlist): what it lists from a corpus,
a batch's candidates, and beam search over them, checked against the full vocabulary's
search on a step whose non-candidates are masked. Untrained tiny models, in seconds."""

import collections
import dataclasses
import os
import subprocess
import sys
from pathlib import Path

import keras
import numpy as np
import pytest
import tensorflow as tf

from keras_transformer import (BOS_ID, EOS_ID, PAD_ID, DecodeConfig, Transformer,
                               TransformerConfig, TransformerStep, beam_search)
from keras_transformer.quantization import (StaticInt8Kernel, quantize_step_weights,
                                            static_step_weights)
from keras_transformer.log_probs import as_log_probs
from keras_transformer.search import WrappedStep
from keras_transformer.shortlist import SPECIAL_IDS, Shortlist

VOCAB = 40
TESTS = Path(__file__).resolve().parent


def random_corpus(seed, pairs=200, source_vocab=VOCAB, target_vocab=VOCAB):
    """Aligned lists of piece ids (no special ids), Zipf-like so that counts differ."""
    rng = np.random.default_rng(seed)

    def sentence(vocab):
        return (SPECIAL_IDS + rng.zipf(1.3, size=rng.integers(1, 9)) % (vocab - SPECIAL_IDS)
                ).tolist()
    return ([sentence(source_vocab) for _ in range(pairs)],
            [sentence(target_vocab) for _ in range(pairs)])


def test_the_shortlist_holds_the_most_frequent_and_each_source_pieces_most_cooccurring():
    sources, targets = random_corpus(0)
    frequent, per_source = 5, 4
    shortlist = Shortlist.from_corpus(sources, targets, VOCAB, VOCAB, frequent, per_source)
    # Counted the plain way: pieces in target sentences, and pairs once per sentence pair.
    counts = collections.Counter(t for target in targets for t in target)
    expected_frequent = sorted(sorted(counts, key=lambda t: (-counts[t], t))[:frequent])
    assert shortlist.frequent.tolist() == expected_frequent
    pairs = collections.Counter((s, t) for source, target in zip(sources, targets)
                                for s in set(source) for t in set(target)
                                if t not in expected_frequent)
    for s in range(VOCAB):
        ranked = sorted((t for (s2, t) in pairs if s2 == s), key=lambda t: (-pairs[s, t], t))
        listed = ranked[:per_source]
        assert shortlist.by_source[s].tolist() == listed + [EOS_ID] * (per_source - len(listed))


def tiny_model(dtype="float32", output_bias=False):
    """An untrained tiny model with a peaked softmax (embeddings scaled up)."""
    keras.utils.set_random_seed(3)
    config = dataclasses.replace(TransformerConfig.tiny(vocab_size=VOCAB),
                                 output_bias=output_bias)
    model = Transformer(config, dtype=dtype)
    model.build()
    model.embedding.embeddings.assign(model.embedding.embeddings.numpy() * 3.0)
    if output_bias:
        model.embedding.bias.assign(np.random.default_rng(3).normal(size=VOCAB))
    return model


SOURCES = tf.constant([[5, 9, 12, 3, 0, 0], [7, 7, 20, 31, 8, 3], [3, 0, 0, 0, 0, 0]])


def small_shortlist():
    sources, targets = random_corpus(1)
    shortlist = Shortlist.from_corpus(sources, targets, VOCAB, VOCAB, frequent=3, per_source=2)
    return Shortlist(tf.constant(shortlist.frequent), tf.constant(shortlist.by_source), VOCAB)


def test_a_batchs_candidates_are_the_specials_the_frequent_its_sources_lists_and_prefix():
    shortlist = small_shortlist()
    prefix = tf.constant([[33, 0], [0, 0], [34, 35]])
    candidates = shortlist.candidates(SOURCES, prefix).numpy()
    expected = (set(range(SPECIAL_IDS)) | set(shortlist.frequent.numpy().tolist())
                | set(shortlist.by_source.numpy()[SOURCES.numpy().ravel()].ravel().tolist())
                | {33, 34, 35})
    assert candidates.tolist() == sorted(expected)
    assert len(candidates) < VOCAB  # a shortlist, not the vocabulary


class MaskedStep(WrappedStep):
    """The full vocabulary's step with every non-candidate at -inf and the softmax taken
    over the candidates: what a shortlist must rank, in the vocabulary's own ids."""

    def __init__(self, step, candidates):
        super().__init__(step)
        self.mask = tf.scatter_nd(candidates[:, None], tf.ones_like(candidates), [VOCAB]) > 0

    def log_probs(self, log_probs, seqs, i):
        return tf.nn.log_softmax(tf.where(self.mask, as_log_probs(log_probs), float("-inf")))


# The tests' search: beam 3, the paper's alpha, 6 tokens beyond the source's.
SEARCH = DecodeConfig(beam_size=3, alpha=0.6, max_extra_length=6)


def model_and_step_weights(weights, output_bias=False):
    """(tiny_model, the step weights a search is given: None, the model's own) computing in
    weights: "float32", "bfloat16", "int8" (quantize_step_weights) or "int8_bfloat16"
    (static_step_weights, every input range 8)."""
    model = tiny_model("bfloat16" if "bfloat16" in weights else "float32", output_bias)
    step_weights = model.step_weights(model.config.max_length)
    if weights == "int8":
        return model, quantize_step_weights(step_weights)
    if weights == "int8_bfloat16":
        ranges = collections.defaultdict(lambda: 8.0)
        return model, static_step_weights(step_weights, step_weights, ranges)
    return model, None


def float_projection(step_weights):
    """step_weights (None: the model's own) whose output projection is the embedding's rows
    in the step's dtype: what a shortlist's search multiplies an int8 export's candidates
    by (SharedEmbedding.restrict_step_weights)."""
    if step_weights is None:
        return None
    embedding = step_weights["embedding"]
    matrix = embedding["matrix"]
    projection = embedding.get("projection")
    bias = (projection.bias if isinstance(projection, StaticInt8Kernel)  # it carries it
            else embedding.get("bias"))
    bias = {} if bias is None else {"bias": tf.cast(bias, matrix.dtype)}
    return {**step_weights, "embedding": {"matrix": matrix, "output_matrix": matrix, **bias}}


@pytest.mark.slow
@pytest.mark.parametrize("weights", ["float32", "bfloat16", "int8", "int8_bfloat16"])
def test_beam_search_over_the_candidates_is_the_masked_full_search(weights):
    model, step_weights = model_and_step_weights(weights)
    shortlist = small_shortlist()
    prefix = tf.constant([[33, 0], [0, 0], [0, 0]])
    candidates = shortlist.candidates(SOURCES, prefix)

    @tf.function  # the int8 kernel runs in graphs only
    def searches():
        result = beam_search(TransformerStep(model, SOURCES, prefix, weights=step_weights,
                                             shortlist=shortlist), SEARCH)
        step = TransformerStep(model, SOURCES, prefix, weights=float_projection(step_weights))
        reference = beam_search(MaskedStep(step, candidates), SEARCH)
        return result, reference

    result, reference = searches()
    np.testing.assert_array_equal(result.ids.numpy(), reference.ids.numpy())
    np.testing.assert_allclose(result.scores.numpy(), reference.scores.numpy(), atol=1e-4)
    ids = result.ids.numpy()
    assert set(ids.ravel().tolist()) <= set(candidates.numpy().tolist())
    assert not np.isin(ids, [BOS_ID]).any()
    assert (ids[0, :, 0] == 33).all()  # the prefix, a piece of no list
    assert (ids == EOS_ID).sum(axis=-1).max() == 1  # every output ends once


def check_each_call_ranks_its_own_batchs_candidates(weights):
    """One traced search called on two batches whose candidates differ: the second call's
    results are those of a search that never saw the first (no kernel kept the first
    batch's projection rows as a constant weight)."""
    model, step_weights = model_and_step_weights(weights, output_bias=True)
    shortlist = small_shortlist()

    def search(sources):
        return beam_search(TransformerStep(model, sources, weights=step_weights,
                                           shortlist=shortlist), SEARCH)

    # Two one-piece sources with as many candidates (a kernel that keeps its weight
    # re-lays it out at a new shape) but different ones.
    found = {}
    for piece in range(SPECIAL_IDS, VOCAB):
        sources = tf.constant([[piece, EOS_ID]])
        candidates = tuple(shortlist.candidates(sources).numpy())
        same_size = [s for c, s in found.items() if len(c) == len(candidates) and c != candidates]
        if same_size:
            first, second = same_size[0], sources
            break
        found[candidates] = sources
    else:
        raise AssertionError("no two sources with as many candidates and different ones")
    fresh = tf.function(search)(second)
    reused = tf.function(search)
    reused(first)
    again = reused(second)
    np.testing.assert_array_equal(again.ids.numpy(), fresh.ids.numpy())
    np.testing.assert_allclose(again.scores.numpy(), fresh.scores.numpy(), atol=1e-6)


WEIGHTS = ["float32", "bfloat16", "int8", "int8_bfloat16"]


@pytest.mark.slow
@pytest.mark.parametrize("weights", WEIGHTS)
def test_each_call_ranks_its_own_batchs_candidates(weights):
    check_each_call_ranks_its_own_batchs_candidates(weights)


# The check above for each kind of weights named on the command line, in this directory's
# module as a fresh Python imports it.
_FROZEN = """
import os, sys
import test_shortlist
assert os.environ["TF_ONEDNN_ASSUME_FROZEN_WEIGHTS"] == "1"
for weights in sys.argv[1:]:
    test_shortlist.check_each_call_ranks_its_own_batchs_candidates(weights)
print("checked", *sys.argv[1:])
"""


@pytest.mark.slow
def test_each_call_ranks_its_own_batchs_candidates_with_frozen_weights():
    """The same, in a Python started with the serving page's
    TF_ONEDNN_ASSUME_FROZEN_WEIGHTS=1, which oneDNN reads once, before its first kernel
    (set in a running test process, it would not be in force): under it a fused
    matmul + bias keeps the first right-hand side it saw, and a shortlist's projection
    rows, a batch's own, must not go through one. One process for every kind of weights
    (TensorFlow's start-up, 6-9 s)."""
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2", "TF_ONEDNN_ASSUME_FROZEN_WEIGHTS": "1",
           "PYTHONPATH": os.pathsep.join([str(TESTS.parent), str(TESTS)])}
    result = subprocess.run([sys.executable, "-c", _FROZEN, *WEIGHTS], cwd=TESTS, env=env,
                            capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.strip().splitlines()[-1] == " ".join(["checked", *WEIGHTS])


def test_a_shortlist_of_every_piece_changes_nothing():
    model = tiny_model()
    everything = Shortlist(tf.range(SPECIAL_IDS, VOCAB),
                           tf.fill([VOCAB, 1], EOS_ID), VOCAB)
    config = DecodeConfig(beam_size=4, alpha=0.6, max_extra_length=6)
    full = beam_search(TransformerStep(model, SOURCES), config)
    listed = beam_search(TransformerStep(model, SOURCES, shortlist=everything), config)
    np.testing.assert_array_equal(listed.ids.numpy(), full.ids.numpy())
    np.testing.assert_allclose(listed.scores.numpy(), full.scores.numpy(), atol=1e-5)
    assert (full.ids.numpy() != PAD_ID).sum() > 0


def test_a_shortlist_needs_the_cached_growing_search():
    model = tiny_model()
    with pytest.raises(ValueError, match="use_cache"):
        TransformerStep(model, SOURCES, use_cache=False, shortlist=small_shortlist())
    with pytest.raises(ValueError, match="fixed_shapes"):
        TransformerStep(model, SOURCES, fixed_shapes=True, shortlist=small_shortlist())
