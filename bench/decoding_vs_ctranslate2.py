"""Benchmark: our SavedModel against CTranslate2 on the same weights, sentences and threads.

One run measures, on Multi30k test2016 (1,000 sentences), beam 4, alpha 0.6, batches of
--batch_size, each system in its own process:

  - throughput (sentences/s, best of --repeats, 2 threads: TensorFlow's intra- and inter-op
    pools, CTranslate2's intra_threads) in file order and sorted by length, text in
    and text out: our `serving_default` (tokenization in the graph) and CTranslate2's
    `translate_batch` with SentencePiece encoding and decoding in Python around it;
  - single-sentence latency, p50 and p95 over the first --latency_sentences sentences sent
    one request at a time, in file order and sorted by length, with 2 threads and with 1
    (CTranslate2's OpenMP threads cost more than they bring on one sentence on some hosts);
  - sacreBLEU and chrF of each system's translations against the references;
  - the same single-sentence latency with two systems taking turns (--turns): our fastest
    serving setup (the bfloat16 export if given, with the --env variables) and CTranslate2
    float32, each in its own process and both loaded at once, send the same sentence one
    after the other, request by request, the first to go alternating, with a pause between
    requests so neither one's threads still spin in the other's time. This VM's speed
    drifts by a third within minutes, which decides the ratio of two rows timed minutes
    apart; taking turns, both see the same minutes.

Rows: each SavedModel given (--saved_model float32, --saved_model_bfloat16 from
`python -m trainer.export --precision=bfloat16`, --previous_saved_model: the same checkpoints
exported by earlier code, for a before/after in one run; --xla: the translate_xla signature of
--saved_model and --saved_model_bfloat16, both exported with --xla, its single-sentence shapes
warmed up before timing) and the CTranslate2 model directory of the same checkpoints
(`python -m trainer.export --format=ctranslate2 --quantization=float32`) loaded with
compute_type float32, int8 and bfloat16 (where the CPU has it). With --env NAME=VALUE
(repeatable), each serving_default row is run a second time with those variables set in its
process (a serving environment, such as TF_ONEDNN_ASSUME_FROZEN_WEIGHTS=1), and the table
counts the translations identical to the row without them. CTranslate2 uses its length penalty
(log-prob / length^alpha, ours ((5 + length) / 6)^alpha), suppresses <pad> and <s> (never
in our outputs) and may stop at 127 tokens (ours: source + 50, at most 127).

  python bench/decoding_vs_ctranslate2.py --saved_model=EXPORT/1 \\
      --saved_model_bfloat16=EXPORT_BF16/1 --ctranslate2=CT2_DIR \\
      [--env=TF_ONEDNN_ASSUME_FROZEN_WEIGHTS=1]
"""

import argparse
import json
import os
import platform
import shlex
import statistics
import subprocess
import sys
import time
from typing import Callable, List

import sacrebleu
import sentencepiece

MULTI30K = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "shared",
                        "data", "multi30k")
LATENCY_THREADS = (2, 1)  # on one sentence a second thread can cost more than it brings
PREVIOUS = "float32, previous code"  # the --previous_saved_model row
# The --xla rows: each export's XLA signature.
XLA = {"float32": "float32, translate_xla", "bfloat16": "bfloat16, translate_xla"}


def saved_model_translator(path: str, threads: int, signature: str = "serving_default"
                           ) -> Callable[[List[str]], List[str]]:
    import tensorflow as tf
    import tensorflow_text  # noqa: F401  (registers the SentencePiece ops)
    import machine  # imports TensorFlow: not in the CTranslate2 workers
    machine.set_threads(threads)
    function = tf.saved_model.load(path).signatures[signature]

    def translate(texts):
        outputs = function(inputs=tf.constant(texts))["translations"].numpy()
        return [t.decode("utf-8") for t in outputs]
    return translate


def ctranslate2_translator(path: str, compute_type: str, threads: int
                           ) -> Callable[[List[str]], List[str]]:
    import ctranslate2
    processor = sentencepiece.SentencePieceProcessor(model_file=os.path.join(path, "spm.model"))
    translator = ctranslate2.Translator(path, device="cpu", compute_type=compute_type,
                                        inter_threads=1, intra_threads=threads)

    def translate(texts):
        results = translator.translate_batch(
            processor.encode(texts, out_type=str), beam_size=4, length_penalty=0.6,
            max_decoding_length=127, min_decoding_length=0,
            suppress_sequences=[["<pad>"], ["<s>"]])
        return processor.decode([r.hypotheses[0] for r in results])
    return translate


