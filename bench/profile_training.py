"""Profile: where a training update's forward and backward passes spend their time, op type
by op type, in float32 and mixed_bfloat16.

Builds the Multi30k recipe's `small` model (vocabulary --vocab_size) in each precision, on one
batch of --batch x --length random ids (a tenth of the positions padded at the end of each
row), and times, best of --repeats calls of a tf.function each:

  forward:            the model's logits with training=True (dropout on), on the
                      non-padding positions (Transformer.packed_logits), as in training;
  forward + backward: the summed label-smoothed loss and its gradients, as
                      trainer.training.trainer.Trainer computes them.

One more call of each runs under the TensorFlow profiler, whose kernel times are summed
by op type (machine.kernel_profile). On 2 cores two kernels run at once, so kernel time can
exceed wall time. Not a test: run it by hand from the repository root,

  python bench/profile_training.py [--batch=128 --length=32 --top=25]
"""

import argparse
import collections
import os
import platform
import shlex
import sys
import time

import keras
import numpy as np
import tensorflow as tf

import keras_transformer
from keras_transformer import (Transformer, TransformerConfig,
                               projected_label_smoothed_cross_entropy)

import machine


def random_batch(batch: int, length: int, vocab_size: int, seed: int = 0):
    """((source_ids, target_input_ids), target_output_ids) int32 [batch, length], the last
    tenth of every row padded."""
    rng = np.random.default_rng(seed)
    ids = rng.integers(4, vocab_size, size=(3, batch, length), dtype=np.int32)
    ids[:, :, length - length // 10:] = 0
    source, target_input, target_output = (tf.constant(x) for x in ids)
    return (source, target_input), target_output


def pieces(model: Transformer, batch):
    """{name: tf.function} of the two timed pieces on `batch`."""
    (source_ids, target_input_ids), target_output_ids = batch
    label_smoothing = model.config.label_smoothing

    @tf.function
    def forward():
        return model.packed_logits((source_ids, target_input_ids), training=True)[0]

    @tf.function
    def forward_backward():
        with tf.GradientTape() as tape:
            outputs, packing = model.packed_logits((source_ids, target_input_ids),
                                                   training=True, project=False)
            loss_sum, _, _ = projected_label_smoothed_cross_entropy(
                packing.pack(target_output_ids), outputs, model.embedding.matrix(),
                label_smoothing)
        return tape.gradient(loss_sum, model.trainable_variables)

    return {"forward": forward, "forward + backward": forward_backward}


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--precisions", default="float32,mixed_bfloat16")
    parser.add_argument("--batch", type=int, default=128)
    parser.add_argument("--length", type=int, default=32)
    parser.add_argument("--vocab_size", type=int, default=8000)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--top", type=int, default=25, help="op types listed")
    args = parser.parse_args(argv)
    config = TransformerConfig.small(vocab_size=args.vocab_size)
    batch = random_batch(args.batch, args.length, args.vocab_size)
    columns = []  # (label, wall seconds, {op type: (seconds, count)}, executor seconds)
    for precision in args.precisions.split(","):
        keras.utils.set_random_seed(0)
        model = Transformer(config, dtype=precision)
        model.build()
        for name, fn in pieces(model, batch).items():
            fn()  # trace, first-call allocations
            wall = min(machine.seconds(lambda: tf.nest.map_structure(np.asarray, fn()))
                       for _ in range(args.repeats))
            columns.append((f"{precision} {name}", wall, *machine.kernel_profile(fn)))

    (source_ids, _), target_output_ids = batch
    flops = machine.forward_flops(config, args.batch, args.length, args.length,
                                  int(tf.math.count_nonzero(source_ids)),
                                  int(tf.math.count_nonzero(target_output_ids)))
    load = ", ".join(f"{x:.1f}" for x in os.getloadavg())
    print()
    for name, value in (
            ("machine", f"{machine.describe()}, load average {load} at the end"),
            ("versions", f"Python {platform.python_version()}, TensorFlow {tf.__version__}, "
                         f"Keras {keras.__version__}, keras_transformer from "
                         f"{os.path.dirname(keras_transformer.__file__)}"),
            ("model", f"TransformerConfig.small, vocabulary {args.vocab_size}, batch "
                      f"{args.batch} x {args.length} (source and target), "
                      f"{flops / 1e9:.1f} forward matmul GFLOP"),
            ("command", "python " + " ".join(map(shlex.quote, sys.argv)))):
        print(f"{name:>9}: {value}")
    print()
    total = collections.Counter()
    for _, _, by_type, _ in columns:
        for op_type, (seconds, _) in by_type.items():
            total[op_type] += seconds
    top = [op_type for op_type, _ in total.most_common(args.top)]
    print("| op type | " + " | ".join(f"{label}: ms (kernels)" for label, *_ in columns) + " |")
    print("|---|" + "---:|" * len(columns))

    def row(name, cells):
        print(f"| {name} | " + " | ".join(cells) + " |")

    row("wall time (best call)", [f"**{wall * 1e3:,.0f}**" for _, wall, _, _ in columns])
    for op_type in top:
        row(op_type, [f"{by_type.get(op_type, (0, 0))[0] * 1e3:,.1f} "
                      f"({by_type.get(op_type, (0, 0))[1]})" for _, _, by_type, _ in columns])
    row("other op types", [f"{sum(s for t, (s, _) in by_type.items() if t not in top) * 1e3:,.1f}"
                           for _, _, by_type, _ in columns])
    row("all kernels", [f"{sum(s for s, _ in by_type.values()) * 1e3:,.1f} "
                        f"({sum(n for _, n in by_type.values())})"
                        for _, _, by_type, _ in columns])
    row("executor outside kernels", [f"{executor * 1e3:,.1f}" for *_, executor in columns])


if __name__ == "__main__":
    start = time.perf_counter()
    main()
    print(f"\n({time.perf_counter() - start:.0f} s)")
