"""The layout of a model directory: config.json (the model, and how it translates), the
vocabulary's files, precision.json (the precision its training runs in), checkpoints
(ckpt-<step>) and TensorBoard summaries (train/, eval/).

`MODEL_FILES` are the files beside the checkpoints that make a model directory: a reader
needs them all to rebuild the model and turn text into its ids and back. A directory made
from another (an average of its checkpoints, a run started `--init_from` it) copies them
with `copy_model_files`, so a file added to the list is carried everywhere at once.
"""

import contextlib
import json
import os
import sys
from typing import Callable, List, Optional, Sequence

import tensorflow as tf

from keras_transformer import DecodeConfig, Transformer, TransformerConfig
from trainer.model_dir import files

# {"model": the TransformerConfig, "decode": the DecodeConfig it translates with}.
CONFIG_FILE = "config.json"
# The vocabulary (trainer/data/vocabulary.py): one SentencePiece model shared by both
# sides, or one per side; for a converted model, the pieces of each side in the model's
# id order (its SentencePiece models only segment).
SHARED_MODEL = "spm.model"
SOURCE_MODEL = "spm_source.model"
TARGET_MODEL = "spm_target.model"
VOCABULARY = "vocabulary.json"
# {"punctuation": a language code}: Moses' punctuation rules for that language normalize
# every source text before SentencePiece (absent: none).
NORMALIZATION = "normalization.json"
# {"precision", "chosen_by", "rates", "seconds"}: what the directory's training runs in,
# and how it was chosen (trainer/training/precision.py); a training matter, not copied to
# directories made from this one.
PRECISION_FILE = "precision.json"
# How text becomes the model's ids and back: what a run started from another inherits.
VOCABULARY_FILES = (SHARED_MODEL, SOURCE_MODEL, TARGET_MODEL, VOCABULARY, NORMALIZATION)
# Everything beside the checkpoints that a reader of the model needs.
MODEL_FILES = (CONFIG_FILE,) + VOCABULARY_FILES


class ModelDirError(ValueError):
    """The model directory cannot serve the run as asked; the message is one line."""


def copy_model_files(from_dir: str, to_dir: str,
                     names: Sequence[str] = MODEL_FILES) -> List[str]:
    """Copies those of `names` (MODEL_FILES by default) that from_dir holds into to_dir,
    each atomically; returns the names copied."""
    found = [name for name in names if tf.io.gfile.exists(os.path.join(from_dir, name))]
    if found:
        tf.io.gfile.makedirs(to_dir)
    for name in found:
        with tf.io.gfile.GFile(os.path.join(from_dir, name), "rb") as f:
            files.write_atomically(os.path.join(to_dir, name), f.read())
    return found


def save_config(model_dir: str, model_config: TransformerConfig,
                decode: Optional[DecodeConfig] = None):
    """Writes config.json: {"model": the TransformerConfig, "decode": the DecodeConfig the
    programs translate with by default} (decode None: the one stored, if any). A second
    run on the same directory must ask for the same model; its decoding settings replace
    the stored ones.

    Raises ModelDirError, naming the fields that differ, when the directory holds another.
    """
    path = os.path.join(model_dir, CONFIG_FILE)
    if tf.io.gfile.exists(path):
        saved = load_config(model_dir)
        if saved != model_config:
            asked = model_config.to_dict()
            changed = {k: (v, asked[k]) for k, v in saved.to_dict().items() if asked[k] != v}
            raise ModelDirError(f"{model_dir} holds a different model (saved vs asked: {changed}); "
                             "use another --model_dir")
        if decode is None and _read(path).get("decode") is not None:
            decode = load_decode(model_dir)
    contents = {"model": model_config.to_dict()}
    if decode is not None:
        contents["decode"] = decode.to_dict()
    tf.io.gfile.makedirs(model_dir)
    files.write_atomically(path, json.dumps(contents, indent=2))


def load_config(model_dir: str) -> TransformerConfig:
    """The TransformerConfig that `save_config` wrote to model_dir.

    Raises FileNotFoundError when there is none, ModelDirError when it cannot be read (a
    half-written or edited file), each naming the file.
    """
    path = os.path.join(model_dir, CONFIG_FILE)
    with _reading(path):
        return TransformerConfig.from_dict(_read(path)["model"])


