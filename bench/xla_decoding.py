"""Would an XLA-compiled beam search win on this CPU? A bound, beside the real search.

The exported search (keras_transformer.decoding.beam_search) grows its self-attention cache
by one position per step and drops finished sentences from the batch, so its shapes change
every step and XLA cannot compile it. This benchmark times what an XLA search could at best
be: the same decoding step (`Transformer.decode_step`) on fixed shapes (a cache of every
position the search may decode, written with a one-hot select and read under a mask), a
top-k over beam x vocabulary and the beam reorder of the cache, with no finished-hypothesis
bookkeeping and no early exit: it runs exactly as many steps as the real search took on the
same input. Fewer ops than the real search, so its XLA time is a lower
bound of an XLA search's, and the same function without XLA shows what fixed shapes alone
cost. First-call times include the trace (and, with XLA, the compile for that shape).

    python bench/xla_decoding.py --model_dir=runs/small_multi30k [--threads=1]
"""

import argparse
import statistics
import sys
import time
from pathlib import Path

import tensorflow as tf

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import machine  # noqa: E402
from keras_transformer import beam_search  # noqa: E402
from keras_transformer.masking import padding_mask  # noqa: E402
from trainer.serving import saved_model  # noqa: E402

BEAM = 4


def fixed_shape_search(model, source_ids, steps):
    """`steps` beam steps on fixed shapes (see the module docstring): int32 [batch * beam]
    tokens of the last step. source_ids int32 [batch, src_len] with a static shape. The
    step is the library's (`Transformer.decode_step` on a fixed-width cache)."""
    batch = source_ids.shape[0]
    rows, width = batch * BEAM, steps + 1
    weights = model.step_weights(width)
    cache = model.initial_cache(model.encode(source_ids, training=False), BEAM, width)
    source_mask = padding_mask(source_ids)

    def body(i, tokens, scores, cache):
        logits, cache = model.decode_step(tokens, i, cache, source_mask, weights,
                                          fixed_width=True)
        log_probs = tf.nn.log_softmax(logits)
        best, index = tf.math.top_k(tf.reshape(scores[:, None] + log_probs, [batch, -1]), BEAM)
        vocab = model.config.vocab_size
        parents = tf.reshape(index // vocab + BEAM * tf.range(batch)[:, None], [-1])
        cache = [{**layer, "key": tf.gather(layer["key"], parents),
                  "value": tf.gather(layer["value"], parents)} for layer in cache]
        return i + 1, tf.reshape(index % vocab, [rows]), tf.reshape(best, [rows]), cache

    start = (tf.constant(0), tf.fill([rows], 2), tf.zeros([rows]), cache)
    return tf.while_loop(lambda i, *_: i < steps, body, start)[1]


def timed(function, inputs, repeats):
    """(first call's seconds, best of `repeats` later calls' seconds)."""
    first = machine.seconds(lambda: function(*inputs))
    return first, min(machine.seconds(lambda: function(*inputs)) for _ in range(repeats))


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model_dir", required=True)
    parser.add_argument("--src", default=str(machine.MULTI30K / "test2016.en"))
    parser.add_argument("--threads", type=int, default=0, help="Intra- and inter-op threads "
                        "(0: TensorFlow's default, all cores).")
    parser.add_argument("--sentences", type=int, default=20,
                        help="Single sentences timed one at a time (the first N).")
    parser.add_argument("--batch_size", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args(argv)
    machine.set_threads(args.threads)
    with open(args.src, encoding="utf-8") as f:
        texts = f.read().splitlines()
    translator, _ = saved_model.build_translator(args.model_dir)
    model = translator.model

    real = tf.function(lambda ids: beam_search(model, ids, BEAM, 0.6).lengths,
                       reduce_retracing=True)
    graph = tf.function(lambda ids, steps: fixed_shape_search(model, ids, steps))
    xla = tf.function(lambda ids, steps: fixed_shape_search(model, ids, steps),
                      jit_compile=True)
    rows = {name: {"first": [], "best": []} for name in ("real", "graph", "xla")}

    def measure(batch_texts, repeats):
        ids = translator.source_ids(tf.constant(batch_texts))
        lengths = []
        first = machine.seconds(lambda: lengths.append(real(ids)))
        steps = int(tf.reduce_max(lengths[0]))  # the real search ran at least this long
        for name, function, inputs in (("real", real, (ids,)), ("graph", graph, (ids, steps)),
                                       ("xla", xla, (ids, steps))):
            if name == "real":
                best = min(machine.seconds(lambda: real(ids)) for _ in range(repeats))
            else:
                first, best = timed(function, inputs, repeats)
            rows[name]["first"].append(first)
            rows[name]["best"].append(best)

    for text in texts[:args.sentences]:
        measure([text], 1)
    single = {name: dict(row) for name, row in rows.items()}
    for row in rows.values():
        row["first"], row["best"] = [], []
    measure(texts[:args.batch_size], args.repeats)

    machine.print_run(args.threads)
    print(f"| search, beam {BEAM} | one sentence: median ms (first {args.sentences}) | "
          f"its first call, median s | {args.batch_size} sentences: best ms | "
          "its first call, s |")
    print("|---|---:|---:|---:|---:|")
    names = {"real": "the exported search (graph, growing cache, early exit)",
             "graph": "fixed shapes, no bookkeeping, graph",
             "xla": "fixed shapes, no bookkeeping, XLA"}
    for name, label in names.items():
        print(f"| {label} | {1000 * statistics.median(single[name]['best']):.1f} | "
              f"{statistics.median(single[name]['first']):.2f} | "
              f"{1000 * rows[name]['best'][0]:.0f} | {rows[name]['first'][0]:.2f} |")


if __name__ == "__main__":
    start = time.perf_counter()
    main()
    print(f"({time.perf_counter() - start:.0f} s)")
