"""Ctrl-C (SIGINT) on `python -m trainer.task` as a user sends it, as docs/training.md
("Preemption and resume") promises: the update in flight finishes, a checkpoint of its
step is written, the validation that step would have run is skipped, and the program
exits with status 75 and one line; a second Ctrl-C interrupts at once. Real processes (the
claim is about a signal), each training the tiny preset on the builtin corpus for a few
updates; the signals are sent when the program's own progress lines say where it is."""

import os
import re
import select
import signal
import subprocess
import sys
import time

import pytest

from conftest import QUICK, REPO, checkpoint_weights, latest_step

pytestmark = pytest.mark.slow

PREEMPTED_STATUS = 75


class Output:
    """A process's stdout line by line as it comes (unbuffered), and whether more has
    come than was read."""

    def __init__(self, process):
        self.fd, self.pending, self.lines = process.stdout.fileno(), b"", []

    def next_line(self, timeout=300):
        deadline = time.time() + timeout
        while b"\n" not in self.pending:
            assert select.select([self.fd], [], [], max(deadline - time.time(), 0))[0], \
                "no output in time: " + "\n".join(self.lines[-5:])
            chunk = os.read(self.fd, 65536)
            assert chunk, "the run ended before the signal: " + "\n".join(self.lines[-5:])
            self.pending += chunk
        line, self.pending = self.pending.split(b"\n", 1)
        self.lines.append(line.decode())
        return self.lines[-1]

    def more_waiting(self) -> bool:
        return b"\n" in self.pending or bool(select.select([self.fd], [], [], 0)[0])

    def rest(self, process, timeout=120):
        out, err = process.communicate(timeout=timeout)
        self.lines += (self.pending + out).decode().splitlines()
        self.pending = b""
        return err.decode()


def start(model_dir, *flags):
    return subprocess.Popen(
        [sys.executable, "-m", "trainer.task", *QUICK, "--train_steps=100000", *flags,
         f"--model_dir={model_dir}"], cwd=REPO, stdout=subprocess.PIPE,
        stderr=subprocess.PIPE, bufsize=0, env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2"})


def logged_step(line):
    match = re.match(r"step (\d+)/", line)
    return int(match.group(1)) if match else None


def test_sigint_skips_the_validation_due_checkpoints_and_exits_75(tmp_path):
    """SIGINT sent on the progress line of step 4, after which the program writes ckpt-4
    (--checkpoint_every=4) and then would validate (--eval_every=4): the signal comes
    while it writes, before the validation begins. The run skips the validation, and
    exits 75 with the documented line naming ckpt-4, its only line on stderr. (A signal
    between checkpoints, and the resume, are test_preemption's, with SIGTERM.)"""
    model_dir = str(tmp_path / "run")
    step = 4
    process = start(model_dir, "--log_every=1", f"--checkpoint_every={step}",
                    f"--eval_every={step}")
    output = Output(process)
    try:
        while logged_step(output.next_line()) != step:
            pass
        process.send_signal(signal.SIGINT)
        err = output.rest(process)
    finally:
        process.kill()
    assert process.returncode == PREEMPTED_STATUS, err[-3000:]
    assert err.strip().splitlines() == [
        f"trainer.task: preempted by SIGINT at step {step}: wrote {model_dir}/ckpt-{step}; "
        "the same command resumes from it"], err[-3000:]
    assert latest_step(model_dir) == step
    assert len(checkpoint_weights(model_dir)) > 20  # a whole checkpoint, restored
    assert [logged_step(line) for line in output.lines if logged_step(line)][-1] == step
    validations = [line for line in output.lines if re.match(r"step \d+: validation", line)]
    assert not validations, validations


def test_a_second_sigint_while_the_checkpoint_is_written_interrupts_at_once(tmp_path):
    """The first SIGINT after step 4's progress line (--log_every=2, --checkpoint_every=3:
    ckpt-3 is written), so during update 4's end or update 5: the program then writes
    that step's checkpoint, the training stream's position first. The second SIGINT,
    sent once that file appears, ends the program as a Ctrl-C does, at once: a
    KeyboardInterrupt, no preempted line, Python's status for it (the shell's 130), and
    the checkpoint left unwritten, so the newest is still ckpt-3, whole."""
    model_dir = tmp_path / "run"
    process = start(model_dir, "--log_every=2", "--checkpoint_every=3")
    output = Output(process)
    stream = model_dir / "training_stream" / "pipeline_0"
    try:
        while logged_step(output.next_line()) != 4:
            pass
        process.send_signal(signal.SIGINT)
        deadline = time.time() + 120
        while not [name for name in os.listdir(stream) if name.startswith(("ckpt-4", "ckpt-5"))]:
            assert process.poll() is None and time.time() < deadline, output.rest(process)
            time.sleep(0.001)
        process.send_signal(signal.SIGINT)
        signalled = time.time()
        err = output.rest(process)
        seconds = time.time() - signalled
    finally:
        process.kill()
    print(f"status {process.returncode}, {seconds:.1f} s from the second SIGINT to the exit, "
          f"newest checkpoint {latest_step(model_dir)}; stderr:\n{err}")
    assert process.returncode == -signal.SIGINT, err[-3000:]
    assert "preempted" not in err and "KeyboardInterrupt" in err, err[-3000:]
    assert latest_step(model_dir) == 3
    assert len(checkpoint_weights(model_dir)) > 20  # the newest checkpoint restores
