"""A run's checkpoints: the model and the optimizer, whose iteration count is the step
(the training stream's position is saved beside them: trainer/training/training_stream.py).

Every worker of a MultiWorkerMirroredStrategy takes part in saving; only the chief keeps
what it writes (`distribute.worker_dir`). `kill -9` at any moment leaves only complete
checkpoints: tf.train.CheckpointManager writes the state file after the data.
"""

import os
from typing import Optional

import tensorflow as tf

from trainer.training import distribute
from trainer.training.moving_average import MovingAverage


class Checkpointer:
    """Saves and restores the model and optimizer of one run as `<model_dir>/ckpt-<step>`.

    Args:
      model, optimizer: what a checkpoint holds.
      model_dir: the run's model directory.
      keep: checkpoints kept (the oldest are deleted); averaging reads the last ones.
      moving_average: the EMA of the weights (trainer/training/moving_average.py), if the
        run keeps one.
    """

    def __init__(self, model, optimizer, model_dir: str, keep: int,
                 moving_average: Optional[MovingAverage] = None):
        self.model_dir, self.model, self.optimizer = model_dir, model, optimizer
        self.moving_average = moving_average
        tracked = {} if moving_average is None else {"moving_average": moving_average}
        self.checkpoint = tf.train.Checkpoint(model=model, optimizer=optimizer, **tracked)
        self.manager = tf.train.CheckpointManager(
            self.checkpoint, distribute.worker_dir(model_dir), max_to_keep=keep,
            checkpoint_name="ckpt")

    @property
    def step(self) -> int:
        """Updates applied so far: the optimizer's iteration count."""
        return int(self.optimizer.iterations.numpy())

    @property
    def latest(self) -> Optional[str]:
        """The newest checkpoint prefix in the model directory, if any."""
        return tf.train.latest_checkpoint(self.model_dir)

    def restore(self) -> int:
        """Restores the latest checkpoint, if there is one; returns the step it holds."""
        if self.latest:
            self.checkpoint.restore(self.latest).assert_existing_objects_matched()
            if self.moving_average is not None and not any(
                    name.startswith("moving_average/")
                    for name, _ in tf.train.list_variables(self.latest)):
                # EMA switched on at a resume: it starts from the restored weights.
                self.moving_average.reset(self.model.trainable_variables)
        return self.step

    def save(self, step: int) -> str:
        """Writes the checkpoint of `step` (every worker takes part); returns its path in
        the model directory, `<model_dir>/ckpt-<step>`."""
        self.manager.save(checkpoint_number=step)
        if not distribute.is_chief():
            tf.io.gfile.rmtree(distribute.worker_dir(self.model_dir))
        return os.path.join(self.model_dir, f"ckpt-{step}")
