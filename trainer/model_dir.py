"""The layout of a model directory: config.json, the SentencePiece model(s),
checkpoints (ckpt-<step>) and TensorBoard summaries (train/, eval/)."""

import dataclasses
import json
import os

import tensorflow as tf

from keras_transformer import Transformer, TransformerConfig

CONFIG_FILE = "config.json"


def save_config(model_dir: str, model_config: TransformerConfig, **extra):
    """Writes config.json; a second run on the same directory must ask for the same model."""
    path = os.path.join(model_dir, CONFIG_FILE)
    record = {"model": dataclasses.asdict(model_config), **extra}
    if tf.io.gfile.exists(path):
        saved = load_config(model_dir)
        if saved != model_config:
            changed = {k: (v, getattr(model_config, k)) for k, v in
                       dataclasses.asdict(saved).items() if getattr(model_config, k) != v}
            raise ValueError(f"{model_dir} holds a different model (saved vs asked: {changed}); "
                             "use another --model_dir")
    tf.io.gfile.makedirs(model_dir)
    with tf.io.gfile.GFile(path + ".tmp", "w") as f:
        json.dump(record, f, indent=2)
    tf.io.gfile.rename(path + ".tmp", path, overwrite=True)


def load_config(model_dir: str) -> TransformerConfig:
    path = os.path.join(model_dir, CONFIG_FILE)
    if not tf.io.gfile.exists(path):
        raise FileNotFoundError(f"{path} not found: is {model_dir} a model directory of "
                                "python -m trainer.task?")
    with tf.io.gfile.GFile(path) as f:
        return TransformerConfig(**json.load(f)["model"])


def checkpoints(model_dir: str):
    """Checkpoint prefixes of the directory, oldest first."""
    state = tf.train.get_checkpoint_state(model_dir)
    if state is None or not state.all_model_checkpoint_paths:
        raise FileNotFoundError(f"no checkpoint in {model_dir}")
    return list(state.all_model_checkpoint_paths)


def restore_model(model_dir: str, checkpoint: str = None) -> Transformer:
    """The float32 model of `checkpoint` (default: the latest) in `model_dir`."""
    model = Transformer(load_config(model_dir))
    model.build()
    tf.train.Checkpoint(model=model).restore(
        checkpoint or checkpoints(model_dir)[-1]).expect_partial()
    return model
