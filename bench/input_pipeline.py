"""Benchmark: input pipeline throughput beside the training step's consumption, on Multi30k.

Measures, in one run on the same batches (Multi30k en->de train, shared
SentencePiece vocabulary at the default size, batch_tokens per replica):

  1. the pipeline alone: non-pad source + target tokens per second that
     `trainer.data.input_pipeline.train_dataset` delivers (text -> ids -> batches);
  2. the training step alone: tokens per second the `small` Transformer consumes
     with Adam and masked cross-entropy, on batches already in memory;
  3. both together: the step fed by the pipeline, as in training.

The ratio (1) / (2) is the pipeline's headroom; the target is at least 10x.
(3) close to (2) means the step is not starved. Not a test: run it by hand from the
repository root,

  python bench/input_pipeline.py [--batch_tokens=4096 --max_len=128 ...]

and copy the table into docs/performance.md.
"""

import argparse
import dataclasses
import os
import tempfile
import time
from pathlib import Path

import keras
import sentencepiece
import tensorflow as tf

import keras_transformer
from trainer.data import input_pipeline, sources

import common
import results_file


def real_tokens(batch) -> int:
    """Non-pad source + target positions of a batch (target counted once, as outputs)."""
    (source_ids, _), target_output_ids = batch
    return int(tf.math.count_nonzero(source_ids) + tf.math.count_nonzero(target_output_ids))


def measure_pipeline(dataset, num_batches):
    """(tokens/s, batches) over num_batches batches after one warm-up batch."""
    iterator = iter(dataset)
    next(iterator)
    batches = []
    start = time.perf_counter()
    for _ in range(num_batches):
        batches.append(next(iterator))
    elapsed = time.perf_counter() - start
    return sum(real_tokens(b) for b in batches) / elapsed, batches


def make_train_step(model, optimizer):
    spec = tf.TensorSpec([None, None], tf.int32)

    @tf.function(input_signature=[((spec, spec), spec)])
    def train_step(batch):
        (source_ids, target_input_ids), target_output_ids = batch
        with tf.GradientTape() as tape:
            logits = model((source_ids, target_input_ids), training=True)  # [batch, len, vocab]
            losses = tf.keras.losses.sparse_categorical_crossentropy(
                target_output_ids, logits, from_logits=True)  # [batch, len]
            mask = tf.cast(target_output_ids != 0, losses.dtype)
            loss = tf.reduce_sum(losses * mask) / tf.reduce_sum(mask)
        gradients = tape.gradient(loss, model.trainable_variables)
        optimizer.apply_gradients(zip(gradients, model.trainable_variables))
        return loss

    return train_step


def measure_steps(train_step, batches):
    """Tokens/s of train_step over `batches` (the first one is a warm-up)."""
    train_step(batches[0]).numpy()
    tokens = 0
    start = time.perf_counter()
    for batch in batches[1:]:
        train_step(batch)
        tokens += real_tokens(batch)
    loss = float(train_step(batches[0]).numpy())  # waits for the queued steps
    elapsed = time.perf_counter() - start
    return tokens / elapsed, loss


def measure_fed_steps(train_step, dataset, num_steps):
    """Tokens/s of train_step fed by the pipeline, as in training."""
    iterator = iter(dataset)
    train_step(next(iterator)).numpy()
    tokens = 0
    start = time.perf_counter()
    for _ in range(num_steps):
        batch = next(iterator)
        train_step(batch).numpy()
        tokens += real_tokens(batch)
    return tokens / (time.perf_counter() - start)


