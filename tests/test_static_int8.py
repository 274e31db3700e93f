"""The int8_bfloat16 export's pieces (keras_transformer.quantization's StaticInt8Kernel,
Observed and static_step_weights; trainer/serving/calibration.py): a matmul whose input is
rounded by a range fixed at export, calibration's record of each matmul's largest input,
and the export options that ask for them. The export itself: test_fast_exports.py."""

import math

import numpy as np
import pytest
import tensorflow as tf

from keras_transformer import BOS_ID, DecodeConfig, Transformer, TransformerConfig
from keras_transformer import TransformerStep, beam_search
from keras_transformer.quantization import (StaticInt8Kernel, dense, map_step_kernels,
                                            observed_step_weights, relu_feed_forward,
                                            static_step_weights)
from keras_transformer.normalization import OneDnnNorm, layer_norm
from keras_transformer.packing import Packing
from trainer.serving import calibration, saved_model


def test_a_static_int8_matmul_rounds_by_its_range_and_clips_beyond_it():
    rng = np.random.default_rng(0)
    x = rng.normal(size=(6, 64)).astype("float32")
    kernel = rng.normal(size=(64, 48)).astype("float32")
    bias = rng.normal(size=48).astype("float32")
    limit = float(np.abs(x[:5]).max())  # the last row goes beyond it
    x[5] *= 3.0 * limit / np.abs(x[5]).max()
    static = StaticInt8Kernel.of(kernel, limit, bias)
    int8 = tf.function(lambda x: dense(tf.cast(x, tf.bfloat16), static))(x)
    assert int8.dtype == tf.float32  # the residual stream's, the bias fused in float32
    with pytest.raises(ValueError, match="carries its own bias"):
        dense(x, static, bias)
    expected = np.clip(x, -limit, limit) @ kernel + bias
    error = np.abs(int8.numpy() - expected).max(axis=1)
    assert (error / np.abs(expected - bias).max(axis=1)).max() < 0.03, error
    unclipped = x[5] @ kernel + bias
    assert np.abs(int8.numpy()[5] - unclipped).max() > 10 * error[5]
    # Asked for bfloat16 (attention's inputs), the matmul rounds its float32 output itself.
    rounded = tf.function(lambda x: dense(tf.cast(x, tf.bfloat16), static, dtype=tf.bfloat16))(x)
    assert rounded.dtype == tf.bfloat16
    np.testing.assert_array_equal(rounded.numpy(), tf.cast(int8, tf.bfloat16).numpy())


def test_an_int8_relu_feed_forward_is_the_float_one_to_within_its_rounding():
    rng = np.random.default_rng(1)
    x = rng.normal(size=(8, 64)).astype("float32")
    w_1, w_2 = (rng.normal(size=shape).astype("float32") / 8 for shape in ((64, 96), (96, 64)))
    b_1, b_2 = (rng.normal(size=n).astype("float32") for n in (96, 64))
    hidden = np.maximum(x @ w_1 + b_1, 0.0)
    expected = hidden @ w_2 + b_2
    inner = StaticInt8Kernel.of(w_1, np.abs(x).max(), b_1)
    outer = StaticInt8Kernel.of(w_2, hidden.max(), b_2)
    y = tf.function(lambda x: relu_feed_forward(x, inner, outer))(x).numpy()
    assert (np.abs(y - expected).max(axis=1) / np.abs(expected).max(axis=1)).max() < 0.03
    # The same as rounding the float ReLU output by the outer's range: no ReLU dropped,
    # no range mixed up (which the bound above would still let through for some rows).
    unfused = tf.function(lambda x: dense(tf.nn.relu(dense(x, inner)), outer))(x).numpy()
    assert np.abs(y - unfused).max() < 0.02 * np.abs(expected).max()


def tiny(dtype):
    model = Transformer(TransformerConfig.tiny(vocab_size=40), dtype=dtype)
    model.build()
    return model


SOURCES = tf.constant([[5, 9, 12, 2], [7, 2, 0, 0]])
SEARCH = DecodeConfig(beam_size=3, max_extra_length=5)


