"""python -m trainer.task as a user runs it: real files, real kills. A real subprocess where
the claim is about the process (kill -9, a second trainer beside a live one, the flags
checked before TensorFlow is imported); the program's main in this process
(programs.program) where it is about what the program says, writes and returns."""

import json
import os
import random
import signal
import subprocess
import sys
import tempfile
import time

import numpy as np
import pytest
import tensorflow as tf

from conftest import MULTI30K, QUICK, REPO, latest_step, needs_multi30k
from programs import program
from trainer.model_dir import layout

# Each test runs the program (most of them train), in a subprocess or in this process.
pytestmark = pytest.mark.slow


def task(*flags, env=None, timeout=600, **kwargs):
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2", **(env or {})}
    return subprocess.run([sys.executable, "-m", "trainer.task", *flags], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=timeout, **kwargs)


KILLS = 5  # kill -9s of one run, at moments drawn from a seed


def kill_9_at(flags, model_dir, rng, while_writing, log, beside=None):
    """Starts trainer.task with `flags`, and kill -9s it at a moment drawn from `rng`:
    once it has logged update `log`, after a random pause, or (while_writing) the moment a
    checkpoint's staging files appear. `beside(pid)` runs first, while the trainer is
    stopped (SIGSTOP: alive, its lock held). Returns (its stdout, its stderr, whether a
    write was cut short)."""
    stream_dir = os.path.join(model_dir, "training_stream", "pipeline_0")
    stderr = tempfile.TemporaryFile("w+")
    process = subprocess.Popen([sys.executable, "-m", "trainer.task", *flags], cwd=REPO,
                               env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2"},
                               stdout=subprocess.PIPE, stderr=stderr, text=True)
    stdout = []
    for line in process.stdout:
        stdout.append(line)
        if line.startswith(f"step {log}/"):
            break
    else:
        stderr.seek(0)
        raise AssertionError(f"trainer.task ended before update {log}:\n{stderr.read()}")
    if beside:
        process.send_signal(signal.SIGSTOP)
        beside(process.pid)
        process.send_signal(signal.SIGCONT)

    def staged():  # checkpoints' staging files (TensorFlow's <prefix>_temp)
        return {os.path.join(directory, name) for directory in (model_dir, stream_dir)
                if os.path.isdir(directory)
                for name in os.listdir(directory) if "_temp" in name}

    left_before = staged()  # by an earlier kill

    def staging():  # the staging files of a write since
        return staged() - left_before

    if while_writing:
        while not staging() and process.poll() is None:
            time.sleep(0.0005)
    else:
        time.sleep(rng.uniform(0.0, 0.3))
    assert process.poll() is None, "the kill must land before the run's end"
    process.send_signal(signal.SIGKILL)
    process.wait()
    stderr.seek(0)
    return "".join(stdout) + process.stdout.read(), stderr.read(), bool(staging())


