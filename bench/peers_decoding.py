"""Benchmark: beam-search decoding speed against keras-hub's BeamSampler and uncached search.

In one process, on the same Multi30k test2016 English sentences (the first --sentences,
256 by default), in the same length-sorted batches of token ids, with the same trained
weights (float32, beam 4):

  ours, SavedModel         the export of trainer.export (python -m trainer.export), its
                           translate_ids signature (ids in, best hypothesis out): beam search
                           with the key/value cache, length penalty alpha 0.6, early exit;
  ours, SavedModel text    its serving_default signature on the same sentences (text in,
                           text out: tokenization and detokenization included);
  ours, in-process cached  keras_transformer.beam_search(use_cache=True) in a tf.function on
                           the model restored by trainer.training.model_dir.restore_model;
  ours, uncached           the same with use_cache=False: every step reruns the decoder over
                           the whole prefix;
  keras-hub BeamSampler    keras_hub.samplers.BeamSampler(num_beams=4) driving a next-token
                           function on a model of keras_hub.layers.TransformerEncoder /
                           TransformerDecoder (bench/peers.KerasHubTransformer) that
                           holds our trained weights, decoding with keras-hub's key/value
                           caches the way keras-hub's BartSeq2SeqLM.generate_step does
                           (stacked per-layer caches, the cross-attention keys and values
                           computed once in a seeding step; here seeded with BOS only), in a
                           tf.function, and again XLA-compiled (keras-hub's default for
                           generate() on TensorFlow; --no-jit_compile skips it).

Same maximum output length for all: (padded source width + 50) tokens, capped at
config.max_length - 1 (section 6.1, as keras_transformer.decoding sets it). The searches
differ, so they run different numbers of steps: ours keeps finished hypotheses aside and
stops once no live beam can beat them (or at each sentence's source length + 50);
BeamSampler has no length penalty and no finished set (a beam that emitted EOS goes on
extending) and stops when every beam of every sentence in the batch holds an EOS. The
table reports the beam steps each ran (loop iterations summed over batches: for ours
counted by a step counter in the in-process runs, which decode exactly what the SavedModel
decodes; for BeamSampler the position of the last first-EOS among all final beams), so
ms per step compares the cost of one step at equal work, and how many of the best outputs
agree with ours.

Output tokens = tokens of the best hypothesis up to and including its first EOS. Each
implementation decodes the first batch untimed (tracing; the XLA row every batch, as it
compiles once per shape), then every batch once timed; they take turns batch by batch so
load from other processes falls on all alike.

Needs the installs of bench/peers_training.py (it imports bench/peers.py's KerasHubTransformer):

  pip install torch==2.13.0
  pip install keras-hub --no-deps && pip install tokenizers --no-deps

and a trained model directory and an export of its latest checkpoint (the same weights the
in-process rows restore), e.g. the Multi30k recipe's (README "Results"; the README's table):

  python -m trainer.task --flagfile=trainer/flagfiles/multi30k.cfg
  python -m trainer.export --model_dir=runs/small_multi30k --export_dir=/tmp/m30k_last

(`--train_steps=200 --eval_every=1000 --export_dir=none --model_dir=DIR` on the first command
gives a model in a few minutes: the speeds per step are alike, its outputs are longer.)

Not a test: run it by hand from the repository root,

  python bench/peers_decoding.py --model_dir=runs/small_multi30k --saved_model=/tmp/m30k_last

and copy the table into the README.
"""

import argparse
import os
import platform
import shlex
import sys
import time
from pathlib import Path

import keras
import keras_hub
import numpy as np
import tensorflow as tf
import tensorflow_text  # noqa: F401  (the SavedModel's SentencePiece ops)
from keras import ops

from keras_transformer import BOS_ID, EOS_ID, beam_search
from trainer.data import tokenizer as tokenizer_lib
from trainer.serving import saved_model
from trainer.serving.signatures import Translator
from trainer.training import model_dir as model_dir_lib

sys.path.insert(0, str(Path(__file__).resolve().parent))
import machine  # noqa: E402
from machine import MULTI30K  # noqa: E402
from peers import KerasHubTransformer  # noqa: E402
BEAM_SIZE, ALPHA, EXTRA_LENGTH = 4, 0.6, 50


# ---------------------------------------------------------------- keras-hub model


