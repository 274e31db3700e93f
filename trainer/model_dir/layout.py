"""The layout of a model directory: config.json, the SentencePiece model(s),
checkpoints (ckpt-<step>) and TensorBoard summaries (train/, eval/)."""

import json
import os
from typing import List, Optional

import tensorflow as tf

from keras_transformer import Transformer, TransformerConfig
from trainer import files

CONFIG_FILE = "config.json"


class ModelDirError(ValueError):
    """The model directory cannot serve the run as asked; the message is one line."""


def save_config(model_dir: str, model_config: TransformerConfig):
    """Writes config.json; a second run on the same directory must ask for the same model.

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
    tf.io.gfile.makedirs(model_dir)
    files.write_atomically(path, json.dumps({"model": model_config.to_dict()}, indent=2))


def load_config(model_dir: str) -> TransformerConfig:
    """The TransformerConfig that `save_config` wrote to model_dir."""
    path = os.path.join(model_dir, CONFIG_FILE)
    if not tf.io.gfile.exists(path):
        raise FileNotFoundError(f"{path} not found: is {model_dir} a model directory of "
                                "python -m trainer.task?")
    with tf.io.gfile.GFile(path) as f:
        return TransformerConfig.from_dict(json.load(f)["model"])


def checkpoints(model_dir: str) -> List[str]:
    """Checkpoint prefixes of the directory, oldest first."""
    state = tf.train.get_checkpoint_state(model_dir)
    if state is None or not state.all_model_checkpoint_paths:
        raise FileNotFoundError(f"no checkpoint in {model_dir}")
    return list(state.all_model_checkpoint_paths)


def restore_model(model_dir: str, checkpoint: Optional[str] = None) -> Transformer:
    """The float32 model of `checkpoint` (default: the latest) in `model_dir`."""
    model = Transformer(load_config(model_dir))
    model.build()
    tf.train.Checkpoint(model=model).restore(
        checkpoint or checkpoints(model_dir)[-1]).expect_partial()
    return model
