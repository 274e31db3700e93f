"""Benchmark: how fast does this project train, alone and against keras-hub and torch?

On the Multi30k recipe's data and model (trainer/flagfiles/multi30k.cfg: `small`, a shared
8000-piece SentencePiece vocabulary, max_len 64, 4096 padded tokens per batch, Adam on the
warm-up schedule, label-smoothed loss), in float32 and mixed_bfloat16, one process:

  python bench/training.py [--steps=30 --warmup_steps=10 --jit_compile=both]

    First what `--precision=auto` chooses here, measured as the trainer measures it
    (trainer/training/precision.py), printed in the header beside the CPU flags. Then ours
    alone, as it trains: a `trainer.training.loop.Trainer` fed by the real input
    pipeline, one row per precision (and, with --jit_compile, with XLA). --warmup_steps
    updates (tracing, first shapes) are run and not timed, then --steps updates are timed as
    `Trainer.train` runs them (accumulate, apply; no host read in between). A timed update
    whose batch shape is new pays a one-off compilation (oneDNN primitives; XLA) and is
    reported apart, not in the rates. MFU is against the matmul peak of the row's precision
    measured just before the row. The breakdown (--breakdown_reps) times one update's
    pieces on one cached batch of the most frequent shape: forward (inference), forward +
    backward, accumulate, apply (the Trainer so driven: bench/peers/our_trainer.py). About 2
    minutes on 2 idle cores, 5 on a shared machine; --jit_compile=both doubles it.

  python bench/training.py --peers [--vocab_dir=runs/small_multi30k --pool=10 --passes=3]

    Ours against the peers (bench/peers/: keras-hub's TransformerEncoder / Decoder layers,
    torch.nn.Transformer; with --implementations, also keras-hub's update compiled by XLA,
    what Keras' `fit` does by default, and torch.compile), on the same --pool real
    Multi30k batches (seed 0), converted to numpy once; ours is the Trainer on that pool.
    Each implementation runs one untimed pass over the pool (tracing, every shape once),
    then --passes timed passes; they take turns update by update (each on the same batch),
    so load from other processes falls on all of them alike. Every update is read back
    (loss to the host) before the next, as Trainer.train does. --peer_dropout=paper (the
    default) puts the peers' dropout where the paper's and ours is (bench/peers/__init__.py);
    =native keeps their own. MFU is against the machine's matmul peak of the precision,
    the best of TF's and torch's at the start, before each precision and at the end
    (other processes only ever lower a measurement); "own peak" takes the implementation's
    own framework's best. The breakdown times each implementation's pieces of one update
    on one batch of the most frequent pool shape (the runners and their turns:
    bench/peers/training_runners.py). About 7 minutes on 2 cores; needs torch and keras-hub
    (bench/peers/__init__.py says how to install them).

Model FLOPs: common.update_flops, the matmul count written out in bench/common.py (its
forward count equals the sum over the MatMul and BatchMatMul ops of the traced forward
graph), one count for every implementation. Embedding lookups, biases, LayerNorm, softmax,
dropout, the loss and Adam are not counted, and neither is work at padding, so they show up
as lost MFU. Not a test: run it by hand from the repository root and copy its tables into
docs/performance.md.
"""

import argparse
import collections
import dataclasses
import os
import tempfile
from pathlib import Path
from typing import List, Optional

import tensorflow as tf

import keras_transformer
from trainer.config import PRECISIONS, RunConfig
from trainer.data import input_pipeline, sources
from trainer.training.precision import Choice, measured_choice

import common
import results_file
from peers import Batch, training_runners
from peers.our_trainer import RecordingData, Result, measure_row
from peers.training_runners import Row

# The matmul dtype a precision's Dense layers run in. No MFU for mixed_float16: a CPU has
# no float16 matmul units, so there is no peak to hold it against.
PEAK_DTYPES = {"float32": "float32", "mixed_bfloat16": "bfloat16"}
IMPLEMENTATIONS = ("ours", "keras-hub", "keras-hub-xla", "torch", "torch-compile")


# ---------------------------------------------------------------- shared by both modes


