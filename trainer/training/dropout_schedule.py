"""A schedule of the dropout rate over a run: `0.2@0,0.3@0.4` holds P_drop at 0.2 from the
start and at 0.3 from 40% of the run on ("late dropout": less dropout while a model is
underfitting, more once it would overfit; Liu et al., 2023, "Dropout Reduces Underfitting").

The run's progress is the cooldown's (`cooldown.run_progress`): the larger of step /
train_steps and, with a time budget, the invocation's elapsed / budget. A budget counts one
invocation only, so the checkpoint keeps the largest progress reached and a resumed run
takes the larger of that and its own (trainer/training/update.py holds both as variables,
which the model's dropouts read: `Transformer.follow_dropout`). The schedule is recorded in
the model directory (dropout_schedule.json): a run that resumes without
--dropout_schedule keeps it, and one given another schedule follows that one.

No TensorFlow here: the flags are checked before it starts.
"""

import dataclasses
import json
import os
from typing import Callable, Optional, Tuple

RECORD = "dropout_schedule.json"


@dataclasses.dataclass(frozen=True)
class DropoutSchedule:
    """Rates held from fractions of the run on.

    Attributes:
      rates: P_drop of each piece, each in [0, 1).
      starts: the progress each piece starts at: 0 first, then rising, each below 1.

    Example:

    >>> schedule = DropoutSchedule.parse("0.2@0,0.3@0.4")
    >>> schedule.rates, schedule.starts
    ((0.2, 0.3), (0.0, 0.4))
    >>> str(schedule)
    '0.2@0,0.3@0.4'
    """

    rates: Tuple[float, ...]
    starts: Tuple[float, ...]

    def __post_init__(self):
        if not self.rates or len(self.rates) != len(self.starts):
            raise ValueError("a dropout schedule needs one start per rate")
        if self.starts[0] != 0:
            raise ValueError(f"a dropout schedule starts at 0 (its first rate's @0), got "
                             f"@{self.starts[0]:g}")
        for rate in self.rates:
            if not 0.0 <= rate < 1.0:
                raise ValueError(f"dropout schedule rates must be in [0, 1), got {rate:g}")
        for before, start in zip(self.starts, self.starts[1:]):
            if not before < start < 1.0:
                raise ValueError(f"dropout schedule starts must rise and stay below 1, got "
                                 f"@{before:g} then @{start:g}")

    @classmethod
    def parse(cls, text: str) -> "DropoutSchedule":
        """`rate@start,...` (e.g. `0.2@0,0.3@0.4`); ValueError in one line if malformed."""
        rates, starts = [], []
        for piece in text.split(","):
            rate, at, start = piece.strip().partition("@")
            try:
                if not at:
                    raise ValueError
                rates.append(float(rate))
                starts.append(float(start))
            except ValueError:
                raise ValueError(f"dropout schedule pieces are rate@start (e.g. "
                                 f"0.2@0,0.3@0.4), got {piece.strip()!r}") from None
        return cls(tuple(rates), tuple(starts))

    def rate(self, progress):
        """P_drop at `progress` of the run (a float or a float32 [] tensor, in [0, 1]):
        the rate of the last piece that starts at or before it, as float32 []. In a
        traced update, or eagerly."""
        import tensorflow as tf
        piece = tf.searchsorted(tf.constant(self.starts, tf.float32),
                                tf.reshape(tf.cast(progress, tf.float32), [1]), side="right")
        return tf.gather(tf.constant(self.rates, tf.float32), piece[0] - 1)

    def __str__(self) -> str:
        return ",".join(f"{rate:g}@{start:g}" for rate, start in zip(self.rates, self.starts))


class ScheduledRate:
    """The schedule's state in a run: `rate`, the float32 [] variable the model's dropouts
    follow (`Transformer.follow_dropout`), and `progress`, the largest progress of the run
    reached, which the checkpoint keeps. Built in the strategy's scope (mirrored)."""

    def __init__(self, schedule: DropoutSchedule):
        import tensorflow as tf
        self.schedule = schedule
        self.rate = tf.Variable(schedule.rates[0], trainable=False, name="dropout_rate")
        self.progress = tf.Variable(0.0, trainable=False, name="dropout_progress")

    def advance(self, progress):
        """progress becomes the larger of itself and `progress` (float32 []), and the rate
        the schedule's there: the rate of the updates that follow. In a traced update or
        eagerly (after a restore)."""
        import tensorflow as tf
        self.progress.assign(tf.maximum(self.progress, tf.cast(progress, tf.float32)))
        self.rate.assign(self.schedule.rate(self.progress))


def read_record(model_dir: str) -> Optional[DropoutSchedule]:
    """The schedule recorded in model_dir (None when there is none)."""
    import tensorflow as tf  # here: the module is read before TensorFlow starts
    path = os.path.join(model_dir, RECORD)
    if not tf.io.gfile.exists(path):
        return None
    with tf.io.gfile.GFile(path) as f:
        return DropoutSchedule.parse(json.load(f)["dropout_schedule"])


def resolve(given: str, model_dir: str, chief: bool,
            log: Callable[[str], None] = print) -> Optional[DropoutSchedule]:
    """The run's schedule: `given` (--dropout_schedule) if set, else the one model_dir
    recorded, else None. The chief records a given one; logs the schedule's line."""
    from trainer.model_dir import files
    recorded = read_record(model_dir)
    if not given:
        if recorded is not None:
            log(f"dropout: {recorded}, as the model directory recorded ({RECORD})")
        return recorded
    schedule = DropoutSchedule.parse(given)
    if chief and schedule != recorded:
        files.write_atomically(os.path.join(model_dir, RECORD),
                               json.dumps({"dropout_schedule": str(schedule)}, indent=2))
    log(f"dropout: {schedule} (rate@progress of the run)"
        + (f", replacing the recorded {recorded}" if recorded not in (None, schedule) else ""))
    return schedule