def measure(args) -> dict:
    """Every figure of the report: the pipeline alone, the step alone on its batches, the
    step fed by it, and what they ran on."""
    load_before = os.getloadavg()[0]  # other processes share the cores
    start = time.perf_counter()
    data_config = dataclasses.replace(
        common.multi30k_data(Path(args.data), max_len=args.max_len,
                             batch_tokens=args.batch_tokens),
        subword_sampling=args.subword_sampling)
    source = sources.select(data_config)
    check_seconds = time.perf_counter() - start
    with tempfile.TemporaryDirectory() as model_dir:
        start = time.perf_counter()
        data = input_pipeline.build(source, model_dir, data_config)
        build_seconds = time.perf_counter() - start
    pipeline_rate, batches = measure_pipeline(data.train_dataset(), args.pipeline_batches)

    config = keras_transformer.TransformerConfig.small(
        vocab_size=data.tokenizers.target.vocab_size)
    model = keras_transformer.Transformer(config)
    train_step = make_train_step(model, keras.optimizers.Adam(1e-4))
    by_shape = {}
    for batch in batches:
        by_shape.setdefault(tuple(batch[1].shape), batch)
    for batch in by_shape.values():  # warm up every shape once
        train_step(batch).numpy()
    step_rate, loss = measure_steps(train_step, batches[:args.train_steps + 1])
    fed_rate = measure_fed_steps(train_step, data.train_dataset(), args.train_steps)
    return dict(load_before=load_before, check_seconds=check_seconds,
                build_seconds=build_seconds, data=data, shapes=sorted(by_shape, key=lambda s: s[1]),
                parameters=model.count_params(), loss=loss, pipeline_rate=pipeline_rate,
                step_rate=step_rate, fed_rate=fed_rate)


def print_report(args, m: dict):
    common.print_header([
        ("machine", f"{common.describe()}; load average before the run "
                    f"{m['load_before']:.1f}, after {os.getloadavg()[0]:.1f}"),
        ("versions", common.versions(f"sentencepiece {sentencepiece.__version__}")),
        ("command", common.command()),
        ("data", f"Multi30k en->de train, {m['data'].report}"),
        ("vocabulary", f"shared BPE, {m['data'].tokenizers.target.vocab_size} pieces (default "
                       f"size); file check {m['check_seconds']:.2f} s, vocabulary + counting "
                       f"pass {m['build_seconds']:.1f} s"),
        ("batches", f"batch_tokens={args.batch_tokens} per replica, max_len={args.max_len}, "
                    f"subword_sampling={args.subword_sampling:g}, {len(m['shapes'])} shapes "
                    "seen: " + " ".join(f"{b}x{l}" for b, l in m["shapes"])),
        ("model", f"TransformerConfig.small ({m['parameters'] / 1e6:.1f}M parameters), "
                  f"Adam, masked cross-entropy, float32; last loss {m['loss']:.2f}"),
    ])
    common.print_table(["measured", "tokens/s (non-pad source + target)", "over"], [
        ["input pipeline alone", f"{m['pipeline_rate']:,.0f}",
         f"{args.pipeline_batches} batches"],
        ["training step alone", f"{m['step_rate']:,.0f}",
         f"{args.train_steps} steps on the pipeline's batches, held in memory"],
        ["training step fed by the pipeline", f"{m['fed_rate']:,.0f}",
         f"{args.train_steps} steps"],
    ], text_columns=(0, 2))
    print(f"pipeline / training step = {m['pipeline_rate'] / m['step_rate']:.0f}x "
          "(the target: at least 10x)")


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", default=str(common.MULTI30K), help="Multi30k directory")
    parser.add_argument("--batch_tokens", type=int, default=4096)
    parser.add_argument("--max_len", type=int, default=128)
    parser.add_argument("--pipeline_batches", type=int, default=1000)
    parser.add_argument("--train_steps", type=int, default=20)
    parser.add_argument("--subword_sampling", type=float, default=0.0,
                        help="the trainer's --subword_sampling (BPE-dropout rate)")
    results_file.add_results_flag(parser, "multi30k")
    args = parser.parse_args(argv)
    if args.max_len > keras_transformer.TransformerConfig.small().max_length:
        parser.error(f"--max_len={args.max_len} exceeds the small model's positions")
    print_report(args, measure(args))
    results_file.write_results(
        "input_pipeline", args.results,
        f"Multi30k train, the small model, float32, --batch_tokens={args.batch_tokens} "
        f"--max_len={args.max_len} --subword_sampling={args.subword_sampling:g}",
        packages=["sentencepiece"])


if __name__ == "__main__":
    main()