def test_calibration_records_each_matmuls_largest_input_and_changes_no_output():
    model = tiny("bfloat16")
    weights = model.step_weights(model.config.max_length)
    observed, largest = observed_step_weights(weights)
    assert len(largest) == 6 * model.config.num_layers + 1  # as quantize_step_weights

    @tf.function
    def search(step_weights):
        return beam_search(TransformerStep(model, SOURCES, weights=step_weights), SEARCH)

    plain, recorded = search(weights), search(observed)
    np.testing.assert_array_equal(recorded.ids.numpy(), plain.ids.numpy())
    assert all(v.numpy() > 0 for v in largest.values())
    # The first layer's first input at the first step: BOS's embedding at position 0.
    first = (tf.gather(weights["embedding"]["matrix"], [BOS_ID])
             * math.sqrt(model.config.d_model) + weights["positions"][:1])
    assert largest["layers/0/self/input"].numpy() >= np.abs(
        tf.cast(first, tf.float32).numpy()).max() * 0.99
    again = largest["projection"].numpy()
    search(observed)  # the same sentences again: the largest stays
    assert largest["projection"].numpy() == again


def test_static_step_weights_make_every_decoding_matmul_int8_with_float32_biases():
    model, float32_model = tiny("bfloat16"), tiny("float32")
    model.set_weights(float32_model.get_weights())
    length = model.config.max_length
    names = []
    map_step_kernels(model.step_weights(length),
                     lambda name, kernel, bias: names.append(name) or (kernel, bias))
    ranges = {name: 1.0 + i for i, name in enumerate(names)}
    weights = static_step_weights(model.step_weights(length),
                                  float32_model.step_weights(length), ranges)
    found = {}
    map_step_kernels(weights, lambda name, kernel, bias: found.setdefault(name, (kernel, bias)))
    assert list(found) == names
    exact = {}
    map_step_kernels(float32_model.step_weights(length),
                     lambda name, kernel, bias: exact.setdefault(name, (kernel, bias)))
    for name, (kernel, bias) in found.items():
        assert isinstance(kernel, StaticInt8Kernel) and kernel.values.dtype == tf.int8
        assert kernel.input_max.numpy() == ranges[name] == -kernel.input_min.numpy()
        assert bias is None and kernel.bias.dtype == tf.float32  # the kernel carries it
        expected = exact[name][1]
        np.testing.assert_array_equal(kernel.bias.numpy(), 0.0 if expected is None
                                      else expected.numpy())
    assert weights["embedding"]["matrix"].dtype == tf.bfloat16
    # The residual stream is float32: the int8 matmuls read and return it without casts.
    assert weights["positions"].dtype == tf.float32
    norms = [w for layer in weights["decoder"]["layers"] for name, w in layer.items()
             if name.endswith("_residual")]
    assert len(norms) == 3 * model.config.num_layers
    assert all(isinstance(w, OneDnnNorm) for w in norms)
    assert weights["decoder"]["layers"][0]["self_attention"]["input_kernel"].values.shape == (
        model.config.d_model, 3 * model.config.d_model)


