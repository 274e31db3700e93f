"""Checkpoint averaging (paper section 6.1): "for the base models, we used a single model
obtained by averaging the last 5 checkpoints, which were written at 10-minute intervals.
For the big models, we averaged the last 20 checkpoints."

The averaged model is written as a model directory of its own, `<model_dir>/averaged`,
with the files that make a model directory (`layout.MODEL_FILES`: config.json, the
vocabulary, its normalization) and one checkpoint `ckpt-<last step>`.
"""

import os
from typing import Callable, List, Tuple

import numpy as np
import tensorflow as tf

from keras_transformer import Transformer
from trainer.model_dir import files, layout

AVERAGED_DIR = "averaged"


def average_checkpoints(model_dir: str, last: int,
                        warn: Callable[[str], None] = layout.warn_on_stderr
                        ) -> Tuple[Transformer, List[str]]:
    """The model whose weights are the mean of the last `last` intact checkpoints'
    weights.

    Returns (Transformer, list of the checkpoint prefixes averaged). `warn` is told of
    each damaged checkpoint passed over, and when the directory holds fewer than `last`
    intact ones (all of them are averaged).
    """
    if last < 1:
        raise ValueError(f"--last must be at least 1, got {last}")
    paths = layout.intact_checkpoints(model_dir, last, warn)
    if len(paths) < last:
        warn(f"only {len(paths)} checkpoints in {model_dir}; averaging them")
    model = layout.restore_model(model_dir, paths[0])
    total = [np.zeros(w.shape, np.float64) for w in model.weights]
    for path in paths:
        model = layout.restore_model(model_dir, path) if path != paths[0] else model
        for t, w in zip(total, model.get_weights()):
            t += w
    model.set_weights([(t / len(paths)).astype(w.dtype) for t, w in zip(total, model.weights)])
    return model, paths


def write_averaged(model_dir: str, last: int,
                   warn: Callable[[str], None] = layout.warn_on_stderr
                   ) -> Tuple[str, List[str]]:
    """Averages the last `last` checkpoints into <model_dir>/averaged (replacing an earlier
    average). Returns (the new checkpoint prefix, the checkpoints averaged)."""
    model, paths = average_checkpoints(model_dir, last, warn)
    step = int(paths[-1].rsplit("-", 1)[-1])
    with files.staged_directory(model_dir) as staging:
        layout.copy_model_files(model_dir, staging.path)
        # The manager's state file names the checkpoint relative to its directory, so it
        # still holds once the directory is renamed.
        tf.train.CheckpointManager(tf.train.Checkpoint(model=model), staging.path,
                                   max_to_keep=1).save(checkpoint_number=step)
        out = staging.publish(os.path.join(model_dir, AVERAGED_DIR), replace=True)
    return os.path.join(out, f"ckpt-{step}"), paths
