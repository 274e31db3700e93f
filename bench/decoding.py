"""Benchmark: beam-search translation speed on this CPU (paper section 6.1 settings).

Measures, on Multi30k test2016 English sources (or --src):

  1. the exported SavedModel's serving_default signature (beam 4, alpha 0.6: text in,
     text out, tokenization included), in length-sorted batches as trainer.translate
     sends them: sentences/s and target tokens/s (output subwords + EOS); beside it, in
     alternate rounds (best of --repeats each), translate_with_options given the same
     settings as request inputs (beam_size 4, alpha 0.6, max_extra_length 50, one
     hypothesis, no prefix), whether its outputs are identical, and its greedy
     (beam_size 1) and sampling (unrestricted, top_k 10, top_p 0.9) requests; with
     --previous_saved_model, that export's sampling requests too, in the same rounds;
  2. with --model_dir: on the first --uncached_sentences sentences, the SavedModel again
     and the same translation in-process with the key/value cache and without it (every
     step recomputes the decoder over the whole prefix);
  3. with --model_dir: how decoding time grows with output length: greedy steps forced
     to L tokens (no early stop) for a batch of sources x beam rows, cached vs uncached.
     Cached steps cost O(L) attention each; uncached steps redo the whole prefix, O(L^2).

Speed depends on output lengths: a model that stops early (or never stops) decodes
fewer (more) steps, so measure a model trained on the same data as --src. Not a test:
run it by hand and copy the table into the README, e.g.

  python -m trainer.task --config=small --train_src=../shared/data/multi30k/train.en.gz \\
      --train_tgt=../shared/data/multi30k/train.de.gz --eval_src=../shared/data/multi30k/val.en \\
      --eval_tgt=../shared/data/multi30k/val.de --model_dir=/tmp/m30k_small \\
      --export_dir=/tmp/m30k_export
  python bench/decoding.py --saved_model=/tmp/m30k_export --model_dir=/tmp/m30k_small
"""

import argparse
import os
import platform
import shlex
import sys
import time

import keras
import sentencepiece
import tensorflow as tf
import tensorflow_text

from keras_transformer import BOS_ID, padding_mask
from trainer.serving import saved_model
from trainer.serving.client import translate_texts

import machine
from machine import MULTI30K


def timed_translation(translate, texts, batch_size, **options):
    """(translations, seconds) after one warm-up batch (tracing, thread pools); options:
    the options signatures' scalar inputs (every text gets the empty target prefix), the
    first hypothesis kept."""
    prefixes = {"target_prefixes": [""] * len(texts)} if options else {}
    warmup = {"target_prefixes": prefixes["target_prefixes"][:batch_size]} if options else {}
    translate_texts(translate, texts[:batch_size], batch_size, **warmup, **options)
    start = time.perf_counter()
    translations = translate_texts(translate, texts, batch_size, **prefixes, **options)
    seconds = time.perf_counter() - start
    return [t[0] if isinstance(t, list) else t for t in translations], seconds


# translate_with_options and sample requests, beside serving_default (beam 4, alpha 0.6).
REQUESTS = {
    "translate_with_options, beam 4": ("translate_with_options", dict(
        beam_size=tf.constant(4), alpha=tf.constant(0.6), max_extra_length=tf.constant(50),
        num_hypotheses=tf.constant(1))),
    "translate_with_options, beam 1 (greedy)": ("translate_with_options", dict(
        beam_size=tf.constant(1), alpha=tf.constant(0.0), max_extra_length=tf.constant(50),
        num_hypotheses=tf.constant(1))),
    **{f"sample, {name}": ("sample", dict(
        num_hypotheses=tf.constant(1), max_extra_length=tf.constant(50),
        temperature=tf.constant(1.0), top_k=tf.constant(top_k), top_p=tf.constant(top_p),
        seed=tf.constant(0, tf.int64)))
       for name, top_k, top_p in (("unrestricted", 0, 1.0), ("top_k 10", 10, 1.0),
                                  ("top_p 0.9", 0, 0.9))},
}


