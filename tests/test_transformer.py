"""Properties of the full model that the paper's architecture guarantees."""

import dataclasses

import keras
import numpy as np
import pytest
import tensorflow as tf

from keras_transformer import Transformer, TransformerConfig

CONFIG = TransformerConfig.tiny(vocab_size=50, dropout=0.1)


def random_batch(rng, batch=3, src_len=7, tgt_len=6, vocab=50):
    source = rng.integers(4, vocab, size=(batch, src_len)).astype("int32")
    target = rng.integers(4, vocab, size=(batch, tgt_len)).astype("int32")
    source[1, 4:] = 0  # a padded sentence
    return source, target


@pytest.fixture(scope="module")
def model():
    keras.utils.set_random_seed(0)
    m = Transformer(CONFIG)
    m.build()
    return m


def test_logits_are_float32_with_vocabulary_width(model):
    source, target = random_batch(np.random.default_rng(0))
    logits = model((source, target), training=False)
    assert logits.shape == (3, 6, 50) and logits.dtype == "float32"


def test_future_target_tokens_do_not_change_earlier_logits(model):
    rng = np.random.default_rng(1)
    source, target = random_batch(rng)
    before = model((source, target), training=False).numpy()
    for t in range(target.shape[1] - 1):
        changed = target.copy()
        changed[:, t + 1:] = rng.integers(4, 50, size=changed[:, t + 1:].shape)
        after = model((source, changed), training=False).numpy()
        np.testing.assert_allclose(after[:, :t + 1], before[:, :t + 1], atol=1e-5)
        assert not np.allclose(after[:, t + 1:], before[:, t + 1:]), "later logits must change"


def test_extra_source_padding_leaves_logits_unchanged(model):
    source, target = random_batch(np.random.default_rng(2))
    padded = np.pad(source, ((0, 0), (0, 9)))
    np.testing.assert_allclose(model((padded, target), training=False),
                               model((source, target), training=False), atol=1e-5)


def test_source_tokens_change_the_logits(model):
    source, target = random_batch(np.random.default_rng(3))
    other = source.copy()
    other[0, 0] = 4 if other[0, 0] != 4 else 5
    a = model((source, target), training=False).numpy()
    b = model((other, target), training=False).numpy()
    assert not np.allclose(a[0], b[0]) and np.allclose(a[2], b[2], atol=1e-6)


def test_embeddings_are_shared_with_the_pre_softmax_projection(model):
    assert model.source_embedding is None
    hidden = np.random.default_rng(4).normal(size=(1, 1, 64)).astype("float32")
    np.testing.assert_allclose(model.embedding.logits(hidden)[0, 0],
                               hidden[0, 0] @ model.embedding.embeddings.numpy().T, rtol=1e-5,
                               atol=1e-5)
    one = model.embedding(np.array([[7]]))[0, 0]
    np.testing.assert_allclose(one, model.embedding.embeddings.numpy()[7] * np.sqrt(64),
                               rtol=1e-6)


@pytest.mark.parametrize("policy", ["float32", "mixed_bfloat16"])
def test_the_decoding_steps_projection_gives_the_models_logits(model, policy):
    """SharedEmbedding.step_logits, traced as the exported search traces it (in bfloat16
    the zero bias that makes it a fused matmul), against `logits`."""
    embedding = Transformer(CONFIG, dtype=policy).embedding
    embedding.build()
    embedding.set_weights(model.embedding.get_weights())
    hidden = keras.ops.cast(np.random.default_rng(8).normal(size=(5, 64)), embedding.compute_dtype)
    step = tf.function(lambda x: embedding.step_logits(x, embedding.step_weights()))(hidden)
    assert step.dtype == "float32"
    np.testing.assert_allclose(step, embedding.logits(hidden[None])[0],
                               rtol=1e-5 if policy == "float32" else 1e-2, atol=1e-5)


def test_dropout_is_active_only_in_training(model):
    source, target = random_batch(np.random.default_rng(5))
    a = model((source, target), training=True).numpy()
    b = model((source, target), training=True).numpy()
    c = model((source, target), training=False).numpy()
    assert not np.allclose(a, b)
    np.testing.assert_allclose(c, model((source, target), training=False), atol=1e-6)


