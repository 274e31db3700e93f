"""A trained model to served translations: the decoding graph (the SavedModel's
signatures), the SavedModel on disk, TF Serving warmup, and Python clients of it."""
