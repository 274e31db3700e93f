"""The signatures whose clients choose the search per request, per sentence:
`translate_with_options` (beam search) and `sample` (random sampling).

Their option inputs are the request options of keras_transformer.config.DecodeConfig
(`Option.request`), one input per option of the signature's search, named and typed by
its declaration, in declaration order, after `inputs` and `target_prefix` (tf.string
[batch]). Each option input has unknown rank: a [batch] vector gives each sentence its
own value, a scalar is every sentence's (that form cannot be merged by a server's
batching). A server with batching on merges requests along dimension 0, so one call may
hold rows of different options: the search keeps each row to its own
(keras_transformer.beam_search), and the options are checked per row. A row out of its
range does not fail the call: its `error` output names the option, its range and its
value, its translations are "" and its scores -inf, and the other rows answer as alone.
"""

import dataclasses
import inspect
from typing import Dict, Tuple

import tensorflow as tf

from keras_transformer import sample_search
from keras_transformer.config import OPTIONS, DecodeConfig
from keras_transformer.options import BEAM, SAMPLE, Option

_NEG_INF = float("-inf")


# The signature of each search, and the search of each signature.
SIGNATURES = {"translate_with_options": BEAM, "sample": SAMPLE}


def request_options(signature: str) -> Tuple[Option, ...]:
    """The option inputs of `signature` (translate_with_options or sample), in order."""
    return tuple(o for o in OPTIONS if o.request and SIGNATURES[signature] in o.searches)


def input_specs(signature: str) -> list:
    """The TensorSpecs of `signature`'s inputs: inputs and target_prefix tf.string
    [batch], then each option of unknown rank (a scalar, or [batch])."""
    return [tf.TensorSpec([None], tf.string, name="inputs"),
            tf.TensorSpec([None], tf.string, name="target_prefix")] + [
        tf.TensorSpec(None, o.tf_dtype, name=o.name) for o in request_options(signature)]


def request_inputs(signature: str, decode: DecodeConfig, batch: int = None,
                   **values) -> Dict[str, tf.Tensor]:
    """The option inputs of `signature` that ask for `decode`'s settings, `values` on top
    (num_hypotheses unset: 1): scalars, or [batch] vectors when batch is given, the form
    a server with batching on merges. A value given as a list is a row's each, as is."""
    given = {**decode.to_dict(), **values}
    if given["num_hypotheses"] is None:
        given["num_hypotheses"] = 1

    def tensor(value, dtype):
        if isinstance(value, (list, tuple)):
            return tf.constant(value, dtype)
        return tf.fill([] if batch is None else [batch], tf.constant(value, dtype))

    return {o.name: tensor(given[o.name], o.tf_dtype) for o in request_options(signature)}


# A row out of range searches with these instead, on an emptied input: one token (EOS).
_SAFE = {"beam_size": 1, "num_hypotheses": 1, "max_extra_length": 0, "min_length": 0}