def copy_weights(ours, peer: KerasHubTransformer):
    """Our Transformer's weights into the keras-hub model (same function, other layout)."""
    config = ours.config
    heads, d_k = config.num_heads, config.d_k

    def attention(source, target):
        for mine, theirs in ((source.query_dense, target._query_dense),
                             (source.key_dense, target._key_dense),
                             (source.value_dense, target._value_dense)):
            theirs.kernel.assign(np.reshape(mine.kernel.numpy(), (-1, heads, d_k)))
            theirs.bias.assign(np.reshape(mine.bias.numpy(), (heads, d_k)))
        target._output_dense.kernel.assign(
            np.reshape(source.output_dense.kernel.numpy(), (heads, d_k, -1)))
        target._output_dense.bias.assign(source.output_dense.bias.numpy())

    def norm(source, target):
        target.gamma.assign(source.layer_norm.gamma.numpy())
        target.beta.assign(source.layer_norm.beta.numpy())

    def feed_forward(layer, block):
        for mine, theirs in ((layer.feed_forward.inner, block._feedforward_intermediate_dense),
                             (layer.feed_forward.outer, block._feedforward_output_dense)):
            theirs.kernel.assign(mine.kernel.numpy())
            theirs.bias.assign(mine.bias.numpy())
        norm(layer.feed_forward_residual, block._feedforward_layer_norm)

    peer.embedding.embeddings.assign(ours.embedding.embeddings.numpy())
    for layer, block in zip(ours.encoder.layers, peer.encoder_layers):
        attention(layer.self_attention, block._self_attention_layer)
        norm(layer.self_attention_residual, block._self_attention_layer_norm)
        feed_forward(layer, block)
    for layer, block in zip(ours.decoder.layers, peer.decoder_layers):
        attention(layer.self_attention, block._self_attention_layer)
        norm(layer.self_attention_residual, block._self_attention_layer_norm)
        attention(layer.cross_attention, block._cross_attention_layer)
        norm(layer.cross_attention_residual, block._cross_attention_layer_norm)
        feed_forward(layer, block)


def keras_hub_generate(model: KerasHubTransformer, jit_compile: bool):
    """tf.function source_ids int32 [batch, src_len] -> (ids int32 [batch, beam, width + 1]
    with BOS first, sorted by log-prob; log-probs [batch, beam]), by BeamSampler."""
    config = model.config
    layers, heads, head_dim = config.num_layers, config.num_heads, config.d_k
    sampler = keras_hub.samplers.BeamSampler(num_beams=BEAM_SIZE, return_all_beams=True)

    def call_decoder_with_cache(memory, source_mask, token_ids, index, self_cache, cross_cache,
                                cross_index):
        # As BartSeq2SeqLM.call_decoder_with_cache: caches [batch, layers, 2, len, heads, d_k].
        x = model.embed(token_ids, model.target_dropout, start_index=index, training=False)
        self_caches, cross_caches = [], []
        for i, block in enumerate(model.decoder_layers):
            x, next_self, next_cross = block(
                x, memory, encoder_padding_mask=source_mask,
                self_attention_cache=self_cache[:, i], self_attention_cache_update_index=index,
                cross_attention_cache=cross_cache[:, i],
                cross_attention_cache_update_index=cross_index, training=False)
            self_caches.append(next_self)
            cross_caches.append(next_cross)
        if cross_index is not None:
            cross_cache = ops.stack(cross_caches, axis=1)
        return model.logits(x), x, ops.stack(self_caches, axis=1), cross_cache

    @tf.function(input_signature=[tf.TensorSpec([None, None], tf.int32)],
                 jit_compile=jit_compile)
    def generate(source_ids):
        batch, src_len = tf.shape(source_ids)[0], tf.shape(source_ids)[1]
        width = tf.minimum(src_len + EXTRA_LENGTH, config.max_length - 1)
        source_mask = source_ids != 0
        memory = model.encode(source_ids, training=False)
        prompt = tf.concat([tf.fill([batch, 1], BOS_ID), tf.zeros([batch, width], tf.int32)], 1)
        prompt_mask = tf.range(width + 1)[None, :] < tf.ones([batch, 1], tf.int32)
        self_cache = tf.zeros([batch, layers, 2, width + 1, heads, head_dim], memory.dtype)
        cross_cache = tf.zeros([batch, layers, 2, src_len, heads, head_dim], memory.dtype)
        _, hidden, self_cache, cross_cache = call_decoder_with_cache(
            memory, source_mask, prompt[:, :1], 0, self_cache, cross_cache, 0)

        def next(prompt, cache, index):
            self_cache, memory, source_mask, cross_cache = cache
            cache_index = index - 1  # the previous token, as in BartSeq2SeqLM
            token = ops.slice(prompt, [0, cache_index], [ops.shape(prompt)[0], 1])
            logits, hidden, self_cache, _ = call_decoder_with_cache(
                memory, source_mask, token, cache_index, self_cache, cross_cache, None)
            return logits[:, 0], hidden[:, 0], (self_cache, memory, source_mask, cross_cache)

        return sampler(next=next, prompt=prompt,
                       cache=(self_cache, memory, source_mask, cross_cache), index=1,
                       mask=prompt_mask, stop_token_ids=[EOS_ID], hidden_states=hidden[:, 0])

    return generate


