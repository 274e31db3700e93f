"""The SavedModel export: TF Serving layout, signatures, graph ops, warmup file, versions,
and the int8, bfloat16 and XLA exports. The programs around an export (a consumer with only
tensorflow and tensorflow_text, TF Serving's session loader, saved_model_cli):
test_serving_programs.py."""

import json
import os
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest
import tensorflow as tf

from conftest import built_once, checkpoint_weights, exported_weights, run, sources
from programs import program, succeeded

# Each test runs the programs, or uses the model they trained.
pytestmark = pytest.mark.slow

SIGNATURES = {
    "serving_default": ({"inputs": (tf.string, [None])},
                        {"translations": (tf.string, [None]), "scores": (tf.float32, [None])}),
    "translate_ids": ({"source_ids": (tf.int32, [None, None])},
                      {"ids": (tf.int32, [None, None]), "lengths": (tf.int32, [None]),
                       "scores": (tf.float32, [None])}),
    "nbest": ({"inputs": (tf.string, [None])},
              {"translations": (tf.string, [None, 4]), "scores": (tf.float32, [None, 4]),
               "log_probs": (tf.float32, [None, 4])}),
    "score": ({"inputs": (tf.string, [None]), "targets": (tf.string, [None])},
              {"log_probs": (tf.float32, [None]), "scores": (tf.float32, [None]),
               "lengths": (tf.int32, [None])}),
    "attention": ({"inputs": (tf.string, [None])},
                  {"translations": (tf.string, [None]),
                   "source_pieces": (tf.string, [None, None]),
                   "source_lengths": (tf.int32, [None]),
                   "output_pieces": (tf.string, [None, None]),
                   "output_lengths": (tf.int32, [None]),
                   "encoder_self_attention": (tf.float32, [None, 2, 4, None, None]),
                   "encoder_decoder_attention": (tf.float32, [None, 2, 4, None, None])}),
    # Each option: a scalar, or one value per input (unknown rank).
    "translate_with_options": (
        {"inputs": (tf.string, [None]), "target_prefix": (tf.string, [None]),
         "beam_size": (tf.int32, None), "alpha": (tf.float32, None),
         "max_extra_length": (tf.int32, None), "min_length": (tf.int32, None),
         "num_hypotheses": (tf.int32, None), "stopping": (tf.string, None),
         "patience": (tf.float32, None)},
        {"translations": (tf.string, [None, None]), "scores": (tf.float32, [None, None]),
         "log_probs": (tf.float32, [None, None]), "error": (tf.string, [None])}),
    "sample": (
        {"inputs": (tf.string, [None]), "target_prefix": (tf.string, [None]),
         "num_hypotheses": (tf.int32, None), "max_extra_length": (tf.int32, None),
         "min_length": (tf.int32, None), "temperature": (tf.float32, None),
         "top_k": (tf.int32, None), "top_p": (tf.float32, None), "seed": (tf.int64, None)},
        {"translations": (tf.string, [None, None]), "scores": (tf.float32, [None, None]),
         "log_probs": (tf.float32, [None, None]), "error": (tf.string, [None])}),
}


def test_training_ends_with_an_integer_version_holding_vocabulary_and_warmup(exported):
    assert f"exported SavedModel to {exported.export_dir / '1'}" in exported.task_stdout
    assert sorted(os.listdir(exported.export_dir)) == ["1"]  # no staging directory left
    version = exported.version_dir
    for path in ("saved_model.pb", "variables/variables.index", "assets/spm.model",
                 "assets.extra/tf_serving_warmup_requests", "assets.extra/export.json"):
        assert (version / path).is_file(), path
    assert ((version / "assets" / "spm.model").read_bytes()
            == (exported.model_dir / "spm.model").read_bytes())
    info = json.loads((version / "assets.extra" / "export.json").read_text())
    assert info["checkpoints"] == [str(exported.model_dir / "ckpt-30")]
    assert (info["beam_size"], info["alpha"], info["version"]) == (4, 0.6, 1)
    assert info["max_beam_size"] == 8


