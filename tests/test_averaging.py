"""Checkpoint averaging (section 6.1) as a user runs it: `python -m trainer.average` writes
a model directory of its own whose weights are the mean of the last checkpoints, with
the config, vocabulary and checkpoint state that `trainer.export` reads."""

import json
import os
import shutil
import socket
import subprocess
import sys

import numpy as np
import pytest

from conftest import _env, checkpoint_weights
from trainer.data import vocabulary
from trainer.model_dir import layout

pytestmark = pytest.mark.slow

def test_the_averaged_directory_holds_the_mean_as_a_model_directory(exported, tmp_path):
    model_dir = tmp_path / "run"
    shutil.copytree(exported.model_dir, model_dir)
    # A reader takes no lock: a live trainer's (this test's own process) stops it not.
    live = {"host": socket.gethostname(), "pid": os.getpid(), "started": "now"}
    (model_dir / "trainer.lock").write_text(json.dumps(live))
    averaged = subprocess.run([sys.executable, "-m", "trainer.average",
                               f"--model_dir={model_dir}", "--last=2"], cwd=tmp_path,
                              env=_env(), capture_output=True, text=True, timeout=600)
    assert averaged.returncode == 0, averaged.stderr[-3000:]
    assert json.loads((model_dir / "trainer.lock").read_text()) == live
    assert averaged.stdout.strip() == (f"averaged 2 checkpoints (ckpt-15, ckpt-30) into "
                                       f"{model_dir}/averaged")
    first, last = (checkpoint_weights(model_dir, model_dir / name)
                   for name in ("ckpt-15", "ckpt-30"))
    mean = checkpoint_weights(model_dir / "averaged")
    assert len(mean) == len(first) > 50
    for average, a, b in zip(mean, first, last):  # every weight
        np.testing.assert_allclose(average, (a.astype(np.float64) + b) / 2, rtol=1e-6,
                                   atol=1e-7)
    assert sum(not np.allclose(a, b) for a, b in zip(first, last)) > len(first) / 2

    # A model directory of its own (its weights were restored from it above, as
    # trainer.export restores them): the same config and a readable vocabulary.
    averaged_dir = str(model_dir / "averaged")
    config = layout.load_config(averaged_dir)
    assert config == layout.load_config(str(model_dir))
    assert vocabulary.load_or_train(averaged_dir, None).target.vocab_size == config.vocab_size
