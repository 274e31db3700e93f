"""The exports that trade a little exactness for speed: `trainer.export --serving_dtype=int8`
(the decoding step's matmuls on int8 weights and inputs, keras_transformer.quantization),
`--serving_dtype=int8_bfloat16 --calibration=FILE` (those matmuls' inputs rounded by ranges
measured on FILE's sentences, the rest bfloat16) and `--shortlist=SRC,TGT` (each batch ranks
its shortlisted target pieces only, keras_transformer.shortlist) translate as the float32
export does, in a Python that has only tensorflow and tensorflow_text, and answer bad
requests as it does."""

import json
import os
import sys
from pathlib import Path

import numpy as np
import pytest
import sentencepiece
import tensorflow as tf

from conftest import built_once, run
from programs import program, succeeded
from keras_transformer import DecodeConfig, Transformer, TransformerConfig
from keras_transformer.quantization import dense, quantize_kernel, quantize_step_weights
from trainer.data import builtin_corpus
from trainer.serving.options import request_inputs

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


def export_fast(model_dir: Path, scratch: Path):
    """trainer.export of model_dir with --serving_dtype=int8 into scratch/int8, with
    int8_bfloat16 calibrated on the main job's training sources into scratch/int8_bfloat16,
    and with a shortlist of its training pairs into scratch/shortlist."""
    english, german = builtin_corpus.splits()["train"]  # what the main job trained on
    (scratch / "train.en").write_text("\n".join(english) + "\n")
    (scratch / "train.de").write_text("\n".join(german) + "\n")
    for name, flags in (("int8", ["--serving_dtype=int8"]),
                        ("int8_bfloat16", ["--serving_dtype=int8_bfloat16",
                                           f"--calibration={scratch / 'train.en'}"]),
                        ("shortlist", [f"--shortlist={scratch / 'train.en'},"
                                       f"{scratch / 'train.de'}", "--shortlist_frequent=50",
                                       f"--shortlist_per_source={PER_SOURCE}"])):
        export_dir = scratch / name
        result = succeeded(program("export", f"--model_dir={model_dir}", *flags,
                                   f"--export_dir={export_dir}"))
        assert f"exported SavedModel to {export_dir / '1'}" in result.stdout


@pytest.fixture(scope="module")
def exports(main_job, tmp_path_factory):
    """{"float32": the main job's SavedModel version, "int8" and "int8_bfloat16": its
    exports so, "shortlist": its float32 export with a shortlist of the main job's training
    pairs}, by the real program's main, once per test run."""
    model_dir = main_job.directory / "runs" / "tiny_builtin"
    scratch = built_once(tmp_path_factory, "fast_exports",
                         lambda scratch: export_fast(model_dir, scratch), model_dir, PER_SOURCE)
    return {"float32": main_job.directory / "saved_models" / "tiny_builtin" / "1",
            "int8": scratch / "int8" / "1", "int8_bfloat16": scratch / "int8_bfloat16" / "1",
            "shortlist": scratch / "shortlist" / "1"}


PER_SOURCE = 20

# Translates stdin's JSON list of texts with each SavedModel named on the command line,
# printing {path: translations}.
_CONSUMER = r"""
import json, sys
import tensorflow as tf
import tensorflow_text  # registers the SentencePiece ops
texts = json.loads(sys.stdin.read())
outputs = {}
for path in sys.argv[1:]:
    translate = tf.saved_model.load(path).signatures["serving_default"]
    out = []
    for i in range(0, len(texts), 100):
        batch = translate(inputs=tf.constant(texts[i:i + 100]))["translations"].numpy()
        out += [t.decode() for t in batch]
    outputs[path] = out
print(json.dumps(outputs))
"""


