"""python -m trainer.task as a user runs it: real subprocesses, real files, real kills."""

import json
import os
import signal
import subprocess
import sys
import time

import numpy as np
import pytest
import tensorflow as tf

from conftest import MULTI30K, QUICK, REPO, latest_step, needs_multi30k

# Each test runs the programs in subprocesses, or uses the model they trained.
pytestmark = pytest.mark.slow


def task(*flags, env=None, timeout=600, **kwargs):
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2", **(env or {})}
    return subprocess.run([sys.executable, "-m", "trainer.task", *flags], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=timeout, **kwargs)


def test_kill_9_mid_training_then_the_same_command_resumes(tmp_path):
    model_dir = str(tmp_path / "run")
    flags = [*QUICK, "--train_steps=400", "--checkpoint_every=5", "--keep_checkpoints=3",
             f"--model_dir={model_dir}"]
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2"}
    process = subprocess.Popen([sys.executable, "-m", "trainer.task", *flags], cwd=REPO,
                               env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.time() + 300
    while latest_step(model_dir) < 15 and time.time() < deadline and process.poll() is None:
        time.sleep(0.2)
    # A second trainer on the same directory stops at once, naming the first
    # (trainer/model_dir/lock.py), and leaves it running.
    lock = os.path.join(model_dir, "trainer.lock")
    holder = json.loads(open(lock).read())
    second = task(*flags)
    assert second.returncode == 2
    assert second.stderr.strip().splitlines()[-1] == (
        f"trainer.task: error: {model_dir} is being trained by trainer.task pid "
        f"{process.pid} on host {holder['host']} since {holder['started']} ({lock}); stop it "
        "first, or use another --model_dir")
    assert process.poll() is None
    process.send_signal(signal.SIGKILL)
    process.wait()
    killed_at = latest_step(model_dir)
    assert 15 <= killed_at < 400, "the kill must land mid-training"
    # Every checkpoint the state file lists is complete and restorable.
    state = tf.train.get_checkpoint_state(model_dir)
    for path in state.all_model_checkpoint_paths:
        reader = tf.train.load_checkpoint(path)
        embedding = reader.get_tensor("model/embedding/embeddings/.ATTRIBUTES/VARIABLE_VALUE")
        assert np.all(np.isfinite(embedding))

    resumed = task(*flags[:-3], "--train_steps=%d" % (killed_at + 10), "--checkpoint_every=5",
                   "--keep_checkpoints=3", f"--model_dir={model_dir}")
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert f"at step {killed_at}" in resumed.stdout
    assert latest_step(model_dir) == killed_at + 10
    # The killed trainer's lock, taken over with one line, and removed at the end.
    assert [line for line in resumed.stderr.splitlines() if "trainer.lock" in line] == [
        f"warning: {lock}: taking over the lock of trainer.task pid {process.pid} on host "
        f"{holder['host']} since {holder['started']}, which no longer runs"]
    assert not os.path.exists(lock)


@pytest.mark.parametrize("interval", [1, 4])
def test_a_non_finite_loss_stops_naming_the_step_and_keeps_the_last_good_checkpoint(
        tmp_path, interval):
    """With interval 4 the host reads every 4th update: the step named is still the
    first bad one, and no checkpoint is written after it."""
    model_dir = str(tmp_path / "run")
    result = task(*QUICK, "--precision=float32", "--train_steps=200",
                  f"--checkpoint_every={interval}", f"--log_every={interval}",
                  "--learning_rate_scale=1e12", f"--model_dir={model_dir}")
    assert result.returncode == 1
    message = result.stderr.strip().splitlines()[-1]
    assert "non-finite loss" in message and "at step" in message, message
    step = int(message.split("at step ")[1].split(";")[0])
    logged = [int(line.split()[1].split("/")[0]) for line in result.stdout.splitlines()
              if line.startswith("step ")]
    assert all(s < step for s in logged) and all(s % interval == 0 for s in logged)
    good = (step - 1) // interval * interval
    if good == 0:
        assert tf.train.latest_checkpoint(model_dir) is None
        assert "no checkpoint" in message
        return
    assert latest_step(model_dir) == good
    reader = tf.train.load_checkpoint(tf.train.latest_checkpoint(model_dir))
    for name, _ in tf.train.list_variables(tf.train.latest_checkpoint(model_dir)):
        if name.startswith("model/"):
            assert np.all(np.isfinite(reader.get_tensor(name))), name


def test_flags_are_checked_without_tensorflow():
    """The command line, its configs and the library's config are pure Python: a bad
    flag is reported before TensorFlow's start-up."""
    code = ("import sys, keras_transformer, trainer.task\n"
            "from keras_transformer import TransformerConfig, PRESETS\n"
            "assert 'tensorflow' not in sys.modules and 'keras' not in sys.modules\n"
            "print(TransformerConfig.preset('base').d_model)")
    result = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True,
                            text=True, timeout=60)
    assert result.returncode == 0 and result.stdout.strip() == "512", result.stderr


