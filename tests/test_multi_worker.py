"""Two MultiWorkerMirroredStrategy workers on localhost, started as docs/training.md
starts them (the same flags, model directory and export directory): their update is the
update one worker computes from the same global batch, and only the chief exports. One
cluster run for the module (`cluster`): 3 updates, a checkpoint after each, dropout off,
--deterministic, the export on."""

import json
import os
import shutil
import subprocess
import sys

import numpy as np
import pytest

from conftest import (QUICK, REPO, built_once, checkpoint_weights, free_port, latest_step,
                      summaries)

pytestmark = pytest.mark.slow

STEPS = 3
# Dropout off: each worker draws its replica's masks, which one worker cannot draw alike.
FLAGS = [*QUICK, "--log_every=1", f"--train_steps={STEPS}", "--checkpoint_every=1",
         f"--keep_checkpoints={STEPS}", "--deterministic", "--hparams=dropout=0.0"]


def _run_cluster(root):
    workers = [f"localhost:{free_port()}", f"localhost:{free_port()}"]
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2"}
    processes = [subprocess.Popen(
        [sys.executable, "-m", "trainer.task", *FLAGS, f"--model_dir={root / 'run'}",
         f"--export_dir={root / 'export'}"], cwd=REPO, text=True,
        stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        env={**env, "TF_CONFIG": json.dumps({"cluster": {"worker": workers},
                                             "task": {"type": "worker", "index": index}})})
        for index in range(2)]
    try:
        results = [p.communicate(timeout=600) for p in processes]
    finally:
        for process in processes:
            process.kill()
    for index, (process, (out, err)) in enumerate(zip(processes, results)):
        (root / f"worker{index}.json").write_text(json.dumps(
            {"status": process.returncode, "stdout": out, "stderr": err}))


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    """The cluster's directory: run/ (the model directory), export/, and worker<i>.json
    (each worker's status, stdout and stderr)."""
    root = built_once(tmp_path_factory, "two_workers", _run_cluster, *FLAGS)
    results = [json.loads((root / f"worker{i}.json").read_text()) for i in range(2)]
    assert [r["status"] for r in results] == [0, 0], [r["stderr"][-3000:] for r in results]
    return root, results


def test_two_workers_update_as_one_worker_does_on_the_same_global_batch(cluster, tmp_path):
    """From the cluster's checkpoint of step 1 (weights, Adam's moments, the step), one
    worker with one replica takes updates 2 and 3, each accumulating the two workers'
    batches of that step (their input pipelines' shards, as the workers read them), and
    ends with the cluster's weights of step 3, bit for bit.

    The one worker's updates are computed in this process (this test's own training): no
    program can feed one worker the two shards' batches. Equal bits, not a tolerance: each
    batch's gradient is the same computation in both processes, the all-reduce of two
    addends is their sum either way round (a + b == b + a in floating point), as the
    accumulation's 0 + a + b is, and the rest (the division by the step's tokens, Adam) is
    the same op on the same values. Measured: 0 difference, with updates 2-3 moving a
    weight by up to 8e-4. A tolerance would not do: in Adam's first updates an entry whose
    gradient is float noise (a key bias: softmax ignores it) steps by the learning rate
    in the noise's sign, so the last bits of a gradient can move a weight by the learning
    rate (up to 1e-3 here)."""
    import keras
    import tensorflow as tf
    from trainer.config import DataConfig, RunConfig
    from trainer.data import input_pipeline, sources
    from trainer.main_job import build_trainer
    from trainer.model_dir import layout
    from trainer.training.cooldown import cooldown_factor

    root, _ = cluster
    model_dir = tmp_path / "run"
    shutil.copytree(root / "run", model_dir)
    assert latest_step(model_dir) == STEPS
    keras.utils.set_random_seed(0)  # as trainer.main_job before it builds the data
    config = DataConfig(max_len=32, batch_tokens=512)
    data = input_pipeline.build(sources.select(config), str(model_dir), config)
    shards = [list(data.train_dataset(tf.distribute.InputContext(2, pipeline, 2))
                   .take(STEPS)) for pipeline in range(2)]
    # The batches are the ones the workers trained on: every step's target tokens.
    logged = summaries(model_dir, "target_tokens")
    assert [logged[step] for step in range(1, STEPS + 1)] == [
        sum(int(tf.math.count_nonzero(shard[step][1])) for shard in shards)
        for step in range(STEPS)]

    run = RunConfig(model_dir=str(model_dir), precision="float32", warmup_steps=50,
                    train_steps=STEPS, accum_steps=2, deterministic=True)
    trainer = build_trainer(layout.load_config(str(model_dir)), data, run,
                            tf.distribute.get_strategy())
    tf.train.Checkpoint(**trainer.checkpointer.tracked).restore(
        str(model_dir / "ckpt-1")).assert_existing_objects_matched()
    assert trainer.step == 1
    for step in range(1, STEPS):
        for shard in shards:
            trainer.update.accumulate(shard[step])
        trainer.update.apply(cooldown_factor(run.cooldown, step, STEPS, 0.0, None))
    assert trainer.step == STEPS

    one_worker = [w.numpy() for w in trainer.model.weights]
    two_workers = checkpoint_weights(model_dir, model_dir / f"ckpt-{STEPS}")
    at_step_1 = checkpoint_weights(model_dir, model_dir / "ckpt-1")
    assert len(one_worker) == len(two_workers) > 20
    moved = max(float(np.abs(a - b).max()) for a, b in zip(two_workers, at_step_1))
    differ = max(float(np.abs(a - b).max()) for a, b in zip(one_worker, two_workers))
    print(f"largest change of a weight in updates 2-3: {moved:.3g}; largest difference "
          f"from the cluster's: {differ:.3g}")
    assert moved > 1e-4  # the updates moved the weights, so equal weights say something
    assert differ == 0.0


def test_only_the_chief_exports(cluster):
    """Both workers are given the same --export_dir: the chief writes the one version
    (and translates the example through it), the other worker writes none and says
    nothing of an export, and both end with status 0."""
    root, (chief, worker) = cluster
    export = root / "export"
    assert os.listdir(export) == ["1"]
    assert (export / "1" / "saved_model.pb").is_file()
    assert f"exported SavedModel to {export / '1'}" in chief["stdout"]
    assert "example through the export:" in chief["stdout"]
    assert "export" not in worker["stdout"].replace("--export_dir", "")
    assert "2 replica(s)" in chief["stdout"]
    assert not [d for d in os.listdir(root / "run") if d.startswith("workertemp")]
