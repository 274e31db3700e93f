"""python -m trainer.average --model_dir=DIR --last=N: average the last N checkpoints.

The paper averages the last 5 (base) or 20 (big) checkpoints, written at 10-minute
intervals. The averaged model is written as a checkpoint `<model_dir>/averaged/ckpt-<step>`
that `python -m trainer.export --model_dir=DIR/averaged` (or `--average_last=N`) exports.
"""

import os
import shutil
import sys

from absl import app, flags

FLAGS = flags.FLAGS


def average_checkpoints(model_dir: str, last: int):
    """The model whose weights are the mean of the last `last` checkpoints' weights.

    Returns (Transformer, list of the checkpoint prefixes averaged).
    """
    import numpy as np
    from trainer import model_dir as model_dir_lib

    if last < 1:
        raise ValueError(f"--last must be at least 1, got {last}")
    paths = model_dir_lib.checkpoints(model_dir)[-last:]
    if len(paths) < last:
        print(f"trainer.average: only {len(paths)} checkpoints in {model_dir}; averaging them",
              file=sys.stderr)
    model = model_dir_lib.restore_model(model_dir, paths[0])
    total = [np.zeros(w.shape, np.float64) for w in model.weights]
    for path in paths:
        model = model_dir_lib.restore_model(model_dir, path) if path != paths[0] else model
        for t, w in zip(total, model.get_weights()):
            t += w
    model.set_weights([(t / len(paths)).astype(w.dtype) for t, w in zip(total, model.weights)])
    return model, paths


def write_averaged(model_dir: str, last: int) -> str:
    """Averages and saves to <model_dir>/averaged (replacing an earlier average);
    returns the checkpoint prefix. The directory gets config.json and the vocabulary too,
    so it is a model directory of its own."""
    import tensorflow as tf
    from trainer import model_dir as model_dir_lib

    model, paths = average_checkpoints(model_dir, last)
    out = os.path.join(model_dir, "averaged")
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
    print(f"averaged {len(paths)} checkpoints ({', '.join(os.path.basename(p) for p in paths)})"
          f" into {out}")
    return os.path.join(out, f"ckpt-{step}")


def _define_flags():
    # Defined only when run as a program: trainer.export and trainer.task import this module
    # and have flags of the same names.
    flags.DEFINE_string("model_dir", None, "Model directory of python -m trainer.task.")
    flags.DEFINE_integer("last", 5, "Number of most recent checkpoints to average (paper: 5 "
                         "for base, 20 for big).")


def main(argv):
    del argv
    if not FLAGS.model_dir:
        print("trainer.average: error: --model_dir is required", file=sys.stderr)
        sys.exit(2)
    try:
        write_averaged(FLAGS.model_dir, FLAGS.last)
    except (FileNotFoundError, ValueError) as e:
        print(f"trainer.average: error: {e}", file=sys.stderr)
        sys.exit(2)


if __name__ == "__main__":
    _define_flags()
    app.run(main)
