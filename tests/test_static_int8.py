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
                                            observed_step_weights, static_step_weights)
from trainer.serving import calibration, saved_model


def test_a_static_int8_matmul_rounds_by_its_range_and_clips_beyond_it():
    rng = np.random.default_rng(0)
    x = rng.normal(size=(6, 64)).astype("float32")
    kernel = rng.normal(size=(64, 48)).astype("float32")
    bias = rng.normal(size=48).astype("float32")
    limit = float(np.abs(x[:5]).max())  # the last row goes beyond it
    x[5] *= 3.0 * limit / np.abs(x[5]).max()
    static = StaticInt8Kernel.of(kernel, limit)
    int8 = tf.function(lambda x: dense(tf.cast(x, tf.bfloat16), static, bias))(x)
    assert int8.dtype == tf.bfloat16  # the step's dtype, the bias fused in float32
    expected = np.clip(x, -limit, limit) @ kernel + bias
    error = np.abs(int8.numpy().astype("float32") - expected).max(axis=1)
    assert (error / np.abs(expected - bias).max(axis=1)).max() < 0.03, error
    unclipped = x[5] @ kernel + bias
    assert np.abs(int8.numpy()[5].astype("float32") - unclipped).max() > 10 * error[5]


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
    for name, (kernel, bias) in found.items():
        assert isinstance(kernel, StaticInt8Kernel) and kernel.values.dtype == tf.int8
        assert kernel.input_range.numpy() == ranges[name]
        assert bias is None or bias.dtype == tf.float32
    assert weights["embedding"]["matrix"].dtype == tf.bfloat16
    assert weights["decoder"]["layers"][0]["self_attention"]["input_kernel"].values.shape == (
        model.config.d_model, 3 * model.config.d_model)


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
