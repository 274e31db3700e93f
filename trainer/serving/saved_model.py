"""The SavedModel on disk: write a model directory's model as a new version, find the
version to serve, load it.

Layout, as TF Serving expects:

  <export_dir>/<version>/saved_model.pb, variables/
  <export_dir>/<version>/assets/spm.model            the vocabulary (or spm_source/target.model)
  <export_dir>/<version>/assets.extra/tf_serving_warmup_requests
  <export_dir>/<version>/assets.extra/export.json    checkpoints, beam settings, model config

The version is one more than the highest already in export_dir (1 for a new one). The
export is written to a staging directory `<export_dir>/.tmp-<uuid>` and renamed
(`trainer.model_dir.files.staged_directory`), so a server polling export_dir never sees a
half-written version.

Signatures (inputs -> outputs; their details in trainer/serving/: translator.py the first
five, options.py translate_with_options and sample, xla.py translate_xla):

  serving_default  inputs tf.string [batch] -> translations tf.string [batch],
                   scores float32 [batch]
  translate_ids    source_ids int32 [batch, src_len] -> ids int32 [batch, width],
                   lengths int32 [batch], scores float32 [batch]
  nbest            inputs tf.string [batch] -> translations tf.string [batch, beam],
                   scores float32 [batch, beam], log_probs float32 [batch, beam]
  translate_with_options
                   inputs, target_prefix tf.string [batch], then beam search's request
                   options (beam_size, alpha, ...: trainer/serving/options.py), each a
                   scalar or [batch], one per input -> translations tf.string [batch, k],
                   scores, log_probs float32 [batch, k], error tf.string [batch]
  sample           inputs, target_prefix tf.string [batch], then sampling's request
                   options (num_hypotheses, ..., seed) -> as translate_with_options
  score            inputs, targets tf.string [batch] -> log_probs, scores float32 [batch],
                   lengths int32 [batch]
  attention        inputs tf.string [batch] -> translations, source_pieces, output_pieces,
                   their lengths, encoder_self_attention, encoder_decoder_attention
  translate_xla    (export(..., xla=True) only) as serving_default; the search of a request
                   of up to 4 sentences is compiled by XLA, a larger one runs
                   serving_default's; needs XLA's CPU JIT in the server

Tokenization runs inside the graph (tensorflow_text SentencePiece), so a client sends and
receives plain text; the graph holds only core TensorFlow and tensorflow_text ops.
"""

import dataclasses
import json
import os
import re
from typing import List, Optional, Tuple

import tensorflow as tf

from keras_transformer import DecodeConfig, Transformer
from keras_transformer.quantization import quantize_step_weights
from trainer.data import vocabulary
from trainer.model_dir import files, layout
from trainer.model_dir.weights import WeightsChoice, final_model
from trainer.serving import calibration, warmup, xla
from trainer.serving.limits import ServingLimits
from trainer.serving.shortlist import ShortlistChoice
from trainer.serving.translator import Translator

DESCRIPTION = "SavedModel"
SIGNATURES = warmup.SIGNATURES
INFO_FILE = "export.json"
# What the exported graph computes its matmuls in (trainer.export --serving_dtype).
SERVING_DTYPES = ("float32", "bfloat16", "int8", "int8_bfloat16")
# --serving_dtype=auto: the fastest of SERVING_DTYPES on this machine (dtype_choice.py).
AUTO = "auto"


