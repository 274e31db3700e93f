"""The decoders bench/decoding.py --peers times in one process, on the same length-sorted
batches of token ids and the same weights: ours (the SavedModel's translate_ids and
serving_default, keras_transformer.beam_search in a tf.function with and without the
key/value cache, its beam steps counted) and keras-hub's BeamSampler on keras-hub layers
holding our weights (keras_hub_transformer.py), each an `Implementation` that totals its
time, outputs and steps, taking turns batch by batch (`decode_in_turns`). A library for
bench/decoding.py; nothing here is run. TensorFlow is imported inside the functions that
use it.
"""

import os
import time
from typing import List


def counting_step(step, counts):
    """A keras_transformer.search WrappedStep around `step` that adds each call's rows
    and one step to counts["rows"] and counts["steps"] (int64 tf.Variables, which survive
    tracing into the search's loop): the work a search asks of its step."""
    import tensorflow as tf
    from keras_transformer.search import WrappedStep

    class Counting(WrappedStep):
        def __call__(self, seqs, i, state):
            with tf.control_dependencies([
                    counts["rows"].assign_add(tf.cast(tf.shape(seqs)[0], tf.int64)),
                    counts["steps"].assign_add(1)]):
                return super().__call__(seqs, i, state)

    return Counting(step)


def counters():
    """{"rows": , "steps": } int64 tf.Variables at 0, for `counting_step`."""
    import tensorflow as tf
    return {name: tf.Variable(0, dtype=tf.int64, trainable=False) for name in ("rows", "steps")}


def best_ids(ids):
    """[batch, width] output rows (no BOS) -> tuples up to and including the first EOS."""
    import numpy as np
    from keras_transformer import EOS_ID
    rows = []
    for row in ids:
        ends = np.flatnonzero(row == EOS_ID)
        rows.append(tuple(row[:ends[0] + 1]) if ends.size else tuple(row[row != 0]))
    return rows


class Implementation:
    """A decoder of batches with its totals: time, outputs, steps."""

    def __init__(self, name, run):
        self.name, self.run = name, run  # run(batch) -> (list of outputs, steps or None)
        self.seconds, self.outputs, self.steps = 0.0, [], 0

    def decode(self, batch, timed: bool):
        start = time.perf_counter()
        outputs, steps = self.run(batch)
        elapsed = time.perf_counter() - start
        if timed:
            self.seconds += elapsed
            self.outputs.extend(outputs)
            self.steps = None if steps is None or self.steps is None else self.steps + steps


def sorted_batches(translator, texts, batch_size):
    """([(texts, source ids int32 [batch, src_len])] sorted by length, source tokens)."""
    import tensorflow as tf
    lengths = [int(n) for n in tf.reduce_sum(
        tf.cast(translator.source_ids(tf.constant(texts)) != 0, tf.int32), axis=1)]
    order = sorted(range(len(texts)), key=lambda i: lengths[i])
    batches = []
    for start in range(0, len(order), batch_size):
        chunk = [texts[i] for i in order[start:start + batch_size]]
        batches.append((chunk, translator.source_ids(tf.constant(chunk))))
    return batches, sum(lengths)


def our_implementations(export, translator):
    """Ours: the SavedModel's translate_ids and serving_default, and the in-process
    search with and without the cache (the last one apart: it may run on fewer batches)."""
    import tensorflow as tf
    from keras_transformer import TransformerStep, beam_search
    translate_ids = export.loaded.signatures["translate_ids"]
    serving = export.loaded.signatures["serving_default"]
    counts = counters()
    searches = {use_cache: tf.function(
        lambda ids, use_cache=use_cache: beam_search(
            counting_step(TransformerStep(translator.model, ids, use_cache=use_cache), counts),
            export.decode),
        input_signature=[tf.TensorSpec([None, None], tf.int32)], autograph=False)
        for use_cache in (True, False)}

    def run_text(batch):
        serving(inputs=tf.constant(batch[0]))
        return [None] * len(batch[0]), None

    def run_ours(use_cache):
        def run(batch):
            before = int(counts["steps"].numpy())
            ids = searches[use_cache](batch[1]).ids[:, 0].numpy()
            return best_ids(ids), int(counts["steps"].numpy()) - before
        return run

    return ([Implementation("ours, SavedModel translate_ids (cache)", lambda batch: (
                best_ids(translate_ids(source_ids=batch[1])["ids"].numpy()), None)),
             Implementation("ours, SavedModel serving_default (text in/out)", run_text),
             Implementation("ours, in-process beam_search (cache)", run_ours(True))],
            Implementation("ours, in-process beam_search (no cache)", run_ours(False)))


def keras_hub_implementations(export, model, probe, xla: bool):
    """keras-hub's BeamSampler on our weights (tf.function, and with `xla` XLA-compiled),
    and the largest |logit| difference of the two models on `probe` (teacher forcing)."""
    import numpy as np
    import tensorflow as tf
    from keras_transformer import BOS_ID, EOS_ID
    from peers.keras_hub_transformer import (KerasHubTransformer, beam_sampler_search,
                                             copy_weights)
    peer = KerasHubTransformer(model.config, dtype="float32")
    copy_weights(model, peer)
    bos = tf.concat([tf.fill([tf.shape(probe)[0], 1], BOS_ID), probe[:, :-1]], 1)
    difference = float(tf.reduce_max(tf.abs(model((probe, bos)) - peer((probe, bos)))))

    def run_keras_hub(search):
        def run(batch):
            ids = search(batch[1])[0].numpy()  # [batch, beam, width + 1]
            eos = ids[:, :, 1:] == EOS_ID
            first = np.where(eos.any(-1), eos.argmax(-1) + 1, ids.shape[-1] - 1)
            return best_ids(ids[:, 0, 1:]), int(first.max())
        return run

    impls = [Implementation("keras-hub BeamSampler (tf.function)", run_keras_hub(
        beam_sampler_search(peer, export.decode, jit_compile=False)))]
    if xla:
        impls.append(Implementation("keras-hub BeamSampler (XLA)", run_keras_hub(
            beam_sampler_search(peer, export.decode, jit_compile=True))))
    return impls, difference


def decode_in_turns(impls, batches, uncached, uncached_batches: int, loads: List[float]):
    """Every implementation on every batch, taking turns batch by batch: the first batch
    untimed (XLA: every batch, one compile per shape), then one timed pass."""
    def active(impl, index):
        return impl is not uncached or index < uncached_batches

    print("warm-up ...", flush=True)
    for index, batch in enumerate(batches):
        for impl in impls:
            # Graph functions trace once (unknown batch and length); XLA compiles per shape.
            if active(impl, index) and (index == 0 or impl.name.endswith("(XLA)")):
                impl.decode(batch, timed=False)
    loads.append(os.getloadavg()[0])
    print("timed ...", flush=True)
    for index, batch in enumerate(batches):
        for impl in impls:
            if active(impl, index):
                impl.decode(batch, timed=True)
    loads.append(os.getloadavg()[0])
