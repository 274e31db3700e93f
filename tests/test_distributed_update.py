"""One update on 2 CPU replicas: one all-reduce, and the Adam step of the whole batch's
token-normalised gradient. In a subprocess: the CPU must be split into logical devices
before TensorFlow starts."""

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

SCRIPT = textwrap.dedent("""
    import json, sys
    import keras, numpy as np, tensorflow as tf
    from trainer.training import distribute
    distribute.split_cpu(2)
    from keras_transformer import (Transformer, TransformerConfig, WarmupSchedule,
                                   label_smoothed_cross_entropy, shift_right)
    from trainer.config import RunConfig
    from trainer.main_job import build_trainer

    config = TransformerConfig.tiny(vocab_size=40, dropout=0.0)
    rng = np.random.default_rng(0)
    source = rng.integers(4, 40, size=(8, 7)).astype("int32")
    target = rng.integers(4, 40, size=(8, 6)).astype("int32")
    source[::2, 5:] = 0  # padding of unequal amounts on the two replicas' halves
    target[1::3, 3:] = 0
    batch = ((source, shift_right(target).numpy()), target)

    strategy = tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"])
    run = RunConfig(model_dir=sys.argv[1], precision="float32", warmup_steps=10)
    trainer = build_trainer(config, None, run, strategy)
    reference = Transformer(config)
    reference.build()
    reference.set_weights(trainer.model.get_weights())

    # Every cross-replica reduction goes through the strategy's _batch_reduce_to or
    # _reduce_to: count them while the update is traced and run.
    extended = type(strategy.extended)
    calls = []
    for name in ("_batch_reduce_to", "_reduce_to"):
        def counting(self, *args, _real=getattr(extended, name), _name=name, **kwargs):
            calls.append(_name)
            return _real(self, *args, **kwargs)
        setattr(extended, name, counting)
    iterator = iter(strategy.experimental_distribute_dataset(
        tf.data.Dataset.from_tensors(batch)))
    trainer.update.accumulate(next(iterator))
    calls.clear()  # accumulating is per replica: only the update reduces
    stats = trainer.update.apply()

    # The update of the whole batch on one device, by Keras' own Adam.
    optimizer = keras.optimizers.Adam(WarmupSchedule(config.d_model, 10), 0.9, 0.98, 1e-9)
    with tf.GradientTape() as tape:
        logits = reference((batch[0][0], batch[0][1]), training=True)
        loss_sum, tokens = label_smoothed_cross_entropy(batch[1], logits, 0.1)
        loss = loss_sum / tokens
    gradients = tape.gradient(loss, reference.trainable_variables)
    optimizer.apply_gradients(zip(gradients, reference.trainable_variables))
    # Entries whose gradient is float noise (the key biases': softmax ignores them) take
    # a step of either sign: left out of the comparison.
    signal = {id(v): np.abs(g.numpy()) > 1e-6 for g, v in
              zip(gradients, reference.trainable_variables)}
    replicas = [[v.numpy() for v in
                 [strategy.experimental_local_results(w.value)[i] for w in trainer.model.weights]]
                for i in range(2)]
    print(json.dumps({
        "calls": calls, "loss": float(stats.loss), "expected_loss": float(loss),
        "iterations": int(trainer.optimizer.iterations.numpy()),
        "replicas_differ": max(float(np.abs(a - b).max())
                               for a, b in zip(*replicas)),
        "mismatched": sum(int(((np.abs(a - w.numpy()) > 1e-6) & signal[id(w)]).sum())
                          for a, w in zip(replicas[0], reference.weights)),
        "compared": sum(int(m.sum()) for m in signal.values()),
    }))
""")


@pytest.mark.slow
def test_two_replicas_all_reduce_once_and_apply_the_whole_batch_adam_step(tmp_path):
    result = subprocess.run([sys.executable, "-c", SCRIPT, str(tmp_path / "run")],
                            capture_output=True, text=True, timeout=600,
                            cwd=Path(__file__).resolve().parents[1])
    assert result.returncode == 0, result.stderr[-3000:]
    report = json.loads(result.stdout.strip().splitlines()[-1])
    # One batched all-reduce: the gradient sums with the totals; Keras reduces nothing.
    assert report["calls"] == ["_batch_reduce_to"], report["calls"]
    assert report["iterations"] == 1
    assert abs(report["loss"] - report["expected_loss"]) < 1e-5 * report["expected_loss"]
    assert report["replicas_differ"] == 0.0  # both copies took the same step
    assert report["compared"] > 100_000
    assert report["mismatched"] == 0, report
