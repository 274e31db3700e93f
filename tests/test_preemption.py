"""A preempted run (SIGTERM mid-training) checkpoints the update in flight, exits with its
own status and one line, and the same command continues the same data stream: on one
replica, two CPU replicas, and two MultiWorkerMirroredStrategy workers on localhost."""

import json
import os
import re
import signal
import subprocess
import sys
import time

import pytest

from conftest import QUICK, REPO, free_port, latest_step, summaries

pytestmark = pytest.mark.slow

# Every update logged, no periodic checkpoint: the only checkpoint is the preemption's.
FLAGS = [*QUICK, "--log_every=1", "--checkpoint_every=100000"]
PREEMPTED_STATUS = 75


def start(model_dir, *flags, tf_config=None):
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2"}
    if tf_config is not None:
        env["TF_CONFIG"] = json.dumps(tf_config)
    return subprocess.Popen([sys.executable, "-m", "trainer.task", *FLAGS, *flags,
                             f"--model_dir={model_dir}"], cwd=REPO, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def logged_steps(lines):
    return [int(m.group(1)) for m in map(re.compile(r"^step (\d+)/").match, lines) if m]


def preempt(processes, signalled, after_step=5):
    """Sends SIGTERM to processes[signalled] once the chief (processes[0]) has logged
    `after_step`; returns (seconds from the signal to the last exit, [(stdout lines,
    stderr) per process])."""
    chief_lines = []
    deadline = time.time() + 300
    while time.time() < deadline:
        line = processes[0].stdout.readline()
        assert line, "the run ended before the signal: " + processes[0].stderr.read()[-3000:]
        chief_lines.append(line.rstrip("\n"))
        if any(step >= after_step for step in logged_steps(chief_lines[-1:])):
            break
    signalled_at = time.time()
    processes[signalled].send_signal(signal.SIGTERM)
    outputs = []
    for index, process in enumerate(processes):
        out, err = process.communicate(timeout=120)
        outputs.append(((chief_lines if index == 0 else []) + out.splitlines(), err))
    return time.time() - signalled_at, outputs


def check_preempted(model_dir, seconds, outputs, processes):
    """Every process exits with PREEMPTED_STATUS and one line naming the checkpoint of the
    step the chief logged last; returns that step."""
    step = latest_step(model_dir)
    # How fast (the target: 30 s for the recipe) is bench/resume.py's to measure, alone on
    # the machine; here the bound is preempt()'s timeout, which a run that went on
    # training would hit.
    assert seconds < 120, f"{seconds:.1f} s from SIGTERM to exit"
    for process, (_, err) in zip(processes, outputs):
        assert process.returncode == PREEMPTED_STATUS, err[-3000:]
        last = err.strip().splitlines()[-1]
        assert re.fullmatch(rf"trainer\.task: preempted by .* at step {step}: wrote "
                            rf"{re.escape(model_dir)}/ckpt-{step}; the same command resumes "
                            r"from it", last), last
    assert 5 <= step and logged_steps(outputs[0][0])[-1] == step
    assert not [d for d in os.listdir(model_dir) if d.startswith("workertemp")]
    return step


def uninterrupted_stream(model_dir, steps, pipelines, replicas_fed):
    """Per step, the target tokens of the batches every replica of an uninterrupted run
    takes, from the pipeline itself (trainer.main_job seeds before building the data, as
    here; the preempted run's vocabulary is read from model_dir)."""
    import keras
    import tensorflow as tf
    from trainer.config import DataConfig
    from trainer.data import input_pipeline, sources
    keras.utils.set_random_seed(0)
    config = DataConfig(max_len=32, batch_tokens=512)
    data = input_pipeline.build(sources.select(config), model_dir, config)
    totals = [0] * steps
    for pipeline in range(pipelines):
        context = tf.distribute.InputContext(pipelines, pipeline, pipelines * replicas_fed)
        for i, (_, target) in enumerate(data.train_dataset(context).take(steps * replicas_fed)):
            totals[i // replicas_fed] += int(tf.math.count_nonzero(target))
    return totals


def check_same_stream(model_dir, steps, pipelines, replicas_fed):
    """Steps 1..steps (the preempted run's, then the resumed run's) saw the batches an
    uninterrupted run sees: the same target-token count at every step, and bucketed
    batches differ in size, so a replayed or skipped batch shows."""
    logged = summaries(model_dir, "target_tokens")
    expected = uninterrupted_stream(model_dir, steps, pipelines, replicas_fed)
    assert [logged[s] for s in range(1, steps + 1)] == expected
    assert len(set(expected)) > 1


@pytest.mark.parametrize("replicas", [1, 2])
def test_sigterm_checkpoints_the_update_in_flight_and_the_same_command_resumes(
        tmp_path, replicas):
    """A resumed run stops at the new total (on one replica, with a validation). (That 2
    CPU replicas update as one whole batch does is test_distributed_update's.)"""
    model_dir = str(tmp_path / "run")
    flags = [f"--num_cpu_replicas={replicas}"]
    process = start(model_dir, *flags, "--train_steps=100000")
    seconds, outputs = preempt([process], signalled=0)
    step = check_preempted(model_dir, seconds, outputs, [process])
    out, err = outputs[0]
    assert f"{replicas} replica(s)" in "\n".join(out)
    assert len(err.strip().splitlines()) == 1, err[-3000:]  # a quiet console: the one line

    validation = ["--eval_every=1000"] if replicas == 1 else []
    resumed = start(model_dir, *flags, f"--train_steps={step + 3}", *validation)
    out, err = resumed.communicate(timeout=300)
    assert resumed.returncode == 0, err[-3000:]
    assert f"resumed from {model_dir}/ckpt-{step} at step {step}" in out
    assert logged_steps(out.splitlines()) == [step + 1, step + 2, step + 3]
    assert ("validation bleu" in out) == bool(validation)
    assert latest_step(model_dir) == step + 3
    # One input pipeline feeds both replicas.
    check_same_stream(model_dir, step + 3, pipelines=1, replicas_fed=replicas)


def test_two_workers_stop_at_the_same_step_when_one_is_preempted(tmp_path):
    """SIGTERM to the second worker only: the chief learns of it through the
    coordination service (PreemptionCheckpointHandler), both save the same step."""
    model_dir = str(tmp_path / "run")

    def cluster(directory, *flags):
        workers = [f"localhost:{free_port()}", f"localhost:{free_port()}"]
        return [start(directory, *flags, tf_config={
            "cluster": {"worker": workers}, "task": {"type": "worker", "index": index}})
            for index in range(2)]

    processes = cluster(model_dir, "--train_steps=100000")
    seconds, outputs = preempt(processes, signalled=1)
    step = check_preempted(model_dir, seconds, outputs, processes)
    assert "preempted by a peer worker's preemption" in outputs[0][1]
    assert "preempted by SIGTERM" in outputs[1][1]

    # The resumed cluster trains to the end, as any MultiWorkerMirroredStrategy run must.
    resumed = cluster(model_dir, f"--train_steps={step + 3}")
    results = [p.communicate(timeout=300) for p in resumed]
    assert [p.returncode for p in resumed] == [0, 0], results[1][1][-3000:]
    assert f"at step {step}" in results[0][0] and "2 replica(s)" in results[0][0]
    assert latest_step(model_dir) == step + 3 and summaries(model_dir, "loss")[step + 3] > 0
    assert not [d for d in os.listdir(model_dir) if d.startswith("workertemp")]
    # A pipeline per worker, each feeding its one replica.
    check_same_stream(model_dir, step + 3, pipelines=2, replicas_fed=1)


def test_two_workers_with_different_budgets_stop_at_the_same_step_on_the_chiefs(tmp_path):
    """Whether the time budget is spent is the chief's to say: every worker reads it, at
    the same steps, from the update's all-reduce. A worker given no budget stops with the
    chief (by its own clock it would train on into the next all-reduce, which fails when
    the chief has left), and both checkpoint the same step."""
    model_dir = str(tmp_path / "run")
    workers = [f"localhost:{free_port()}", f"localhost:{free_port()}"]
    processes = [start(model_dir, "--train_steps=100000", f"--max_train_minutes={minutes}",
                       tf_config={"cluster": {"worker": workers},
                                  "task": {"type": "worker", "index": index}})
                 for index, minutes in enumerate((0.3, 0))]
    try:
        results = [p.communicate(timeout=180) for p in processes]
    finally:
        for process in processes:
            process.kill()
    assert [p.returncode for p in processes] == [0, 0], results[1][1][-3000:]
    step = latest_step(model_dir)
    assert step > 1
    assert f"time budget of 0.3 minutes spent at step {step}" in results[0][0]
    assert f"the chief's time budget spent at step {step}" in results[1][0]
    assert logged_steps(results[0][0].splitlines())[-1] == step