def test_kill_9s_at_five_random_moments_change_no_bit_of_the_trained_weights(tmp_path):
    """--deterministic: a run killed with kill -9 at five random moments, one of them while
    a checkpoint is being written, and resumed each time by the same command, ends with
    the weights, optimizer state and dropout random state of an uninterrupted run, bit for
    bit. Each resume starts from the newest checkpoint, which is intact. On the way: a
    second trainer beside a live one stops at once naming it, and a killed trainer's lock
    is taken over with one line. The kill moments come from the seed printed first:
    KILL_SEED=<seed> replays them."""
    seed = int(os.environ.get("KILL_SEED", random.randrange(1 << 30)))
    print(f"KILL_SEED={seed}")
    rng = random.Random(seed)
    steps = 60
    flags = [*QUICK, "--deterministic", "--hparams=dropout=0.1", f"--train_steps={steps}",
             "--checkpoint_every=5", "--keep_checkpoints=3", "--log_every=1"]
    straight = str(tmp_path / "straight")
    result = task(*flags, f"--model_dir={straight}")
    assert result.returncode == 0, result.stderr[-3000:]

    model_dir = str(tmp_path / "killed")
    flags.append(f"--model_dir={model_dir}")
    lock = os.path.join(model_dir, "trainer.lock")
    writing = rng.randrange(KILLS)  # which kill waits for a checkpoint's write

    def second_trainer(pid):  # on a live one's directory: stops at once, naming it
        holder = json.loads(open(lock).read())
        second = task(*flags)
        assert second.returncode == 2
        assert second.stderr.strip().splitlines()[-1] == (
            f"trainer.task: error: {model_dir} is being trained by trainer.task pid {pid} on "
            f"host {holder['host']} since {holder['started']} ({lock}); stop it first, or use "
            "another --model_dir")

    kills, cut_short, resumed_from, killed = 0, 0, 0, None
    while kills < KILLS or not cut_short:
        assert kills < 2 * KILLS, f"no kill landed while a checkpoint was written (seed {seed})"
        # Up to 15 updates on, until 20 before the end; past that, the next update
        # (an empty range there failed seed 954816441 once resumed at step 40).
        log = rng.randint(resumed_from + 1,
                          max(resumed_from + 1, min(steps - 20, resumed_from + 15)))
        stdout, stderr, staged = kill_9_at(
            flags, model_dir, rng, kills >= writing and not cut_short, log,
            beside=second_trainer if kills == 0 else None)
        if resumed_from:
            assert f"resumed from {model_dir}/ckpt-{resumed_from} at step {resumed_from}" in \
                stdout, f"{stdout}\n{stderr} (seed {seed})"
        if killed:  # the lock of the trainer killed before, taken over with one line
            assert [line for line in stderr.splitlines() if "trainer.lock" in line][:1] == [
                f"warning: {lock}: taking over the lock of trainer.task pid {killed['pid']} "
                f"on host {killed['host']} since {killed['started']}, which no longer runs"]
        killed = json.loads(open(lock).read())
        kills, cut_short = kills + 1, cut_short + staged
        print(f"kill {kills}: after update {log}{' while writing' if staged else ''}, "
              f"newest checkpoint {latest_step(model_dir)}; the run said:", *(
                  line for line in (stdout + stderr).splitlines()
                  if line.startswith(("resumed", "training stream", "warning"))), sep="\n  ")
        # The newest checkpoint, where the next run resumes, is intact.
        resumed_from = latest_step(model_dir)
        assert not resumed_from or layout.damage(f"{model_dir}/ckpt-{resumed_from}") is None
    final = task(*flags)
    assert final.returncode == 0, final.stderr[-3000:]
    assert f"at step {resumed_from}" in final.stdout and not os.path.exists(lock)

    want = tf.train.load_checkpoint(f"{straight}/ckpt-{steps}")
    got = tf.train.load_checkpoint(f"{model_dir}/ckpt-{steps}")
    names = set(want.get_variable_to_shape_map()) - {"save_counter/.ATTRIBUTES/VARIABLE_VALUE"}
    assert set(got.get_variable_to_shape_map()) - {"save_counter/.ATTRIBUTES/VARIABLE_VALUE"} \
        == names and any(name.startswith("dropout_rng/") for name in names)
    differ = [name for name in sorted(names)
              if not np.array_equal(got.get_tensor(name), want.get_tensor(name))]
    assert not differ, f"{len(differ)} of {len(names)} tensors differ, e.g. {differ[:3]} " \
                       f"(seed {seed})"


@pytest.mark.parametrize("interval", [1, 4])
def test_a_non_finite_loss_stops_naming_the_step_and_keeps_the_last_good_checkpoint(
        tmp_path, interval):
    """With interval 4 the host reads every 4th update: the step named is still the
    first bad one, and no checkpoint is written after it. A learning rate 1e11 times the
    schedule's diverges at step 9 here, after checkpoints (the scale is no gauge: 1e12
    diverged at step 2, before any)."""
    model_dir = str(tmp_path / "run")
    result = program("task", *QUICK, "--precision=float32", "--train_steps=200",
                     f"--checkpoint_every={interval}", f"--log_every={interval}",
                     "--learning_rate_scale=1e11", f"--model_dir={model_dir}")
    assert result.returncode == 1
    message = result.stderr.strip().splitlines()[-1]
    assert "non-finite loss" in message and "at step" in message, message
    step = int(message.split("at step ")[1].split(";")[0])
    logged = [int(line.split()[1].split("/")[0]) for line in result.stdout.splitlines()
              if line.startswith("step ")]
    assert all(s < step for s in logged) and all(s % interval == 0 for s in logged)
    good = (step - 1) // interval * interval
    assert good > 0, f"diverged at step {step}, before any checkpoint: {message}"
    assert latest_step(model_dir) == good
    reader = tf.train.load_checkpoint(tf.train.latest_checkpoint(model_dir))
    for name, _ in tf.train.list_variables(tf.train.latest_checkpoint(model_dir)):
        if name.startswith("model/"):
            assert np.all(np.isfinite(reader.get_tensor(name))), name


def test_a_non_finite_loss_before_the_first_checkpoint_says_none_was_written(tmp_path):
    """A learning rate 1e30 times the schedule's: the first update throws the weights so
    far that the second's loss is not finite, and the host's read after update 4 names
    step 2 and says that no checkpoint was written before it; none was."""
    model_dir = str(tmp_path / "run")
    result = program("task", *QUICK, "--train_steps=8", "--checkpoint_every=4",
                     "--log_every=4", "--learning_rate_scale=1e30", f"--model_dir={model_dir}")
    assert result.returncode == 1
    assert result.stderr.strip().splitlines()[-1] == (
        "trainer.task: error: non-finite loss at step 2; stopping: no checkpoint was written "
        "before it")
    assert tf.train.latest_checkpoint(model_dir) is None
    assert not [line for line in result.stdout.splitlines() if line.startswith("step ")]


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