def test_signatures_take_and_give_the_documented_tensors(loaded):
    assert set(loaded.signatures) == set(SIGNATURES)
    for name, (inputs, outputs) in SIGNATURES.items():
        signature = loaded.signatures[name]
        specs = signature.structured_input_signature[1]
        assert {k: (v.dtype, _dims(v.shape)) for k, v in specs.items()} == inputs, name
        got = signature.structured_outputs
        assert {k: (v.dtype, _dims(v.shape)) for k, v in got.items()} == outputs, name


def _dims(shape):
    """A shape's dimensions, None for an unknown rank."""
    return None if shape.rank is None else shape.as_list()


def _op_types(saved_model_dir):
    """Every op type in the SavedModel's graph and function library."""
    from tensorflow.core.protobuf import saved_model_pb2
    proto = saved_model_pb2.SavedModel()
    proto.ParseFromString((saved_model_dir / "saved_model.pb").read_bytes())
    graph = proto.meta_graphs[0].graph_def
    functions = {f.signature.name for f in graph.library.function}
    types = {node.op for node in graph.node}
    for function in graph.library.function:
        types |= {node.op for node in function.node_def}
    # A node may call a library function directly by its name.
    return types - functions


def _not_core(op_types):
    """The op types that are not core TensorFlow ops (tf.raw_ops)."""
    return {t for t in op_types if not hasattr(tf.raw_ops, t)}


@pytest.fixture(scope="module")
def int8_export(exported, tmp_path_factory):
    """(version directory, loaded) of the session's model exported with
    serving_dtype="int8" (trainer.export --serving_dtype=int8), exported once per test
    run for every worker."""
    import tensorflow_text  # noqa: F401
    from trainer.serving import saved_model

    def export(directory):
        saved_model.export(str(exported.model_dir), str(directory),
                           saved_model.Options(serving_dtype="int8"))

    version = built_once(tmp_path_factory, "int8_export", export, exported.model_dir) / "1"
    return version, tf.saved_model.load(str(version))


def version_and_loaded(request, which):
    """(version directory, loaded) of the float32 or int8 export, for tests that take both."""
    if which == "int8":
        return request.getfixturevalue("int8_export")
    return request.getfixturevalue("exported").version_dir, request.getfixturevalue("loaded")


def test_an_int8_export_adds_only_onednns_int8_matmul_to_the_graph(exported, int8_export):
    """oneDNN's _QuantizedMatMul, which the stock x86 TensorFlow registers, is the one op
    of the int8 export that is neither core TensorFlow (tf.raw_ops) nor tensorflow-text."""
    version, _ = int8_export
    assert _not_core(_op_types(version)) - _not_core(_op_types(exported.version_dir)) == \
        {"_QuantizedMatMul"}
    info = json.loads((version / "assets.extra" / "export.json").read_text())
    assert info["serving_dtype"] == "int8"


def test_graph_holds_only_core_tensorflow_and_tensorflow_text_ops(exported):
    types = _op_types(exported.version_dir)
    python_ops = {"PyFunc", "PyFuncStateless", "EagerPyFunc"}
    assert not types & python_ops
    not_core = _not_core(types)
    # Tokenization and detokenization run in the graph, as tf-text SentencePiece ops.
    assert {"SentencepieceOp", "SentencepieceTokenizeOp",
            "SentencepieceDetokenizeOp"} <= not_core
    assert all(t.startswith("Sentencepiece") for t in not_core), not_core


