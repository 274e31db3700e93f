"""Batches to a trained model: the strategy, the model directory, the training loop with
its checkpoints and validation, and checkpoint averaging."""
