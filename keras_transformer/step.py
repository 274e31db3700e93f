"""The Transformer as a search's step (keras_transformer.search): the next token's
log-probabilities from the decoder, one position per step with the decoding cache
(section 3.2.3's masked self-attention, computed incrementally), or the whole prefix
recomputed (for tests and benchmarks). Everything a search needs of the model is set up
here, so that the searches import nothing of it, and a caller that wraps a step (a
benchmark's, a test's) wraps a TransformerStep and copies none of it.

The state of a cached step: "source_mask" bool [batch, 1, 1, src_len] and "cache" (see
Transformer.initial_cache), whose self-attention keys and values have a row per beam and
encoder-decoder ones a row per sentence. The weights the step reads
(Transformer.step_weights) are read once per search, outside its loop. A recomputing
step's state: "source_ids" [batch, src_len] and "encoder_output" [batch, src_len, d_model].
"""

import tensorflow as tf

from keras_transformer.attention import ELEMENTWISE_MAX_ROWS
from keras_transformer.log_probs import LogProbs
from keras_transformer.masking import padding_mask
from keras_transformer.normalization import OneDnnNorm
from keras_transformer.packing import Packing
from keras_transformer.search import Step


class TransformerStep(Step):
    """step(seqs, i, state) -> (log-probs [rows, vocab] as a log_probs.LogProbs, state) of a
    Transformer for a batch of sentences, with the rest of the step protocol
    (keras_transformer.search).

    Args:
      model: a Transformer.
      source_ids: int [batch, src_len], 0-padded.
      target_prefix: None, or int [batch, prefix_len], 0-padded: the tokens each output
        starts with (PAD, BOS and EOS are not tokens a prefix holds).
      use_cache: decode one position per step with `model.decode_step` (False:
        recompute `model.decode` over the whole prefix).
      fixed_shapes: the cache has every position the search may decode from the start
        (written at each step, attended under a mask), so that no tensor changes shape
        from step to step: for XLA (`tf.function(jit_compile=True)`, given a source of
        fixed shape). Without XLA it is slower (every step costs as much as the last).
      weights: what the step reads, `model.step_weights(length)` for a length of at
        least the outputs' width + 1 (default: read from the model at the start); e.g.
        int8 weights made once (keras_transformer.quantization.quantize_step_weights).
        With "encoder" (`model.encoder_weights()`, or int8 weights made from it:
        quantization.static_step_weights), the encoder and the encoder-decoder keys and
        values are computed on those too (not with fixed_shapes).
      shortlist: None, or a keras_transformer.shortlist.Shortlist: the step ranks only
        the batch's candidates (its sources' and prefix's shortlisted pieces), whose
        softmax normalizes over them (cached, growing steps only).

    Example: an untrained model's beam search and its first step, from BOS, for 2 beams.

    >>> import tensorflow as tf
    >>> from keras_transformer import DecodeConfig, Transformer, TransformerConfig
    >>> from keras_transformer import beam_search
    >>> from keras_transformer.search import first_tokens
    >>> model = Transformer(TransformerConfig.tiny(vocab_size=20))
    >>> model.build()
    >>> step = TransformerStep(model, tf.constant([[5, 6, 7, 3]]))
    >>> result = beam_search(step, DecodeConfig(beam_size=2, max_extra_length=3))
    >>> tuple(result.ids.shape)  # [batch, beam, 4 source tokens + 3]
    (1, 2, 7)
    >>> state = step.start(rows_per_sentence=2, width=4)
    >>> log_probs, state = step(first_tokens([2], 4), 0, state)
    >>> tuple(log_probs.logits.shape), tuple(state["cache"][0]["key"].shape)  # [rows, vocab]
    ((2, 20), (2, 4, 1, 16))
    """

    def __init__(self, model, source_ids, target_prefix=None, use_cache=True,
                 fixed_shapes=False, weights=None, shortlist=None):
        self.model = model
        self.source_ids = tf.cast(source_ids, tf.int32)
        self.max_positions = model.config.max_length
        self.target_prefix = (None if target_prefix is None
                              else tf.cast(target_prefix, tf.int32))
        self.use_cache, self.fixed_shapes = use_cache, fixed_shapes
        self.given_weights, self.weights = weights, None
        self.vocabulary = None
        if shortlist is not None:
            if fixed_shapes or not use_cache:
                raise ValueError("a shortlist's candidates change from batch to batch: a "
                                 "step over them needs use_cache=True, not fixed_shapes")
            # The special ids keep their values among them (keras_transformer.shortlist).
            self.vocabulary = shortlist.candidates(self.source_ids, self.target_prefix)
        self.rows_per_sentence = 1

    def start(self, rows_per_sentence, width):
        """The first state, for rows_per_sentence adjacent rows per sentence and outputs
        of `width` tokens at most; reads the step's weights (once per search)."""
        self.rows_per_sentence = rows_per_sentence
        if not self.use_cache:
            return {"source_ids": self.source_ids,
                    "encoder_output": self.model.encode(self.source_ids, training=False)}
        # The encoder on the source's tokens alone, as training runs it: its projections
        # are then matmuls of 2-D inputs, which TensorFlow fuses with their bias and
        # activation (XLA's fixed shapes keep the padded batch). Encoder-decoder keys and
        # values are projected once per sentence.
        packing = None if self.fixed_shapes else Packing(self.source_ids, custom_gradient=False)
        weights = (self.model.step_weights(width + 1) if self.given_weights is None
                   else _read(self.given_weights))
        # Given weights may hold the encoder's too (an int8_bfloat16 export's).
        encoder = weights.get("encoder", {}) if packing is not None else {}
        encoder_output = self.model.encode(self.source_ids, training=False, packing=packing,
                                           weights=encoder.get("encoder"))
        cache = self.model.initial_cache(encoder_output, rows_per_sentence,
                                         width + 1 if self.fixed_shapes else 0, packing,
                                         encoder.get("key_value"))
        if self.vocabulary is not None:  # the projection's rows gathered once per batch
            weights = {**weights, "embedding": self.model.embedding.restrict_step_weights(
                weights["embedding"], self.vocabulary)}
        self.weights = weights
        return {"source_mask": padding_mask(self.source_ids), "cache": cache}

    def run(self, search, rows):
        """search(step) on a step whose attentions' way is fixed for the whole search:
        rows only leave, so a search that starts with at most ELEMENTWISE_MAX_ROWS rows
        (a request of up to 4 sentences of 4 beams) attends elementwise at every step,
        without a `tf.cond` per attention per step (one sentence 2-8% faster,
        bench/performance-notes.md); a larger one chooses at each step."""
        if not self.use_cache or self.fixed_shapes:
            return search(self)
        return tf.cond(rows <= ELEMENTWISE_MAX_ROWS,
                       lambda: search(self.with_elementwise(True)), lambda: search(self))

    def with_elementwise(self, elementwise):
        """The same step, started, with the attentions' way chosen once for every step:
        True or False for a search known to stay at most (or above)
        ELEMENTWISE_MAX_ROWS rows, which saves each step a `tf.cond` per attention; None
        chooses at each step. It rides in the step's weights (Transformer.step_weights)."""
        step = object.__new__(TransformerStep)
        step.__dict__.update(self.__dict__)
        step.weights = _with_elementwise(self.weights, elementwise)
        return step

    def __call__(self, seqs, i, state):
        if not self.use_cache:
            logits = self.model.decode(
                seqs[:, :i + 1],
                tf.repeat(state["encoder_output"], self.rows_per_sentence, 0),
                tf.repeat(state["source_ids"], self.rows_per_sentence, 0),
                training=False)[:, -1, :]
            return LogProbs.of(logits), state
        tokens = seqs[:, i]
        if self.vocabulary is not None:
            tokens = tf.gather(self.vocabulary, tokens)
        logits, cache = self.model.decode_step(tokens, i, state["cache"],
                                               state["source_mask"], self.weights,
                                               self.fixed_shapes)
        return LogProbs.of(logits), {**state, "cache": cache}

    def reorder(self, state, rows):
        """The state with the self-attention cache's rows reordered: rows int32 [rows']."""
        if "cache" not in state:
            return state
        return {**state, "cache": [{**layer, "key": tf.gather(layer["key"], rows),
                                    "value": tf.gather(layer["value"], rows)}
                                   for layer in state["cache"]]}

    def keep(self, state, sentences):
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


def _read(weights):
    """Given step weights with their variables (an export's int8 weights) read here, once
    per search: read where the loop uses them, every step would read each again (some 175
    reads a step of the recipe's int8 export)."""
    return tf.nest.map_structure(
        lambda w: tf.convert_to_tensor(w) if isinstance(w, tf.Variable) else w, weights)


def _with_elementwise(weights, elementwise):
    """A copy of step weights (nested dicts, lists and tuples) with every attention's
    "elementwise" set to `elementwise`; with True (16 rows or fewer), OneDnnNorms become
    plain ops' weights, faster at so few rows (keras_transformer.normalization)."""
    if isinstance(weights, OneDnnNorm):
        return (weights.gamma, weights.beta) if elementwise else weights
    if isinstance(weights, dict):
        return {key: elementwise if key == "elementwise" else _with_elementwise(value, elementwise)
                for key, value in weights.items()}
    if isinstance(weights, list):
        return [_with_elementwise(value, elementwise) for value in weights]
    return weights
