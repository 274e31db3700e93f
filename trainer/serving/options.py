"""The signatures whose clients choose the search per request: `translate_with_options`
(beam size, length penalty, output length, hypotheses, stopping rule and patience, a
forced output prefix) and `sample` (temperature, top-k, nucleus). Each checks its options
inside the graph, so a bad request fails with one InvalidArgument naming the option and
its range.
"""

import dataclasses

import tensorflow as tf

from keras_transformer import sample_search
from keras_transformer.config import STOPPING_RULES, DecodeConfig


class OptionSignatures:
    """The option signatures of `trainer.serving.translator.Translator`, which provides
    what they use: decode, source_ids, prefix_ids, step, search and _hypotheses."""

    @tf.function(input_signature=[tf.TensorSpec([None], tf.string),
                                  tf.TensorSpec([None], tf.string),
                                  tf.TensorSpec([], tf.int32), tf.TensorSpec([], tf.float32),
                                  tf.TensorSpec([], tf.int32), tf.TensorSpec([], tf.int32),
                                  tf.TensorSpec([], tf.string), tf.TensorSpec([], tf.float32)],
                 autograph=False)
    def translate_with_options(self, inputs, target_prefix, beam_size, alpha,
                               max_extra_length, num_hypotheses, stopping, patience):
        """Beam search with the client's settings, from one trace: `translate` (the
        export's DecodeConfig and num_hypotheses 1) or `nbest` per request, greedy search
        (beam_size 1, alpha 0), and a forced start of the output.

        Inputs:
          inputs: tf.string [batch].
          target_prefix: tf.string [batch], the start each translation must have (the
            words a translator has typed), "" for none. Its pieces are forced, scored by
            the model (their log-probabilities count in log_probs) and the search goes on
            from them; a prefix longer than the output may be is cut.
          beam_size: int32 scalar, 1 to max_beam_size.
          alpha: float32 scalar, the length penalty exponent, >= 0 (0: none).
          max_extra_length: int32 scalar >= 0: outputs have at most (source pieces + 1 +
            max_extra_length) tokens with EOS (section 6.1: input + 50), and at most
            config.max_length - 1.
          num_hypotheses: int32 scalar, 1 to beam_size: the best hypotheses returned.
          stopping: tf.string scalar, when a sentence is done: "exact", "transformers"
            or "first" (keras_transformer.config.STOPPING_RULES).
          patience: float32 scalar > 0: with stopping "first", the finished hypotheses
            a sentence waits for, as a multiple of beam_size.
        Returns {"translations": tf.string [batch, num_hypotheses], best first; "scores",
          "log_probs": float32 [batch, num_hypotheses], as `nbest`}. An option out of its
          range fails the call with InvalidArgument naming it and the range; an empty
          input gives empty translations scoring 0.
        """
        checks = [
            _check_range("beam_size", beam_size, 1, self.decode.max_beam_size),
            _check_range("num_hypotheses", num_hypotheses, 1, beam_size, "beam_size"),
            _check_range("max_extra_length", max_extra_length, 0),
            _check_range("alpha", alpha, 0.0),
            _check_range("patience", patience, 0.0, low_included=False),
            _check_stopping(stopping),
            _check_same_batch(inputs, target_prefix)]
        (beam_size, alpha, max_extra_length, num_hypotheses, stopping, patience, inputs,
         target_prefix) = _after(checks, beam_size, alpha, max_extra_length, num_hypotheses,
                                 stopping, patience, inputs, target_prefix)
        decode = dataclasses.replace(self.decode, beam_size=beam_size, alpha=alpha,
                                     max_extra_length=max_extra_length, stopping=stopping,
                                     patience=patience)
        source_ids = self.source_ids(inputs)
        result = self.search(source_ids, num_hypotheses, decode,
                             self.prefix_ids(target_prefix))
        return self._hypotheses(source_ids, result, num_hypotheses)

    @tf.function(input_signature=[tf.TensorSpec([None], tf.string),
                                  tf.TensorSpec([None], tf.string),
                                  tf.TensorSpec([], tf.int32), tf.TensorSpec([], tf.int32),
                                  tf.TensorSpec([], tf.float32), tf.TensorSpec([], tf.int32),
                                  tf.TensorSpec([], tf.float32), tf.TensorSpec([], tf.int64)],
                 autograph=False)
    def sample(self, inputs, target_prefix, num_hypotheses, max_extra_length, temperature,
               top_k, top_p, seed):
        """Random translations (back-translation, diverse outputs): each token drawn from
        the model's distribution (keras_transformer.sample_search), over the whole
        vocabulary (never the export's shortlist).

        Inputs:
          inputs, target_prefix, max_extra_length: as `translate_with_options`.
          num_hypotheses: int32 scalar, samples per input, 1 to max_beam_size.
          temperature: float32 scalar >= 0; 0 takes the most probable token (greedy).
          top_k: int32 scalar >= 0, sample among the k most probable tokens; 0: all.
          top_p: float32 scalar in (0, 1], sample within the smallest set of most probable
            tokens whose probability reaches top_p (nucleus sampling); 1: all.
          seed: int64 scalar. The same seed, input and prefix give the same samples in
            any process, thread or batch (each input is seeded by a hash of the three);
            another seed gives others.
        Returns {"translations": tf.string [batch, num_hypotheses], each input's samples
          sorted by score; "scores", "log_probs": float32 [batch, num_hypotheses], the
          model's log P(translation | input) (at temperature 1) and that divided by the
          export's length penalty}. Errors and empty inputs as `translate_with_options`.
        """
        checks = [
            _check_range("num_hypotheses", num_hypotheses, 1, self.decode.max_beam_size),
            _check_range("max_extra_length", max_extra_length, 0),
            _check_range("temperature", temperature, 0.0),
            _check_range("top_k", top_k, 0),
            _check_range("top_p", top_p, 0.0, 1.0, low_included=False),
            _check_same_batch(inputs, target_prefix)]
        num_hypotheses, max_extra_length, temperature, top_k, top_p, inputs, target_prefix = \
            _after(checks, num_hypotheses, max_extra_length, temperature, top_k, top_p, inputs,
                   target_prefix)
        source_ids = self.source_ids(inputs)
        # A seed per input, so that server-side batching does not change its samples.
        seeds = tf.strings.to_hash_bucket_fast(
            tf.strings.join([tf.strings.as_string(seed), inputs, target_prefix], "\x00"),
            2**62)
        result = sample_search(
            self.step(source_ids, self.prefix_ids(target_prefix), shortlist=False),
            dataclasses.replace(self.decode, max_extra_length=max_extra_length), seeds,
            num_hypotheses, temperature, top_k, top_p)
        return self._hypotheses(source_ids, result, num_hypotheses)


