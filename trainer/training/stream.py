"""The training batches of a run, and their place in its checkpoints.

Each worker reads its shard of the training pairs through one tf.data iterator, which
feeds the worker's replicas in turn (replica 0 the first batch, replica 1 the next, ...).
With every model checkpoint, each worker saves that iterator's state (its position in
the shuffled order, the pairs being tokenized, the bucketing windows, the batches in
flight: a few hundred kB, whatever the corpus, as the order is a permutation drawn from
the seed and the epoch over the pairs in memory, trainer/data/shuffling.py) as
`<model_dir>/training_stream/pipeline_<i>/ckpt-<step>`, so a resumed run restores its
stream where the checkpointed run left it, in a time that does not grow with the step.
tf.distribute's own iterators cannot be checkpointed, hence the plain one.

A model checkpoint without a stream state (written before there was one, or after the
data settings changed) falls back to replay: the stream is deterministic (seeded
shuffle, ordered maps), so skipping the batches the checkpointed run consumed gives the
same stream, in a time that grows with the step. (With subword sampling only the pairs'
order is: their segmentations, and so their bucketing into batches, are drawn anew, and
the replay lands near the checkpointed run's place, not on it.)
"""

import os
import time
from typing import Callable

import tensorflow as tf

from trainer.data.input_pipeline import Data


class TrainingStream:
    """The per-replica training batches of this worker, saved and restored with the
    model's checkpoints.

    Args:
      strategy: the run's strategy; it decides the input pipelines (one per worker) and
        the replicas each feeds.
      data: the run's data (`Data.train_dataset` is the stream).
      model_dir: the run's model directory.
      keep: stream states kept, as many as model checkpoints.
      batches_per_step: batches each replica takes per update (accum_steps).
      log: where the stream says what it did (reading the pairs, restoring its place).
    """

    def __init__(self, strategy: tf.distribute.Strategy, data: Data, model_dir: str,
                 keep: int, batches_per_step: int, log: Callable[[str], None] = print):
        self.strategy, self.data, self.batches_per_step = strategy, data, batches_per_step
        self.log = log
        contexts = []  # The strategy's own split into input pipelines, for this worker.
        strategy.distribute_datasets_from_function(
            lambda context: contexts.append(context) or tf.data.Dataset.range(1))
        self.context = contexts[0]
        self.replicas_fed = strategy.num_replicas_in_sync // self.context.num_input_pipelines
        self.directory = os.path.join(model_dir, "training_stream",
                                      f"pipeline_{self.context.input_pipeline_id}")
        self.keep = keep
        self._start()

    def _start(self):
        """The stream from its beginning."""
        start = time.perf_counter()
        self.iterator = iter(self.data.train_dataset(self.context))
        self.log(f"training stream: pairs read into memory, a seeded permutation per epoch, "
                 f"in {time.perf_counter() - start:.1f} s")
        self.checkpoint = tf.train.Checkpoint(iterator=self.iterator)
        self.manager = tf.train.CheckpointManager(self.checkpoint, self.directory,
                                                  max_to_keep=self.keep, checkpoint_name="ckpt")

    def restore(self, step: int):
        """Positions the stream after `step` updates: from the state saved with that
        step's checkpoint, else by replaying the batches those updates consumed."""
        if not step:
            return
        prefix = os.path.join(self.directory, f"ckpt-{step}")
        if prefix in self.manager.checkpoints:
            try:
                self.checkpoint.restore(prefix).assert_consumed()
                self.log(f"training stream restored from {prefix}")
                return
            except (tf.errors.OpError, AssertionError, ValueError) as e:
                reason = " ".join(str(getattr(e, "message", e)).split())[:200]
                self.log(f"training stream state {prefix} does not fit this pipeline ({reason})")
                self._start()
        batches = step * self.batches_per_step * self.replicas_fed
        self.log(f"training stream: no state saved at step {step}; replaying {batches} batches")
        for _ in range(batches):  # Python steps: a skip() would change the saved graph
            next(self.iterator)

    def save(self, step: int):
        """Saves the stream's position after `step` updates (every worker its own)."""
        self.manager.save(checkpoint_number=step)

    def next(self):
        """The next batch of every replica: ((source_ids, target_input_ids),
        target_output_ids) of PerReplica int32 [batch, length] values."""
        batches = [next(self.iterator) for _ in range(self.replicas_fed)]
        first = self.context.input_pipeline_id * self.replicas_fed
        devices = self.strategy.extended.worker_devices

        def on_device(context):  # The replica's batch, copied to the replica's device.
            local = context.replica_id_in_sync_group - first
            with tf.device(devices[local]):
                return tf.nest.map_structure(tf.identity, batches[local])

        return self.strategy.experimental_distribute_values_from_function(on_device)