# `python -m trainer.task ARGS` in a Python where `import tensorflow` (and keras, which
# imports it) raises ImportError.
WITHOUT_TENSORFLOW = ("import runpy, sys\n"
                      "sys.modules['tensorflow'] = sys.modules['keras'] = None\n"
                      "sys.argv = ['trainer.task', *sys.argv[1:]]\n"
                      "runpy.run_module('trainer.task', run_name='__main__', alter_sys=True)")


def test_a_bad_flag_is_reported_by_a_python_that_cannot_import_tensorflow(tmp_path):
    """trainer.task, as `python -m` runs it, in a Python that cannot import TensorFlow:
    a bad flag of each kind of check (absl's parse, the preset, the data files, the
    configs' checks, main's own) is still its one-line error with status 2, so none of
    them waited for TensorFlow. Good flags reach the import and fail on it: the block is
    in force."""
    model_dir = tmp_path / "run"
    for flags, expected in [
            (["--no_such_flag=1"], "Unknown command line flag 'no_such_flag'"),
            (["--config=huge"], "unknown preset --config=huge"),
            (["--train_src=/nonexistent/train.en", "--train_tgt=/nonexistent/train.de"],
             "--train_src=/nonexistent/train.en: no such file"),
            (["--max_len=128", "--batch_tokens=64"], "batch_tokens=64 is less than max_len=128"),
            (["--deterministic", "--subword_sampling=0.1"],
             "--deterministic contradicts --subword_sampling")]:
        result = subprocess.run([sys.executable, "-c", WITHOUT_TENSORFLOW, *flags,
                                 f"--model_dir={model_dir}"], cwd=REPO, capture_output=True,
                                text=True, timeout=60)
        assert result.returncode == 2, result.stderr[-3000:]
        lines = result.stderr.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("trainer.task: error: "), result.stderr
        assert expected in lines[0]
        assert not model_dir.exists()
    good = subprocess.run([sys.executable, "-c", WITHOUT_TENSORFLOW, "--train_steps=1",
                           "--export_dir=none", f"--model_dir={model_dir}"], cwd=REPO,
                          capture_output=True, text=True, timeout=60)
    assert good.returncode == 1 and "import of tensorflow halted" in good.stderr, \
        good.stderr[-3000:]


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
    (["--deterministic", "--max_train_minutes=5"], "deterministic needs a run bounded by its "
     "steps: a time budget (max_train_minutes) makes the steps trained depend on the clock"),
    (["--deterministic", "--subword_sampling=0.1"], "--deterministic contradicts "
     "--subword_sampling: SentencePiece draws the segmentations from a generator no "
     "checkpoint holds"),
])
def test_bad_flags_give_a_one_line_error_before_any_work(tmp_path, flags, expected):
    model_dir = tmp_path / "run"
    result = program("task", *flags, f"--model_dir={model_dir}")
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("trainer.task: error: "), result.stderr
    assert expected in lines[0]
    assert not model_dir.exists(), "no work may happen before the error"


def test_a_run_its_data_cannot_serve_stops_in_one_line_before_the_model_directory(tmp_path):
    """Training files of 3 and 2 lines: the line-count error, and the model directory is
    neither made nor looked at, so what its path holds does not change the line. (The
    lock's makedirs came first: it left an empty directory behind, and a path that held
    no directory when it looked, a file, or a directory another program was moving,
    ended in a FileExistsError traceback instead.)"""
    for name, lines in (("train.en", "a\nb\nc\n"), ("train.de", "x\ny\n"),
                        ("val.en", "a\n"), ("val.de", "x\n")):
        (tmp_path / name).write_text(lines)
    files = [f"--train_src={tmp_path / 'train.en'}", f"--train_tgt={tmp_path / 'train.de'}",
             f"--eval_src={tmp_path / 'val.en'}", f"--eval_tgt={tmp_path / 'val.de'}"]
    taken = tmp_path / "taken"
    taken.write_text("not a model directory\n")
    for model_dir in (tmp_path / "new", taken):
        result = program("task", *files, f"--model_dir={model_dir}", "--export_dir=none")
        assert result.returncode == 2, result.stderr[-3000:]
        assert result.stderr.strip().splitlines() == [
            f"trainer.task: error: source and target line counts differ: "
            f"{tmp_path / 'train.en'} has 3 lines, {tmp_path / 'train.de'} has 2"]
    assert not (tmp_path / "new").exists()
    assert taken.read_text() == "not a model directory\n"


def test_the_time_budget_stops_training_with_a_checkpoint_before_train_steps(tmp_path):
    model_dir = str(tmp_path / "run")
    result = program("task", *QUICK, "--train_steps=100000", "--max_train_minutes=0.02",
                     "--checkpoint_every=100000", f"--model_dir={model_dir}")
    assert result.returncode == 0, result.stderr[-3000:]
    assert "time budget of 0.02 minutes spent at step" in result.stdout
    # --eval_every=0 (QUICK): not even the run's end validates.
    assert "validation loss" not in result.stdout and not os.path.exists(f"{model_dir}/eval")
    step = latest_step(model_dir)
    assert 0 < step < 100000, "a checkpoint at the step where the budget ran out"
