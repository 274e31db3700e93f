"""`trainer.export --serving_dtype=int8`: the decoding step's matmuls on int8 weights and
inputs (keras_transformer.quantization) translate as the float32 export does, in a Python
that has only tensorflow and tensorflow_text, and answer bad requests as it does."""

import json
import os
import sys

import numpy as np
import pytest
import tensorflow as tf

from conftest import REPO, _env, run
from keras_transformer import Transformer, TransformerConfig
from keras_transformer.quantization import dense, quantize_kernel, quantize_step_weights
from trainer.data import builtin_corpus

# One worker runs this file beside test_quick_start and test_ctranslate2 (pytest-xdist
# --dist loadgroup): the README's main job, whose model translates the builtin corpus, is
# trained once for them.
pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("main_job")]


def test_an_int8_matmul_is_the_float_one_to_within_its_rounding():
    rng = np.random.default_rng(0)
    x = rng.normal(size=(6, 64)).astype("float32")
    x[2] *= 100.0  # rows of very different ranges each keep their own scale
    kernel = rng.normal(size=(64, 48)).astype("float32")
    bias = rng.normal(size=48).astype("float32")
    exact = x @ kernel + bias
    int8 = tf.function(lambda x: dense(x, quantize_kernel(kernel), bias))(x).numpy()
    error = np.abs(int8 - exact).max(axis=1) / np.abs(x @ kernel).max(axis=1)
    assert error.max() < 0.02, error  # each row within 2% of its own range
    assert not np.array_equal(int8, exact)  # it is int8, not the float path


def test_every_decoding_matmul_is_int8_and_nothing_else_is():
    model = Transformer(TransformerConfig.tiny(vocab_size=40))
    model.build()
    weights = quantize_step_weights(model.step_weights(8))
    int8 = [path for path, leaf in _leaves(weights) if leaf.dtype == tf.int8]
    layers = model.config.num_layers
    # Per layer: fused QKV, self-attention W^O, cross-attention query and W^O, FFN W_1 and
    # W_2; and the output projection.
    assert len(int8) == 6 * layers + 1, int8
    assert ("embedding", "projection", "values") in int8
    # The embedding rows, positions, biases and layer norms stay float32.
    assert all(leaf.dtype in (tf.float32, tf.int8) for _, leaf in _leaves(weights))
    assert weights["embedding"]["matrix"].dtype == tf.float32


def _leaves(weights, path=()):
    """(path, tensor) of every tensor in nested step weights."""
    if isinstance(weights, dict):
        for key, value in weights.items():
            yield from _leaves(value, path + (key,))
    elif isinstance(weights, tuple) and hasattr(weights, "_fields"):
        for key, value in zip(weights._fields, weights):
            yield from _leaves(value, path + (key,))
    elif isinstance(weights, (list, tuple)):
        for i, value in enumerate(weights):
            yield from _leaves(value, path + (i,))
    elif tf.is_tensor(weights):
        yield path, weights


@pytest.fixture(scope="module")
def exports(main_job, tmp_path_factory):
    """{"float32": the main job's SavedModel version, "int8": its int8 export by the
    real CLI}."""
    model_dir = main_job.directory / "runs" / "tiny_builtin"
    export_dir = tmp_path_factory.mktemp("int8") / "export"
    result = run([sys.executable, "-m", "trainer.export", f"--model_dir={model_dir}",
                  "--serving_dtype=int8", f"--export_dir={export_dir}"], cwd=REPO, env=_env())
    assert f"exported SavedModel to {export_dir / '1'}" in result.stdout.decode()
    return {"float32": main_job.directory / "saved_models" / "tiny_builtin" / "1",
            "int8": export_dir / "1"}


# Translates stdin's JSON list of texts with a SavedModel, printing the translations.
_CONSUMER = r"""
import json, sys
import tensorflow as tf
import tensorflow_text  # registers the SentencePiece ops
texts = json.loads(sys.stdin.read())
translate = tf.saved_model.load(sys.argv[1]).signatures["serving_default"]
out = []
for i in range(0, len(texts), 100):
    out += [t.decode() for t in translate(inputs=tf.constant(texts[i:i + 100]))["translations"].numpy()]
print(json.dumps(out))
"""


def test_the_int8_export_translates_the_validation_set_as_float32_in_a_fresh_python(
        exports, tmp_path):
    english, german = builtin_corpus.splits()["validation"]  # the main job's held-out 1,000
    script = tmp_path / "consumer.py"
    script.write_text(_CONSUMER)
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}  # no project here
    env["TF_CPP_MIN_LOG_LEVEL"] = "2"
    exact = {}
    for name, version in exports.items():
        result = run([sys.executable, str(script), str(version)], cwd=tmp_path,
                     input=json.dumps(english).encode(), env=env)
        translations = json.loads(result.stdout.decode().strip().splitlines()[-1])
        exact[name] = 100 * np.mean([t == g for t, g in zip(translations, german)])
    assert exact["float32"] > 99.0, exact
    assert abs(exact["int8"] - exact["float32"]) <= 0.5, exact


def test_the_int8_export_answers_bad_requests_as_the_float32_one(exports):
    import tensorflow_text  # noqa: F401
    loaded = {name: tf.saved_model.load(str(version)) for name, version in exports.items()}
    texts = tf.constant(["", "  ", b"\xff\xfe broken utf-8", "twenty-one"])
    answers = {name: m.signatures["serving_default"](inputs=texts)["translations"].numpy()
               for name, m in loaded.items()}
    assert answers["int8"][:2].tolist() == answers["float32"][:2].tolist() == [b"", b""]
    assert answers["int8"][3] == answers["float32"][3]
    for name, m in loaded.items():
        with pytest.raises(tf.errors.InvalidArgumentError,
                           match=r"beam_size must be in \[1, 8\], got 9"):
            m.signatures["translate_with_options"](
                inputs=texts, target_prefix=tf.constant([""] * 4), beam_size=tf.constant(9),
                alpha=tf.constant(0.6), max_extra_length=tf.constant(50),
                num_hypotheses=tf.constant(1))
        with pytest.raises(tf.errors.InvalidArgumentError, match="one entry per input"):
            m.signatures["translate_with_options"](
                inputs=texts, target_prefix=tf.constant([""]), beam_size=tf.constant(4),
                alpha=tf.constant(0.6), max_extra_length=tf.constant(50),
                num_hypotheses=tf.constant(1))
    info = json.loads((exports["int8"] / "assets.extra" / "export.json").read_text())
    assert info["serving_dtype"] == "int8"