def signature_rows(loaded, texts, batch_size, repeats, processor, previous=None):
    """Table rows (name, sentences, best seconds, target tokens) of serving_default and the
    REQUESTS, timed in alternate rounds; whether translate_with_options at beam 4 gave
    serving_default's translations; and, for `previous` (another loaded export, whose
    sample REQUESTS join the rounds), how many of each request's translations are this
    export's."""
    runs = {"SavedModel serving_default, beam 4": (loaded.signatures["serving_default"], {})}
    twins = {}  # a previous export's run -> this export's
    for name, (signature, options) in REQUESTS.items():
        if signature in loaded.signatures:
            runs[f"SavedModel {name}"] = (loaded.signatures[signature], options)
        if previous is not None and signature == "sample" and signature in previous.signatures:
            runs[f"previous export's {name}"] = (previous.signatures[signature], options)
            twins[f"previous export's {name}"] = f"SavedModel {name}"
    best, outputs = {}, {}
    for _ in range(repeats):
        for name, (translate, options) in runs.items():
            outputs[name], seconds = timed_translation(translate, texts, batch_size, **options)
            best[name] = min(best.get(name, float("inf")), seconds)
    rows = [(name, len(texts), best[name], target_tokens(processor, outputs[name]))
            for name in runs]
    names = list(runs)
    same = len(names) > 1 and outputs[names[0]] == outputs[names[1]]
    agreeing = {name: sum(a == b for a, b in zip(outputs[name], outputs[ours]))
                for name, ours in twins.items()}
    return rows, same, agreeing


def target_tokens(processor, translations) -> int:
    """Output subwords + EOS, as the decoder produced them (re-tokenized output)."""
    return sum(len(processor.encode(t)) + 1 for t in translations)


def forced_decode(model, source_ids, length, use_cache):
    """Greedy decoding of exactly `length` steps (EOS does not stop it); returns the
    tokens [rows, length]. The decoder alone: the encoder runs once outside the timing."""
    encoder_output = model.encode(source_ids, training=False)
    rows = tf.shape(source_ids)[0]
    seqs = tf.fill(tf.stack([rows, 1]), BOS_ID)
    if use_cache:
        weights, source_mask = model.step_weights(length), padding_mask(source_ids)

        def step(i, seqs, cache):
            logits, cache = model.decode_step(seqs[:, -1], i, cache, source_mask, weights)
            next_ids = tf.argmax(logits, axis=-1, output_type=tf.int32)
            return i + 1, tf.concat([seqs, next_ids[:, None]], axis=1), cache

        # The sequences and the cache grow by one position per step.
        cache = model.initial_cache(encoder_output)
        loop_vars = (tf.constant(0), seqs, cache)
        invariants = (tf.TensorShape([]), tf.TensorShape([None, None]), tf.nest.map_structure(
            lambda t: tf.TensorShape([None, None, None, t.shape[-1]]), cache))
        _, seqs, _ = tf.while_loop(lambda i, *_: i < length, step, loop_vars,
                                   shape_invariants=invariants)
    else:
        for _ in tf.range(length):
            tf.autograph.experimental.set_loop_options(
                shape_invariants=[(seqs, tf.TensorShape([None, None]))])
            logits = model.decode(seqs, encoder_output, source_ids, training=False)
            next_ids = tf.argmax(logits[:, -1], axis=-1, output_type=tf.int32)
            seqs = tf.concat([seqs, next_ids[:, None]], axis=1)
    return seqs[:, 1:]


