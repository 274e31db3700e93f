"""python -m trainer.export --model_dir=DIR --export_dir=DIR [--average_last=N]: write a
SavedModel that TF Serving (or any TensorFlow program with tensorflow_text) serves.

Layout, as TF Serving expects:

  <export_dir>/<version>/saved_model.pb, variables/
  <export_dir>/<version>/assets/spm.model            the vocabulary (or spm_source/target.model)
  <export_dir>/<version>/assets.extra/tf_serving_warmup_requests
  <export_dir>/<version>/assets.extra/export.json    checkpoints, beam settings, model config

The version is one more than the highest already in export_dir (1 for a new one). The
export is written to `<export_dir>/.tmp-<version>-<pid>` and renamed, so a server polling
export_dir never sees a half-written version.

Signatures (inputs -> outputs; see trainer/translator.py for the details):

  serving_default  inputs tf.string [batch] -> translations tf.string [batch],
                   scores float32 [batch]
  translate_ids    source_ids int32 [batch, src_len] -> ids int32 [batch, width],
                   lengths int32 [batch], scores float32 [batch]
  nbest            inputs tf.string [batch] -> translations tf.string [batch, beam],
                   scores float32 [batch, beam], log_probs float32 [batch, beam]
  score            inputs, targets tf.string [batch] -> log_probs, scores float32 [batch],
                   lengths int32 [batch]
  attention        inputs tf.string [batch] -> translations, source_pieces, output_pieces,
                   their lengths, encoder_self_attention, encoder_decoder_attention

Tokenization runs inside the graph (tensorflow_text SentencePiece), so a client sends and
receives plain text; the graph holds only core TensorFlow and tensorflow_text ops.
"""

import json
import os
import re
import shutil
import sys
from typing import List, Sequence

SIGNATURES = ("serving_default", "translate_ids", "nbest", "score", "attention")
WARMUP_FILE = "tf_serving_warmup_requests"
INFO_FILE = "export.json"
# Warmup requests: short, empty and repeated text, so TF Serving runs every signature once
# before the first real request.
WARMUP_TEXTS = ("A man is riding a bicycle.", "", "twenty one")


def versions(export_dir: str) -> List[int]:
    """The integer versions in export_dir, ascending."""
    import tensorflow as tf
    if not tf.io.gfile.isdir(export_dir):
        return []
    names = (name.rstrip("/") for name in tf.io.gfile.listdir(export_dir))
    return sorted(int(name) for name in names if re.fullmatch(r"\d+", name))


def resolve(saved_model: str) -> str:
    """A SavedModel directory: `saved_model` itself if it holds saved_model.pb, else its
    highest version (what TF Serving would serve)."""
    import tensorflow as tf
    if tf.io.gfile.exists(os.path.join(saved_model, "saved_model.pb")):
        return saved_model
    found = versions(saved_model)
    if not found:
        raise FileNotFoundError(f"{saved_model} holds neither saved_model.pb nor a version "
                                "directory; export one with python -m trainer.export")
    return os.path.join(saved_model, str(found[-1]))


def build_translator(model_dir: str, beam_size: int = 4, alpha: float = 0.6,
                     average_last: int = 0):
    """(Translator of the float32 model of model_dir, checkpoint prefixes it comes from):
    the latest checkpoint, or the mean of the last `average_last` ones."""
    from trainer import average, model_dir as model_dir_lib, tokenizer
    from trainer.translator import Translator

    if average_last:
        model, paths = average.average_checkpoints(model_dir, average_last)
    else:
        paths = model_dir_lib.checkpoints(model_dir)[-1:]
        model = model_dir_lib.restore_model(model_dir, paths[0])
    tokenizers = tokenizer.load_or_train(model_dir, None)
    return Translator(model, tokenizers, beam_size=beam_size, alpha=alpha), paths


