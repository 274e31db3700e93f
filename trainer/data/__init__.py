"""Text to batches: the builtin corpus, the sources of sentence pairs, the SentencePiece
vocabulary and the tf.data input pipeline."""