def length_scaling(model, source_ids, lengths, repeats=3):
    """{(length, use_cache): best seconds of `repeats`} of forced_decode."""
    results = {}
    for use_cache in (True, False):
        decode = tf.function(lambda ids, n, c=use_cache: forced_decode(model, ids, n, c))
        decode(source_ids, tf.constant(2))  # trace once: the length is a tensor
        for length in lengths:
            times = []
            for _ in range(repeats):
                start = time.perf_counter()
                decode(source_ids, tf.constant(length)).numpy()
                times.append(time.perf_counter() - start)
            results[length, use_cache] = min(times)
    return results


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--saved_model", required=True,
                        help="Export directory or version of python -m trainer.export.")
    parser.add_argument("--model_dir", help="Its model directory: enables the cached vs "
                        "uncached comparisons (2, 3).")
    parser.add_argument("--src", default=str(MULTI30K / "test2016.en"))
    parser.add_argument("--sentences", type=int, default=0, help="First N sentences (0: all).")
    parser.add_argument("--batch_size", type=int, default=64)
    parser.add_argument("--uncached_sentences", type=int, default=200)
    parser.add_argument("--length_batch", type=int, default=16,
                        help="Sources in the output-length experiment (x beam 4 rows).")
    parser.add_argument("--lengths", default="8,16,32,64,120")
    parser.add_argument("--repeats", type=int, default=3,
                        help="Rounds of the signature comparison (best of each).")
    parser.add_argument("--previous_saved_model",
                        help="Another export (e.g. the same weights exported by the previous "
                             "code): its sample requests are timed in the same rounds.")
    args = parser.parse_args(argv)

    with open(args.src, encoding="utf-8") as f:
        texts = f.read().splitlines()
    if args.sentences:
        texts = texts[:args.sentences]
    version_dir = saved_model.resolve(args.saved_model)
    loaded = tf.saved_model.load(version_dir)
    vocabulary = os.path.join(version_dir, "assets", "spm.model")
    if not os.path.exists(vocabulary):
        vocabulary = os.path.join(version_dir, "assets", "spm_target.model")
    processor = sentencepiece.SentencePieceProcessor(model_file=vocabulary)

    previous_dir = (saved_model.resolve(args.previous_saved_model)
                    if args.previous_saved_model else None)
    previous = tf.saved_model.load(previous_dir) if previous_dir else None
    rows, same, agreeing = signature_rows(loaded, texts, args.batch_size, args.repeats,
                                          processor, previous)
    mean_output = rows[0][3] / len(texts)

    scaling = None
    if args.model_dir:
        subset = texts[:args.uncached_sentences]
        out, seconds = timed_translation(loaded.signatures["serving_default"], subset,
                                         args.batch_size)
        rows.append(("SavedModel serving_default, beam 4", len(subset), seconds,
                     target_tokens(processor, out)))
        for use_cache in (True, False):
            translator, _ = saved_model.build_translator(args.model_dir)
            translator.use_cache = use_cache
            out, seconds = timed_translation(translator.translate, subset, args.batch_size)
            label = "in-process, cached" if use_cache else "in-process, uncached"
            rows.append((f"{label}, beam 4", len(subset), seconds,
                         target_tokens(processor, out)))
        lengths = [int(x) for x in args.lengths.split(",")]
        beam_rows = args.length_batch * 4
        source_ids = translator.source_ids(tf.constant(texts[:args.length_batch]))
        source_ids = tf.repeat(source_ids, 4, axis=0)  # [sources * beam, src_len]
        lengths = [n for n in lengths if n < translator.model.config.max_length]
        scaling = length_scaling(translator.model, source_ids, lengths)

    print()
    load = ", ".join(f"{x:.1f}" for x in os.getloadavg())
    for name, value in (("machine", f"{machine.describe()}, load average "
                                    f"{load} at the end (other work slows the numbers)"),
                        ("python", platform.python_version()),
                        ("tensorflow", tf.__version__),
                        ("tf-text", tensorflow_text.__version__),
                        ("keras", keras.__version__),
                        ("model", version_dir),
                        ("previous", previous_dir),
                        ("data", f"{args.src} ({len(texts)} sentences, mean output "
                                 f"{mean_output:.1f} tokens)"),
                        ("command", "python " + " ".join(map(shlex.quote, sys.argv)))):
        if value:
            print(f"{name:>10}: {value}")
    print()
    print("| decoding | sentences | seconds | sentences/s | target tokens/s |")
    print("|---|---:|---:|---:|---:|")
    for name, n, seconds, tokens in rows:
        print(f"| {name} | {n} | {seconds:.1f} | {n / seconds:.1f} | {tokens / seconds:,.0f} |")
    if len(rows) > 1:
        print()
        print(f"translate_with_options (beam 4) / serving_default time: "
              f"{rows[1][2] / rows[0][2]:.3f}; identical translations: {'yes' if same else 'no'}")
    for name, count in agreeing.items():
        print(f"{name}: the same translation as this export's on {count} of {len(texts)}")
    if scaling:
        print()
        print(f"Forced-length greedy decoding, {args.length_batch} sources x 4 = {beam_rows} "
              "rows (decoder only):")
        print()
        print("| output length L | cached ms | cached ms/step | uncached ms | "
              "uncached ms/step | uncached / cached |")
        print("|---:|---:|---:|---:|---:|---:|")
        for n in sorted({n for n, _ in scaling}):
            cached, uncached = scaling[n, True], scaling[n, False]
            print(f"| {n} | {cached * 1e3:.0f} | {cached * 1e3 / n:.1f} | {uncached * 1e3:.0f}"
                  f" | {uncached * 1e3 / n:.1f} | {uncached / cached:.1f}x |")
    print()


if __name__ == "__main__":
    main()
