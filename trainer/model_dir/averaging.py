"""Checkpoint averaging (paper section 6.1): "for the base models, we used a single model
obtained by averaging the last 5 checkpoints, which were written at 10-minute intervals.
For the big models, we averaged the last 20 checkpoints."

The averaged model is written as a model directory of its own, `<model_dir>/averaged`,
with config.json, the vocabulary and one checkpoint `ckpt-<last step>`.
"""

import os
import shutil
from typing import Callable, List, Optional, Tuple

import numpy as np
import tensorflow as tf

from keras_transformer import Transformer
from trainer.training import model_dir as model_dir_lib, moving_average

AVERAGED_DIR = "averaged"
# What an export ships (--export_weights).
WEIGHTS = ("last", "average", "ema")


def average_checkpoints(model_dir: str, last: int,
                        warn: Callable[[str], None] = print) -> Tuple[Transformer, List[str]]:
    """The model whose weights are the mean of the last `last` checkpoints' weights.

    Returns (Transformer, list of the checkpoint prefixes averaged). `warn` is told when
    the directory holds fewer than `last` checkpoints (all of them are averaged).
    """
    if last < 1:
        raise ValueError(f"--last must be at least 1, got {last}")
    paths = model_dir_lib.checkpoints(model_dir)[-last:]
    if len(paths) < last:
        warn(f"only {len(paths)} checkpoints in {model_dir}; averaging them")
    model = model_dir_lib.restore_model(model_dir, paths[0])
    total = [np.zeros(w.shape, np.float64) for w in model.weights]
    for path in paths:
        model = model_dir_lib.restore_model(model_dir, path) if path != paths[0] else model
        for t, w in zip(total, model.get_weights()):
            t += w
    model.set_weights([(t / len(paths)).astype(w.dtype) for t, w in zip(total, model.weights)])
    return model, paths


def final_model(model_dir: str, average_last: int = 0, weights: Optional[str] = None
                ) -> Tuple[Transformer, List[str]]:
    """(the model to ship from model_dir, the checkpoint prefixes it comes from).

    weights: one of WEIGHTS: "last", the latest checkpoint's weights; "average", the mean
      of the last `average_last` checkpoints; "ema", the moving average of the weights
      kept in the latest checkpoint (a run with --ema_decay). None: "average" when
      average_last is set, else "last".
    """
    weights = weights or ("average" if average_last else "last")
    if weights not in WEIGHTS:
        raise ValueError(f"unknown weights {weights!r}; choose one of {', '.join(WEIGHTS)}")
    if weights == "average":
        if average_last < 1:
            raise ValueError("averaging needs the number of checkpoints: --average_last=N")
        return average_checkpoints(model_dir, average_last)
    paths = model_dir_lib.checkpoints(model_dir)[-1:]
    model = model_dir_lib.restore_model(model_dir, paths[0])
    if weights == "ema":
        moving_average.load_into(model, paths[0])
    return model, paths


def write_averaged(model_dir: str, last: int, warn: Callable[[str], None] = print
                   ) -> Tuple[str, List[str]]:
    """Averages the last `last` checkpoints into <model_dir>/averaged (replacing an earlier
    average). Returns (the new checkpoint prefix, the checkpoints averaged)."""
    model, paths = average_checkpoints(model_dir, last, warn)
    out = os.path.join(model_dir, AVERAGED_DIR)
    staging = out + ".tmp"
    shutil.rmtree(staging, ignore_errors=True)
    os.makedirs(staging)
    for name in os.listdir(model_dir):
        if name == model_dir_lib.CONFIG_FILE or name.endswith(".model"):
            shutil.copy(os.path.join(model_dir, name), staging)
    step = int(paths[-1].rsplit("-", 1)[-1])
    manager = tf.train.CheckpointManager(tf.train.Checkpoint(model=model), staging, max_to_keep=1)
    manager.save(checkpoint_number=step)
    shutil.rmtree(out, ignore_errors=True)
    os.rename(staging, out)
    # CheckpointManager recorded the staging path; point the state file at the final one.
    tf.train.update_checkpoint_state(out, os.path.join(out, f"ckpt-{step}"))
    return os.path.join(out, f"ckpt-{step}"), paths
