"""The Transformer as a search's step (keras_transformer.search): the next token's
log-probabilities from the decoder, one position per step with the decoding cache
(section 3.2.3's masked self-attention, computed incrementally), or the whole prefix
recomputed (for tests and benchmarks).

The state of a cached step: "source_mask" bool [batch, 1, 1, src_len] and "cache" (see
Transformer.initial_cache), whose self-attention keys and values have a row per beam and
encoder-decoder ones a row per sentence. The weights the step reads
(Transformer.step_weights) are read once per search, outside its loop. A recomputing
step's state: "source_ids" [batch, src_len] and "encoder_output" [batch, src_len, d_model].
"""

import tensorflow as tf

from keras_transformer.masking import padding_mask


class TransformerStep:
    """step(seqs, i, state) -> (log-probs float32 [rows, vocab], state) of a Transformer
    over batch * beam_size rows, a sentence's beams adjacent; with `reorder` and `keep`
    (see keras_transformer.search).

    Built by `start`, which also returns the first state.

    Example: an untrained model's first step, from BOS, for 2 beams of one sentence.

    >>> import tensorflow as tf
    >>> from keras_transformer import Transformer, TransformerConfig
    >>> from keras_transformer.search import first_tokens
    >>> model = Transformer(TransformerConfig.tiny(vocab_size=20))
    >>> model.build()
    >>> step, state = TransformerStep.start(model, tf.constant([[5, 6, 3]]), width=4,
    ...                                     beam_size=2)
    >>> log_probs, state = step(first_tokens([2], 4), 0, state)
    >>> tuple(log_probs.shape), tuple(state["cache"][0]["key"].shape)  # [rows, vocab]
    ((2, 20), (2, 4, 1, 16))
    """

    def __init__(self, model, width, weights=None, beam_size=1, fixed_shapes=False,
                 vocabulary=None):
        self.model, self.width, self.weights = model, width, weights
        self.beam_size, self.fixed_shapes = beam_size, fixed_shapes
        self.vocabulary = vocabulary

    @classmethod
    def start(cls, model, source_ids, width, use_cache=True, beam_size=1, fixed_shapes=False,
              weights=None, vocabulary=None):
        """(TransformerStep, its first state) for source_ids int32 [batch, src_len] and
        outputs of `width` tokens at most.

        Args:
          use_cache: decode one position per step with `model.decode_step` (False:
            recompute `model.decode` over the whole prefix).
          fixed_shapes: the cache has width + 1 positions from the start (XLA; see
            beam_search).
          weights: what the step reads, `model.step_weights(length)` for a length of at
            least width + 1 (default: read from the model now); e.g. int8 weights made
            once (keras_transformer.quantization.quantize_step_weights).
          vocabulary: None, or int32 [C], the pieces the step ranks (a shortlist's
            candidates, keras_transformer.shortlist): its log-probs are [rows, C] and the
            tokens it reads are indices into vocabulary (cached steps only).
        Its attentions choose their way at each step by its rows (see `with_elementwise`).
        """
        encoder_output = model.encode(source_ids, training=False)
        if not use_cache:
            if vocabulary is not None:
                raise ValueError("a step over a shortlist needs use_cache=True")
            return cls(model, width, None, beam_size), {"source_ids": source_ids,
                                                         "encoder_output": encoder_output}
        # Encoder-decoder keys and values are projected once per sentence.
        cache = model.initial_cache(encoder_output, beam_size, width + 1 if fixed_shapes else 0)
        weights = model.step_weights(width + 1) if weights is None else weights
        if vocabulary is not None:  # the projection's rows gathered once per batch
            weights = {**weights, "embedding": model.embedding.restrict_step_weights(
                weights["embedding"], vocabulary)}
        step = cls(model, width, weights, beam_size, fixed_shapes, vocabulary)
        return step, {"source_mask": padding_mask(source_ids), "cache": cache}

    def with_elementwise(self, elementwise):
        """The same step with the attentions' way chosen once for every step: True or
        False for a search known to stay at most (or above) attention.ELEMENTWISE_MAX_ROWS
        rows, which saves each step a `tf.cond` per attention; None chooses at each step.
        It rides in the step's weights (Transformer.step_weights)."""
        if self.weights is None:  # recomputing: the attentions choose their own way
            return self
        return TransformerStep(self.model, self.width, _with_elementwise(self.weights, elementwise),
                               self.beam_size, self.fixed_shapes, self.vocabulary)

    def __call__(self, seqs, i, state):
        if self.weights is None:
            logits = self.model.decode(seqs[:, :i + 1],
                                       tf.repeat(state["encoder_output"], self.beam_size, 0),
                                       tf.repeat(state["source_ids"], self.beam_size, 0),
                                       training=False)[:, -1, :]
            return tf.nn.log_softmax(logits, axis=-1), state
        tokens = seqs[:, i]
        if self.vocabulary is not None:
            tokens = tf.gather(self.vocabulary, tokens)
        logits, cache = self.model.decode_step(tokens, i, state["cache"],
                                               state["source_mask"], self.weights,
                                               self.fixed_shapes)
        return tf.nn.log_softmax(logits, axis=-1), {**state, "cache": cache}

    @staticmethod
    def reorder(state, rows):
        """The state with the self-attention cache's rows reordered: rows int32 [rows']."""
        if "cache" not in state:
            return state
        return {**state, "cache": [{**layer, "key": tf.gather(layer["key"], rows),
                                    "value": tf.gather(layer["value"], rows)}
                                   for layer in state["cache"]]}

    @staticmethod
    def keep(state, sentences):
        """The per-sentence tensors of the sentences int32 [n'] only (the per-beam rows
        of those that left go at the `reorder` that follows)."""
        state = {**state, **{name: tf.gather(state[name], sentences)
                             for name in ("source_ids", "source_mask", "encoder_output")
                             if name in state}}
        if "cache" in state:
            state["cache"] = [{**layer, "cross_key": tf.gather(layer["cross_key"], sentences),
                               "cross_value": tf.gather(layer["cross_value"], sentences)}
                              for layer in state["cache"]]
        return state


def _with_elementwise(weights, elementwise):
    """A copy of step weights (nested dicts, lists and tuples) with every attention's
    "elementwise" set to `elementwise`."""
    if isinstance(weights, dict):
        return {key: elementwise if key == "elementwise" else _with_elementwise(value, elementwise)
                for key, value in weights.items()}
    if isinstance(weights, list):
        return [_with_elementwise(value, elementwise) for value in weights]
    return weights