def test_the_int8_and_shortlist_exports_translate_as_float32_in_a_fresh_python(
        exports, tmp_path):
    english, german = builtin_corpus.splits()["validation"]  # the main job's held-out 1,000
    script = tmp_path / "consumer.py"
    script.write_text(_CONSUMER)
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}  # no project here
    env["TF_CPP_MIN_LOG_LEVEL"] = "2"
    result = run([sys.executable, str(script), *map(str, exports.values())], cwd=tmp_path,
                 input=json.dumps(english).encode(), env=env)
    outputs = json.loads(result.stdout.decode().strip().splitlines()[-1])
    exact = {name: 100 * np.mean([t == g for t, g in zip(outputs[str(path)], german)])
             for name, path in exports.items()}
    assert exact["float32"] > 99.0, exact
    # As float32: at most 2 of the 1,000 translations differ from float32's (so the exact
    # matches are within 0.2 points). Measured on the 2-core EPYC: 0 (int8), 0
    # (int8_bfloat16) and 1 (shortlist: a piece it leaves out), and 2 leaves room for one
    # near-tie more on another CPU's kernels. What it catches: a shortlist of 13 pieces
    # per source instead of 20 changes 3 (0.3 points of exact matches); int8 weights in
    # 5 levels instead of 127 change 1, in 3 levels 970.
    float32 = outputs[str(exports["float32"])]
    for name in ("int8", "int8_bfloat16", "shortlist"):
        differ = [(english[i], t, float32[i]) for i, t in enumerate(outputs[str(exports[name])])
                  if t != float32[i]]
        assert len(differ) <= 2, (name, exact, differ)


def test_the_shortlist_is_stored_and_ranks_fewer_pieces_than_the_vocabulary(exports):
    import tensorflow_text  # noqa: F401
    from keras_transformer.shortlist import Shortlist
    loaded = tf.saved_model.load(str(exports["shortlist"]))
    frequent, by_source = loaded.shortlist
    info = json.loads((exports["shortlist"] / "assets.extra" / "export.json").read_text())
    vocab = info["model"]["vocab_size"]
    assert info["shortlist"]["frequent"] == 50 and frequent.shape == [50]
    assert by_source.shape == [vocab, PER_SOURCE]
    english, _ = builtin_corpus.splits()["validation"]
    pieces = sentencepiece.SentencePieceProcessor(
        model_file=str(exports["shortlist"] / "assets" / "spm.model"))
    ids = tf.ragged.constant(pieces.encode(english[:64])).to_tensor()  # a batch's sources
    candidates = Shortlist(frequent, by_source, vocab).candidates(ids)
    assert 4 < len(candidates) < vocab / 2, (len(candidates), vocab)


def test_the_int8_and_shortlist_exports_answer_bad_requests_as_the_float32_one(exports):
    import tensorflow_text  # noqa: F401
    loaded = {name: tf.saved_model.load(str(version)) for name, version in exports.items()}
    # Invalid UTF-8 alone, and within a number the model translates: replaced by U+FFFD,
    # its bytes change neither's translation.
    texts = tf.constant(["", "  ", b"\xff\xfe broken utf-8", "twenty-one",
                         b"three \xff\xfe thousand", "three \ufffd\ufffd thousand"])
    answers = {name: m.signatures["serving_default"](inputs=texts)["translations"].numpy()
               for name, m in loaded.items()}
    # Nothing to translate gives ""; the rest get float32's translations, every item.
    assert answers["float32"][:2].tolist() == [b"", b""]
    assert all(answers["float32"][2:]), answers["float32"]
    assert answers["float32"][4] == answers["float32"][5]
    for name in ("int8", "int8_bfloat16", "shortlist"):
        assert answers[name].tolist() == answers["float32"].tolist(), name
    for name, m in loaded.items():
        bad = m.signatures["translate_with_options"](
            inputs=texts, target_prefix=tf.constant([""] * 6),
            **request_inputs("translate_with_options", DecodeConfig(), 6,
                             beam_size=[4, 9, 4, 4, 4, 4]))
        assert [e.decode() for e in bad["error"].numpy()] == [
            "", "beam_size must be in [1, 8], got 9", "", "", "", ""], name
        # The bad row answers "" and the others as serving_default does.
        assert bad["translations"][:, 0].numpy().tolist() == [
            answers["float32"][0], b"", *answers["float32"][2:]], name
        with pytest.raises(tf.errors.InvalidArgumentError, match="one entry per input"):
            m.signatures["translate_with_options"](
                inputs=texts, target_prefix=tf.constant([""]),
                **request_inputs("translate_with_options", DecodeConfig()))
    for name in ("int8", "int8_bfloat16"):
        info = json.loads((exports[name] / "assets.extra" / "export.json").read_text())
        assert info["serving_dtype"] == name
