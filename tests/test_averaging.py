"""Checkpoint averaging (section 6.1) as a user runs it: `python -m trainer.average` writes
a model directory of its own whose weights are the mean of the last checkpoints, with
the config, vocabulary and checkpoint state that `trainer.export` reads."""

import shutil
import subprocess
import sys

import numpy as np
import pytest
import tensorflow as tf

from conftest import _env
from trainer.data import vocabulary
from trainer.model_dir import layout

pytestmark = pytest.mark.slow

EMBEDDING = "model/embedding/embeddings/.ATTRIBUTES/VARIABLE_VALUE"


def test_the_averaged_directory_holds_the_mean_as_a_model_directory(exported, tmp_path):
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

    # What trainer.export and trainer.task read of a model directory, in this process.
    averaged_dir = str(model_dir / "averaged")
    model = layout.restore_model(averaged_dir)
    np.testing.assert_array_equal(model.embedding.embeddings.numpy(),
                                  mean.get_tensor(EMBEDDING))
    assert vocabulary.load_or_train(averaged_dir, None).target.vocab_size == \
        model.config.vocab_size