# ---------------------------------------------------------------- ours, counted


class StepCounter:
    """The model as beam_search sees it, counting decoder steps (loop iterations)."""

    def __init__(self, model):
        self.model, self.config = model, model.config
        self.steps = tf.Variable(0, dtype=tf.int64, trainable=False)

    def encode(self, *args, **kwargs):
        return self.model.encode(*args, **kwargs)

    def initial_cache(self, *args):
        return self.model.initial_cache(*args)

    def decode_step(self, *args):
        self.steps.assign_add(1)
        return self.model.decode_step(*args)

    def decode(self, *args, **kwargs):
        self.steps.assign_add(1)
        return self.model.decode(*args, **kwargs)


# ---------------------------------------------------------------- outputs


def best_ids(ids: np.ndarray):
    """[batch, width] output rows (no BOS) -> list of tuples up to and including the first EOS."""
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


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model_dir", required=True, help="of python -m trainer.task")
    parser.add_argument("--saved_model", required=True,
                        help="its export (a version directory or the export directory)")
    parser.add_argument("--src", default=str(MULTI30K / "test2016.en"))
    parser.add_argument("--sentences", type=int, default=256,
                        help="the first N sentences of --src (0: all 1000; keras-hub's "
                             "tf.function row then takes ~12 minutes)")
    parser.add_argument("--batch_size", type=int, default=64)
    parser.add_argument("--uncached", type=int, default=-1,
                        help="decode only the first N batches uncached too (-1: all, 0: none)")
    parser.add_argument("--jit_compile", action=argparse.BooleanOptionalAction, default=True,
                        help="add keras-hub with XLA, its default for generate() (compiles "
                             "once per batch shape)")
    args = parser.parse_args(argv)
    command = "python " + " ".join(shlex.quote(a) for a in [sys.argv[0]] + sys.argv[1:])
    loads = [os.getloadavg()]

    with open(args.src, encoding="utf-8") as f:
        texts = [line.rstrip("\n") for line in f]
    texts = texts[:args.sentences] if args.sentences else texts
    model = model_dir_lib.restore_model(args.model_dir)
    config = model.config
    tokenizers = tokenizer_lib.load_or_train(args.model_dir, None)
    translator = Translator(model, tokenizers, beam_size=BEAM_SIZE, alpha=ALPHA)
    lengths = [int(n) for n in tf.reduce_sum(
        tf.cast(translator.source_ids(tf.constant(texts)) != 0, tf.int32), axis=1)]
    order = sorted(range(len(texts)), key=lambda i: lengths[i])
    batches = []  # (texts, source ids int32 [batch, src_len] padded to the batch's longest)
    for start in range(0, len(order), args.batch_size):
        chunk = [texts[i] for i in order[start:start + args.batch_size]]
        batches.append((chunk, translator.source_ids(tf.constant(chunk))))

    saved_path = saved_model.resolve(args.saved_model)
    loaded = tf.saved_model.load(saved_path)
    translate_ids = loaded.signatures["translate_ids"]
    serving = loaded.signatures["serving_default"]

    counted = StepCounter(model)
    searches = {use_cache: tf.function(
        lambda ids, use_cache=use_cache: beam_search(counted, ids, BEAM_SIZE, ALPHA,
                                                     EXTRA_LENGTH, use_cache=use_cache),
        input_signature=[tf.TensorSpec([None, None], tf.int32)]) for use_cache in (True, False)}

    peer = KerasHubTransformer(config, dtype="float32")
    copy_weights(model, peer)
    probe = batches[len(batches) // 2][1]
    bos = tf.concat([tf.fill([tf.shape(probe)[0], 1], BOS_ID), probe[:, :-1]], 1)
    difference = float(tf.reduce_max(tf.abs(model((probe, bos)) - peer((probe, bos)))))

    def run_saved(batch):
        result = translate_ids(source_ids=batch[1])
        return best_ids(result["ids"].numpy()), None

    def run_text(batch):
        serving(inputs=tf.constant(batch[0]))
        return [None] * len(batch[0]), None

    def run_ours(use_cache):
        def run(batch):
            before = int(counted.steps.numpy())
            result = searches[use_cache](batch[1])
            ids = result.ids[:, 0].numpy()
            return best_ids(ids), int(counted.steps.numpy()) - before
        return run

    def run_keras_hub(generate):
        def run(batch):
            ids, _ = generate(batch[1])
            ids = ids.numpy()  # [batch, beam, width + 1]
            eos = ids[:, :, 1:] == EOS_ID
            first = np.where(eos.any(-1), eos.argmax(-1) + 1, ids.shape[-1] - 1)
            return best_ids(ids[:, 0, 1:]), int(first.max())
        return run

    impls = [Implementation("ours, SavedModel translate_ids (cache)", run_saved),
             Implementation("ours, SavedModel serving_default (text in/out)", run_text),
             Implementation("ours, in-process beam_search (cache)", run_ours(True)),
             Implementation("keras-hub BeamSampler (tf.function)",
                            run_keras_hub(keras_hub_generate(peer, False)))]
    if args.jit_compile:
        impls.append(Implementation("keras-hub BeamSampler (XLA)",
                                    run_keras_hub(keras_hub_generate(peer, True))))
    uncached_batches = len(batches) if args.uncached < 0 else args.uncached
    uncached = Implementation("ours, in-process beam_search (no cache)", run_ours(False))
    if uncached_batches:
        impls.append(uncached)

    def active(impl, index):
        return impl is not uncached or index < uncached_batches

    print("warm-up ...", flush=True)
    for index, batch in enumerate(batches):
        for impl in impls:
            # Graph functions trace once (unknown batch and length); XLA compiles per shape.
            if active(impl, index) and (index == 0 or impl.name.endswith("(XLA)")):
                impl.decode(batch, timed=False)
    loads.append(os.getloadavg())
    print("timed ...", flush=True)
    for index, batch in enumerate(batches):
        for impl in impls:
            if active(impl, index):
                impl.decode(batch, timed=True)
    loads.append(os.getloadavg())

    # Output tokens of the text signature: those of translate_ids (the same search).
    impls[1].outputs = impls[0].outputs
    reference = impls[0].outputs
    steps = {i.name: i.steps for i in impls}
    steps[impls[0].name] = steps[impls[1].name] = impls[2].steps

    header = [
        ("machine", machine.describe()),
        ("load", "os.getloadavg() 1-min at start, after warm-up, end: "
                 + ", ".join(f"{load[0]:.2f}" for load in loads)),
        ("versions", f"Python {platform.python_version()}, TensorFlow {tf.__version__}, "
                     f"Keras {keras.__version__}, keras-hub {keras_hub.__version__}"),
        ("command", command),
        ("model", f"{args.model_dir} (N={config.num_layers}, d_model {config.d_model}, "
                  f"vocabulary {config.vocab_size}), float32; SavedModel {saved_path}; "
                  f"keras-hub copy: max |logit difference| {difference:.1e} (teacher forcing)"),
        ("data", f"{len(texts)} sentences of {args.src}, {len(batches)} length-sorted batches "
                 f"of {args.batch_size}, {sum(lengths):,} source tokens (pieces + EOS); "
                 f"beam {BEAM_SIZE}; ours alpha {ALPHA}; max output length src width + "
                 f"{EXTRA_LENGTH}"),
        ("timing", "first batch untimed (XLA: every batch), then one timed pass; "
                   "implementations take turns batch by batch"
                   + (f"; uncached: first {uncached_batches} batches only"
                      if uncached_batches < len(batches) else "")),
    ]
    print()
    for name, value in header:
        print(f"{name:>8}: {value}")
    print()
    print("| implementation | sentences | seconds | sentences/s | output tokens/s "
          "| output tokens / sentence | beam steps | ms / step | best output = ours |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|")
    for impl in impls:
        n = len(impl.outputs)
        tokens = sum(len(o) for o in impl.outputs)
        agree = sum(a == b for a, b in zip(impl.outputs, reference)) / n
        step_count = steps[impl.name]
        per_step = f"{1000 * impl.seconds / step_count:.1f}" if step_count else "-"
        print(f"| {impl.name} | {n} | {impl.seconds:.1f} | {n / impl.seconds:.1f} "
              f"| {tokens / impl.seconds:,.0f} | {tokens / n:.1f} "
              f"| {step_count if step_count else '-'} | {per_step} | {100 * agree:.0f}% |")
    print("\n(beam steps of the SavedModel rows: the in-process cached search's, same "
          "weights and algorithm; ms / step: seconds over beam steps)")


if __name__ == "__main__":
    main()
