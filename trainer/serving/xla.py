"""translate_xla, the opt-in signature for latency-bound serving (`trainer.export --xla`):
serving_default's inputs, outputs and translations, with the search of a small request
compiled by XLA on fixed shapes (`TransformerStep(fixed_shapes=True)`): a step's hundreds of
small ops fused. A larger request runs serving_default's search, whose shrinking batch and
growing cache win there (bench/performance-notes.md has the measurements).

Each batch size and source width (in pieces, padded to a multiple of WIDTH_MULTIPLE)
costs one compile, seconds, on its first request; TF Serving runs the signature only with
XLA's CPU JIT enabled (--xla_cpu_compilation_enabled).
"""

import dataclasses
import tensorflow as tf

from keras_transformer import TransformerStep, beam_search
from trainer.serving.translator import Translator

SIGNATURE = "translate_xla"
# Source widths are padded to a multiple of this: one XLA compile per batch size and
# multiple, not per source length.
WIDTH_MULTIPLE = 16
# Requests of at most this many sentences are compiled; larger ones run translate's search,
# which is faster from about 8 sentences on, where every step attending over every
# position costs more than XLA saves (bench/sweeps/xla_batch_sizes.py measures where).
MAX_BATCH = 4


class XlaRoute:
    """The XLA route of a Translator's model, tokenizers and decoding settings. Keep it
    alive while its functions are traced and saved: they hold it weakly, as tf.function
    methods do."""

    def __init__(self, translator: Translator):
        self.translator = translator

    @tf.function(input_signature=[tf.TensorSpec([None], tf.string)], autograph=False)
    def translate(self, inputs):
        """tf.string [batch] -> {"translations": tf.string [batch], "scores": float32
        [batch]}, as Translator.translate; a request of up to MAX_BATCH sentences through
        the compiled fixed-shape search."""
        translator = self.translator
        source_ids = translator.source_ids(inputs)
        return tf.cond(tf.shape(source_ids)[0] <= MAX_BATCH,
                       lambda: translator.best(*self.fixed_shape_search(source_ids)),
                       lambda: translator.best(source_ids, translator.search(source_ids)))

    def fixed_shape_search(self, source_ids):
        """The compiled search, on any batch (the benchmark times it): source_ids int32
        [batch, src_len] -> (the ids padded to a width that is a multiple of
        WIDTH_MULTIPLE, their best hypotheses' DecodeResult)."""
        width = tf.shape(source_ids)[1]
        padded = tf.minimum(-(-width // WIDTH_MULTIPLE) * WIDTH_MULTIPLE,
                            tf.maximum(width, self.translator.model.config.max_length))
        source_ids = tf.pad(source_ids, [[0, 0], [0, padded - width]])
        return source_ids, self._compiled_search(source_ids)

    @tf.function(autograph=False, jit_compile=True)
    def _compiled_search(self, source_ids):
        translator = self.translator
        step = TransformerStep(translator.model, source_ids, fixed_shapes=True)
        return beam_search(step, dataclasses.replace(translator.decode, num_hypotheses=1))