def test_warmup_file_holds_a_request_per_signature_that_the_export_answers(exported, loaded,
                                                                           sentencepiece):
    from tensorflow_serving.apis import prediction_log_pb2
    from trainer.serving.warmup import TEXTS
    path = exported.version_dir / "assets.extra" / "tf_serving_warmup_requests"
    logs = [prediction_log_pb2.PredictionLog.FromString(record.numpy())
            for record in tf.data.TFRecordDataset(str(path))]
    requests = [log.predict_log.request for log in logs]
    assert sorted(r.model_spec.signature_name for r in requests) == sorted(SIGNATURES)
    assert {r.model_spec.name for r in requests} == {"export"}
    sent, got = {}, {}
    for request in requests:
        name = request.model_spec.signature_name
        inputs = {k: tf.constant(tf.make_ndarray(v)) for k, v in request.inputs.items()}
        outputs = loaded.signatures[name](**inputs)
        batch = max(v.shape[0] for v in inputs.values() if v.shape.rank)
        assert batch > 0
        assert all(v.shape[0] == batch for v in outputs.values())
        sent[name] = {k: v.numpy() for k, v in inputs.items()}
        got[name] = {k: v.numpy() for k, v in outputs.items()}
    # The answers are the export's own: the texts' translations as serving_default gives
    # them, which nbest, attention and translate_with_options (asking for the export's
    # settings) give too; and for the requests no other signature answers (translate_ids,
    # score, sample), each row gets what it gets sent alone.
    texts = [t.encode() for t in TEXTS]
    assert sent["serving_default"]["inputs"].tolist() == texts
    best = got["serving_default"]
    direct = loaded.signatures["serving_default"](inputs=tf.constant(texts))
    np.testing.assert_array_equal(best["translations"], direct["translations"])
    np.testing.assert_allclose(best["scores"], direct["scores"], rtol=1e-6)
    assert best["translations"][1] == b"" and best["scores"][1] == 0.0  # the empty text
    nbest = got["nbest"]
    for name in ("nbest", "attention", "translate_with_options"):
        assert sent[name]["inputs"].tolist() == texts, name
    np.testing.assert_array_equal(nbest["translations"][:, 0], best["translations"])
    np.testing.assert_allclose(nbest["scores"][:, 0], best["scores"], rtol=1e-5)
    np.testing.assert_array_equal(got["attention"]["translations"], best["translations"])
    options, prefixes = got["translate_with_options"], sent["translate_with_options"]
    free = prefixes["target_prefix"] == b""
    k = options["translations"].shape[1]
    np.testing.assert_array_equal(options["translations"][free], nbest["translations"][free, :k])
    np.testing.assert_allclose(options["scores"][free], nbest["scores"][free, :k], rtol=1e-5)
    info = json.loads((exported.version_dir / "assets.extra" / "export.json").read_text())
    for option in ("beam_size", "alpha", "stopping", "patience", "max_extra_length"):
        value = info[option].encode() if isinstance(info[option], str) else np.array(
            info[option], prefixes[option].dtype)  # alpha: as float32
        assert np.all(prefixes[option] == value), (option, prefixes[option], info[option])
    for prefix, row in zip(prefixes["target_prefix"][~free], options["translations"][~free]):
        for translation in row:
            start = sentencepiece.encode(prefix.decode())
            assert sentencepiece.encode(translation.decode())[:len(start)] == start
    # A prefixed row's log-prob counts its forced pieces: the teacher-forced log-prob of its
    # output.
    scored = loaded.signatures["score"](inputs=tf.constant(prefixes["inputs"][~free]),
                                        targets=tf.constant(options["translations"][~free, 0]))
    np.testing.assert_allclose(options["log_probs"][~free, 0], scored["log_probs"],
                               rtol=1e-4, atol=1e-4)
    for name, keys in (("translate_ids", ("lengths", "scores")),
                       ("score", ("log_probs", "scores", "lengths")),
                       ("sample", ("translations", "scores", "log_probs", "error"))):
        for i in range(len(next(iter(got[name].values())))):
            alone = loaded.signatures[name](**{
                k: tf.constant(v[i:i + 1] if v.ndim else v) for k, v in sent[name].items()})
            for key in keys:
                expected, answer = alone[key].numpy()[0], got[name][key][i]
                if np.asarray(expected).dtype.kind == "f":
                    np.testing.assert_allclose(answer, expected, rtol=1e-5, err_msg=name)
                else:
                    np.testing.assert_array_equal(answer, expected, err_msg=name)