class Peaks:
    """The matmul peaks (GFLOP/s) a run measures, by "<framework> <dtype>", in order."""

    def __init__(self, runs: int, frameworks: dict):
        self.runs, self.frameworks = runs, frameworks  # name -> fn(dtype name, runs)
        self.values = {f"{name} {kind}": [] for kind in ("float32", "bfloat16")
                       for name in frameworks}

    def measure(self, kind: str) -> float:
        """Each framework's peak in `kind` ("float32", "bfloat16") now; returns TF's."""
        for name, peak in self.frameworks.items():
            self.values[f"{name} {kind}"].append(peak(kind, self.runs))
        return self.values[f"tf {kind}"][-1]

    def best(self, kind: str, framework: Optional[str] = None) -> float:
        return max(max(values) for name, values in self.values.items()
                   if name.endswith(kind) and values
                   and (framework is None or name.startswith(framework)))

    def describe(self, when: str) -> str:
        return (f"{common.peak_description(self.runs)}, {when} (GFLOP/s): " + "; ".join(
            f"{name} " + ", ".join(f"{p:,.0f}" for p in values)
            for name, values in self.values.items() if values))


def tf_peak(kind: str, runs: int) -> float:
    return common.tf_matmul_peak(getattr(tf, kind), runs)


def build_data(args) -> input_pipeline.Data:
    """The recipe's Data on --data, its vocabulary from --vocab_dir or trained anew."""
    config = common.multi30k_data(Path(args.data), vocab_size=args.vocab_size,
                                  max_len=args.max_len, batch_tokens=args.batch_tokens)
    with tempfile.TemporaryDirectory() as scratch:
        return input_pipeline.build(sources.select(config), args.vocab_dir or scratch, config)


def percent(x: Optional[float]) -> str:
    return "-" if x is None else f"{100 * x:.1f}%"


# ---------------------------------------------------------------- ours, fed by the pipeline


def measure_pipeline(args, precisions: List[str], jit_modes: List[bool]):
    """(Result rows, Peaks, Data, model config): every precision, each XLA mode."""
    peaks = Peaks(args.peak_runs, {"tf": tf_peak})
    peaks.measure("float32")
    peaks.measure("bfloat16")
    built = build_data(args)
    data = RecordingData(**{f.name: getattr(built, f.name)
                            for f in dataclasses.fields(input_pipeline.Data)})
    model_config = keras_transformer.TransformerConfig.small(
        vocab_size=data.tokenizers.target.vocab_size)
    # What --precision=auto chooses here, measured as the trainer measures it.
    auto = measured_choice(model_config, built, RunConfig(
        model_dir=tempfile.mkdtemp(), warmup_steps=args.schedule_warmup_steps))
    print(auto.describe(), flush=True)
    results = []
    for jit_compile in jit_modes:
        for precision in precisions:
            print(f"{precision}{', XLA' if jit_compile else ''} ...", flush=True)
            # The peak of the row's precision again just before it: other processes on
            # the machine slow both down alike, not a peak taken minutes earlier.
            kind = PEAK_DTYPES.get(precision)
            peak = peaks.measure(kind) if kind else None
            results.append(measure_row(precision, jit_compile, data, model_config, args, peak))
    return results, peaks, data, model_config, auto


def print_pipeline_report(args, results: List[Result], peaks: Peaks, data, model_config,
                          load_before: str, auto: Choice):
    params = keras_transformer.Transformer(model_config)
    params.build()
    shapes = collections.Counter()
    for result in results:
        shapes.update(result.shapes)
    common.print_header([
        ("machine", f"{common.describe()}; load average {load_before} before, "
                    f"{common.load_average()} after"),
        ("--precision=auto", auto.describe().partition(": ")[2]),
        ("versions", common.versions()),
        ("command", common.command()),
        ("matmul peak", peaks.describe("at the start and before each row")),
        ("data", f"Multi30k en->de, {data.report}"),
        ("recipe", f"TransformerConfig.small ({params.count_params() / 1e6:.2f}M parameters, "
                   f"vocabulary {model_config.vocab_size}), max_len {args.max_len}, "
                   f"batch_tokens {args.batch_tokens}, 1 replica, Adam, schedule warm-up "
                   f"{args.schedule_warmup_steps}"),
        ("timing", f"{args.warmup_steps} untimed then {args.steps} timed updates per row, "
                   "fed by the input pipeline; rates leave out the first update of a new "
                   "shape; batch shapes timed (batch x length: updates): "
                   + ", ".join(f"{b}x{l}: {n}" for (b, l), n in sorted(
                       shapes.items(), key=lambda item: item[0][1]))),
    ])
    pipeline_table(results)
    breakdown_table(results, args.breakdown_reps)


