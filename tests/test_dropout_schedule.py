"""--dropout_schedule: the rate a run's dropouts read at each update is the schedule's at the
run's progress, through a resume; a schedule at the model's own rate trains bit for bit as
no schedule; the update is traced once however the rate moves."""

import numpy as np
import pytest
import tensorflow as tf

from conftest import summaries
from keras_transformer import TransformerConfig
from keras_transformer.dropout import Dropout
from programs import program
from trainer.training.dropout_schedule import DropoutSchedule


@pytest.mark.parametrize("text, rates, starts", [
    ("0.2@0,0.3@0.4", (0.2, 0.3), (0.0, 0.4)),
    ("0.1@0", (0.1,), (0.0,)),
    (" 0@0 , 0.1@0.25 ,0.3@0.5", (0.0, 0.1, 0.3), (0.0, 0.25, 0.5))])
def test_a_schedule_reads_as_its_rates_and_starts(text, rates, starts):
    schedule = DropoutSchedule.parse(text)
    assert (schedule.rates, schedule.starts) == (rates, starts)
    assert DropoutSchedule.parse(str(schedule)) == schedule


@pytest.mark.parametrize("text, message", [
    ("0.2,0.3@0.4", "dropout schedule pieces are rate@start (e.g. 0.2@0,0.3@0.4), got '0.2'"),
    ("0.2@0.1", "a dropout schedule starts at 0 (its first rate's @0), got @0.1"),
    ("0.2@0,1.0@0.5", "dropout schedule rates must be in [0, 1), got 1"),
    ("0.2@0,0.3@0.5,0.1@0.5",
     "dropout schedule starts must rise and stay below 1, got @0.5 then @0.5"),
    ("0.2@0,0.3@1", "dropout schedule starts must rise and stay below 1, got @0 then @1")])
def test_a_malformed_schedule_is_one_line_naming_the_fault(text, message):
    with pytest.raises(ValueError) as error:
        DropoutSchedule.parse(text)
    assert str(error.value) == message


def test_the_rate_is_the_last_piece_started_at_or_before_the_progress():
    schedule = DropoutSchedule.parse("0.1@0,0.2@0.25,0.3@0.5")
    progress = [0.0, 0.2499, 0.25, 0.4, 0.5, 0.75, 1.0]
    expected = [0.1, 0.1, 0.2, 0.2, 0.3, 0.3, 0.3]
    assert [float(schedule.rate(p)) for p in progress] == pytest.approx(expected)
    traced = tf.function(schedule.rate)
    assert [float(traced(tf.constant(p))) for p in progress] == pytest.approx(expected)
    assert traced.experimental_get_tracing_count() == 1


def test_a_dropout_following_a_variable_draws_the_fixed_rates_masks_in_one_trace():
    """Dropout(0.1) following a variable set to r drops what Dropout(r) drops from the
    same random numbers, bit for bit; 0 drops nothing; one trace for every rate."""
    x = tf.random.stateless_normal([64, 1000], seed=[1, 2])
    rate = tf.Variable(0.0, trainable=False)
    following = Dropout(0.1, seed=7)
    following.build(x.shape)
    following.follow(rate)
    call = tf.function(lambda x: following(x, training=True))
    for value in (0.3, 0.0, 0.6, 0.1):
        rate.assign(value)
        state = following.seed_generator.state.numpy()  # where the follower's draw starts
        got = call(x).numpy()
        if value == 0.0:
            np.testing.assert_array_equal(got, x.numpy())
            continue
        fixed = Dropout(value, seed=7)
        fixed.build(x.shape)
        fixed.seed_generator.state.assign(state)
        np.testing.assert_array_equal(got, fixed(x, training=True).numpy())
        dropped = float(np.mean(got == 0))
        assert abs(dropped - value) < 0.01, (value, dropped)
    assert call.experimental_get_tracing_count() == 1


def test_only_a_dropout_with_its_random_state_can_follow_a_variable():
    with pytest.raises(ValueError, match="rate above 0 and no noise_shape"):
        Dropout(0.0).follow(tf.Variable(0.1))


def _start(trainer):
    """A trainer's weights and its dropouts' random states (not among the weights)."""
    from trainer.training.checkpointing import dropout_states
    return trainer.model.get_weights(), [v.numpy() for v in dropout_states(trainer.model)]


def _trainer(data, tmp_path, name, start=None, **run):
    """A tiny trainer with dropout 0.1 (a schedule needs dropout > 0), float32, from
    `start` (`_start`'s) when given."""
    from trainer.training.checkpointing import dropout_states
    from trainer.config import RunConfig
    from trainer.main_job import build_trainer
    from trainer.training import distribute
    config = TransformerConfig.tiny(vocab_size=data.tokenizers.target.vocab_size, dropout=0.1)
    run = RunConfig(model_dir=str(tmp_path / name), warmup_steps=50, precision="float32",
                    eval_every=0, log_every=1, checkpoint_every=100, **run)
    trainer = build_trainer(config, data, run, distribute.make_strategy(0), log=lambda _: None)
    if start is not None:
        trainer.model.set_weights(start[0])
        for variable, value in zip(dropout_states(trainer.model), start[1]):
            variable.assign(value)
    return trainer