def test_the_encoder_on_given_weights_is_the_models_and_its_int8_matmuls_are_calibrated():
    model, float32_model = tiny("bfloat16"), tiny("float32")
    model.set_weights(float32_model.get_weights())
    length, layers = model.config.max_length, model.config.num_layers
    packing = Packing(SOURCES, custom_gradient=False)
    # float32 weights of its own: the same encoder output and encoder-decoder keys and values
    given = float32_model.encoder_weights()
    own = float32_model.encode(SOURCES, training=False, packing=packing)
    np.testing.assert_array_equal(float32_model.encode(
        SOURCES, training=False, packing=packing, weights=given["encoder"]).numpy(), own.numpy())
    for cache, expected in zip(float32_model.initial_cache(own, 3, 0, packing, given["key_value"]),
                               float32_model.initial_cache(own, 3, 0, packing)):
        for name in ("cross_key", "cross_value"):
            np.testing.assert_array_equal(cache[name].numpy(), expected[name].numpy())

    def step_weights(model):
        return {**model.step_weights(length), "encoder": model.encoder_weights()}

    @tf.function
    def search(weights):
        return beam_search(TransformerStep(model, SOURCES, weights=weights), SEARCH)

    # A search reads the encoder's weights from its step weights: calibration sees them.
    weights = step_weights(model)
    observed, largest = observed_step_weights(weights)
    encoder = [name for name in largest if name.startswith("encoder/")]
    assert len(encoder) == 4 * layers + layers  # per layer 4, and each decoder layer's keys
    np.testing.assert_array_equal(search(observed).ids.numpy(), search(weights).ids.numpy())
    assert all(largest[name].numpy() > 0 for name in encoder)
    ranges = {name: float(v.numpy()) for name, v in largest.items()}
    static = static_step_weights(weights, step_weights(float32_model), ranges)
    kernels = {}
    map_step_kernels(static, lambda name, kernel, bias: kernels.setdefault(name, (kernel, bias)))
    assert all(isinstance(kernels[name][0], StaticInt8Kernel) for name in encoder)
    assert all(isinstance(w, OneDnnNorm) for layer in static["encoder"]["encoder"]["layers"]
               for name, w in layer.items() if name.endswith("_residual"))
    int8 = tf.function(lambda: model.encode(SOURCES, training=False, packing=Packing(
        SOURCES, custom_gradient=False), weights=static["encoder"]["encoder"]))()
    assert int8.dtype == tf.float32  # the residual stream the int8 matmuls read and return
    error = np.abs(int8.numpy() - own.numpy()).max(axis=1) / np.abs(own.numpy()).max(axis=1)
    assert error.max() < 0.05, error
    ids = search(static).ids.numpy()
    assert ids.shape[:2] == (2, SEARCH.beam_size) and (ids[:, 0, 0] > BOS_ID).all()


def test_onednns_layer_norm_is_the_plain_ops_one_and_few_rows_run_the_plain_ops():
    rng = np.random.default_rng(2)
    x = tf.constant(rng.normal(size=(300, 64)).astype("float32") * 3.0 + 1.0)
    gamma, beta = (tf.constant(rng.normal(size=64).astype("float32")) for _ in range(2))
    fused = tf.function(lambda x: layer_norm(x, OneDnnNorm(gamma, beta), 1e-6))(x)
    np.testing.assert_allclose(fused.numpy(), layer_norm(x, (gamma, beta), 1e-6).numpy(),
                               atol=2e-5)
    model = tiny("float32")
    step = TransformerStep(model, SOURCES, weights={
        **model.step_weights(model.config.max_length),
        "decoder": {"layers": [{"feed_forward_residual": OneDnnNorm(gamma, beta)}],
                    "final_norm": None}})
    step.start(rows_per_sentence=3, width=5)
    for elementwise, kind in ((True, tuple), (None, OneDnnNorm), (False, OneDnnNorm)):
        norm = step.with_elementwise(elementwise).weights["decoder"]["layers"][0][
            "feed_forward_residual"]
        assert type(norm) is kind


def test_int8_bfloat16_needs_calibration_sentences_and_only_it_takes_them(tmp_path):
    with pytest.raises(ValueError, match="needs --calibration=FILE"):
        saved_model.Options(serving_dtype="int8_bfloat16")
    with pytest.raises(ValueError, match="--calibration is for --serving_dtype=int8_bfloat16"):
        saved_model.Options(serving_dtype="bfloat16", calibration="val.en")
    with pytest.raises(ValueError, match="--xla cannot compile the int8_bfloat16 step"):
        saved_model.Options(serving_dtype="int8_bfloat16", calibration="val.en", xla=True)
    with pytest.raises(ValueError, match="cannot be read"):
        calibration.read_sentences(str(tmp_path / "missing.en"))
    (tmp_path / "blank.en").write_text("\n  \n")
    with pytest.raises(ValueError, match="holds no sentence"):
        calibration.read_sentences(str(tmp_path / "blank.en"))
    (tmp_path / "val.en").write_text("".join(f"sentence {i}\n\n" for i in range(1500)))
    sentences = calibration.read_sentences(str(tmp_path / "val.en"))
    assert sentences == [f"sentence {i}" for i in range(calibration.SENTENCES)]
