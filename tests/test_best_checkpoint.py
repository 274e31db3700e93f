"""--keep_best keeps the checkpoint of the best validation apart and --export_weights=best
ships it; --early_stopping stops a run whose validation stopped improving, says why and
exports; a resumed run keeps the best score and the patience count. The builtin corpus,
the real program (its main, in this process: programs.program)."""

import json
import re

import numpy as np
import pytest
import tensorflow as tf

from conftest import QUICK, checkpoint_weights, exported_weights
from programs import program

pytestmark = pytest.mark.slow

# Validation every 5 updates on 10 sentences.
FLAGS = [*QUICK, "--eval_every=5", "--checkpoint_every=5", "--log_every=5"]


def task(*flags):
    return program("task", *FLAGS, *flags)


def validations(stdout, metric):
    return {int(step): float(value) for step, value in
            re.findall(rf"^step (\d+): .*validation {metric} ([\d.e+-]+)", stdout, re.M)}


def test_the_best_validations_checkpoint_is_kept_apart(tmp_path):
    model_dir = tmp_path / "run"
    result = task("--train_steps=15", "--keep_best=loss", "--keep_checkpoints=1",
                  f"--model_dir={model_dir}")
    assert result.returncode == 0, result.stderr[-3000:]
    losses = validations(result.stdout, "loss")
    assert sorted(losses) == [5, 10, 15]
    best_step = min(losses, key=losses.get)
    state = json.loads((model_dir / "best" / "best.json").read_text())
    assert state["metric"] == "loss" and state["step"] == best_step
    assert state["score"] == pytest.approx(losses[best_step], rel=1e-3)
    assert tf.train.latest_checkpoint(str(model_dir / "best")).endswith(
        f"best/ckpt-{best_step}")
    # Apart from the rotating ones: keep_checkpoints=1 left only the last.
    assert tf.train.latest_checkpoint(str(model_dir)).endswith("ckpt-15")


def test_early_stopping_stops_says_why_exports_the_best_and_resumes_with_its_count(tmp_path):
    """A min_delta no loss change reaches: the first validation is the best, and each one
    after it counts. Patience 3: a run to step 10 counts 1; resumed, it counts 2 at step
    15 and stops at step 20 (a resume that forgot the count would stop at 25), then
    exports the best checkpoint (--export_weights=best), step 5's."""
    model_dir, export_dir = tmp_path / "run", tmp_path / "export"
    stopping = ["--keep_best=loss", "--early_stopping=3", "--early_stopping_min_delta=1000",
                "--keep_checkpoints=1", f"--model_dir={model_dir}"]
    first = task("--train_steps=10", *stopping)
    assert first.returncode == 0, first.stderr[-3000:]
    assert "early stopping" not in first.stdout
    assert json.loads((model_dir / "best" / "best.json").read_text())[
        "without_improvement"] == 1
    resumed = task("--train_steps=100", *stopping, "--export_weights=best",
                   f"--export_dir={export_dir}")
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    line = [line for line in resumed.stdout.splitlines() if "early stopping" in line]
    assert len(line) == 1 and line[0].startswith(
        "early stopping at step 20: validation loss has not improved by 1000 or more in 3 "
        "validations (best "), line
    assert line[0].endswith("at step 5)")
    assert tf.train.latest_checkpoint(str(model_dir)).endswith("ckpt-20")
    assert sorted(validations(resumed.stdout, "loss")) == [15, 20]
    # Exported after stopping: the best checkpoint, kept apart from the rotating ones.
    kept = tf.train.latest_checkpoint(str(model_dir / "best"))
    assert kept.endswith("best/ckpt-5")
    info = json.loads((export_dir / "1" / "assets.extra" / "export.json").read_text())
    assert info["checkpoints"] == [kept] and info["weights"] == "best"
    # What it says it shipped is what it shipped: every exported variable is the best
    # checkpoint's, and not the last checkpoint's, 15 updates later.
    shipped, best = exported_weights(export_dir / "1"), checkpoint_weights(model_dir, kept)
    assert len(shipped) == len(best)
    for weight, want in zip(shipped, best):
        np.testing.assert_array_equal(weight, want)
    last = checkpoint_weights(model_dir)
    assert sum(not np.array_equal(weight, w) for weight, w in zip(shipped, last)) > \
        len(last) / 2
