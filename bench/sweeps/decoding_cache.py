"""Sweep: what does the key/value cache buy, and how does it grow with output length?

On the first --uncached_sentences Multi30k test2016 sentences (--src), in length-sorted
batches: the SavedModel's (--saved_model) `serving_default`, and the same search in-process
on the same weights (--model_dir, the export's model directory) with the key/value cache
and without it (every step reruns the decoder over the whole prefix); sentences/s and
target tokens/s (output subwords + EOS). Then how decoding time grows with output length:
greedy steps forced to each of --lengths tokens (no early stop) for --length_batch sources
x beam rows, the decoder alone, cached (O(L) attention a step) against uncached (the whole
prefix a step, O(L^2)). The search is the export's: its beam size, alpha and extra output
length, from its export.json. Not a test: run it by hand from the repository root,

  python bench/sweeps/decoding_cache.py --saved_model=EXPORT --model_dir=runs/small_multi30k
"""

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # bench/, for common
import common  # noqa: E402


def forced_decode(model, source_ids, length, use_cache):
    """Greedy decoding of exactly `length` steps (EOS does not stop it); returns the
    tokens [rows, length]. The decoder alone: the encoder runs once outside the timing."""
    import tensorflow as tf
    from keras_transformer import BOS_ID, padding_mask
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
    else:  # every step reruns the decoder over the whole prefix
        def step_uncached(i, seqs):
            logits = model.decode(seqs, encoder_output, source_ids, training=False)
            next_ids = tf.argmax(logits[:, -1], axis=-1, output_type=tf.int32)
            return i + 1, tf.concat([seqs, next_ids[:, None]], axis=1)

        _, seqs = tf.while_loop(lambda i, _: i < length, step_uncached, (tf.constant(0), seqs),
                                shape_invariants=(tf.TensorShape([]),
                                                  tf.TensorShape([None, None])))
    return seqs[:, 1:]


def length_scaling(model, source_ids, lengths, repeats=3):
    """{(length, use_cache): best seconds of `repeats`} of forced_decode."""
    import tensorflow as tf
    results = {}
    for use_cache in (True, False):
        decode = tf.function(lambda ids, n, c=use_cache: forced_decode(model, ids, n, c))
        decode(source_ids, tf.constant(2))  # trace once: the length is a tensor
        for length in lengths:
            results[length, use_cache] = common.best_seconds(
                lambda: decode(source_ids, tf.constant(length)).numpy(), repeats)
    return results


def measure(args, export: common.Export, texts):
    """(rows (name, sentences, seconds, target tokens): the SavedModel and the in-process
    search with and without the cache on the first --uncached_sentences; {(length,
    use_cache): seconds} of forced-length decoding)."""
    import tensorflow as tf
    from trainer.serving import saved_model
    subset = texts[:args.uncached_sentences]
    out, seconds = common.timed_translation(export.loaded.signatures["serving_default"],
                                            subset, args.batch_size)
    rows = [(export.serving_row, len(subset), seconds,
             common.target_tokens(export.processor, out))]
    beam = export.decode.beam_size
    translator, _ = saved_model.build_translator(args.model_dir, export.options)
    for use_cache in (True, False):
        translator.use_cache = use_cache
        out, seconds = common.timed_translation(translator.translate, subset, args.batch_size)
        label = "in-process, cached" if use_cache else "in-process, uncached"
        rows.append((f"{label}, beam {beam}", len(subset), seconds,
                     common.target_tokens(export.processor, out)))
    source_ids = translator.source_ids(tf.constant(texts[:args.length_batch]))
    source_ids = tf.repeat(source_ids, beam, axis=0)  # [sources * beam, src_len]
    lengths = [n for n in map(int, args.lengths.split(","))
               if n < translator.model.config.max_length]
    return rows, length_scaling(translator.model, source_ids, lengths)


def print_report(args, export: common.Export, rows, scaling):
    beam = export.decode.beam_size
    common.print_header([
        ("machine", f"{common.describe()}, load average {common.load_average()} at the end"),
        ("versions", common.versions()),
        ("export", export.describe()),
        ("data", f"{args.src}, batches of {args.batch_size}"),
        ("command", common.command()),
    ])
    common.print_speed_table(rows, "The key/value cache against none, on the first "
                                   f"{rows[0][1]} sentences:")
    common.print_table(
        ["output length L", "cached ms", "cached ms/step", "uncached ms", "uncached ms/step",
         "uncached / cached"],
        [[n, f"{scaling[n, True] * 1e3:.0f}", f"{scaling[n, True] * 1e3 / n:.1f}",
          f"{scaling[n, False] * 1e3:.0f}", f"{scaling[n, False] * 1e3 / n:.1f}",
          f"{scaling[n, False] / scaling[n, True]:.1f}x"]
         for n in sorted({n for n, _ in scaling})],
        title=f"Forced-length greedy decoding, {args.length_batch} sources x {beam} = "
              f"{args.length_batch * beam} rows (decoder only):")


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--saved_model", required=True,
                        help="the export (a version or its export directory)")
    parser.add_argument("--model_dir", required=True, help="the export's model directory")
    parser.add_argument("--src", default=str(common.MULTI30K / "test2016.en"))
    parser.add_argument("--batch_size", type=int, default=64)
    parser.add_argument("--uncached_sentences", type=int, default=200,
                        help="the first N sentences of --src, decoded each way")
    parser.add_argument("--length_batch", type=int, default=16,
                        help="sources in the output-length experiment (x beam rows)")
    parser.add_argument("--lengths", default="8,16,32,64,120")
    args = parser.parse_args(argv)
    export = common.Export(args.saved_model)
    texts = common.read_lines(args.src)
    rows, scaling = measure(args, export, texts)
    print_report(args, export, rows, scaling)


if __name__ == "__main__":
    common.timed_main(main)