def test_the_rate_of_each_update_is_the_schedules_and_a_resume_keeps_it(data, tmp_path):
    """0.05@0,0.3@0.5 over 8 updates: the rate reported after update s, which the next
    update reads, is the schedule's at s / 8. A run stopped after 4 updates and resumed
    reads 0.3 from its first update on, as the uninterrupted one does; the update is
    traced once across the change."""
    schedule = "0.05@0,0.3@0.5"
    whole = _trainer(data, tmp_path, "whole", train_steps=8, dropout_schedule=schedule)
    whole.train()
    rates = summaries(whole.run.model_dir, "dropout")
    assert rates == pytest.approx({s: 0.05 if s < 4 else 0.3 for s in range(1, 9)})
    assert whole.update._apply_traced.experimental_get_tracing_count() == 1
    assert float(whole.checkpointer.dropout.progress.numpy()) == 1.0

    first = _trainer(data, tmp_path, "resumed", train_steps=8, dropout_schedule=schedule)
    first.restore()
    for _ in range(4):
        first.update.accumulate(first.stream.next())
        first.update.apply(progress=float(first.step + 1) / 8)
    first.save(4)
    resumed = _trainer(data, tmp_path, "resumed", train_steps=8, dropout_schedule=schedule)
    assert resumed.restore() == 4
    assert float(resumed.checkpointer.dropout.rate.numpy()) == pytest.approx(0.3)
    assert float(resumed.checkpointer.dropout.progress.numpy()) == 0.5


def test_a_resumed_run_takes_the_larger_of_the_progress_kept_and_its_own(data, tmp_path):
    """A time budget can take a run further than its steps say: the checkpoint keeps the
    progress reached (0.75 after 2 of 8 updates here), and a run resumed at step 2 (its
    own progress 0.25) reads the rate of 0.75."""
    first = _trainer(data, tmp_path, "budget", train_steps=8, dropout_schedule="0.1@0,0.3@0.5")
    first.restore()
    for _ in range(2):
        first.update.accumulate(first.stream.next())
        first.update.apply(progress=0.75)
    first.save(2)
    resumed = _trainer(data, tmp_path, "budget", train_steps=8,
                       dropout_schedule="0.1@0,0.3@0.5")
    assert resumed.restore() == 2
    assert float(resumed.checkpointer.dropout.progress.numpy()) == 0.75
    assert float(resumed.checkpointer.dropout.rate.numpy()) == pytest.approx(0.3)


def test_a_schedule_at_the_models_rate_trains_bit_for_bit_as_none(data, tmp_path):
    """A schedule holding the model's own 0.1 reads it from the variable, and 4 updates
    give the weights of 4 without a schedule, to the bit; 0.3 gives others."""
    plain = _trainer(data, tmp_path, "plain", train_steps=4)
    start = _start(plain)
    plain.train()
    same = _trainer(data, tmp_path, "same", start=start, train_steps=4,
                    dropout_schedule="0.1@0")
    same.train()
    other = _trainer(data, tmp_path, "other", start=start, train_steps=4,
                     dropout_schedule="0.3@0")
    other.train()
    for a, b in zip(plain.model.get_weights(), same.model.get_weights()):
        np.testing.assert_array_equal(a, b)
    assert any(not np.array_equal(a, b) for a, b in
               zip(plain.model.get_weights(), other.model.get_weights()))


QUICK = ["--max_len=32", "--batch_tokens=512", "--eval_every=0", "--export_dir=none",
         "--log_every=5", "--warmup_steps=50", "--precision=float32", "--checkpoint_every=5"]


@pytest.mark.slow
def test_the_task_records_the_schedule_and_a_resume_without_the_flag_keeps_it(tmp_path):
    """trainer.task --dropout_schedule writes dropout_schedule.json; run again with more
    steps and no flag, it follows the recorded schedule from the rate it had reached."""
    model_dir = tmp_path / "model"
    flags = [*QUICK, f"--model_dir={model_dir}", "--hparams=dropout=0.1"]
    first = program("task", *flags, "--train_steps=10", "--dropout_schedule=0.05@0,0.2@0.5",
                    cwd=tmp_path)
    assert first.returncode == 0, first.stderr
    assert (model_dir / "dropout_schedule.json").exists()
    assert "dropout: 0.05@0,0.2@0.5 (rate@progress of the run)" in first.stdout
    again = program("task", *flags, "--train_steps=20", cwd=tmp_path)
    assert again.returncode == 0, again.stderr
    assert "dropout: 0.05@0,0.2@0.5, as the model directory recorded" in again.stdout
    # The progress kept (10 of 10: 1) is above the resumed run's own (10 of 20).
    assert "dropout 0.2 from step 10 (progress 1.000" in again.stdout
    rates = summaries(model_dir, "dropout")
    assert rates == pytest.approx({5: 0.2, 10: 0.2, 15: 0.2, 20: 0.2})


@pytest.mark.parametrize("flags, message", [
    (["--dropout_schedule=0.2@0,0.3@0.4"],
     "--dropout_schedule needs dropout > 0 (--hparams=dropout=...): the model has no "
     "dropout to schedule"),
    (["--hparams=dropout=0.1", "--dropout_schedule=0.2@0,0.3"],
     "dropout schedule pieces are rate@start (e.g. 0.2@0,0.3@0.4), got '0.3'")])
def test_a_schedule_the_model_cannot_follow_is_refused_in_one_line(flags, message, tmp_path):
    result = program("task", *QUICK, f"--model_dir={tmp_path / 'model'}", *flags,
                     cwd=tmp_path)
    assert result.returncode == 2
    assert result.stderr.strip().splitlines()[-1] == f"trainer.task: error: {message}"
    assert not (tmp_path / "model").exists()
