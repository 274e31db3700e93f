"""Checkpoint averaging (section 6.1) as a user runs it: `python -m trainer.average` writes
a model directory of its own whose weights are the mean of the last checkpoints, and
`python -m trainer.export` exports it."""

import json
import shutil
import subprocess
import sys

import numpy as np
import pytest
import tensorflow as tf

from conftest import _env

pytestmark = pytest.mark.slow

EMBEDDING = "model/embedding/embeddings/.ATTRIBUTES/VARIABLE_VALUE"


def test_the_averaged_directory_holds_the_mean_and_exports(exported, tmp_path):
    model_dir = tmp_path / "run"
    shutil.copytree(exported.model_dir, model_dir)
    averaged = subprocess.run([sys.executable, "-m", "trainer.average",
                               f"--model_dir={model_dir}", "--last=2"], cwd=tmp_path,
                              env=_env(), capture_output=True, text=True, timeout=600)
    assert averaged.returncode == 0, averaged.stderr[-3000:]
    assert averaged.stdout.strip() == (f"averaged 2 checkpoints (ckpt-15, ckpt-30) into "
                                       f"{model_dir}/averaged")
    embeddings = [tf.train.load_checkpoint(str(model_dir / name)).get_tensor(EMBEDDING)
                  for name in ("ckpt-15", "ckpt-30")]
    mean = tf.train.load_checkpoint(tf.train.latest_checkpoint(str(model_dir / "averaged")))
    np.testing.assert_allclose(mean.get_tensor(EMBEDDING), np.mean(embeddings, axis=0),
                               rtol=1e-6, atol=1e-7)
    assert not np.allclose(embeddings[0], embeddings[1])

    export = subprocess.run([sys.executable, "-m", "trainer.export",
                             f"--model_dir={model_dir / 'averaged'}",
                             f"--export_dir={tmp_path / 'export'}"], cwd=tmp_path, env=_env(),
                            capture_output=True, text=True, timeout=600)
    assert export.returncode == 0, export.stderr[-3000:]
    info = json.loads((tmp_path / "export" / "1" / "assets.extra" / "export.json").read_text())
    assert info["checkpoints"] == [f"{model_dir}/averaged/ckpt-30"]