def test_export_cli_averages_into_the_next_version_that_appears_only_complete(exported,
                                                                               tmp_path):
    """While `python -m trainer.export --average_last=2` runs (its main, in this process: the
    watcher is a thread beside it), every version directory that is visible is complete: the
    export is staged and renamed. Its version is one more than the highest there."""
    export_dir = tmp_path / "export"
    (export_dir / "7").mkdir(parents=True)  # an older version
    (export_dir / "10.txt").write_text("not a version")
    seen_incomplete = []
    done = threading.Event()

    def watch():
        while not done.is_set():
            for name in os.listdir(export_dir):
                version = export_dir / name
                if name.isdigit() and name != "7" and not all(
                        (version / p).exists() for p in (
                            "saved_model.pb", "variables/variables.index",
                            "assets.extra/tf_serving_warmup_requests",
                            "assets.extra/export.json")):
                    seen_incomplete.append(sorted(os.listdir(version)))
            time.sleep(0.005)

    watcher = threading.Thread(target=watch)
    watcher.start()
    try:
        result = program("export", f"--model_dir={exported.model_dir}",
                         f"--export_dir={export_dir}", "--average_last=2", cwd=tmp_path)
    finally:
        done.set()
        watcher.join()
    assert not seen_incomplete
    assert result.returncode == 0, result.stderr[-3000:]
    assert f"exported SavedModel to {export_dir / '8'}" in result.stdout
    assert sorted(os.listdir(export_dir)) == ["10.txt", "7", "8"]
    info = json.loads((export_dir / "8" / "assets.extra" / "export.json").read_text())
    assert [os.path.basename(p) for p in info["checkpoints"]] == ["ckpt-15", "ckpt-30"]

    # Every weight is the mean of the two checkpoints'.
    first, last = (checkpoint_weights(exported.model_dir, exported.model_dir / name)
                   for name in ("ckpt-15", "ckpt-30"))
    weights = exported_weights(export_dir / "8")
    assert len(weights) == len(last) > 50
    for weight, a, b in zip(weights, first, last):
        np.testing.assert_allclose(weight, (a.astype(np.float64) + b) / 2, rtol=1e-6,
                                   atol=1e-7)
    assert sum(not np.allclose(weight, b) for weight, b in zip(weights, last)) > len(last) / 2


def test_the_xla_signature_translates_as_serving_default_in_a_fresh_process(exported,
                                                                          tmp_path):
    """export(..., Options(xla=True)) adds translate_xla: serving_default's inputs, outputs and
    translations, loaded in a process with only tensorflow and tensorflow_text. A request
    above xla.MAX_BATCH runs serving_default's search (no XLA compile); one sentence at a
    time, or a few, is compiled by XLA (empty and over-long inputs among them)."""
    from trainer.serving import saved_model
    path = saved_model.export(str(exported.model_dir), str(tmp_path / "export"),
                              saved_model.Options(xla=True))
    info = json.loads((tmp_path / "export" / "1" / "assets.extra" / "export.json").read_text())
    assert info["signatures"] == [*SIGNATURES, "translate_xla"]
    not_core = _not_core(_op_types(Path(path)))
    assert all(t.startswith("Sentencepiece") for t in not_core), not_core
    from trainer.serving import xla
    batch = sources(3 * xla.MAX_BATCH)
    # Two short sentences share a compile (one width bucket); "" and the over-long input
    # (cut to the model's positions) take their own, and so does the pair.
    small = [[batch[1]], [""], [batch[0]], [" ".join(sources(40))], [batch[2], ""]]
    program = (
        "import json, sys\n"
        "import tensorflow as tf, tensorflow_text\n"
        "loaded = tf.saved_model.load(sys.argv[1])\n"
        "batch, small = json.loads(sys.argv[2])\n"
        "def texts(r):\n"
        "    return [[t.decode(), float(s)] for t, s in zip(r['translations'].numpy(),\n"
        "                                                  r['scores'].numpy())]\n"
        "out = {}\n"
        "for name in ('serving_default', 'translate_xla'):\n"
        "    f = loaded.signatures[name]\n"
        "    out[name] = texts(f(inputs=tf.constant(batch)))\n"
        "    sys.stderr.write(f'BATCH DONE {name}\\n'); sys.stderr.flush()\n"
        "    out[name] += [t for s in small for t in texts(f(inputs=tf.constant(s)))]\n"
        "print(json.dumps(out))\n")
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    # Log level 0: XLA's "Compiled cluster using XLA!" line shows when the first compile runs.
    result = run([sys.executable, "-c", program, path, json.dumps([batch, small])],
                 cwd=tmp_path, env={**env, "TF_CPP_MIN_LOG_LEVEL": "0"})
    out = json.loads(result.stdout.decode().strip().splitlines()[-1])
    assert len(out["translate_xla"]) == len(batch) + sum(map(len, small))
    assert [t for t, _ in out["translate_xla"]] == [t for t, _ in out["serving_default"]]
    np.testing.assert_allclose([s for _, s in out["translate_xla"]],
                               [s for _, s in out["serving_default"]], atol=1e-4)
    assert out["translate_xla"][len(batch) + 1] == out["translate_xla"][-1] == ["", 0.0]
    stderr = result.stderr.decode()
    compiled = stderr.find("Compiled cluster using XLA")
    assert compiled > stderr.index("BATCH DONE translate_xla"), stderr[-3000:]