def pipeline_table(results: List[Result]):
    common.print_table(
        ["precision", "XLA", "updates/s", "tokens/s (real src+tgt)", "tokens/s (padded)",
         "model GFLOP/s", "peak GFLOP/s", "MFU", "CPU busy",
         "loss: first -> mean timed -> last"],
        [[r.precision, "yes" if r.jit_compile else "no", f"{r.updates / r.seconds:.3f}",
          f"{r.real_tokens / r.seconds:,.0f}", f"{r.padded_tokens / r.seconds:,.0f}",
          f"{r.flops / r.seconds / 1e9:,.0f}", f"{r.peak:,.0f}" if r.peak else "-",
          percent(r.mfu), f"{100 * r.cpu_busy:.0f}%",
          f"{r.first_loss:.2f} -> {r.mean_loss:.2f} -> {r.last_loss:.2f}"] for r in results],
        text_columns=(0, 1, 9))
    print("CPU busy: this process's CPU time over the timed updates / (wall time x cores). "
          "Well short of 100%, other processes\nhad the rest, and the MFU compares updates "
          "and a peak that met different loads: rerun on a quiet machine.")
    if any(r.first_of_shape for r in results):
        print("\nSet apart, not in the rates: the first timed update of a shape that no "
              "earlier update had (seconds): " + "; ".join(
                  f"{r.precision}{' XLA' if r.jit_compile else ''} "
                  + ", ".join(f"{s:.1f}" for s in r.first_of_shape)
                  for r in results if r.first_of_shape))
    print()


def breakdown_table(results: List[Result], reps: int):
    measured = [r for r in results if r.breakdown]
    if not measured:
        return
    names = list(measured[0].breakdown)
    rows = []
    for r in measured:
        batch, length = r.shapes.most_common(1)[0][0]
        seconds = r.breakdown["forward + backward"] / 1000
        mfu = r.breakdown_flops / seconds / 1e9 / r.peak if r.peak else None
        rows.append([r.precision, "yes" if r.jit_compile else "no", f"{batch}x{length}",
                     *(f"{r.breakdown[n]:,.0f}" for n in names), percent(mfu)])
    common.print_table(
        ["precision", "XLA", "shape", *names, "MFU of forward + backward"], rows,
        text_columns=3, title="One update on a cached batch of the most frequent shape, "
        f"median ms of {reps} (MFU against the row's peak above):")


# ---------------------------------------------------------------- ours against the peers
# The runners and their turns: bench/peers/training_runners.py.


def peer_peaks(args) -> Peaks:
    """The peaks --peers measures: TF's, and torch's if a torch row runs (once the peers
    asked for are found installed)."""
    torch_rows = any(name.startswith("torch") for name in args.implementations)
    common.require([module for module, used in (
        ("keras_hub", any(n.startswith("keras-hub") for n in args.implementations)),
        ("torch", torch_rows)) if used], "--peers")
    frameworks = {"tf": tf_peak}
    if torch_rows:
        import torch
        from peers.torch_transformer import matmul_peak
        torch.set_num_threads(2)
        frameworks["torch"] = matmul_peak
    return Peaks(args.peak_runs, frameworks)


