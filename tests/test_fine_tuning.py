"""`trainer.task --init_from=MODEL_DIR`: a new run on another corpus that starts from a
trained model's weights, vocabulary and architecture, as a user fine-tunes; and the
OPUS-MT path: a converted Marian model fine-tuned the same way."""

import math
import random
import subprocess
import sys
from pathlib import Path

import keras
import numpy as np
import pytest
from conftest import QUICK, REPO, _env, summaries
from keras_transformer import Transformer
from trainer.conversion import marian
from trainer.data import builtin_corpus
from trainer.model_dir import layout

pytestmark = pytest.mark.slow

FIXTURE = Path(__file__).parent / "fixtures" / "marian" / "shared_swish"


def corpus(directory, seed, size):
    """Files of `size` builtin pairs drawn with `seed` (train.en/de, valid.en/de): another
    corpus of the same task than the one the session's model saw."""
    rng = random.Random(seed)
    numbers = [rng.randrange(10 ** rng.randrange(1, 7)) for _ in range(size)]
    directory.mkdir(exist_ok=True)
    for split, part in (("train", numbers[20:]), ("valid", numbers[:20])):
        (directory / f"{split}.en").write_text("".join(builtin_corpus.english(n) + "\n"
                                                       for n in part))
        (directory / f"{split}.de").write_text("".join(builtin_corpus.german(n) + "\n"
                                                       for n in part))
    return [f"--train_src={directory / 'train.en'}", f"--train_tgt={directory / 'train.de'}",
            f"--eval_src={directory / 'valid.en'}", f"--eval_tgt={directory / 'valid.de'}"]


def task(*flags):
    return subprocess.run([sys.executable, "-m", "trainer.task", *flags], cwd=REPO, env=_env(),
                          capture_output=True, text=True, timeout=600)


def test_a_fine_tuned_run_starts_at_its_models_loss_with_its_vocabulary(exported, tmp_path):
    data = corpus(tmp_path / "data", seed=7, size=600)
    flags = [*QUICK, "--log_every=1", "--train_steps=2", "--checkpoint_every=2", *data]
    tuned = tmp_path / "tuned"
    result = task(*flags, f"--init_from={exported.model_dir}", f"--model_dir={tuned}")
    assert result.returncode == 0, result.stderr[-3000:]
    assert f"initialized from {exported.model_dir}/ckpt-30: its weights" in result.stdout
    # Its vocabulary, byte for byte, and its architecture.
    assert (tuned / "spm.model").read_bytes() == (exported.model_dir / "spm.model").read_bytes()
    assert (tuned / "config.json").read_text() == (exported.model_dir / "config.json").read_text()
    # A new step count: steps 1 and 2 of this run.
    tuned_loss = summaries(str(tuned), "loss")
    assert sorted(tuned_loss) == [1, 2]
    # The same first batch from random weights, in a run that only shares the vocabulary.
    fresh = tmp_path / "fresh"
    fresh.mkdir()
    (fresh / "spm.model").write_bytes((exported.model_dir / "spm.model").read_bytes())
    result = task(*flags, f"--model_dir={fresh}")
    assert result.returncode == 0, result.stderr[-3000:]
    random_loss = summaries(str(fresh), "loss")[1]
    trained_loss = summaries(str(exported.model_dir), "loss")[30]
    assert random_loss > math.log(500) - 0.5  # about ln(vocab) from random weights
    assert tuned_loss[1] < random_loss - 0.5, (tuned_loss, random_loss, trained_loss)
    assert abs(tuned_loss[1] - trained_loss) < 0.5, (tuned_loss, trained_loss)


def test_a_flag_that_contradicts_the_models_architecture_is_one_line(exported, tmp_path):
    for flag, named in (("--hparams=num_layers=3", "--hparams=num_layers=3 contradicts"),
                        ("--config=small", "--config=small contradicts")):
        result = task(f"--init_from={exported.model_dir}", flag,
                      f"--model_dir={tmp_path / 'run'}")
        assert result.returncode == 2, result.stderr[-3000:]
        line = result.stderr.strip().splitlines()[-1]
        assert line.startswith("trainer.task: error: ") and named in line, line
    assert not (tmp_path / "run").exists()


def model_weights(model: keras.Model):
    """[(variable path, array)] of every weight of a model, in the model's order (the same
    for the same architecture; the paths' layer numbers may differ)."""
    return [(weight.path, weight.numpy()) for weight in model.weights]


def test_a_converted_opus_mt_model_fine_tunes_from_its_weights(tmp_path):
    """(Its export is test_marian's: the same programs read a fine-tuned directory.)"""
    converted = tmp_path / "opus-mt"
    marian.convert(str(FIXTURE), str(converted))
    data = corpus(tmp_path / "data", seed=8, size=300)
    result = task(*QUICK, "--log_every=1", "--train_steps=2", "--checkpoint_every=2", *data,
                  f"--init_from={converted}", f"--model_dir={tmp_path / 'tuned'}",
                  "--hparams=dropout=0.0")
    assert result.returncode == 0, result.stderr[-3000:]
    assert f"initialized from {converted}/ckpt-0: its weights" in result.stdout
    assert (tmp_path / "tuned" / "vocabulary.json").read_bytes() == \
        (converted / "vocabulary.json").read_bytes()
    assert sorted(summaries(str(tmp_path / "tuned"), "loss")) == [1, 2]
    # The converted weights were the start: two warm-up updates (each moves a weight by
    # about the learning rate, 5e-4 per step here) leave every weight near them, where a
    # random start of the same architecture lies far from them.
    start = model_weights(layout.restore_model(str(converted)))
    tuned = model_weights(layout.restore_model(str(tmp_path / "tuned")))
    keras.utils.set_random_seed(0)
    fresh = Transformer(layout.load_config(str(converted)))
    fresh.build()
    random_start = model_weights(fresh)
    assert [a.shape for _, a in tuned] == [a.shape for _, a in start] == \
        [a.shape for _, a in random_start] and len(start) > 30
    moved = [np.abs(a - b).max() for (_, a), (_, b) in zip(tuned, start)]
    apart = [np.abs(a - b).max() for (_, a), (_, b) in zip(random_start, start)]
    assert max(moved) < 0.01, max(zip(moved, [name for name, _ in start]))
    # Layer norms start at 1 and 0 either way; every other weight tells the starts apart.
    alike = [name for (name, _), distance in zip(start, apart) if distance < 0.05]
    assert all("norm" in name for name in alike), alike
    assert len(alike) < len(start) / 2