def test_a_saved_model_path_resolves_to_the_version_tf_serving_would_serve(tmp_path):
    from trainer.serving import saved_model
    for version in ("3", "12", "9"):
        (tmp_path / version).mkdir()
        (tmp_path / version / "saved_model.pb").write_bytes(b"")
    (tmp_path / ".tmp-13").mkdir()  # an export in progress is not a version
    assert saved_model.versions(str(tmp_path)) == [3, 9, 12]
    assert saved_model.resolve(str(tmp_path)) == str(tmp_path / "12")
    assert saved_model.resolve(str(tmp_path / "3")) == str(tmp_path / "3")
    with pytest.raises(FileNotFoundError):
        saved_model.resolve(str(tmp_path / ".tmp-13"))


def test_a_bfloat16_export_keeps_bfloat16_weights_and_scores_close_to_float32(
        exported, loaded, tmp_path):
    export_dir = tmp_path / "bf16"
    succeeded(program("export", f"--model_dir={exported.model_dir}",
                      f"--export_dir={export_dir}", "--serving_dtype=bfloat16", cwd=tmp_path))
    version = export_dir / "1"
    info = json.loads((version / "assets.extra" / "export.json").read_text())
    assert info["serving_dtype"] == "bfloat16"
    weights = exported_weights(version)
    assert {weight.dtype for weight in weights} == {np.dtype(tf.bfloat16.as_numpy_dtype)}
    for weight, f32 in zip(weights, checkpoint_weights(exported.model_dir)):
        np.testing.assert_array_equal(weight, f32.astype(tf.bfloat16.as_numpy_dtype))
    types = _op_types(version)
    assert all(t.startswith("Sentencepiece") for t in types if not hasattr(tf.raw_ops, t))
    # The same pairs score alike: bfloat16 keeps about 3 significant digits (8 bits) of
    # each weight and activation, so a token's log-prob, a difference of logits near 10,
    # moves by thousandths of a nat. Measured on these 64 pairs: at most 0.009 nats per
    # token, 0.063 a pair; the bound, 0.02 per token, is twice that. A log-softmax
    # rounded to bfloat16 as well moves them up to 0.024 per token.
    texts, targets = sources(64), sources(64)[::-1]
    bf16 = tf.saved_model.load(str(version)).signatures["score"](
        inputs=tf.constant(texts), targets=tf.constant(targets))
    f32 = loaded.signatures["score"](inputs=tf.constant(texts), targets=tf.constant(targets))
    assert bf16["log_probs"].dtype == tf.float32
    np.testing.assert_array_equal(bf16["lengths"], f32["lengths"])
    per_token = (np.abs(bf16["log_probs"].numpy() - f32["log_probs"].numpy())
                 / f32["lengths"].numpy())
    assert per_token.max() <= 0.02, per_token.max()
    served = tf.saved_model.load(str(version)).signatures["serving_default"](
        inputs=tf.constant(texts[:8] + [""]))
    assert served["translations"].shape == (9,) and served["translations"][-1] == b""