class OptionSignatures:
    """The option signatures of `trainer.serving.translator.Translator`, which provides
    what they use: decode, limits, source_ids, prefix_ids, step, search and _hypotheses."""

    def _with_options(self, inputs, target_prefix, **options):
        """Beam search with each row's own settings, from one trace: `translate` (the
        export's settings and num_hypotheses 1) or `nbest` per request, greedy search
        (beam_size 1, alpha 0), a forced start of the output (target_prefix: the words a
        translator has typed, "" for none; its pieces are forced, scored by the model
        and the search goes on from them; a prefix longer than the output may be is cut).

        Inputs: inputs, target_prefix tf.string [batch]; the options of
          request_options("translate_with_options"), each a scalar or [batch].
        Returns {"translations": tf.string [batch, k], best first, k the batch's largest
          num_hypotheses; "scores", "log_probs": float32 [batch, k], as `nbest`;
          "error": tf.string [batch], "" or the row's option out of range}. Past a row's
          own num_hypotheses, and on a row out of range: "" and -inf. An empty input
          gives empty translations scoring 0.
        """
        rows, error, inputs, target_prefix = self._rows("translate_with_options", inputs,
                                                        target_prefix, options)
        decode = dataclasses.replace(self.decode, **rows)
        source_ids = self.source_ids(inputs)
        result = self.search(source_ids, decode, self.prefix_ids(target_prefix))
        return self._answers(source_ids, result, rows["num_hypotheses"], error,
                             options["num_hypotheses"])

    def _sample(self, inputs, target_prefix, **options):
        """Random translations (back-translation, diverse outputs): each token drawn from
        the model's distribution (keras_transformer.sample_search), over the whole
        vocabulary (never the export's shortlist), with each row's own settings.

        Inputs: inputs, target_prefix tf.string [batch], as translate_with_options; the
          options of request_options("sample"), each a scalar or [batch]: num_hypotheses
          samples per input, 1 to max_beam_size. The same seed, input and prefix give the
          same samples in any process, thread or batch (each input is seeded by a hash of
          the three); another seed gives others.
        Returns as translate_with_options: the samples sorted by score; "scores" and
          "log_probs": the model's log P(translation | input) (at temperature 1) divided
          by the export's length penalty, and not.
        """
        rows, error, inputs, target_prefix = self._rows("sample", inputs, target_prefix,
                                                        options)
        source_ids = self.source_ids(inputs)
        # A seed per input, so that server-side batching does not change its samples.
        rows["seed"] = tf.strings.to_hash_bucket_fast(
            tf.strings.join([tf.strings.as_string(rows["seed"]), inputs, target_prefix],
                            "\x00"), 2**62)
        result = sample_search(
            self.step(source_ids, self.prefix_ids(target_prefix), shortlist=False),
            dataclasses.replace(self.decode, **rows))
        return self._answers(source_ids, result, rows["num_hypotheses"], error,
                             options["num_hypotheses"])

    def _rows(self, signature, inputs, target_prefix, options):
        """(each option as [batch] with the rows out of range at _SAFE's, the rows'
        errors tf.string [batch], inputs and target_prefix with those rows emptied)."""
        tf.debugging.assert_equal(
            tf.shape(inputs), tf.shape(target_prefix),
            message="target_prefix must have one entry per input (\"\" for none)")
        batch = tf.shape(inputs)[0]
        rows = {name: _per_row(name, value, batch) for name, value in options.items()}
        # Sampling's beam is its samples: at most max_beam_size of them.
        bounds = {"max_beam_size": self.limits.max_beam_size,
                  "beam_size": rows["beam_size"] if "beam_size" in rows
                  else self.limits.max_beam_size}
        error = tf.fill([batch], "")
        for declared in request_options(signature):
            ok, message = declared.check_rows(rows[declared.name], bounds,
                                              named=("beam_size",) if "beam_size" in rows
                                              else ())
            error = tf.where((error == "") & ~ok, message, error)
        bad = error != ""
        safe = {**DecodeConfig().to_dict(), **_SAFE}
        rows = {name: tf.where(bad, tf.constant(safe[name], value.dtype), value)
                for name, value in rows.items()}
        return rows, error, tf.where(bad, "", inputs), tf.where(bad, "", target_prefix)

    def _answers(self, source_ids, result, wanted, error, asked):
        """The signatures' outputs of a search's DecodeResult: each row's first wanted
        [batch] hypotheses of the batch's largest, "" and -inf past them and on the rows
        of `error`, and error itself. asked: the num_hypotheses input, whose value (a
        scalar's) shapes the outputs of an empty batch."""
        k = tf.cond(tf.size(wanted) > 0, lambda: tf.reduce_max(wanted),
                    lambda: tf.reduce_max(tf.concat([tf.reshape(asked, [-1]), [1]], 0)))
        out = self._hypotheses(source_ids, result, k)
        padding = (tf.range(k)[None, :] >= wanted[:, None]) | (error != "")[:, None]

        def padded(t, value):  # [batch, k]: a search of fewer hypotheses padded
            return tf.pad(t, [[0, 0], [0, k - tf.shape(t)[1]]], constant_values=value)

        return {"translations": tf.where(padding, "", padded(out["translations"], "")),
                "scores": tf.where(padding, _NEG_INF, padded(out["scores"], _NEG_INF)),
                "log_probs": tf.where(padding, _NEG_INF, padded(out["log_probs"], _NEG_INF)),
                "error": error}


def _per_row(name, value, batch):
    """An option input (a scalar or [batch]) as [batch]; any other shape fails the call
    with InvalidArgument naming it."""
    rank, size = tf.rank(value), tf.size(value)
    fits = tf.debugging.Assert(
        (rank == 0) | ((rank == 1) & (size == batch)),
        [f"{name} must be a scalar or hold one value per input; its shape:", tf.shape(value),
         "inputs:", batch])
    with tf.control_dependencies([fits]):
        return tf.broadcast_to(tf.reshape(value, [-1]), [batch])


def _signature(signature: str, body):
    """The tf.function of `signature`, body(self, inputs, target_prefix, **options) with
    the inputs of `input_specs`: one parameter per declared option."""
    names = ["inputs", "target_prefix"] + [o.name for o in request_options(signature)]
    parameters = inspect.Signature(
        [inspect.Parameter(name, inspect.Parameter.POSITIONAL_OR_KEYWORD)
         for name in ["self"] + names])

    def method(*args, **kwargs):
        arguments = parameters.bind(*args, **kwargs).arguments
        return body(arguments.pop("self"), **arguments)

    method.__signature__ = parameters
    method.__name__ = signature
    method.__doc__ = body.__doc__
    return tf.function(method, input_signature=input_specs(signature), autograph=False)


OptionSignatures.translate_with_options = _signature("translate_with_options",
                                                     OptionSignatures._with_options)
OptionSignatures.sample = _signature("sample", OptionSignatures._sample)