def seconds(fn) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def throughput(translate, texts: List[str], batch_size: int, repeats: int):
    """(best sentences/s of `repeats` passes, translations in the order of texts)."""
    translate(texts[:batch_size])  # warm-up
    best, outputs = float("inf"), []
    for _ in range(repeats):
        start = time.perf_counter()
        outputs = [t for i in range(0, len(texts), batch_size)
                   for t in translate(texts[i:i + batch_size])]
        best = min(best, time.perf_counter() - start)
    return len(texts) / best, outputs


def percentiles(times: List[float]):
    """(p50, p95) of a list of milliseconds."""
    times = sorted(times)
    return statistics.median(times), times[int(round(0.95 * (len(times) - 1)))]


def latency(translate, texts: List[str]):
    """(p50, p95) milliseconds of one-sentence requests, one at a time."""
    translate(texts[:1])
    return percentiles([seconds(lambda t=t: translate([t])) * 1e3 for t in texts])


def worker(args):
    """One system at one thread count in this process; prints its results as JSON, or
    with --serve answers requests from standard input (see serve)."""
    engine, precision, threads = args.worker.split(":")
    threads = int(threads)
    with open(args.src, encoding="utf-8") as f:
        texts = f.read().splitlines()
    if engine == "ctranslate2":
        try:
            translate = ctranslate2_translator(args.ctranslate2, precision, threads)
        except ValueError as e:  # a compute type this CPU lacks
            print(json.dumps({"skipped": str(e)}))
            return
    else:
        paths = {"float32": args.saved_model, "bfloat16": args.saved_model_bfloat16,
                 PREVIOUS: args.previous_saved_model, XLA["float32"]: args.saved_model,
                 XLA["bfloat16"]: args.saved_model_bfloat16}
        translate = saved_model_translator(paths[precision], threads,
                                           "translate_xla" if precision in XLA.values()
                                           else "serving_default")
        if precision in XLA.values():
            # A compile per batch size (up to XLA_MAX_BATCH; larger requests run
            # serving_default's search) and source-width bucket: warm the single-sentence
            # shapes up first, as a server's warmup requests would.
            start = time.perf_counter()
            for text in texts[:args.latency_sentences]:
                translate([text])
            print(f"translate_xla warm-up: {time.perf_counter() - start:.1f} s",
                  file=sys.stderr)
    if args.serve:
        return serve(translate, texts)
    result = {}
    if threads == 2:
        with open(args.ref, encoding="utf-8") as f:
            references = f.read().splitlines()
        result["file_rate"], outputs = throughput(translate, texts, args.batch_size,
                                                  args.repeats)
        result["sorted_rate"], _ = throughput(
            translate, sorted(texts, key=lambda t: len(t.split())), args.batch_size,
            args.repeats)
        result["bleu"] = sacrebleu.corpus_bleu(outputs, [references]).score
        result["chrf"] = sacrebleu.corpus_chrf(outputs, [references]).score
        result["outputs"] = outputs
    first = texts[:args.latency_sentences]
    result["latency"] = latency(translate, first)
    result["sorted_latency"] = latency(translate, sorted(first, key=lambda t: len(t.split())))
    print(json.dumps(result))


def serve(translate, texts: List[str]):
    """A turn-taking worker: warms up on the first sentence, prints "ready", then for each
    line i on standard input translates texts[i] alone and prints the milliseconds it took,
    until standard input closes."""
    translate(texts[:1])
    print("ready", flush=True)
    for line in sys.stdin:
        text = texts[int(line)]
        print(f"{seconds(lambda: translate([text])) * 1e3:.3f}", flush=True)


