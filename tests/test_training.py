"""The optimisation recipe of section 5: schedule, label smoothing, accumulation, precision."""


import keras
import numpy as np
import pytest
import tensorflow as tf

from conftest import INITIAL_WEIGHTS, make_trainer, one_update, summaries
from keras_transformer import (LabelSmoothedCrossEntropy, Transformer, WarmupSchedule,
                               label_smoothed_cross_entropy)
from trainer.config import PRECISIONS
from trainer.training.cooldown import cooldown_factor


def paper_lrate(step, d_model=512, warmup=4000):
    return d_model ** -0.5 * min(step ** -0.5, step * warmup ** -1.5)


@pytest.mark.parametrize("step", [1, 4000, 40000])
def test_schedule_equals_the_formula_at_1_warmup_and_10x_warmup(step):
    schedule = WarmupSchedule(d_model=512, warmup_steps=4000)
    assert float(schedule(step)) == pytest.approx(paper_lrate(step), rel=1e-6)
    # Peak at warm-up: rising before, falling after.
    assert float(schedule(3999)) < float(schedule(4000)) > float(schedule(4001))


def test_schedule_round_trips_through_keras_serialization():
    schedule = WarmupSchedule(d_model=256, warmup_steps=100, scale=2.0)
    clone = keras.saving.deserialize_keras_object(keras.saving.serialize_keras_object(schedule))
    assert float(clone(50)) == pytest.approx(float(schedule(50)))


def test_smoothed_loss_equals_a_hand_computation():
    logits = np.array([[[2.0, 0.5, -1.0, 0.0], [0.1, 0.2, 0.3, 0.4], [9.0, 9.0, 9.0, 9.0]]],
                      np.float32)
    labels = np.array([[2, 1, 0]])  # the last position is padding
    eps, vocab = 0.1, 4
    expected = 0.0
    for t in range(2):
        p = np.exp(logits[0, t]) / np.exp(logits[0, t]).sum()
        q = np.full(vocab, eps / vocab)
        q[labels[0, t]] += 1 - eps
        expected += -(q * np.log(p)).sum()
    loss_sum, tokens = label_smoothed_cross_entropy(labels, logits, label_smoothing=eps)
    assert float(tokens) == 2.0
    assert float(loss_sum) == pytest.approx(expected, rel=1e-6)


def distributed(trainer, *batches):
    dataset = tf.data.Dataset.from_tensors(batches[0])
    for batch in batches[1:]:
        dataset = dataset.concatenate(tf.data.Dataset.from_tensors(batch))
    return iter(trainer.strategy.experimental_distribute_dataset(dataset))


def test_two_accumulated_batches_give_the_update_of_one_double_batch(data, tmp_path):
    (source, target_in), target_out = next(iter(data.eval_dataset()))
    half = source.shape[0] // 2
    assert half >= 2
    first = ((source[:half], target_in[:half]), target_out[:half])
    second = ((source[half:2 * half], target_in[half:2 * half]), target_out[half:2 * half])
    double = ((source[:2 * half], target_in[:2 * half]), target_out[:2 * half])

    accumulated = make_trainer(data, tmp_path, "accumulated", accum_steps=2)
    iterator = distributed(accumulated, first, second)
    accumulated.update.accumulate(next(iterator))
    accumulated.update.accumulate(next(iterator))
    single = make_trainer(data, tmp_path, "single")
    single.update.accumulate(next(distributed(single, double)))

    # The gradient each update sees: accumulated sums over all target tokens of the step.
    def gradient(trainer):
        tokens = trainer.update.totals.target_tokens.numpy()
        return [g.numpy() / tokens for g in trainer.update.gradient_sums]

    gradients = gradient(single)
    for a, b in zip(gradient(accumulated), gradients):
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-7)
    stats_a, stats_b = accumulated.update.apply(), single.update.apply()
    for key in ("loss", "gradient_norm", "target_tokens"):
        assert float(getattr(stats_a, key)) == pytest.approx(float(getattr(stats_b, key)),
                                                             rel=1e-5), key
    before = make_trainer(data, tmp_path, "untrained").model.get_weights()
    after_a, after_b = accumulated.model.get_weights(), single.model.get_weights()
    step = max(np.abs(a - w).max() for a, w in zip(after_a, before))
    assert step > 0, "the update must change the weights"
    # Adam's first step is lr * sign(g) where |g| is large enough: the same update but
    # where the gradient is float noise (the key biases' is zero: a softmax ignores them).
    noise = 1e-6 * max(np.abs(g).max() for g in gradients)
    mismatched = [int(((np.abs(a - b) > 1e-3 * step) & (np.abs(g) > noise)).sum())
                  for a, b, g in zip(after_a, after_b, gradients)]
    assert sum(mismatched) <= 1e-4 * sum(a.size for a in after_a), mismatched


