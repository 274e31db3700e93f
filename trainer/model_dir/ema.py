"""An exponential moving average (EMA) of the weights, kept in the checkpoint beside them
and exported on request (`--ema_decay`, `--export_weights=ema`).

After update t (1, 2, ...), ema = d_t * ema + (1 - d_t) * weights, starting from the
initial weights, with d_t = min(decay, (1 + t) / (10 + t)): the schedule of
tf.train.ExponentialMovingAverage's num_updates (and OpenNMT-tf's EMA), so that a decay
of 0.9999 does not keep the random initial weights for tens of thousands of updates.
"""

from typing import List

import tensorflow as tf


def decay_at(decay: float, step) -> tf.Tensor:
    """d_t, the weight of the previous average after update `step` (float32 [])."""
    step = tf.cast(step, tf.float32)
    return tf.minimum(tf.constant(decay, tf.float32), (1.0 + step) / (10.0 + step))


class MovingAverage(tf.Module):
    """The EMA of `variables` (float32 copies, one per variable, created in the current
    strategy's scope so that every replica holds one).

    Args:
      variables: the model's trainable variables.
      decay: the largest d_t, e.g. 0.9999.
    """

    def __init__(self, variables, decay: float):
        super().__init__(name="moving_average")
        if not 0.0 < decay < 1.0:
            raise ValueError(f"ema_decay must be in (0, 1), got {decay}")
        self.decay = decay
        self.averages: List[tf.Variable] = [
            tf.Variable(tf.cast(tf.convert_to_tensor(v), tf.float32), trainable=False,
                        name=f"average_{i}") for i, v in enumerate(variables)]

    def update(self, strategy: tf.distribute.Strategy, variables, step):
        """After update `step`: every replica's averages move towards its copy of the
        variables (the cross-replica context, like the trainer's Adam)."""
        d = decay_at(self.decay, step)
        for average, variable in zip(self.averages, variables):
            strategy.extended.update(
                average, lambda a, v: a.assign(d * a + (1.0 - d) * tf.cast(v, tf.float32)),
                args=(getattr(variable, "value", variable),), group=False)

    def reset(self, variables):
        """Restarts the average at `variables`' values (a run that resumes with EMA from a
        checkpoint that has none)."""
        for average, variable in zip(self.averages, variables):
            average.assign(tf.cast(tf.convert_to_tensor(variable), tf.float32))

    def copy_to(self, variables):
        """Sets `variables` (a model's trainable variables, in this order) to the EMA."""
        for average, variable in zip(self.averages, variables):
            variable.assign(tf.cast(average, variable.dtype))


def load_into(model, checkpoint: str):
    """Sets `model`'s trainable weights to the EMA stored in `checkpoint` (a prefix).
    Raises ValueError when the checkpoint holds none (the run had no --ema_decay)."""
    average = MovingAverage(model.trainable_variables, 0.5)  # the decay is not stored
    names = {name for name, _ in tf.train.list_variables(checkpoint)}
    if not any(name.startswith("moving_average/") for name in names):
        raise ValueError(f"{checkpoint} holds no moving average of the weights: train "
                         "with --ema_decay to keep one")
    tf.train.Checkpoint(moving_average=average).restore(checkpoint).expect_partial()
    average.copy_to(model.trainable_variables)