def measure_peers(args, peaks: Peaks, loads: List[float]):
    """(Rows, model config, pool, the breakdown's batch): the peaks at the start, before
    each precision and at the end; each precision's implementations taking turns."""
    for precision in args.precisions:
        peaks.measure(PEAK_DTYPES[precision])
    pool_data = training_runners.build_pool(build_data(args), args.pool)
    pool = pool_data.pool
    config = keras_transformer.TransformerConfig.small(
        vocab_size=pool_data.tokenizers.target.vocab_size)
    shapes = collections.Counter(b.shape for b in pool)
    probe = next(b for b in pool if b.shape == shapes.most_common(1)[0][0])
    rows = []
    for precision in args.precisions:
        print(f"{precision} ...", flush=True)
        peaks.measure(PEAK_DTYPES[precision])
        rows += training_runners.run_pool(args, config, precision, pool_data, probe, loads)
    loads.append(os.getloadavg()[0])
    for precision in args.precisions:
        peaks.measure(PEAK_DTYPES[precision])
    for row in rows:
        kind = PEAK_DTYPES[row.precision]
        row.own_peak = peaks.best(kind, "torch" if row.name.startswith("torch") else "tf")
        row.peak = peaks.best(kind)
    return rows, config, pool, probe


def print_peers_report(args, rows: List[Row], peaks: Peaks, config, pool, probe, loads):
    shapes = collections.Counter(b.shape for b in pool)
    common.print_header([
        ("machine", common.describe()),
        ("load", "os.getloadavg() 1-min at start, around each timed block, end: "
                 + ", ".join(f"{load:.2f}" for load in loads)),
        ("versions", common.versions(*training_runners.peer_versions())),
        ("command", common.command()),
        ("peak", peaks.describe("at the start, before each precision and at the end")),
        ("model", f"TransformerConfig.small: N={config.num_layers}, d_model {config.d_model}, "
                  f"d_ff {config.d_ff}, {config.num_heads} heads, vocabulary {config.vocab_size} "
                  f"(shared), dropout {config.dropout}, label smoothing {config.label_smoothing}; "
                  "peer dropout sites: " + args.peer_dropout),
        ("data", f"Multi30k en->de, {len(pool)} training batches (max_len {args.max_len}, "
                 f"batch_tokens {args.batch_tokens}), shapes (batch x length: count) "
                 + ", ".join(f"{b}x{l}: {n}" for (b, l), n in sorted(shapes.items(),
                                                                      key=lambda s: s[0][1]))
                 + f"; {sum(b.real_tokens for b in pool):,} real / "
                   f"{sum(b.padded_tokens for b in pool):,} padded src+tgt tokens per pass"),
        ("timing", f"1 untimed pass, then {args.passes} timed passes per implementation, "
                   "in alternation update by update; loss: first update -> mean of the last "
                   "pass"),
    ])
    peers_table(rows)
    peers_breakdown_table(rows, probe, config, args.breakdown_reps)


def peers_table(rows: List[Row]):
    ours = {r.precision: r for r in rows if r.name == "ours"}
    table = []
    for r in rows:
        base = ours.get(r.precision)
        versus = (f"{(r.updates / r.seconds) / (base.updates / base.seconds):.2f}x"
                  if base else "-")
        table.append([r.precision, r.name, f"{r.params / 1e6:.2f}M",
                      f"{r.updates / r.seconds:.3f}", f"{r.real_tokens / r.seconds:,.0f}",
                      f"{r.padded_tokens / r.seconds:,.0f}", f"{r.flops / r.seconds / 1e9:,.0f}",
                      percent(r.mfu), percent(r.own_mfu), versus,
                      f"{r.first_loss:.2f} -> {r.last_pass_loss:.2f}"])
    common.print_table(
        ["precision", "implementation", "parameters", "updates/s", "tokens/s (real src+tgt)",
         "tokens/s (padded)", "model GFLOP/s", "MFU", "MFU (own peak)", "vs ours", "loss"],
        table, text_columns=(0, 1, 10))
    print("(MFU: against the machine's matmul peak of the precision, the best of TF's and "
          "torch's in the run; own peak: against its own framework's best; vs ours: updates/s "
          "over ours, above 1 is faster than ours)\n")


def peers_breakdown_table(rows: List[Row], probe: Batch, config, reps: int):
    measured = [r for r in rows if r.pieces]
    if not measured:
        return
    names = list(measured[0].pieces)
    flops = probe.flops(config)
    common.print_table(
        ["precision", "implementation", *names, "MFU of forward + backward"],
        [[r.precision, r.name, *(f"{r.pieces[n]:,.0f}" for n in names),
          percent(flops / (r.pieces["forward + backward"] / 1000) / 1e9 / r.peak)]
         for r in measured],
        text_columns=2,
        title=f"One update on a {probe.shape[0]}x{probe.shape[1]} batch, median ms of {reps} "
              "(forward: training mode, no gradient; ours: forward + backward = "
              "Updater.gradients, optimizer = Updater.apply (all-reduce, Adam, zeroing the "
              "accumulators), update = Updater.accumulate + apply; peers: optimizer = the "
              "Adam step):")