def test_the_forward_and_backward_pass_is_traced_once_for_every_shape_of_batch(data, tmp_path):
    """Batches of three shapes: one trace of the gradients (a trace is seconds of a run's
    start), and each batch's gradient sums as a trainer seeing only that batch adds."""
    (source, target_in), target_out = next(iter(data.eval_dataset()))
    shapes = [(4, source.shape[1]), (3, source.shape[1] - 1), (5, source.shape[1] - 2)]
    batches = [((source[:rows, :length], target_in[:rows, :length]), target_out[:rows, :length])
               for rows, length in shapes]
    trainer = make_trainer(data, tmp_path, "shapes")
    iterator = distributed(trainer, *batches)
    sums = []
    for _ in batches:
        trainer.update.accumulate(next(iterator))
        sums.append([g.numpy() for g in trainer.update.gradient_sums])
    assert trainer.update.gradients.experimental_get_tracing_count() == 1
    alone = make_trainer(data, tmp_path, "alone")
    alone.update.accumulate(next(distributed(alone, batches[2])))
    noise = 1e-6 * max(np.abs(total).max() for total in sums[2])  # float32 sums' rounding
    for total, before, single in zip(sums[2], sums[1], alone.update.gradient_sums):
        np.testing.assert_allclose(total - before, single.numpy(), rtol=1e-4, atol=noise)


def test_the_learning_rate_factor_scales_adams_step_and_the_reported_rate(data, tmp_path):
    """apply(f) takes Adam's step at f times the schedule's rate: the weights move f times
    as far as with f = 1 (Adam's first step is proportional to its rate), and the reported
    rate is f times the schedule's."""
    batch = next(iter(data.eval_dataset()))
    before = make_trainer(data, tmp_path, "untouched").model.get_weights()
    moved, rates = {}, {}
    for factor in (1.0, 0.25, 0.0):
        trainer = make_trainer(data, tmp_path, f"factor_{factor}")
        trainer.update.accumulate(next(distributed(trainer, batch)))
        rates[factor] = float(trainer.update.apply(factor).learning_rate)
        moved[factor] = [a - b for a, b in zip(trainer.model.get_weights(), before)]
    schedule = WarmupSchedule(trainer.model.config.d_model, 50)
    assert rates[1.0] == pytest.approx(float(schedule(0)), rel=1e-6)
    assert rates[0.25] == pytest.approx(0.25 * rates[1.0], rel=1e-6) and rates[0.0] == 0.0
    assert all(not d.any() for d in moved[0.0])
    full = np.concatenate([d.ravel() for d in moved[1.0]])
    quarter = np.concatenate([d.ravel() for d in moved[0.25]])
    big = np.abs(full) > 0.5 * np.abs(full).max()
    assert big.sum() > 1000
    np.testing.assert_allclose(quarter[big], 0.25 * full[big], rtol=1e-3)


def test_cooldown_decays_the_rate_linearly_to_zero_over_the_last_steps(data, tmp_path):
    """cooldown=0.5 of 8 updates: the schedule's rate for the first 4, then 4/4, 3/4, 2/4
    and 1/4 of it (the factor of the update after step s is (1 - s / 8) / 0.5, capped
    at 1)."""
    trainer = make_trainer(data, tmp_path, "cooldown", train_steps=8, cooldown=0.5,
                           log_every=1, eval_every=0, checkpoint_every=100)
    trainer.log = lambda line: None
    trainer.train()
    rates = summaries(trainer.run.model_dir, "learning_rate")
    assert sorted(rates) == list(range(1, 9))
    schedule = WarmupSchedule(trainer.model.config.d_model, 50)
    factors = [rates[step] / float(schedule(step - 1)) for step in range(1, 9)]
    np.testing.assert_allclose(factors, [1, 1, 1, 1, 1, 0.75, 0.5, 0.25], rtol=1e-5)
    assert factors == pytest.approx([cooldown_factor(0.5, s, 8) for s in range(8)], rel=1e-5)