@dataclasses.dataclass(frozen=True)
class Options:
    """How a model directory becomes a SavedModel.

    Attributes:
      weights: which weights the export ships.
      decode: the search of every signature: serving_default's beam size and length
        penalty (and the other fixed signatures'); None: the model directory's
        (config.json's "decode", else the paper's).
      limits: what a request may ask of translate_with_options and sample (the largest
        beam).
      serving_dtype: one of SERVING_DTYPES, or AUTO. "float32"; "bfloat16": weights and
        activations in bfloat16, attention softmax, log-probs and scores in float32
        (bfloat16 weights rather than float32 ones cast at every decoding step, Keras'
        mixed_bfloat16: the casts cost more than the matmuls save); "int8": the decoding
        step's matmuls on int8 weights (a scale per output column) and int8 inputs (a
        scale per row), oneDNN's int8 kernel, the rest float32
        (keras_transformer.quantization); "int8_bfloat16": the encoder's and the step's
        matmuls int8 with each one's input range measured on `calibration`'s sentences,
        the rest bfloat16 (trainer/serving/calibration.py). Which is fastest depends on
        the CPU; AUTO builds each, times them on `calibration`'s sentences on this machine
        and keeps the fastest that agrees with float32 (trainer/serving/dtype_choice.py).
      xla: also export translate_xla (trainer/serving/xla.py); not with int8, whose
        kernel XLA cannot compile, nor with a shortlist.
      shortlist: a vocabulary shortlist for every beam search (trainer/serving/shortlist.py).
      calibration: int8_bfloat16 and AUTO only: a text file of source sentences, one per
        line.
    """

    weights: WeightsChoice = dataclasses.field(default_factory=WeightsChoice)
    decode: Optional[DecodeConfig] = None
    limits: ServingLimits = dataclasses.field(default_factory=ServingLimits)
    serving_dtype: str = "float32"
    xla: bool = False
    shortlist: ShortlistChoice = dataclasses.field(default_factory=ShortlistChoice)
    calibration: str = ""

    def __post_init__(self):
        if self.serving_dtype not in SERVING_DTYPES + (AUTO,):
            raise ValueError(f"unknown serving dtype {self.serving_dtype!r}; choose one of "
                             f"{', '.join(SERVING_DTYPES + (AUTO,))}")
        if self.xla and self.serving_dtype.startswith("int8"):
            raise ValueError(f"--xla cannot compile the {self.serving_dtype} step (XLA has "
                             "no int8 matmul kernel of oneDNN's); export it without --xla")
        if self.serving_dtype == "int8_bfloat16" and not self.calibration:
            raise ValueError("--serving_dtype=int8_bfloat16 needs --calibration=FILE: source "
                             "sentences, one per line, to measure each int8 matmul's input "
                             "range on (the validation set's source side, say)")
        if self.serving_dtype == AUTO and not self.calibration:
            raise ValueError("--serving_dtype=auto needs --calibration=FILE: source "
                             "sentences, one per line, to calibrate int8_bfloat16 and time "
                             "each dtype on (the validation set's source side, say)")
        if self.calibration and self.serving_dtype not in ("int8_bfloat16", AUTO):
            raise ValueError(f"--calibration is for --serving_dtype=int8_bfloat16 or auto, "
                             f"not {self.serving_dtype}")
        if self.xla and self.shortlist.paths:
            raise ValueError("--xla compiles fixed shapes, and a shortlist's candidates "
                             "change from batch to batch; export it without --xla")

    @property
    def candidates(self) -> Tuple[str, ...]:
        """The serving dtypes AUTO builds and times: SERVING_DTYPES, without the int8
        ones under xla (XLA cannot compile oneDNN's int8 kernel)."""
        return tuple(dtype for dtype in SERVING_DTYPES
                     if not (self.xla and dtype.startswith("int8")))


def default_dir(name: str, options: Options) -> str:
    """Where `python -m trainer.export` writes the versions of model directory `name`."""
    del options
    return os.path.join("saved_models", name)


def versions(export_dir: str) -> List[int]:
    """The integer versions in export_dir, ascending."""
    if not tf.io.gfile.isdir(export_dir):
        return []
    names = (name.rstrip("/") for name in tf.io.gfile.listdir(export_dir))
    return sorted(int(name) for name in names if re.fullmatch(r"\d+", name))


def resolve(saved_model: str) -> str:
    """A SavedModel directory: `saved_model` itself if it holds saved_model.pb, else its
    highest version (what TF Serving would serve)."""
    if tf.io.gfile.exists(os.path.join(saved_model, "saved_model.pb")):
        return saved_model
    found = versions(saved_model)
    if not found:
        raise FileNotFoundError(f"{saved_model} holds neither saved_model.pb nor a version "
                                "directory; export one with python -m trainer.export")
    return os.path.join(saved_model, str(found[-1]))


class ExportError(ValueError):
    """An export cannot be read (a file cut short or edited); the message is one line
    naming it."""


def load(saved_model: str):
    """The SavedModel at `saved_model` (a version, or an export directory's highest).
    Raises FileNotFoundError when there is none, ExportError when it cannot be read."""
    import tensorflow_text  # noqa: F401  (registers the SentencePiece ops)
    path = resolve(saved_model)
    from google.protobuf.message import DecodeError  # TensorFlow's own dependency
    try:
        return tf.saved_model.load(path)
    except (tf.errors.OpError, ValueError, IOError, DecodeError) as e:
        # DecodeError: a saved_model.pb cut short.
        raise ExportError(f"{path} is not a readable SavedModel ({_one_line(e)}); export "
                          "it again with python -m trainer.export") from None


def _one_line(error) -> str:
    return " ".join(str(getattr(error, "message", error)).split())[:160]


def build_translator(model_dir: str, options: Options = Options()
                     ) -> Tuple[Translator, List[str]]:
    """(Translator of the model of model_dir as `options` ask, checkpoint prefixes its
    weights come from)."""
    float32_model, paths = final_model(model_dir, options.weights)
    model, step_weights = float32_model, None
    tokenizers = vocabulary.load_or_train(model_dir, None)
    decode = options.decode or layout.load_decode(model_dir)
    if options.serving_dtype in ("bfloat16", "int8_bfloat16"):
        model = Transformer(float32_model.config, dtype="bfloat16")
        model.build()
        model.set_weights(float32_model.get_weights())
    if options.serving_dtype == "int8":
        step_weights = quantize_step_weights(model.step_weights(model.config.max_length))
    elif options.serving_dtype == "int8_bfloat16":
        step_weights = calibration.calibrated_step_weights(
            float32_model, model, tokenizers, decode, options.calibration)
    if step_weights is not None:  # made once, here; the export saves them as variables
        step_weights = tf.nest.map_structure(
            lambda t: tf.Variable(t, trainable=False) if tf.is_tensor(t) else t, step_weights)
    shortlist = options.shortlist.build(tokenizers, model.config.input_vocab_size,
                                        model.config.vocab_size)
    if shortlist is not None:  # saved as variables beside the model's
        shortlist = shortlist._replace(frequent=tf.Variable(shortlist.frequent, trainable=False),
                                       by_source=tf.Variable(shortlist.by_source,
                                                             trainable=False))
    return Translator(model, tokenizers, decode, step_weights=step_weights,
                      shortlist=shortlist, limits=options.limits), paths


