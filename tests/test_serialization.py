"""get_config / from_config and .keras save/load round trips."""

import keras
import numpy as np
import pytest
import tensorflow as tf

import keras_transformer as kt


def batch():
    rng = np.random.default_rng(0)
    source = rng.integers(1, 40, size=(2, 5)).astype("int32")
    target = rng.integers(1, 40, size=(2, 4)).astype("int32")
    source[0, 3:] = 0
    return source, target


@pytest.mark.parametrize("layer", [
    kt.MultiHeadAttention(num_heads=2, d_model=8, key_dim=3, value_dim=5, dropout=0.1),
    kt.PositionwiseFeedForward(d_model=8, d_ff=16),
    kt.PositionalEncoding(d_model=8, max_length=10, kind="learned"),
    kt.SharedEmbedding(vocab_size=12, d_model=8),
    kt.Residual(dropout=0.2, pre_norm=True),
    kt.EncoderLayer(d_model=8, num_heads=2, d_ff=16, pre_norm=True),
    kt.DecoderLayer(d_model=8, num_heads=2, d_ff=16, dropout=0.3),
    kt.Encoder(num_layers=2, d_model=8, num_heads=2, d_ff=16),
    kt.Decoder(num_layers=2, d_model=8, num_heads=2, d_ff=16),
], ids=lambda layer: type(layer).__name__)
def test_every_layer_round_trips_through_its_config(layer):
    config = layer.get_config()
    rebuilt = type(layer).from_config(config)
    assert rebuilt.get_config() == config
    # The registered name lets Keras deserialize it with no custom_objects.
    clone = keras.saving.deserialize_keras_object(keras.saving.serialize_keras_object(layer))
    assert type(clone) is type(layer) and clone.get_config() == config


def test_model_from_config_rebuilds_the_same_architecture():
    model = kt.Transformer(kt.TransformerConfig.tiny(vocab_size=40, pre_norm=True))
    model.build()
    clone = kt.Transformer.from_config(model.get_config())
    clone.build()
    assert clone.config == model.config
    assert [w.shape for w in clone.weights] == [w.shape for w in model.weights]
    clone.set_weights(model.get_weights())
    source, target = batch()
    np.testing.assert_allclose(clone((source, target)), model((source, target)), atol=1e-6)


@pytest.mark.parametrize("config", [
    kt.TransformerConfig.tiny(vocab_size=40),
    kt.TransformerConfig.tiny(vocab_size=40, positional="learned", share_embeddings=False,
                              source_vocab_size=45),
], ids=["shared", "separate-learned"])
@pytest.mark.slow
def test_keras_file_round_trip_gives_identical_outputs(tmp_path, config):
    model = kt.Transformer(config)
    source, target = batch()
    expected = model((source, target), training=False).numpy()
    path = tmp_path / "model.keras"
    model.save(path)
    loaded = keras.saving.load_model(path)
    assert isinstance(loaded, kt.Transformer) and loaded.config == config
    np.testing.assert_array_equal(loaded((source, target), training=False).numpy(), expected)


def test_tf_checkpoint_round_trip_restores_every_weight(tmp_path):
    """The trainer checkpoints with tf.train.Checkpoint: every variable must be tracked
    (Keras 3 lists of layers are not, which once silently dropped the encoder)."""
    config = kt.TransformerConfig.tiny(vocab_size=40)
    model = kt.Transformer(config)
    model.build()
    path = tf.train.Checkpoint(model=model).save(str(tmp_path / "ckpt"))
    saved = [name for name, _ in tf.train.list_variables(path) if name.startswith("model/")]
    assert len(saved) == len(model.weights)
    restored = kt.Transformer(config)
    restored.build()
    tf.train.Checkpoint(model=restored).restore(path).assert_existing_objects_matched()
    source, target = batch()
    np.testing.assert_array_equal(restored((source, target)), model((source, target)))