def test_cooldown_follows_the_time_budget_when_it_ends_the_run_first(data, tmp_path):
    """With a budget that ends the run long before train_steps, the factor follows the
    clock: it falls from update to update and the last update, started in the budget's
    last part, has the least of it; the step count alone would have left it at 1."""
    # 30 s: the first update's tracing (5-11 s under a loaded CI) spends part of it.
    trainer = make_trainer(data, tmp_path, "budget", train_steps=100_000, cooldown=1.0,
                           max_train_minutes=0.5, log_every=1, eval_every=0,
                           checkpoint_every=100_000)
    trainer.log = lambda line: None
    trainer.train()
    rates = summaries(trainer.run.model_dir, "learning_rate")
    steps = sorted(rates)
    assert 3 <= len(steps) < 100_000 and steps == list(range(1, len(steps) + 1))
    schedule = WarmupSchedule(trainer.model.config.d_model, 50)
    factors = [rates[step] / float(schedule(step - 1)) for step in steps]
    assert all(0.0 <= f <= 1.0 for f in factors), factors
    assert all(a > b for a, b in zip(factors, factors[1:])), factors
    assert factors[-1] < 0.5 and factors[0] > factors[-1] + 0.3, factors


def test_keras_fit_with_the_paper_loss_trains_and_reports_the_trainers_loss(data, tmp_path):
    """The library's Keras way: compile with Adam(WarmupSchedule) and
    LabelSmoothedCrossEntropy, fit on ((source_ids, target_input_ids), target_output_ids)."""
    batch = next(iter(data.eval_dataset()))
    trainer = make_trainer(data, tmp_path, "for_fit")
    trainer.update.accumulate(next(distributed(trainer, batch)))
    trainer_loss = float(trainer.update.apply().loss)

    config = trainer.model.config
    model = Transformer(config)
    model.build()
    model.set_weights(INITIAL_WEIGHTS[config])
    model.compile(optimizer=keras.optimizers.Adam(WarmupSchedule(config.d_model, 50),
                                                  0.9, 0.98, 1e-9),
                  loss=LabelSmoothedCrossEntropy(config.label_smoothing))
    # One batch per epoch: each epoch's loss is that batch's before the epoch's update.
    losses = model.fit(tf.data.Dataset.from_tensors(batch), epochs=30, verbose=0).history["loss"]
    assert losses[0] == pytest.approx(trainer_loss, rel=1e-5)
    assert losses[-1] < losses[0] - 1.0, losses
    # The same number as the trainer's summed loss over the batch's tokens.
    (source_ids, target_input_ids), target_output_ids = batch
    logits = model((source_ids, target_input_ids))
    loss_sum, tokens = label_smoothed_cross_entropy(target_output_ids, logits)
    assert float(LabelSmoothedCrossEntropy()(target_output_ids, logits)) == pytest.approx(
        float(loss_sum / tokens), rel=1e-6)


def losses_by_update(trainer, updates):
    """{n: the loss of the batch taken with the weights of n applied updates} until
    `updates` updates have been applied. A step that float16's loss scale skips applies
    none; the step after it, with the same weights, takes its place. Every step's loss
    must be finite."""
    trainer.restore()
    losses = {}
    for _ in range(updates + 16):  # float16 skips a few of its first updates
        applied = int(trainer.optimizer.iterations.numpy())
        if applied == updates:
            return losses
        losses[applied] = float(one_update(trainer).loss)
        assert np.isfinite(losses[applied]), (applied, losses)
    raise AssertionError(f"{updates} updates not applied in {updates + 16} steps: {losses}")


