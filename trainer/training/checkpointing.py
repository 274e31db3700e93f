"""A run's checkpoints: the model, the optimizer, whose iteration count is the step, and
the state of dropout's random numbers, so that a resumed run draws the masks an
uninterrupted one would, and with a dropout schedule the largest progress of the run reached
(the training stream's position is saved beside them: trainer/training/stream.py).

Every worker of a MultiWorkerMirroredStrategy takes part in saving; only the chief keeps
what it writes (`distribute.worker_dir`). `kill -9` at any moment leaves only complete
checkpoints: tf.train.CheckpointManager writes the state file after the data.
"""

import os
from typing import Callable, Optional, Set

import keras
import tensorflow as tf

from trainer.model_dir import layout
from trainer.model_dir.ema import MovingAverage
from trainer.training import distribute
from trainer.training.dropout_schedule import ScheduledRate

# A float16 run's checkpoint holds its loss scale (keras.optimizers.LossScaleOptimizer).
_LOSS_SCALE = "optimizer/dynamic_scale/"
_MOVING_AVERAGE = "moving_average/"
_DROPOUT_RNG = "dropout_rng/"
_DROPOUT_PROGRESS = "dropout_progress/"


def dropout_states(model: keras.Model):
    """The state variables of the model's dropout seed generators (Keras leaves them out
    of the model's own checkpoint), in the model's order."""
    return [v for v in model.non_trainable_variables if v.name == "seed_generator_state"]


class Checkpointer:
    """Saves and restores the model and optimizer of one run as `<model_dir>/ckpt-<step>`.

    Args:
      model, optimizer: what a checkpoint holds.
      model_dir: the run's model directory.
      keep: checkpoints kept (the oldest are deleted); averaging reads the last ones.
      moving_average: the EMA of the weights (trainer/model_dir/ema.py), if the
        run keeps one.
      dropout: a dropout schedule's state (trainer/training/dropout_schedule.py), if the
        run follows one: the checkpoint keeps the largest progress of the run reached.
    """

    def __init__(self, model, optimizer, model_dir: str, keep: int,
                 moving_average: Optional[MovingAverage] = None,
                 dropout: Optional[ScheduledRate] = None):
        self.model_dir, self.model, self.optimizer = model_dir, model, optimizer
        self.moving_average, self.dropout = moving_average, dropout
        self.tracked = {"model": model, "optimizer": optimizer}
        if moving_average is not None:
            self.tracked["moving_average"] = moving_average
        if dropout is not None:
            self.tracked["dropout_progress"] = dropout.progress
        dropout_rng = dropout_states(model)
        if dropout_rng:
            self.tracked["dropout_rng"] = dropout_rng
        self.checkpoint = tf.train.Checkpoint(**self.tracked)
        self.restored: Optional[str] = None  # the checkpoint `restore` read
        self.manager = tf.train.CheckpointManager(
            self.checkpoint, distribute.worker_dir(model_dir), max_to_keep=keep,
            checkpoint_name="ckpt")

    @property
    def step(self) -> int:
        """Updates applied so far: the optimizer's iteration count."""
        return int(self.optimizer.iterations.numpy())

    @property
    def latest(self) -> Optional[str]:
        """The newest checkpoint prefix in the model directory, if any (ModelDirError when
        its index is damaged: `layout.checkpoint_state`)."""
        state = layout.checkpoint_state(self.model_dir)
        return state.model_checkpoint_path if state else None

    def restore(self, log: Callable[[str], None] = print) -> int:
        """Restores the newest checkpoint that reads whole, if there is one; returns the
        step it holds (0 without one).

        A damaged checkpoint (cut short by a crash or a full disk) is passed over with a
        warning line. A moving average that the checkpoint lacks starts from the restored
        weights, dropout's random numbers it lacks (a checkpoint from before they were
        kept) from the seed, and a dropout schedule's progress it lacks (a run that had
        none) from this run's, each with a line saying so. Raises ModelDirError, one line
        naming the flag and the checkpoint, when this run's flags build what the checkpoint
        cannot fill.
        """
        if not self.latest:
            return self.step
        path = layout.intact_checkpoints(
            self.model_dir, warn=lambda message: log(f"warning: {message}"))[-1]
        names = {name for name, _ in tf.train.list_variables(path)}
        self._check_precision(path, names)
        lacks = {key for key, prefix in (("moving_average", _MOVING_AVERAGE),
                                         ("dropout_rng", _DROPOUT_RNG),
                                         ("dropout_progress", _DROPOUT_PROGRESS))
                 if key in self.tracked and not any(name.startswith(prefix) for name in names)}
        checkpoint = tf.train.Checkpoint(
            **{key: value for key, value in self.tracked.items() if key not in lacks})
        try:
            checkpoint.restore(path).assert_existing_objects_matched()
        except AssertionError as e:
            reason = " ".join(str(e).split())[:120]
            raise layout.ModelDirError(
                f"{path} does not hold what these flags build ({reason}...); resume with "
                "the flags that wrote it, or use another --model_dir") from None
        if "moving_average" in lacks:
            self.moving_average.reset(self.model.trainable_variables)
            log(f"{path} holds no moving average of the weights: --ema_decay="
                f"{self.moving_average.decay:g} starts one from its weights at step {self.step}")
        if "dropout_rng" in lacks:
            log(f"{path} holds no state of dropout's random numbers: the masks after step "
                f"{self.step} are drawn from the seed's start, not where its run left them")
        if "dropout_progress" in lacks:
            log(f"{path} holds no progress of a dropout schedule: --dropout_schedule="
                f"{self.dropout.schedule} starts from this run's progress at step {self.step}")
        self.restored = path
        return self.step

    def _check_precision(self, path: str, names: Set[str]):
        """Raises ModelDirError when float16 loss scaling differs between the checkpoint
        and this run: the optimizer's state is laid out differently with and without."""
        trained_scaled = any(name.startswith(_LOSS_SCALE) for name in names)
        scaled = isinstance(self.optimizer, keras.optimizers.LossScaleOptimizer)
        if trained_scaled and not scaled:
            raise layout.ModelDirError(
                f"--precision contradicts {path}, which was trained with "
                "--precision=mixed_float16 (its loss scale is in the checkpoint); resume with "
                "--precision=mixed_float16, or use another --model_dir")
        if scaled and not trained_scaled:
            raise layout.ModelDirError(
                f"--precision=mixed_float16 contradicts {path}, which was trained without "
                "float16 loss scaling (--precision=float32 or mixed_bfloat16); resume with "
                "its precision, or use another --model_dir")

    def save(self, step: int) -> str:
        """Writes the checkpoint of `step` (every worker takes part); returns its path in
        the model directory, `<model_dir>/ckpt-<step>`."""
        self.manager.save(checkpoint_number=step)
        if not distribute.is_chief():
            tf.io.gfile.rmtree(distribute.worker_dir(self.model_dir))
        return os.path.join(self.model_dir, f"ckpt-{step}")