def taking_turns(commands, envs, sentences: int, pause: float):
    """Milliseconds per sentence of each worker command, the workers (all loaded first)
    translating sentences 0..sentences-1 in turn, the first to go alternating from one
    sentence to the next, `pause` seconds between requests."""
    workers = [subprocess.Popen(c, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                                env={**os.environ, **e}) for c, e in zip(commands, envs)]
    try:
        for w in workers:
            if w.stdout.readline().strip() != "ready":
                raise RuntimeError(f"worker {w.args[-1]} did not start")
        times = [[] for _ in workers]
        for i in range(sentences):
            order = range(len(workers)) if i % 2 == 0 else reversed(range(len(workers)))
            for k in order:
                time.sleep(pause)
                workers[k].stdin.write(f"{i}\n")
                workers[k].stdin.flush()
                times[k].append(float(workers[k].stdout.readline()))
        return times
    finally:
        for w in workers:
            w.stdin.close()
            w.wait()


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--saved_model", required=True, help="Float32 export version dir.")
    parser.add_argument("--saved_model_bfloat16", help="The same checkpoints exported with "
                        "--precision=bfloat16.")
    parser.add_argument("--previous_saved_model", help="A float32 export of the same "
                        "checkpoints by earlier code (a before/after row in the same run).")
    parser.add_argument("--xla", action="store_true", help="Also time the exports' "
                        "translate_xla signature (exported with --xla).")
    parser.add_argument("--ctranslate2", required=True, help="The same checkpoints "
                        "exported with --format=ctranslate2 --quantization=float32.")
    parser.add_argument("--src", default=os.path.join(MULTI30K, "test2016.en"))
    parser.add_argument("--ref", default=os.path.join(MULTI30K, "test2016.de"))
    parser.add_argument("--batch_size", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--latency_sentences", type=int, default=200)
    parser.add_argument("--env", action="append", default=[], metavar="NAME=VALUE",
                        help="Also run each serving_default row with this environment "
                        "variable set in its process (repeatable: all of them in one more "
                        "row each).")
    parser.add_argument("--turns", action=argparse.BooleanOptionalAction, default=True,
                        help="Also time one sentence with our fastest serving setup and "
                        "CTranslate2 float32 taking turns request by request.")
    parser.add_argument("--turn_pause", type=float, default=0.02,
                        help="Seconds between two requests when taking turns (CTranslate2's "
                        "OpenMP threads spin for a while after each call).")
    parser.add_argument("--worker", help=argparse.SUPPRESS)  # engine:precision:threads
    parser.add_argument("--serve", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker:
        return worker(args)

    bad = [e for e in args.env if "=" not in e]
    if bad:
        parser.error(f"--env takes NAME=VALUE, not {bad[0]!r}")
    exports = ["float32"] + (["bfloat16"] if args.saved_model_bfloat16 else [])
    ours = exports + ([PREVIOUS] if args.previous_saved_model else []) + (
        [XLA[p] for p in exports] if args.xla else [])
    serving_env = dict(e.split("=", 1) for e in args.env)

    def serving_label(precision):  # a serving_default row run in the --env environment
        return f"{precision}, {' '.join(args.env)}" if args.env else precision

    # (name, engine, precision, environment, row label)
    systems = [("this project, SavedModel", "saved_model", p, {}, p) for p in ours]
    if args.env:  # serving_default's rows again, in that environment
        systems += [("this project, SavedModel", "saved_model", p, serving_env,
                     serving_label(p)) for p in exports]
    systems += [("CTranslate2", "ctranslate2", c, {}, c)
                for c in ("float32", "int8", "bfloat16")]
    results = {}
    for name, engine, precision, env, label in systems:
        for threads in LATENCY_THREADS:
            # Each in a fresh process: its own thread pools, and no TensorFlow beside
            # CTranslate2.
            out = subprocess.run([sys.executable, __file__, *sys.argv[1:],
                                  f"--worker={engine}:{precision}:{threads}"],
                                 check=True, capture_output=True, text=True,
                                 env={**os.environ, **env}).stdout
            result = results[name, label, threads] = json.loads(out.strip().splitlines()[-1])
            if env and "outputs" in result:
                plain = results[name, precision, threads]["outputs"]
                result["identical"] = sum(a == b for a, b in zip(result["outputs"], plain))
            print(f"  {name}, {label}, {threads} threads: "
                  f"{ {k: v for k, v in result.items() if k != 'outputs'} }", file=sys.stderr)

    turns = {}
    if args.turns:
        fastest = exports[-1]  # bfloat16 when given
        label = serving_label(fastest)
        for threads in LATENCY_THREADS:
            commands = [[sys.executable, __file__, *sys.argv[1:], "--serve",
                         f"--worker={engine}:{precision}:{threads}"]
                        for engine, precision in (("saved_model", fastest),
                                                  ("ctranslate2", "float32"))]
            ours, theirs = taking_turns(commands, [serving_env, {}], args.latency_sentences,
                                        args.turn_pause)
            turns[label, threads] = (percentiles(ours), percentiles(theirs),
                                     statistics.median(a / b for a, b in zip(ours, theirs)))
            print(f"  taking turns, {label}, {threads} threads: {turns[label, threads]}",
                  file=sys.stderr)

    import machine  # TensorFlow, for the matmul peak and the machine line
    import tensorflow as tf
    peaks = {d: machine.tf_matmul_peak(d, runs=5) for d in (tf.float32, tf.bfloat16)}
    import ctranslate2
    import tensorflow_text
    print()
    load = ", ".join(f"{x:.1f}" for x in os.getloadavg())
    for key, value in (("machine", f"{machine.describe()}, load average {load} at the end"),
                       ("peak", f"TensorFlow matmul {peaks[tf.float32]:.0f} GFLOP/s float32, "
                                f"{peaks[tf.bfloat16]:.0f} bfloat16 (2048^3, this run)"),
                       ("python", platform.python_version()),
                       ("tensorflow", tf.__version__),
                       ("tf-text", tensorflow_text.__version__),
                       ("ctranslate2", ctranslate2.__version__),
                       ("data", f"{args.src}, beam 4, alpha 0.6, batches of {args.batch_size}"),
                       ("command", "python " + " ".join(map(shlex.quote, sys.argv)))):
        print(f"{key:>11}: {value}")
    print()
    print(f"Throughput (2 threads, best of {args.repeats}, text in and out) and quality:")
    print()
    print("| system | precision | sentences/s, file order | sentences/s, sorted by length | "
          "x CTranslate2 float32 | sacreBLEU | chrF |" + (" identical to the row without "
                                                          "--env |" if args.env else ""))
    print("|---|---|---:|---:|---:|---:|---:|" + ("---:|" if args.env else ""))
    reference = results["CTranslate2", "float32", 2]["file_rate"]
    for (name, precision, threads), r in results.items():
        if threads == 2 and "skipped" not in r:
            identical = (f" {r['identical']} of {len(r['outputs'])} |" if "identical" in r
                         else " |" if args.env else "")
            print(f"| {name} | {precision} | {r['file_rate']:.1f} | {r['sorted_rate']:.1f} | "
                  f"{r['file_rate'] / reference:.2f}x | {r['bleu']:.2f} | {r['chrf']:.2f} |"
                  + identical)
    print()
    print(f"Single-sentence latency, p50 / p95 ms over the first {args.latency_sentences} "
          "sentences, one request at a time:")
    print()
    print("| system | precision | threads | file order | sorted by length |")
    print("|---|---|---:|---:|---:|")
    for (name, precision, threads), r in results.items():
        if "skipped" in r:
            continue
        (p50, p95), (s50, s95) = r["latency"], r["sorted_latency"]
        print(f"| {name} | {precision} | {threads} | {p50:.1f} / {p95:.1f} | "
              f"{s50:.1f} / {s95:.1f} |")
    if turns:
        print()
        print(f"The same, our SavedModel and CTranslate2 float32 taking turns request by "
              f"request (file order, {args.turn_pause * 1e3:.0f} ms between requests):")
        print()
        print("| SavedModel | threads | SavedModel p50 / p95 | CTranslate2 float32 p50 / p95 | "
              "p50 ratio | median of per-sentence ratios |")
        print("|---|---:|---:|---:|---:|---:|")
        for (label, threads), ((o50, o95), (c50, c95), ratio) in turns.items():
            print(f"| {label} | {threads} | {o50:.1f} / {o95:.1f} | {c50:.1f} / {c95:.1f} | "
                  f"{o50 / c50:.2f}x | {ratio:.2f}x |")
    skipped = [f"{n} {p}: {r['skipped']}" for (n, p, t), r in results.items()
               if "skipped" in r and t == 2]
    if skipped:
        print()
        print("Skipped: " + "; ".join(skipped))
    print()


if __name__ == "__main__":
    main()
