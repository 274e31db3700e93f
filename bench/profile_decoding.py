"""Profile: where a SavedModel's beam search spends its time, op type by op type.

Runs `serving_default` under the TensorFlow profiler on Multi30k test2016 sentences (a
batch of --batch_size in file order, and one sentence alone) and sums the kernels' time
by op type from the trace (`*.xplane.pb`). With --compare=OTHER_EXPORT the same calls
profile a second SavedModel in the same run (an export of the previous code: the
before/after table of a change), and the two then take turns on all of --src in batches and
on its first sentences one request at a time.

On 2 cores TensorFlow runs two ops at once, so kernel time can exceed wall time; the
"executor" row is the time the executor threads spent outside any kernel (scheduling,
allocation, the while loop's control flow): per-op dispatch. Not a test: run it by hand,

  python bench/profile_decoding.py --saved_model=EXPORT [--compare=OLD_EXPORT] [--threads=1]
"""

import argparse
import collections
import os
import platform
import shlex
import statistics
import sys
import time
from typing import Dict, Tuple

import tensorflow as tf
import tensorflow_text

import machine
from machine import MULTI30K


def profile(function, texts, repeats: int) -> Tuple[float, Dict[str, Tuple[float, int]], float]:
    """(best wall seconds of `repeats` calls, {op type: (kernel seconds, kernels run)} of
    one profiled call, executor seconds outside kernels) for function(inputs=texts)."""
    inputs = tf.constant(texts)
    function(inputs=inputs)  # warm-up: thread pools, first-call allocations
    wall = min(machine.seconds(lambda: function(inputs=inputs)) for _ in range(repeats))
    return (wall, *machine.kernel_profile(lambda: function(inputs=inputs)))


def interleaved(functions, texts, batch_size, rounds):
    """Seconds [rounds, len(functions), batches]: each round translates all of texts in
    batches of batch_size, every function in turn on each batch, the first alternating by
    round (so a drift of the machine's speed falls on both alike)."""
    batches = [tf.constant(texts[i:i + batch_size]) for i in range(0, len(texts), batch_size)]
    for function in functions:
        function(inputs=batches[0])
    seconds = [[[] for _ in functions] for _ in range(rounds)]
    for round_ in range(rounds):
        order = list(range(len(functions)))[::1 if round_ % 2 == 0 else -1]
        for batch in batches:
            for j in order:
                seconds[round_][j].append(machine.seconds(lambda: functions[j](inputs=batch)))
    return seconds