def load_decode(model_dir: str) -> DecodeConfig:
    """The DecodeConfig stored in model_dir's config.json: how its model translates
    unless a flag says otherwise (the paper's settings for a directory written before
    config.json held them). Raises as `load_config`."""
    path = os.path.join(model_dir, CONFIG_FILE)
    with _reading(path):
        return DecodeConfig.from_dict(_read(path).get("decode") or {})


def _read(path: str) -> dict:
    """config.json's contents; FileNotFoundError naming it when there is none."""
    if not tf.io.gfile.exists(path):
        model_dir = os.path.dirname(path)
        raise FileNotFoundError(f"{path} not found: is {model_dir} a model directory of "
                                "python -m trainer.task?")
    with tf.io.gfile.GFile(path) as f:
        return json.load(f)


@contextlib.contextmanager
def _reading(path: str):
    """Turns what a half-written or edited config.json raises into one ModelDirError."""
    try:
        yield
    except (ValueError, KeyError, TypeError, AttributeError) as e:  # JSONDecodeError too
        raise ModelDirError(f"{path} is damaged ({_one_line(e)}); restore it from a copy, "
                            "or use another model directory") from None


def warn_on_stderr(message: str):
    """The default `warn` of the functions below: one line on stderr."""
    print(f"warning: {message}", file=sys.stderr, flush=True)


def checkpoint_state(model_dir: str):
    """The directory's checkpoint index (`tf.train.get_checkpoint_state`), None when it
    has no checkpoint. Raises ModelDirError, one line, when the index
    (`<model_dir>/checkpoint`) is there but does not read while checkpoint files lie beside
    it: TensorFlow would take the directory for an empty one, and a trainer would start
    over on top of them. (No index at all is what a kill leaves before the first
    checkpoint is recorded: a new start, as TensorFlow takes it.)"""
    index = os.path.join(model_dir, "checkpoint")
    try:
        state, reason = tf.train.get_checkpoint_state(model_dir), "it does not parse"
    except ValueError as e:  # parses, but names no newest checkpoint
        state, reason = None, _one_line(e)
    if (state is None and tf.io.gfile.exists(index)
            and tf.io.gfile.glob(os.path.join(model_dir, "ckpt-*.index"))):
        raise ModelDirError(
            f"{index}, the index of the checkpoints beside it, cannot be used ({reason}); "
            "restore it from a copy, or write it naming the newest: "
            'model_checkpoint_path: "ckpt-<step>"')
    return state


def checkpoints(model_dir: str) -> List[str]:
    """Checkpoint prefixes of the directory, oldest first."""
    state = checkpoint_state(model_dir)
    if state is None or not state.all_model_checkpoint_paths:
        raise FileNotFoundError(f"no checkpoint in {model_dir}")
    return list(state.all_model_checkpoint_paths)


def damage(checkpoint: str) -> Optional[str]:
    """Why the checkpoint at prefix `checkpoint` cannot be read whole (a file cut short
    by a crash or a full disk, or missing), or None when every tensor reads."""
    try:
        reader = tf.train.load_checkpoint(checkpoint)
        for name in reader.get_variable_to_shape_map():
            reader.get_tensor(name)
    except (tf.errors.OpError, IndexError, ValueError, RuntimeError) as e:
        return _one_line(getattr(e, "message", e))
    return None


def intact_checkpoints(model_dir: str, count: int = 1,
                       warn: Callable[[str], None] = warn_on_stderr) -> List[str]:
    """The newest `count` checkpoints of model_dir that read whole, oldest first; each
    damaged one passed over is named by one `warn` line. Fewer when fewer are intact;
    raises ModelDirError when none is."""
    found = []
    for path in reversed(checkpoints(model_dir)):
        reason = damage(path)
        if reason is None:
            found.insert(0, path)
            if len(found) == count:
                break
        else:
            warn(f"checkpoint {path} is damaged ({reason}); passing over it")
    if not found:
        raise ModelDirError(f"every checkpoint in {model_dir} is damaged")
    return found


def restore_model(model_dir: str, checkpoint: Optional[str] = None,
                  warn: Callable[[str], None] = warn_on_stderr) -> Transformer:
    """The float32 model of `checkpoint` (default: the newest intact one) in
    `model_dir`."""
    model = Transformer(load_config(model_dir))
    model.build()
    tf.train.Checkpoint(model=model).restore(
        checkpoint or intact_checkpoints(model_dir, warn=warn)[-1]).expect_partial()
    return model


def _one_line(error) -> str:
    """An exception's message on one short line."""
    return " ".join(str(error).split())[:160]