def test_float16_and_bfloat16_training_follow_the_float32_loss_curve(data, tmp_path):
    """From the same weights and batches, every precision learns the same curve.

    The tiny model falls from ln(vocab) to a plateau near 4.3-4.5 nats. float16 skips its
    first updates (3 to 5 here) while its loss scale falls to a finite level, so each
    curve is read by applied updates. Over eight initial weights (an AMX Xeon), updates
    12-24 averaged within 0.13% of float32's for bfloat16 and within 1% for float16. After
    that, when a curve leaves the plateau is chaotic: bfloat16 was 2% from float32 over
    steps 20-35 for one of the eight, and a CI run saw 6%; so the curves are compared
    before it. On a Xeon whose oneDNN runs float16 natively (AVX512-FP16, as well as AMX),
    float16's window lay 2.4%, 2.7% and 5.0% above float32's in three runs (bfloat16's
    within 0.2%), so float16 is held to 10%: a float16 run that does not learn (an
    unscaled loss whose gradients underflow) stays near ln(vocab), 1.8 nats above.
    """
    window = range(12, 25)
    curves = {}
    for precision in PRECISIONS:
        trainer = make_trainer(data, tmp_path, precision, precision=precision)
        losses = losses_by_update(trainer, window.stop)
        curves[precision] = np.mean([losses[n] for n in window])
    initial = np.log(data.tokenizers.target.vocab_size)
    for precision, mean in curves.items():
        assert mean < initial - 1.2, (precision, initial, curves)
    assert curves["mixed_bfloat16"] == pytest.approx(curves["float32"], rel=0.05), curves
    assert curves["mixed_float16"] == pytest.approx(curves["float32"], rel=0.1), curves


def test_loss_scale_is_used_only_for_float16(data, tmp_path):
    fp16 = make_trainer(data, tmp_path, "fp16", precision="mixed_float16")
    assert isinstance(fp16.optimizer, keras.optimizers.LossScaleOptimizer)
    bf16 = make_trainer(data, tmp_path, "bf16", precision="mixed_bfloat16")
    assert not isinstance(bf16.optimizer, keras.optimizers.LossScaleOptimizer)
    assert bf16.model.compute_dtype == "bfloat16" and bf16.model.variable_dtype == "float32"


def test_a_resumed_stream_continues_where_the_checkpointed_run_was(data, tmp_path):
    """Resuming at step k skips the k * accum_steps batches the checkpointed run consumed:
    its first batch is the batch an uninterrupted run would see next."""
    uninterrupted = iter(data.train_dataset())
    for _ in range(7):
        next(uninterrupted)
    expected = next(uninterrupted)
    trainer = make_trainer(data, tmp_path, "resumed", accum_steps=1)
    trainer.optimizer.iterations.assign(7)  # as if a checkpoint of step 7 was restored
    assert trainer.restore() == 7
    resumed = trainer.stream.next()
    for got, want in zip(tf.nest.flatten(resumed), tf.nest.flatten(expected)):
        got = trainer.strategy.experimental_local_results(got)[0]
        np.testing.assert_array_equal(got.numpy(), want.numpy())


def test_a_resumed_stream_is_restored_from_its_saved_state_not_replayed(data, tmp_path):
    """With every checkpoint the stream's state is saved: a resumed run restores it (no
    batch goes through the pipeline twice) and takes the batch the checkpointed run
    would have taken next."""
    trainer = make_trainer(data, tmp_path, "saved", accum_steps=2)
    trainer.restore()
    for _ in range(3 * 2):  # 3 updates of 2 microbatches
        trainer.stream.next()
    trainer.optimizer.iterations.assign(3)
    trainer.save(3)
    expected = trainer.stream.next()

    resumed = make_trainer(data, tmp_path, "saved", accum_steps=2)
    lines = []
    resumed.log = lines.append
    assert resumed.restore() == 3
    assert lines[1:] == [f"training stream restored from {tmp_path}/saved/training_stream/"
                         "pipeline_0/ckpt-3"]
    local = resumed.strategy.experimental_local_results
    for got, want in zip(tf.nest.flatten(resumed.stream.next()), tf.nest.flatten(expected)):
        np.testing.assert_array_equal(local(got)[0].numpy(), local(want)[0].numpy())