# Real files for the checks that come after "no such file".
NEEDS_FILES = needs_multi30k("val.en", "val.de", "test2016.en", "test2016.de")


@pytest.mark.parametrize("flags,expected", [
    (["--config=huge"], "unknown preset --config=huge"),
    (["--train_src=/nonexistent/train.en", "--train_tgt=/nonexistent/train.de"],
     "--train_src=/nonexistent/train.en: no such file"),
    (["--max_len=128", "--batch_tokens=64"], "batch_tokens=64 is less than max_len=128"),
    (["--hparams=d_modle=3"], "unknown field 'd_modle'"),
    (["--batch_tokens=many"], "flag --batch_tokens=many: invalid literal"),
    (["--precision=fp8"], "value should be one of"),
    pytest.param([f"--train_src={MULTI30K}/val.en,{MULTI30K}/test2016.en",
                  f"--train_tgt={MULTI30K}/val.de", f"--eval_src={MULTI30K}/val.en",
                  f"--eval_tgt={MULTI30K}/val.de"],
                 "train_src has 2 files but train_tgt has 1", marks=NEEDS_FILES),
    pytest.param([f"--train_src={MULTI30K}/val.en,{MULTI30K}/test2016.en",
                  f"--train_tgt={MULTI30K}/val.de,{MULTI30K}/test2016.de",
                  "--train_weights=0.7,-0.3", f"--eval_src={MULTI30K}/val.en",
                  f"--eval_tgt={MULTI30K}/val.de"],
                 "train_weights must all be positive, got 0.7,-0.3", marks=NEEDS_FILES),
    pytest.param([f"--train_src={MULTI30K}/val.en,{MULTI30K}/test2016.en",
                  f"--train_tgt={MULTI30K}/val.de,{MULTI30K}/test2016.de",
                  "--train_weights=1,2,3", f"--eval_src={MULTI30K}/val.en",
                  f"--eval_tgt={MULTI30K}/val.de"],
                 "train_weights has 3 weights for 2 training corpora", marks=NEEDS_FILES),
    (["--train_weights=1,x"], "--train_weights=1,x: not a list of numbers"),
    (["--no_such_flag=1"], "Unknown command line flag 'no_such_flag'"),
])
def test_bad_flags_give_a_one_line_error_before_any_work(tmp_path, flags, expected):
    model_dir = tmp_path / "run"
    result = task(*flags, f"--model_dir={model_dir}", timeout=120)
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("trainer.task: error: "), result.stderr
    assert expected in lines[0]
    assert not model_dir.exists(), "no work may happen before the error"


def test_the_time_budget_stops_training_with_a_checkpoint_before_train_steps(tmp_path):
    model_dir = str(tmp_path / "run")
    result = task(*QUICK, "--train_steps=100000", "--max_train_minutes=0.02",
                  "--checkpoint_every=100000", f"--model_dir={model_dir}")
    assert result.returncode == 0, result.stderr[-3000:]
    assert "time budget of 0.02 minutes spent at step" in result.stdout
    # --eval_every=0 (QUICK): not even the run's end validates.
    assert "validation loss" not in result.stdout and not os.path.exists(f"{model_dir}/eval")
    step = latest_step(model_dir)
    assert 0 < step < 100000, "a checkpoint at the step where the budget ran out"