def print_table(title, results, top):
    """results: [(label, wall, by_type, executor)] -> one markdown table, ops by time."""
    print(f"**{title}**\n")
    total = collections.Counter()
    for _, _, by_type, _ in results:
        for op_type, (seconds, _) in by_type.items():
            total[op_type] += seconds
    header = " | ".join(f"{label} ms | {label} kernels" for label, *_ in results)
    print(f"| op type | {header} |")
    print("|---|" + "---:|---:|" * len(results))
    print("| wall time (best call) | " + " | ".join(
        f"{wall * 1e3:.1f} | " for _, wall, _, _ in results) + "")
    for op_type, _ in total.most_common(top):
        cells = []
        for _, _, by_type, _ in results:
            seconds, count = by_type.get(op_type, (0.0, 0))
            cells.append(f"{seconds * 1e3:.1f} | {count}")
        print(f"| {op_type} | " + " | ".join(cells) + " |")
    rest = [sum(s for t, (s, _) in by_type.items()
                if t not in dict(total.most_common(top))) for _, _, by_type, _ in results]
    print("| other op types | " + " | ".join(f"{r * 1e3:.1f} | " for r in rest))
    print("| all kernels | " + " | ".join(
        f"{sum(s for s, _ in by_type.values()) * 1e3:.1f} | "
        f"{sum(n for _, n in by_type.values())}" for _, _, by_type, _ in results) + " |")
    print("| executor outside kernels | " + " | ".join(
        f"{executor * 1e3:.1f} | " for *_, executor in results))
    print()


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--saved_model", required=True, help="Export version directory.")
    parser.add_argument("--compare", help="A second export version directory, profiled "
                        "in the same run (e.g. the previous code's export).")
    parser.add_argument("--src", default=str(MULTI30K / "test2016.en"))
    parser.add_argument("--batch_size", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--top", type=int, default=14, help="Op types listed.")
    parser.add_argument("--rounds", type=int, default=4, help="With --compare: passes "
                        "over --src, the two exports taking turns batch by batch.")
    parser.add_argument("--one_at_a_time", type=int, default=40, help="With --compare: "
                        "the first this many sentences also one request at a time, the two "
                        "exports taking turns request by request for --rounds + 3 rounds "
                        "(one sentence's latency, which a best-of-3 on one sentence leaves "
                        "to the machine's drift).")
    parser.add_argument("--threads", type=int, default=0, help="TensorFlow's intra- and "
                        "inter-op threads (0: one per core).")
    args = parser.parse_args(argv)
    machine.set_threads(args.threads)
    with open(args.src, encoding="utf-8") as f:
        texts = f.read().splitlines()
    exports = [("this", args.saved_model)] + ([("compare", args.compare)] if args.compare
                                              else [])
    batch, single, functions = [], [], []
    for label, path in exports:
        function = tf.saved_model.load(path).signatures["serving_default"]
        functions.append(function)
        batch.append((label, *profile(function, texts[:args.batch_size], args.repeats)))
        single.append((label, *profile(function, texts[:1], args.repeats)))
    seconds, requests = [], []
    if args.compare:
        seconds = interleaved(functions, texts, args.batch_size, args.rounds)
        requests = interleaved(functions, texts[:args.one_at_a_time], 1, args.rounds + 3)

    print()
    load = ", ".join(f"{x:.1f}" for x in os.getloadavg())
    for name, value in (("machine", f"{machine.describe()}, load average {load} at the end"),
                        ("python", platform.python_version()),
                        ("tensorflow", tf.__version__),
                        ("tf-text", tensorflow_text.__version__),
                        ("threads", args.threads or "default"),
                        ("oneDNN env", " ".join(f"{k}={v}" for k, v in sorted(os.environ.items())
                                                if k.startswith(("TF_ONEDNN", "TF_ENABLE_ONEDNN")))
                         or "-"),
                        ("this", args.saved_model),
                        ("compare", args.compare or "-"),
                        ("command", "python " + " ".join(map(shlex.quote, sys.argv)))):
        print(f"{name:>10}: {value}")
    print()
    print_table(f"serving_default, the first {args.batch_size} test2016 sentences in one "
                "call, beam 4", batch, args.top)
    print_table("serving_default, the first test2016 sentence alone, beam 4", single, args.top)
    if seconds:
        print(f"**serving_default on all {len(texts)} sentences in batches of "
              f"{args.batch_size}, the two exports taking turns batch by batch**\n")
        print("| round | this, sentences/s | compare, sentences/s | this / compare |")
        print("|---:|---:|---:|---:|")
        ratios = []
        for round_, (this, compare) in enumerate(seconds, 1):
            this, compare = sum(this), sum(compare)
            ratios.append(compare / this)
            print(f"| {round_} | {len(texts) / this:.1f} | {len(texts) / compare:.1f} | "
                  f"{ratios[-1]:.3f}x |")
        print(f"| median | | | {statistics.median(ratios):.3f}x |\n")
    if requests:
        # Each sentence's best and median over the rounds, summed over the sentences.
        per_request = [list(zip(*(round_[j] for round_ in requests))) for j in range(2)]
        best, median = ([sum(map(statistic, times)) for times in per_request]
                        for statistic in (min, statistics.median))
        print(f"**serving_default on the first {args.one_at_a_time} sentences one request at "
              f"a time, the two exports taking turns request by request, {len(requests)} "
              "rounds**\n")
        print("| each sentence's | this, ms (sum) | compare, ms (sum) | time, this / compare |")
        print("|---|---:|---:|---:|")
        for name, (this, compare) in (("best", best), ("median", median)):
            print(f"| {name} | {this * 1e3:.0f} | {compare * 1e3:.0f} | {this / compare:.3f}x |")
        print()


if __name__ == "__main__":
    start = time.perf_counter()
    main()
    print(f"({time.perf_counter() - start:.0f} s)")
