"""One trainer per model directory (trainer/model_dir/lock.py): another host's lock needs
--force_unlock; a model directory path that is no directory is one line. What the program
says and leaves, so its main runs in this process (programs.program). (Two live trainers'
processes, a second trainer beside a running one and a killed trainer's lock taken over:
tests/test_task.py's kill -9 test; a reader beside a live lock: tests/test_averaging.py.)"""

import json

import pytest

from programs import program

pytestmark = pytest.mark.slow

LOCK = "trainer.lock"


def trainer(model_dir, *flags, steps=2):
    """trainer.task on the builtin corpus, without validation or export."""
    return program("task", f"--train_steps={steps}", "--eval_every=0", "--export_dir=none",
                   "--precision=float32",
                   f"--checkpoint_every={steps}", f"--model_dir={model_dir}", *flags)


def test_another_hosts_lock_is_taken_over_only_with_force_unlock(tmp_path):
    model_dir = tmp_path / "model"
    model_dir.mkdir()
    other = {"host": "another-host", "pid": 4242, "started": "2026-01-01T00:00:00+00:00"}
    (model_dir / LOCK).write_text(json.dumps(other))
    refused = trainer(model_dir)
    assert refused.returncode == 2
    assert refused.stderr.strip().splitlines()[-1].endswith(
        f"is being trained by trainer.task pid 4242 on host another-host since "
        f"2026-01-01T00:00:00+00:00 ({model_dir / LOCK}); if that trainer is gone, rerun "
        "with --force_unlock")
    assert json.loads((model_dir / LOCK).read_text()) == other
    forced = trainer(model_dir, "--force_unlock")
    assert forced.returncode == 0, forced.stderr[-3000:]
    assert f"warning: {model_dir / LOCK}: taking over the lock of trainer.task pid 4242 on " \
           "host another-host since 2026-01-01T00:00:00+00:00 (--force_unlock)" in \
        forced.stderr.splitlines()
    assert not (model_dir / LOCK).exists()


def test_a_model_dir_that_is_not_a_directory_is_one_line(tmp_path):
    """A file where the model directory would go, or on its path: one line naming it,
    before any work, and the file untouched (os.makedirs' FileExistsError and
    NotADirectoryError were tracebacks)."""
    taken = tmp_path / "taken"
    taken.write_text("a file\n")
    for model_dir, line in (
            (taken, f"{taken} exists and is not a directory: use another --model_dir"),
            (taken / "model", f"{taken / 'model'} cannot be made: a part of its path is a "
                              "file, not a directory")):
        result = trainer(model_dir)
        assert result.returncode == 2, result.stderr[-3000:]
        assert result.stderr.strip().splitlines() == [f"trainer.task: error: {line}"]
    assert taken.read_text() == "a file\n"
