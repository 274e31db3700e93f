"""Checkpoint averaging (section 6.1) as a user runs it: `python -m trainer.average` writes
a model directory of its own whose weights are the mean of the last checkpoints, with
the config, vocabulary and checkpoint state that `trainer.export` reads."""

import json
import os
import shutil
import socket
from pathlib import Path

import numpy as np
import pytest
import tensorflow as tf

from conftest import checkpoint_weights
from programs import program
from trainer.conversion import marian
from trainer.data import vocabulary
from trainer.model_dir import averaging, layout
from trainer.model_dir.weights import WeightsChoice
from trainer.serving import saved_model

pytestmark = pytest.mark.slow

def test_the_averaged_directory_holds_the_mean_as_a_model_directory(exported, tmp_path):
    model_dir = tmp_path / "run"
    shutil.copytree(exported.model_dir, model_dir)
    # A reader takes no lock: a live trainer's (this test's own process, where the
    # program's main runs too) stops it not.
    live = {"host": socket.gethostname(), "pid": os.getpid(), "started": "now"}
    (model_dir / "trainer.lock").write_text(json.dumps(live))
    averaged = program("average", f"--model_dir={model_dir}", "--last=2", cwd=tmp_path)
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


FIXTURE = Path(__file__).parent / "fixtures" / "marian" / "shared_swish"
# Numbers with the punctuation Moses' rules rewrite (curly quotes, a dash, a space before
# a colon), so that a directory that stopped normalizing reads other pieces.
TEXTS = ["\u201cone hundred\u201d \u2013 two : three", "seven", "\u00abtwelve\u00bb ; nine"]


def with_a_second_checkpoint(model_dir: Path):
    """Adds ckpt-1 to a converted directory (whose one checkpoint is ckpt-0): every weight
    moved by a seeded 10%, a second model to average with."""
    model = layout.restore_model(str(model_dir))
    rng = np.random.default_rng(0)
    model.set_weights([w * (1 + 0.1 * rng.standard_normal(w.shape)).astype(w.dtype)
                       for w in model.get_weights()])
    tf.train.CheckpointManager(tf.train.Checkpoint(model=model), str(model_dir),
                               max_to_keep=5).save(checkpoint_number=1)


def test_an_averaged_converted_and_normalizing_directory_translates_as_its_average(tmp_path):
    """The averaged directory of a converted model (its ids come from vocabulary.json)
    that normalizes punctuation (normalization.json) is a whole model directory:
    exported as it is, it translates as the original directory exported with
    --export_weights=average and the same --average_last."""
    model_dir = tmp_path / "model"
    marian.convert(str(FIXTURE), str(model_dir), normalize_punctuation="en")
    with_a_second_checkpoint(model_dir)
    averaging.write_averaged(str(model_dir), 2)
    averaged = model_dir / averaging.AVERAGED_DIR
    for name in (layout.CONFIG_FILE, layout.VOCABULARY, layout.NORMALIZATION):
        assert (averaged / name).read_bytes() == (model_dir / name).read_bytes(), name
    # The average is a third model, neither checkpoint's.
    mean = checkpoint_weights(averaged)
    last = checkpoint_weights(model_dir, model_dir / "ckpt-1")
    assert sum(not np.allclose(a, b) for a, b in zip(mean, last)) > len(mean) / 2

    exported = saved_model.export(str(averaged), str(tmp_path / "export"))
    translated = saved_model.load(exported).signatures["serving_default"](
        inputs=tf.constant(TEXTS))["translations"]
    original, _ = saved_model.build_translator(
        str(model_dir), saved_model.Options(weights=WeightsChoice("average", 2)))
    expected = original.translate(tf.constant(TEXTS))["translations"]
    assert translated.numpy().tolist() == expected.numpy().tolist()
