"""Validation during training: its loss and token accuracy are those of the validation
split, token-weighted over every batch, whatever the batches' shapes."""

import numpy as np

from conftest import make_trainer
from keras_transformer import PAD_ID
from trainer.training.validation import Validator


def test_validation_loss_and_accuracy_are_the_token_weighted_ones_of_every_batch(
        data, tmp_path):
    trainer = make_trainer(data, tmp_path, "validated")
    model = trainer.model
    validator = Validator(model, data, str(tmp_path / "validated"), bleu_sentences=None)
    metrics = validator.validation_loss()

    # By hand, eagerly, batch by batch: per-token losses of the padded batches.
    epsilon, losses, hits, shapes = model.config.label_smoothing, [], [], set()
    for (source_ids, target_input_ids), labels in data.eval_dataset():
        shapes.add(tuple(labels.shape))
        logits = model((source_ids, target_input_ids), training=False).numpy().astype(np.float64)
        log_probs = logits - np.log(np.exp(logits).sum(-1, keepdims=True))
        labels = labels.numpy()
        real = labels != PAD_ID
        nll = -np.take_along_axis(log_probs, labels[..., None], -1)[..., 0]
        token_losses = (1 - epsilon) * nll - epsilon * log_probs.mean(-1)
        losses.extend(token_losses[real])
        hits.extend((logits.argmax(-1) == labels)[real])
    assert len(shapes) > 2, "batches of several shapes (one trace must serve them all)"
    np.testing.assert_allclose(metrics["loss"], np.mean(losses), rtol=1e-5)
    assert metrics["token_accuracy"] == np.mean(hits)
    assert validator.batch_sums.experimental_get_tracing_count() == 1
