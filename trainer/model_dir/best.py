"""The best checkpoint by a validation score, kept apart from the rotating ones
(`--keep_best`), and the patience of early stopping (`--early_stopping`).

On disk, in the model directory: `best/`, a checkpoint of the model's weights (the ones
validation scored: the moving average with --export_weights=ema) at the best validation,
and `best/best.json`: the metric, the best score, its step, and how many validations since
have not improved on it by --early_stopping_min_delta. A resumed run reads both, so it
keeps the best score and the patience count.
"""

import json
import os
from typing import Callable, Dict, Optional

import tensorflow as tf

from trainer.model_dir import files

DIRECTORY = "best"
STATE = "best.json"
# The metrics validation reports, and whether higher is better.
METRICS = {"bleu": True, "chrf": True, "loss": False}


def checkpoint(model_dir: str) -> Optional[str]:
    """The best checkpoint's prefix, or None when the run kept none."""
    return tf.train.latest_checkpoint(os.path.join(model_dir, DIRECTORY))


class BestTracker:
    """Follows one validation metric over a run: keeps the best weights (when `keep`),
    and says when `patience` validations in a row have not improved on the best by
    `min_delta` (patience 0: never).

    Args:
      model: the Transformer whose weights are kept.
      model_dir: the run's model directory.
      metric: one of METRICS.
    """

    def __init__(self, model, model_dir: str, metric: str, keep: bool, patience: int,
                 min_delta: float, log: Callable[[str], None] = print):
        if metric not in METRICS:
            raise ValueError(f"unknown metric {metric!r}; choose one of {', '.join(METRICS)}")
        self.model, self.metric, self.keep, self.log = model, metric, keep, log
        self.patience, self.min_delta = patience, min_delta
        self.directory = os.path.join(model_dir, DIRECTORY)
        self.state = {"metric": metric, "score": None, "step": None, "without_improvement": 0}
        path = os.path.join(self.directory, STATE)
        if tf.io.gfile.exists(path):
            with tf.io.gfile.GFile(path) as f:
                saved = json.load(f)
            if saved.get("metric") == metric:
                self.state = saved

    def improves(self, score: float) -> bool:
        best = self.state["score"]
        if best is None:
            return True
        gain = score - best if METRICS[self.metric] else best - score
        return gain > 0 and gain >= self.min_delta

    def update(self, step: int, metrics: Dict[str, float]) -> bool:
        """Records the validation of `step` (the model holds the weights it scored);
        returns True when early stopping says stop."""
        score = metrics[self.metric]
        if self.improves(score):
            self.state.update(score=score, step=step, without_improvement=0)
            if self.keep:
                manager = tf.train.CheckpointManager(tf.train.Checkpoint(model=self.model),
                                                     self.directory, max_to_keep=1,
                                                     checkpoint_name="ckpt")
                path = manager.save(checkpoint_number=step)
                self.log(f"step {step}: best validation {self.metric} so far, {score:.4g}: "
                         f"kept as {path}")
        else:
            self.state["without_improvement"] += 1
        tf.io.gfile.makedirs(self.directory)
        files.write_atomically(os.path.join(self.directory, STATE), json.dumps(self.state))
        return bool(self.patience) and self.state["without_improvement"] >= self.patience

    def stop_line(self, step: int) -> str:
        return (f"early stopping at step {step}: validation {self.metric} has not improved by "
                f"{self.min_delta:g} or more in {self.patience} validations (best "
                f"{self.state['score']:.4g} at step {self.state['step']})")
