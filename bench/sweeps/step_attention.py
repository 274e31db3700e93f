"""Sweep: where should a decoding step stop attending elementwise? Its answer is
attention.py's ELEMENTWISE_MAX_ROWS: steps of at most that many rows (sentences x beams)
attend with elementwise float32 ops, larger ones with oneDNN's batched matmuls and softmax.

Times the two ways one step attends (keras_transformer.attention's _elementwise_attention
and _matmul_attention), per call, in a tf.while_loop as the search runs them, for
self-attention (a query per row against its --cache_length cached keys) and
cross-attention (a sentence's --beams queries against its --source_length source keys),
at each of --rows, with one thread and with --threads. `small`'s shapes by default
(4 heads of 64). Each thread count runs in its own process (TensorFlow fixes its pools at
first use). Not a test: run it by hand from the repository root,

  python bench/sweeps/step_attention.py [--dtype=float32] [--threads=2]
"""

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

import tensorflow as tf

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # bench/, for common
import common  # noqa: E402
from keras_transformer import DecodeConfig, TransformerConfig  # noqa: E402
from keras_transformer.attention import (ELEMENTWISE_MAX_ROWS,  # noqa: E402
                                         _elementwise_attention, _matmul_attention)

SMALL = TransformerConfig.small()
WAYS = {"elementwise": _elementwise_attention, "matmuls": _matmul_attention}


def per_call_us(attention, args, calls: int, repeats: int) -> float:
    """Best of `repeats` loops of `calls` attention(*args) calls, in microseconds per call."""
    def body(i, total):
        return i + 1, total + tf.cast(tf.reduce_sum(attention(*args)[:1, :1, :1, :1]), tf.float32)

    loop = tf.function(lambda: tf.while_loop(lambda i, _: i < calls, body, (0, 0.0))[1])
    loop()  # trace
    return common.best_seconds(loop, repeats) / calls * 1e6


def measure(args) -> dict:
    """{"kind rows way": microseconds per call} with this process's threads."""
    common.set_threads(args.threads)
    dtype = tf.bfloat16 if args.dtype == "bfloat16" else tf.float32
    heads, depth = args.heads, args.depth

    def normal(shape):
        return tf.cast(tf.random.normal(shape), dtype)

    results = {}
    for rows in map(int, args.rows.split(",")):
        for kind, queries, length in (("self", 1, args.cache_length),
                                      ("cross", args.beams, args.source_length)):
            groups = max(rows // queries, 1)
            inputs = (normal([groups, queries, heads, depth]),
                      normal([groups, heads, length, depth]),
                      normal([groups, heads, length, depth]), tf.ones([groups, 1, 1, length], bool))
            for way, attention in WAYS.items():
                results[f"{kind} {groups * queries} {way}"] = per_call_us(
                    attention, inputs, args.calls, args.repeats)
    return results


def measure_in_processes(args) -> dict:
    """{threads: measure()'s results}, each thread count in a worker process."""
    columns = {}
    for threads in (1, args.threads):
        command = [sys.executable, __file__, "--worker", f"--threads={threads}",
                   *(f"--{name}={value}" for name, value in vars(args).items()
                     if name not in ("threads", "worker"))]
        worker = subprocess.run(command, capture_output=True, text=True, check=True,
                                env=os.environ)
        columns[threads] = json.loads(worker.stdout.strip().splitlines()[-1])
    return columns


def print_report(args, columns: dict):
    common.print_header([
        ("machine", f"{common.describe()}, load average {common.load_average()} at the end"),
        ("versions", common.versions()),
        ("threads", f"1 and {args.threads}"),
        ("command", common.command()),
    ])
    rows = []
    for key in columns[1]:
        kind, count, way = key.split()
        if way == "elementwise":
            rows.append([kind, count, *(f"{columns[threads][f'{kind} {count} {w}']:.0f}"
                                        for threads in columns for w in WAYS)])
    common.print_table(
        ["attention", "rows", *(f"{way}, {threads} thread{'s' * (threads > 1)}"
                                for threads in columns for way in WAYS)],
        rows, title=f"{args.dtype}, {args.heads} heads of {args.depth}; self-attention over "
        f"{args.cache_length} cached keys, cross-attention of {args.beams} beams over "
        f"{args.source_length} source keys; us per call, best of {args.repeats} loops of "
        f"{args.calls}. ELEMENTWISE_MAX_ROWS = {ELEMENTWISE_MAX_ROWS}.")


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dtype", choices=["bfloat16", "float32"], default="bfloat16")
    parser.add_argument("--rows", default="4,8,16,32,64,256")
    parser.add_argument("--threads", type=int, default=2, help="The second thread count "
                        "timed (the first is 1).")
    parser.add_argument("--beams", type=int, default=DecodeConfig().beam_size)
    parser.add_argument("--cache_length", type=int, default=20)
    parser.add_argument("--source_length", type=int, default=16)
    parser.add_argument("--heads", type=int, default=SMALL.num_heads)
    parser.add_argument("--depth", type=int, default=SMALL.d_k)
    parser.add_argument("--calls", type=int, default=200)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker:
        print(json.dumps(measure(args)))
        return
    common.timed_main(lambda: print_report(args, measure_in_processes(args)))


if __name__ == "__main__":
    main()