# ---------------------------------------------------------------- main


def parse_args(argv):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--peers", action="store_true",
                        help="ours against keras-hub and torch on a pool of batches")
    parser.add_argument("--data", default=str(common.MULTI30K), help="the Multi30k directory")
    parser.add_argument("--vocab_dir", default=None,
                        help="a directory holding spm.model to reuse (default: train one)")
    parser.add_argument("--precisions", default="float32,mixed_bfloat16",
                        help=f"comma-separated, of {', '.join(PRECISIONS)} (--peers: the "
                             "first two)")
    parser.add_argument("--batch_tokens", type=int, default=4096)
    parser.add_argument("--max_len", type=int, default=64)
    parser.add_argument("--vocab_size", type=int, default=8000)
    parser.add_argument("--schedule_warmup_steps", type=int, default=1000,
                        help="the learning-rate schedule's warm-up (the recipe's)")
    parser.add_argument("--peak_runs", type=int, default=10)
    parser.add_argument("--breakdown_reps", type=int, default=None,
                        help="timed calls per piece of the update breakdown (0: skip it; "
                             "default 5, --peers 3)")
    alone = parser.add_argument_group("ours alone, fed by the input pipeline")
    alone.add_argument("--steps", type=int, default=30, help="timed updates per row")
    alone.add_argument("--warmup_steps", type=int, default=10,
                       help="untimed updates before them (tracing, first shapes)")
    alone.add_argument("--jit_compile", choices=("false", "true", "both"), default="false",
                       help="XLA-compile forward and backward; both: a row each way")
    peers = parser.add_argument_group("--peers")
    peers.add_argument("--pool", type=int, default=10, help="distinct batches, in order")
    peers.add_argument("--passes", type=int, default=3, help="timed passes over the pool")
    peers.add_argument("--implementations", default=",".join(IMPLEMENTATIONS))
    peers.add_argument("--peer_dropout", choices=("paper", "native"), default="paper")
    results_file.add_results_flag(parser, None)
    args = parser.parse_args(argv)
    if args.breakdown_reps is None:
        args.breakdown_reps = 3 if args.peers else 5
    args.precisions = [p.strip() for p in args.precisions.split(",") if p.strip()]
    args.implementations = [n for n in args.implementations.split(",") if n]
    allowed = list(PEAK_DTYPES) if args.peers else PRECISIONS
    if set(args.precisions) - set(allowed) or set(args.implementations) - set(IMPLEMENTATIONS):
        parser.error(f"precisions: {', '.join(allowed)}; implementations: "
                     + ", ".join(IMPLEMENTATIONS))
    if args.steps < 1 or args.warmup_steps < 1 or args.pool < 1 or args.passes < 1:
        parser.error("--steps, --warmup_steps, --pool and --passes must be at least 1")
    return args


def main(argv=None):
    args = parse_args(argv)
    if args.peers:
        peaks, loads = peer_peaks(args), [os.getloadavg()[0]]
        rows, config, pool, probe = measure_peers(args, peaks, loads)
        print_peers_report(args, rows, peaks, config, pool, probe, loads)
        return results_file.write_results(
            "training", "peers" if args.results is None else args.results,
            "the same Multi30k batches for every implementation, measured in alternation "
            "update by update", packages=["torch", "keras-hub"])
    jit_modes = {"false": [False], "true": [True], "both": [False, True]}[args.jit_compile]
    load_before = common.load_average()
    results, peaks, data, model_config, auto = measure_pipeline(args, args.precisions,
                                                                jit_modes)
    print_pipeline_report(args, results, peaks, data, model_config, load_before, auto)
    results_file.write_results("training", "pipeline" if args.results is None else args.results,
                         "the Multi30k recipe's model, timed updates fed by the input "
                         f"pipeline: {', '.join(args.precisions)}")


if __name__ == "__main__":
    main()