def export(model_dir: str, export_dir: str, beam_size: int = 4, alpha: float = 0.6,
           average_last: int = 0) -> str:
    """Exports model_dir's model as the next version in export_dir; returns its path."""
    import tensorflow as tf

    translator, checkpoints = build_translator(model_dir, beam_size, alpha, average_last)
    # The vocabulary travels as an asset (assets/<name>) for clients that tokenize
    # themselves (translate_ids); the graph carries its own copy inside the tf-text op.
    for role, tok in (("source", translator.source_tokenizer),
                      ("target", translator.target_tokenizer)):
        setattr(translator, f"{role}_vocabulary", tf.saved_model.Asset(tok.path))
    signatures = {
        "serving_default": translator.translate.get_concrete_function(),
        "translate_ids": translator.translate_ids.get_concrete_function(),
        "nbest": translator.nbest.get_concrete_function(),
        "score": translator.score.get_concrete_function(),
        "attention": translator.attention.get_concrete_function(),
    }
    info = {"model_dir": os.path.abspath(model_dir), "checkpoints": checkpoints,
            "beam_size": beam_size, "alpha": alpha,
            "model": translator.model.config.to_dict(),
            "signatures": list(signatures)}

    tf.io.gfile.makedirs(export_dir)
    version = (versions(export_dir) or [0])[-1] + 1
    # The pid keeps two concurrent exports out of each other's staging directory.
    staging = os.path.join(export_dir, f".tmp-{version}-{os.getpid()}")
    shutil.rmtree(staging, ignore_errors=True)
    try:
        tf.saved_model.save(translator, staging, signatures=signatures)
        extra = os.path.join(staging, "assets.extra")
        tf.io.gfile.makedirs(extra)
        write_warmup(os.path.join(extra, WARMUP_FILE),
                     os.path.basename(os.path.abspath(export_dir)))
        while True:
            with tf.io.gfile.GFile(os.path.join(extra, INFO_FILE), "w") as f:
                json.dump({**info, "version": version}, f, indent=2)
            final = os.path.join(export_dir, str(version))
            try:
                # Atomic; fails if `final` exists and is not empty, i.e. another export
                # took this version meanwhile: then take the next one.
                os.rename(staging, final)
                return final
            except OSError:
                if not os.path.isdir(final):
                    raise
                version += 1
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def warmup_requests(model_name: str, texts: Sequence[str] = WARMUP_TEXTS):
    """PredictRequest protos (tensorflow_serving.apis), one per signature, on `texts`."""
    import tensorflow as tf
    from tensorflow_serving.apis import predict_pb2

    texts = [t.encode("utf-8") for t in texts]
    inputs = {
        "serving_default": {"inputs": texts},
        # Pieces + EOS (3), an empty row, a shorter row.
        "translate_ids": {"source_ids": tf.constant([[5, 6, 3], [0, 0, 0], [7, 3, 0]],
                                                    tf.int32)},
        "nbest": {"inputs": texts},
        "score": {"inputs": texts, "targets": list(reversed(texts))},
        "attention": {"inputs": texts},
    }
    requests = []
    for signature in SIGNATURES:
        request = predict_pb2.PredictRequest()
        request.model_spec.name = model_name
        request.model_spec.signature_name = signature
        for name, value in inputs[signature].items():
            request.inputs[name].CopyFrom(tf.make_tensor_proto(value))
        requests.append(request)
    return requests


def write_warmup(path: str, model_name: str):
    """Writes the TF Serving warmup file: a TFRecord of PredictionLog protos."""
    import tensorflow as tf
    from tensorflow_serving.apis import prediction_log_pb2

    with tf.io.TFRecordWriter(path) as writer:
        for request in warmup_requests(model_name):
            log = prediction_log_pb2.PredictionLog(
                predict_log=prediction_log_pb2.PredictLog(request=request))
            writer.write(log.SerializeToString())


def _define_flags():
    # Defined only when run as a program: trainer.task imports this module after parsing
    # its own flags, some of the same names.
    from absl import flags
    flags.DEFINE_string("model_dir", None, "Model directory of python -m trainer.task.")
    flags.DEFINE_string("export_dir", None, "Where versions go (default "
                        "saved_models/<name of model_dir>).")
    flags.DEFINE_integer("average_last", 0, "Export the mean of the last N checkpoints "
                         "(paper: 5 for base, 20 for big); 0 exports the latest.")
    flags.DEFINE_integer("beam_size", 4, "Beam size of every signature (and k of nbest).")
    flags.DEFINE_float("alpha", 0.6, "Length penalty exponent.")


def main(argv):
    from absl import flags
    FLAGS = flags.FLAGS
    if len(argv) > 1:
        _fail(f"unexpected arguments {argv[1:]}")
    if not FLAGS.model_dir:
        _fail("--model_dir is required")
    if FLAGS.beam_size < 1 or FLAGS.average_last < 0:
        _fail("--beam_size must be at least 1 and --average_last at least 0")
    export_dir = FLAGS.export_dir or os.path.join(
        "saved_models", os.path.basename(os.path.normpath(FLAGS.model_dir)))
    try:
        path = export(FLAGS.model_dir, export_dir, FLAGS.beam_size, FLAGS.alpha,
                      FLAGS.average_last)
    except (FileNotFoundError, ValueError) as e:
        _fail(str(e))
    print(f"exported SavedModel to {path}")


def _fail(message: str):
    print(f"trainer.export: error: {message}", file=sys.stderr)
    sys.exit(2)


if __name__ == "__main__":
    from absl import app
    _define_flags()
    app.run(main)