def _servable(translator: Translator) -> tf.Module:
    """What the SavedModel saves besides the signatures: the weights as the tf.Variables
    the signatures read, the tokenizers (their SentencePiece resources) and the
    vocabularies as assets/<name>, for clients that tokenize themselves (translate_ids).

    Not the Keras model: its variables are saved as Keras objects that the TF1-style
    restore op skips, so TF Serving and saved_model_cli run, which load through it, would
    fail with "Could not find variable" (keras-team/keras#19274), and saving both would
    store every weight twice. tf.saved_model.load reads either form."""
    servable = tf.Module(name="translator")
    servable.weights = [variable.value for variable in translator.model.weights]
    if translator.step_weights is not None:  # int8's: the decoding step's own weights
        servable.step_weights = [t for t in tf.nest.flatten(translator.step_weights)
                                 if isinstance(t, tf.Variable)]
    if translator.shortlist is not None:
        servable.shortlist = [translator.shortlist.frequent, translator.shortlist.by_source]
    servable.tokenizers = [translator.source_tokenizer, translator.target_tokenizer]
    servable.vocabularies = [tf.saved_model.Asset(tokenizer.path)
                             for tokenizer in servable.tokenizers]
    return servable


def export(model_dir: str, export_dir: str, options: Options = Options()) -> str:
    """Exports model_dir's model as the next version in export_dir; returns its path.
    With serving_dtype AUTO, the fastest candidate's (dtype_choice.py), the others built
    beside it in staging directories and removed."""
    if options.serving_dtype == AUTO:
        from trainer.serving import dtype_choice  # it builds its candidates with `write`
        with dtype_choice.fastest(model_dir, export_dir, options, options.candidates,
                                  write) as (staging, info):
            return _publish(staging, export_dir, info)
    with files.staged_directory(export_dir) as staging:
        return _publish(staging, export_dir, write(model_dir, export_dir, staging.path,
                                                   options))


def write(model_dir: str, export_dir: str, path: str, options: Options) -> dict:
    """Writes model_dir's model as `options` ask (serving_dtype one of SERVING_DTYPES) as
    a SavedModel version at `path`, a staging directory of export_dir; returns what its
    export.json records, the version to come."""
    translator, checkpoints = build_translator(model_dir, options)
    signatures = {name: getattr(translator, "translate" if name == "serving_default" else name
                                ).get_concrete_function() for name in SIGNATURES}
    route = xla.XlaRoute(translator) if options.xla else None
    if route is not None:
        signatures[xla.SIGNATURE] = route.translate.get_concrete_function()
    info = {"model_dir": os.path.abspath(model_dir), "checkpoints": checkpoints,
            "weights": options.weights.kind, **translator.decode.to_dict(),
            **dataclasses.asdict(translator.limits),
            "serving_dtype": options.serving_dtype,
            "calibration": options.calibration or None,
            "shortlist": options.shortlist.describe() if options.shortlist.paths else None,
            "model": translator.model.config.to_dict(), "signatures": list(signatures)}
    tf.saved_model.save(_servable(translator), path, signatures=signatures)
    extra = os.path.join(path, "assets.extra")
    tf.io.gfile.makedirs(extra)
    warmup.write(os.path.join(extra, warmup.FILE),
                 os.path.basename(os.path.abspath(export_dir)), translator.decode,
                 translator.limits)
    return info


def read_info(saved_model: str) -> dict:
    """The export.json of an export version ({} when it has none: an older export).
    Raises ExportError when it cannot be read."""
    path = os.path.join(saved_model, "assets.extra", INFO_FILE)
    if not tf.io.gfile.exists(path):
        return {}
    try:
        with tf.io.gfile.GFile(path) as f:
            return json.load(f)
    except ValueError as e:
        raise ExportError(f"{path} is damaged ({_one_line(e)}); export the model again "
                          "with python -m trainer.export") from None


def _publish(staging: files.StagingDirectory, export_dir: str, info: dict) -> str:
    """Publishes `staging` as the next version of export_dir, with export.json (info and
    the version) written into it; returns the version's path."""
    version = (versions(export_dir) or [0])[-1] + 1
    while True:
        with tf.io.gfile.GFile(os.path.join(staging.path, "assets.extra", INFO_FILE), "w") as f:
            json.dump({**info, "version": version}, f, indent=2)
        try:
            return staging.publish(os.path.join(export_dir, str(version)))
        except FileExistsError:  # another export took this version meanwhile
            version += 1
