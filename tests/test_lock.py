"""One trainer per model directory (trainer/model_dir/lock.py), with real processes: a
second trainer exits 2 naming the first; a killed trainer's lock is taken over with one
warning line; another host's lock needs --force_unlock; the readers take no lock."""

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time

import pytest

from conftest import REPO, _env

pytestmark = pytest.mark.slow

LOCK = "trainer.lock"


def trainer(model_dir, *flags, steps=2):
    """trainer.task on the builtin corpus, without validation or export."""
    return [sys.executable, "-m", "trainer.task", f"--train_steps={steps}", "--eval_every=0",
            "--export_dir=none", f"--checkpoint_every={steps}", f"--model_dir={model_dir}",
            *flags]


def run(args):
    return subprocess.run(args, cwd=REPO, env=_env(), capture_output=True, text=True,
                          timeout=600)


def wait_for_lock(model_dir, process):
    for _ in range(240):
        if (model_dir / LOCK).exists() and (model_dir / LOCK).read_text():
            return json.loads((model_dir / LOCK).read_text())
        assert process.poll() is None, process.communicate()
        time.sleep(0.5)
    raise AssertionError("the trainer took no lock in 2 minutes")


def test_a_second_trainer_stops_and_a_killed_ones_lock_is_taken_over(tmp_path):
    model_dir = tmp_path / "model"
    first = subprocess.Popen(trainer(model_dir, steps=100000), cwd=REPO, env=_env(),
                             stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        holder = wait_for_lock(model_dir, first)
        assert (holder["host"], holder["pid"]) == (socket.gethostname(), first.pid)
        second = run(trainer(model_dir))
        assert second.returncode == 2
        assert second.stderr.strip().splitlines()[-1] == (
            f"trainer.task: error: {model_dir} is being trained by trainer.task pid "
            f"{first.pid} on host {holder['host']} since {holder['started']} "
            f"({model_dir / LOCK}); stop it first, or use another --model_dir")
        assert first.poll() is None  # the first trainer runs on, untouched
    finally:
        first.send_signal(signal.SIGKILL)
        first.wait()
    # Killed, it left its lock: the next trainer takes it over with one line, trains, and
    # removes it at the end.
    assert (model_dir / LOCK).exists()
    third = run(trainer(model_dir))
    assert third.returncode == 0, third.stderr[-3000:]
    warnings = [line for line in third.stderr.splitlines() if LOCK in line]
    assert warnings == [f"warning: {model_dir / LOCK}: taking over the lock of trainer.task "
                        f"pid {first.pid} on host {holder['host']} since {holder['started']}, "
                        "which no longer runs"]
    assert not (model_dir / LOCK).exists()


def test_another_hosts_lock_is_taken_over_only_with_force_unlock(tmp_path):
    model_dir = tmp_path / "model"
    model_dir.mkdir()
    other = {"host": "another-host", "pid": 4242, "started": "2026-01-01T00:00:00+00:00"}
    (model_dir / LOCK).write_text(json.dumps(other))
    refused = run(trainer(model_dir))
    assert refused.returncode == 2
    assert refused.stderr.strip().splitlines()[-1].endswith(
        f"is being trained by trainer.task pid 4242 on host another-host since "
        f"2026-01-01T00:00:00+00:00 ({model_dir / LOCK}); if that trainer is gone, rerun "
        "with --force_unlock")
    assert json.loads((model_dir / LOCK).read_text()) == other
    forced = run(trainer(model_dir, "--force_unlock"))
    assert forced.returncode == 0, forced.stderr[-3000:]
    assert f"warning: {model_dir / LOCK}: taking over the lock of trainer.task pid 4242 on " \
           "host another-host since 2026-01-01T00:00:00+00:00 (--force_unlock)" in \
        forced.stderr.splitlines()
    assert not (model_dir / LOCK).exists()


def test_the_readers_take_no_lock(exported, tmp_path):
    """A live trainer's lock (this test's own process) stops no reader."""
    model_dir = tmp_path / "model"
    shutil.copytree(exported.model_dir, model_dir)
    live = {"host": socket.gethostname(), "pid": os.getpid(), "started": "now"}
    (model_dir / LOCK).write_text(json.dumps(live))
    for args in (["trainer.export", f"--model_dir={model_dir}",
                  f"--export_dir={tmp_path / 'export'}"],
                 ["trainer.average", f"--model_dir={model_dir}", "--last=2"]):
        result = run([sys.executable, "-m", *args])
        assert result.returncode == 0, result.stderr[-3000:]
    assert json.loads((model_dir / LOCK).read_text()) == live
