"""`trainer.task --init_from=MODEL_DIR`: a new run on another corpus that starts from a
trained model's weights, vocabulary and architecture, as a user fine-tunes; and the
OPUS-MT path: a converted Marian model fine-tuned the same way."""

import math
import random
import re
import subprocess
import sys
from pathlib import Path

import keras
import numpy as np
import pytest
from conftest import QUICK, REPO, _env, built_once, summaries
from programs import program
from keras_transformer import BOS_ID, PAD_ID, Transformer
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
    """trainer.task's main, in this process (programs.program)."""
    return program("task", *flags)


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


def readme_fine_tuning_row():
    """The README's OPUS-MT row: its three commands (convert, fine-tune, export), as
    written."""
    readme = (REPO / "README.md").read_text(encoding="utf-8")
    row = next(line for line in readme.splitlines() if "OPUS-MT model fine-tuned" in line)
    commands = [c for c in re.findall(r"`(python -m trainer\.[^`]+)`", row)]
    assert [c.split()[2] for c in commands] == ["trainer.convert", "trainer.task",
                                                 "trainer.export"], commands
    return commands


def run_readme_row(root: Path):
    """The README's row run in `root` as a user types it (subprocesses): the committed
    Marian fixture in place of opus-mt-en-de, builtin number pairs in place of the `...`
    files, and two updates; each program's stdout in root/<program>.out."""
    data = corpus(root / "data", seed=8, size=300)
    for command in readme_fine_tuning_row():
        args = command.split()
        args = [f"--input={FIXTURE}" if a == "--input=opus-mt-en-de" else a for a in args
                if not a.endswith("=...")]
        if args[2] == "trainer.task":
            args += [*data, *QUICK, "--log_every=1", "--train_steps=2", "--checkpoint_every=2"]
        result = subprocess.run([sys.executable, *args[1:]], cwd=root, env=_env(),
                                capture_output=True, text=True, timeout=600)
        assert result.returncode == 0, (command, result.stderr[-3000:])
        (root / f"{args[2]}.out").write_text(result.stdout)


@pytest.fixture(scope="module")
def fine_tuned(tmp_path_factory):
    """The directory the README's row ran in (`run_readme_row`), once per test run for
    both tests that read it, whichever workers run them."""
    return built_once(tmp_path_factory, "readme_fine_tuning_row", run_readme_row,
                      readme_fine_tuning_row(), QUICK)


def test_a_converted_opus_mt_model_fine_tunes_from_its_weights(fine_tuned):
    """(Its export is test_marian's: the same programs read a fine-tuned directory.)"""
    converted, tuned = fine_tuned / "runs" / "opus-mt", fine_tuned / "runs" / "opus-mt-tuned"
    assert "initialized from runs/opus-mt/ckpt-0: its weights" in \
        (fine_tuned / "trainer.task.out").read_text()
    assert (tuned / "vocabulary.json").read_bytes() == (converted / "vocabulary.json").read_bytes()
    assert sorted(summaries(str(tuned), "loss")) == [1, 2]
    # The converted weights were the start: two warm-up updates (each moves a weight by
    # about the learning rate, 5e-4 per step here) leave every weight near them, where a
    # random start of the same architecture lies far from them.
    start = model_weights(layout.restore_model(str(converted)))
    tuned = model_weights(layout.restore_model(str(tuned)))
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


def test_the_readmes_fine_tuning_row_publishes_the_fine_tuned_weights(fine_tuned, tmp_path):
    """The row's last command exports the fine-tuning run, not the model it started from:
    the Marian checkpoint it writes, read back, holds the fine-tuned checkpoint's weights
    exactly, and they are not the converted model's. (But for our PAD's embedding row and
    output bias, which Marian has no id for.)"""
    runs = fine_tuned / "runs"
    published = fine_tuned / "saved_models" / "opus-mt-tuned-marian"
    marian.convert(str(published), str(tmp_path / "back"))
    back = model_weights(layout.restore_model(str(tmp_path / "back")))
    tuned = model_weights(layout.restore_model(str(runs / "opus-mt-tuned")))
    converted = model_weights(layout.restore_model(str(runs / "opus-mt")))
    assert len(back) == len(tuned) > 30
    differing = [i for i, ((_, a), (_, b)) in enumerate(zip(back, tuned))
                 if not np.array_equal(a, b)]
    # The shared embedding [vocab, d_model] and the output bias [vocab], by their rows.
    assert all("embedding" in tuned[i][0] for i in differing) and len(differing) <= 2
    for i in differing:
        (_, a), (_, b) = back[i], tuned[i]
        np.testing.assert_array_equal(a[PAD_ID + 1:], b[PAD_ID + 1:])
        # The way back gives PAD what a conversion gives it: <pad>'s embedding, which is
        # our BOS's, and the bias that keeps it out of the softmax.
        np.testing.assert_array_equal(a[PAD_ID], b[BOS_ID] if a.ndim == 2 else
                                      marian.ABSENT_BIAS)
    moved = [not np.array_equal(a, b) for (_, a), (_, b) in zip(back, converted)]
    assert sum(moved) > len(moved) / 2
