"""A run's checkpoints: the model and the optimizer, whose iteration count is the step,
and through the step the position of the training data stream.

Every worker of a MultiWorkerMirroredStrategy takes part in saving; only the chief keeps
what it writes (`distribute.worker_dir`). `kill -9` at any moment leaves only complete
checkpoints: tf.train.CheckpointManager writes the state file after the data.
"""

from typing import Optional

import tensorflow as tf

from trainer.data.input_pipeline import Data
from trainer.training import distribute


class Checkpointer:
    """Saves and restores the model and optimizer of one run as `<model_dir>/ckpt-<step>`.

    Args:
      model, optimizer: what a checkpoint holds.
      model_dir: the run's model directory.
      keep: checkpoints kept (the oldest are deleted); averaging reads the last ones.
    """

    def __init__(self, model, optimizer, model_dir: str, keep: int):
        self.model_dir, self.optimizer = model_dir, optimizer
        self.checkpoint = tf.train.Checkpoint(model=model, optimizer=optimizer)
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
        return self.step

    def save(self, step: int):
        self.manager.save(checkpoint_number=step)
        if not distribute.is_chief():
            tf.io.gfile.rmtree(distribute.worker_dir(self.model_dir))

    def training_stream(self, strategy: tf.distribute.Strategy, data: Data,
                        batches_per_step: int):
        """The per-replica training batches from where the restored step left them.

        tf.distribute iterators cannot be checkpointed, so the training stream is
        deterministic (seeded shuffle, ordered maps) and a resumed run skips the
        step * batches_per_step batches per replica that the checkpointed run consumed.
        """
        consumed = self.step * batches_per_step
        return iter(strategy.distribute_datasets_from_function(
            lambda context: data.train_dataset(context).skip(consumed)))