@pytest.mark.parametrize("policy", ["mixed_bfloat16", "mixed_float16"])
def test_mixed_precision_forward_is_finite_with_float32_logits(policy):
    m = Transformer(CONFIG, dtype=policy)
    source, target = random_batch(np.random.default_rng(6))
    logits = m((source, target), training=True)
    assert logits.dtype == "float32" and np.all(np.isfinite(logits.numpy()))
    assert m.embedding.embeddings.dtype == "float32", "variables stay float32"
    assert m.encoder.layers[0].self_attention.query_dense.compute_dtype == policy.split("_")[1]


@pytest.mark.parametrize("overrides", [
    dict(pre_norm=True), dict(positional="learned"),
    dict(share_embeddings=False, source_vocab_size=70),
])
def test_variants_run_and_keep_causality(overrides):
    config = dataclasses.replace(CONFIG, **overrides)
    m = Transformer(config)
    rng = np.random.default_rng(7)
    source, target = random_batch(rng, vocab=50)
    if config.source_vocab_size:
        source[0, 0] = 69  # an id only the separate source vocabulary has
    a = m((source, target), training=False).numpy()
    changed = target.copy()
    changed[:, 3:] = 4
    np.testing.assert_allclose(m((source, changed), training=False)[:, :3], a[:, :3], atol=1e-5)
    if config.pre_norm:
        assert m.encoder.final_norm is not None and m.decoder.final_norm is not None


def test_config_validation_and_presets():
    with pytest.raises(ValueError, match="unknown preset"):
        TransformerConfig.preset("huge", vocab_size=10)
    with pytest.raises(ValueError, match="positional"):
        TransformerConfig(positional="rotary")
    with pytest.raises(ValueError, match="share_embeddings"):
        TransformerConfig(source_vocab_size=10, vocab_size=20)
    base, big = TransformerConfig.base(), TransformerConfig.big()
    assert (base.num_layers, base.d_model, base.d_ff, base.num_heads, base.d_k, base.dropout,
            base.label_smoothing) == (6, 512, 2048, 8, 64, 0.1, 0.1)
    assert (big.num_layers, big.d_model, big.d_ff, big.num_heads, big.d_k, big.dropout) == (
        6, 1024, 4096, 16, 64, 0.3)
    assert TransformerConfig.preset("small", vocab_size=123).vocab_size == 123
    assert TransformerConfig.big(dropout=0.1).dropout == 0.1  # big for en-fr (section 6.1)


@pytest.mark.slow
@pytest.mark.parametrize("encoder_layers,decoder_layers", [(3, 1), (2, 3)])
def test_encoder_and_decoder_depths_apart(encoder_layers, decoder_layers):
    """num_encoder_layers and num_decoder_layers build stacks of their own depths, and the
    cached search (its cache and step weights per decoder layer) decodes what teacher
    forcing does; num_layers alone sets both, so older configs read back unchanged."""
    from keras_transformer import DecodeConfig, TransformerStep, beam_search
    config = dataclasses.replace(CONFIG, num_encoder_layers=encoder_layers,
                                 num_decoder_layers=decoder_layers)
    m = Transformer(config)
    m.build()
    assert (len(m.encoder.layers), len(m.decoder.layers)) == (encoder_layers, decoder_layers)
    assert config.depth == f"{encoder_layers}+{decoder_layers}"
    source = tf.constant(random_batch(np.random.default_rng(8), vocab=50)[0])
    cached, uncached = (beam_search(TransformerStep(m, source, use_cache=use),
                                    DecodeConfig(beam_size=3, max_extra_length=5))
                        for use in (True, False))
    np.testing.assert_array_equal(cached.ids, uncached.ids)
    np.testing.assert_allclose(cached.scores, uncached.scores, atol=1e-4)
    old = {k: v for k, v in CONFIG.to_dict().items()
           if k not in ("num_encoder_layers", "num_decoder_layers")}
    same = TransformerConfig.from_dict(old)
    assert same == CONFIG and (same.encoder_layers, same.decoder_layers) == (
        CONFIG.num_layers, CONFIG.num_layers)
    assert TransformerConfig.from_dict(config.to_dict()) == config