def request_options(decode: DecodeConfig, num_hypotheses: int = 1) -> dict:
    """translate_with_options' scalar inputs that ask for `decode`'s search, num_hypotheses
    best (the length penalty's form and max_length are always the export's own)."""
    return {"beam_size": tf.constant(decode.beam_size, tf.int32),
            "alpha": tf.constant(decode.alpha, tf.float32),
            "max_extra_length": tf.constant(decode.max_extra_length, tf.int32),
            "num_hypotheses": tf.constant(num_hypotheses, tf.int32),
            "stopping": tf.constant(decode.stopping),
            "patience": tf.constant(decode.patience, tf.float32)}


def _check_range(name, value, low, high=None, high_name=None, low_included=True):
    """An assertion that the scalar option `value` is finite and lies in [low, high]
    ((low, high] when not low_included; no upper bound when high is None). Its
    InvalidArgument message names the option, the range and the value."""
    within = value >= low if low_included else value > low
    if high is not None:
        within &= value <= high
    if value.dtype.is_floating:
        within &= tf.math.is_finite(value)
    opening = "[" if low_included else "("
    closing = (f"{high_name}=" if high_name else "") + "{}]" if high is not None else "inf)"
    message = tf.strings.format(f"{name} must be in {opening}{low}, {closing}, got {{}}",
                                [high, value] if high is not None else [value])
    return tf.debugging.Assert(within, [message])


def _after(checks, *tensors):
    """The tensors, read only once every assertion in `checks` has passed: no op sees an
    option out of its range (tf.fill would fail first, with a message naming nothing)."""
    with tf.control_dependencies(checks):
        return [tf.identity(t) for t in tensors]


def _check_stopping(stopping):
    """An assertion that `stopping` (tf.string scalar) names a rule."""
    known = tf.reduce_any(tf.equal(stopping, list(STOPPING_RULES)))
    message = tf.strings.join([f"stopping must be one of {', '.join(STOPPING_RULES)}, got ",
                               stopping])
    return tf.debugging.Assert(known, [message])


def _check_same_batch(inputs, target_prefix):
    """An assertion that there is one target prefix per input."""
    return tf.debugging.assert_equal(
        tf.shape(inputs), tf.shape(target_prefix),
        message="target_prefix must have one entry per input (\"\" for none)")
