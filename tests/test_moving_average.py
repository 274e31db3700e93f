"""The exponential moving average of the weights (--ema_decay): its definition update by
update, in the checkpoint across a resume, and in the export with --export_weights=ema."""

import os

import numpy as np
import pytest

from conftest import checkpoint_weights, exported_weights, make_trainer, one_update
from trainer.data import vocabulary
from trainer.model_dir import layout
from trainer.model_dir.ema import decay_at
from trainer.model_dir.weights import WeightsChoice
from trainer.serving import saved_model
from trainer.training.validation import Validator


def test_the_moving_average_follows_its_definition_update_by_update(data, tmp_path):
    trainer = make_trainer(data, tmp_path, "ema", ema_decay=0.9)
    trainer.restore()
    averages = trainer.checkpointer.moving_average.averages
    expected = [a.numpy().astype(np.float64) for a in averages]
    for step in range(1, 5):
        one_update(trainer)
        d = min(0.9, (1 + step) / (10 + step))
        assert float(decay_at(0.9, step)) == pytest.approx(d)
        weights = [w.numpy() for w in trainer.model.trainable_variables]
        expected = [d * e + (1 - d) * w for e, w in zip(expected, weights)]
        for average, want in zip(averages, expected):
            np.testing.assert_allclose(average.numpy(), want, rtol=1e-5, atol=1e-6)
    # Not the weights themselves: the average lags behind them.
    assert max(np.abs(a.numpy() - w).max() for a, w in zip(averages, weights)) > 1e-4


def three_updates(trainer):
    """The trainer, restored (its step 0), after three updates."""
    trainer.restore()
    for _ in range(3):
        one_update(trainer)
    return trainer


def test_the_moving_average_is_in_the_checkpoint_and_survives_a_resume(data, tmp_path):
    trainer = three_updates(make_trainer(data, tmp_path, "resumed", ema_decay=0.99))
    trainer.checkpointer.save(3)
    saved = [a.numpy() for a in trainer.checkpointer.moving_average.averages]

    resumed = make_trainer(data, tmp_path, "resumed", ema_decay=0.99)
    assert resumed.restore() == 3
    for average, want in zip(resumed.checkpointer.moving_average.averages, saved):
        np.testing.assert_array_equal(average.numpy(), want)
    # A run without EMA resumes from the same checkpoint (the average is not required).
    assert make_trainer(data, tmp_path, "resumed").restore() == 3


def test_validation_scores_the_moving_average_when_the_export_ships_it(data, tmp_path):
    trainer = three_updates(make_trainer(data, tmp_path, "validated", ema_decay=0.9,
                                         export_weights="ema"))
    variables = trainer.model.trainable_variables
    live = [v.numpy() for v in variables]
    trainer.validator = Validator(trainer.model, data, str(tmp_path / "validated"),
                                  bleu_sentences=None)
    scored = trainer._validate(3)
    # The live weights are back after validation ...
    for variable, want in zip(variables, live):
        np.testing.assert_array_equal(variable.numpy(), want)
    # ... and what was scored is the average, not them.
    assert scored != trainer.validator(3)
    trainer.checkpointer.moving_average.copy_to(variables)
    assert trainer.validator(3) == scored


def test_export_weights_ema_ships_the_moving_average(data, tmp_path):
    """The export of a model directory whose checkpoint holds a moving average (the
    export that trainer.task --export_weights=ema runs after training)."""
    model_dir = tmp_path / "run"
    trainer = three_updates(make_trainer(data, tmp_path, "run", ema_decay=0.99))
    trainer.checkpointer.save(3)
    layout.save_config(str(model_dir), trainer.model.config)
    vocabulary.copy_vocabulary(os.path.dirname(data.tokenizers.target.path), str(model_dir))
    path = saved_model.export(str(model_dir), str(tmp_path / "export"),
                              saved_model.Options(weights=WeightsChoice("ema")))
    # Every weight of the export is its variable's moving average, not the variable.
    model = trainer.model
    assert [w.path for w in model.weights] == [w.path for w in model.trainable_variables]
    averages = [a.numpy() for a in trainer.checkpointer.moving_average.averages]
    weights = exported_weights(path)
    assert len(weights) == len(averages) == len(model.weights)
    for weight, average in zip(weights, averages):
        np.testing.assert_array_equal(weight, average)
    last = checkpoint_weights(model_dir)
    assert sum(np.abs(average - w).max() > 1e-5 for average, w in zip(averages, last)) > \
        len(last) / 2

