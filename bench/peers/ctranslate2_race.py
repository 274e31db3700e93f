"""The race against CTranslate2 (bench/decoding.py --ctranslate2): which systems run, in which
setups, each in a worker process of its own (bench/decoding.py again with --worker, whose code
is decoding_workers.py: its own thread pools, and no TensorFlow beside CTranslate2), and the
tables and best-setup lines their results make. The flags are bench/decoding.py's; its
docstring says what each table measures."""

import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

import common
from peers.decoding_workers import (IN_FLIGHT, LATENCY_THREADS, PREVIOUS, SHORTLIST, VMAP, XLA,
                                    ctranslate2_sentencepiece, percentiles, taking_turns)

SCRIPT = Path(__file__).resolve().parents[1] / "decoding.py"  # what a worker runs



def search(export: common.Export) -> dict:
    """What CTranslate2 is given: the export's beam, alpha and patience, and the longest
    output its model's positions allow."""
    if "model" not in export.info:
        sys.exit(f"{export.version_dir} has no export.json saying its model; export it "
                 "again with python -m trainer.export")
    return {"beam_size": export.decode.beam_size, "alpha": export.decode.alpha,
            "patience": export.decode.patience,
            "max_length": export.info["model"]["max_length"] - 1}


def rules_line(export: common.Export) -> str:
    """Whether both engines search by the same rules: CTranslate2 ranks by the average
    length penalty and stops by the "first" rule; our export by its own DecodeConfig."""
    d = export.decode
    both = (f"beam {d.beam_size}, log-prob / length^{d.alpha:g}, done once "
            f"{d.patience:g} x beam hypotheses have finished")
    if d.length_penalty == "average" and d.stopping == "first":
        return f"equal on both sides: {both}"
    return (f"NOT EQUAL: the export ranks by its {d.length_penalty} penalty and stops by its "
            f"{d.stopping} rule, CTranslate2 by {both}; export with --length_penalty=average "
            "--stopping=first for the race at equal rules")


def worker_command(args, engine: str, precision: str, threads: int, search: dict,
                   serve=False, in_flight=1):
    return [sys.executable, str(SCRIPT), *sys.argv[1:], *(["--serve"] if serve else []),
            f"--ctranslate2_search={json.dumps(search)}",
            f"--worker={engine}:{precision}:{threads}:{in_flight}"]


def ctranslate2_systems(args):
    """[(system, engine, precision, environment, row label)], in the order they run."""
    exports = ["float32"] + (["bfloat16"] if args.saved_model_bfloat16 else []) + (
        ["int8"] if args.saved_model_int8 else []) + (
        ["int8_bfloat16"] if args.saved_model_int8_bfloat16 else []) + (
        [SHORTLIST] if args.saved_model_shortlist else [])
    ours = exports + ([PREVIOUS] if args.previous_saved_model else []) + (
        [XLA[p] for p in ("float32", "bfloat16") if p in exports] if args.xla else [])
    systems = [("this project, SavedModel", "saved_model", p, {}, p) for p in ours]
    if args.env:  # serving_default's rows again, in that environment
        systems += [("this project, SavedModel", "saved_model", p, dict(args.env),
                     serving_label(args, p)) for p in exports]
    ct2 = ["float32", "int8", "bfloat16"] + ([c + VMAP for c in ("float32", "int8")]
                                            if args.vmap else [])
    return systems + [("CTranslate2", "ctranslate2", c, {}, c) for c in ct2]


def serving_label(args, precision: str) -> str:
    """A serving_default row's label, run in the --env environment."""
    return f"{precision}, {' '.join(f'{k}={v}' for k, v in args.env)}" if args.env else precision


def worker_setups(engine: str, precision: str):
    """(threads, requests in flight) a system's workers run at: one request at a time at
    each of LATENCY_THREADS, and for our SavedModel (not its XLA route, which leaves
    batches of more than 4 to serving_default) IN_FLIGHT requests of one thread each, as
    a server runs concurrent requests. CTranslate2 runs its own two at once (its best
    setup, decoding_workers.ctranslate2_translator)."""
    setups = [(threads, 1) for threads in LATENCY_THREADS]
    if engine == "saved_model" and precision not in XLA.values():
        setups.append((1, IN_FLIGHT))
    return setups


def measure(args, search: dict):
    """({(system, label, threads, in_flight): a worker's results}, {(label, threads):
    taking turns})."""
    results = {}
    for name, engine, precision, env, label in ctranslate2_systems(args):
        for threads, in_flight in worker_setups(engine, precision):
            out = subprocess.run(worker_command(args, engine, precision, threads, search,
                                                in_flight=in_flight),
                                 check=True, capture_output=True, text=True,
                                 env={**os.environ, **env}).stdout
            key = (name, label, threads, in_flight)
            result = results[key] = json.loads(out.strip().splitlines()[-1])
            if env and "outputs" in result:
                plain = results[name, precision, threads, in_flight]["outputs"]
                result["identical"] = sum(a == b for a, b in zip(result["outputs"], plain))
            print(f"  {name}, {label}, {threads} threads, {in_flight} in flight: "
                  f"{ {k: v for k, v in result.items() if k != 'outputs'} }", file=sys.stderr)
    turns = {"latency": {}, "throughput": {}}
    if args.turns:
        turns["latency"] = latency_turns(args, search)
    if args.throughput_rounds:
        turns["throughput"] = throughput_turns(args, search)
    return results, turns


def latency_turns(args, search: dict):
    """{(label, threads): ((p50, p95) ours, (p50, p95) CTranslate2 float32, the median of
    per-sentence ratios)}: our fastest setup for one sentence (the bfloat16 export if
    given, in the --env environment) and CTranslate2 float32 taking turns request by
    request, at each of LATENCY_THREADS."""
    fastest = "bfloat16" if args.saved_model_bfloat16 else "float32"
    label, turns = serving_label(args, fastest), {}
    for threads in LATENCY_THREADS:
        commands = [worker_command(args, engine, precision, threads, search, serve=True)
                    for engine, precision in (("saved_model", fastest),
                                              ("ctranslate2", "float32"))]
        ours, theirs = taking_turns(commands, [dict(args.env), {}],
                                    [str(i) for i in range(args.latency_sentences)],
                                    args.turn_pause)
        turns[label, threads] = (percentiles(ours), percentiles(theirs),
                                 statistics.median(a / b for a, b in zip(ours, theirs)))
        print(f"  taking turns, {label}, {threads} threads: {turns[label, threads]}",
              file=sys.stderr)
    return turns


def throughput_turns(args, search: dict):
    """{system label: sentences/s of each round}: our fastest export for throughput (the
    shortlist's if given, else int8_bfloat16's, else bfloat16's, else float32's; in the
    --env environment, two
    requests in flight of one thread each) and CTranslate2 at each compute type (with its
    vocabulary map too, with --vmap; two translators of one thread each), all loaded at
    once, taking turns pass by pass over the length-sorted sentences for
    --throughput_rounds rounds, the first to go rotating."""
    ours = (SHORTLIST if args.saved_model_shortlist else
            "int8_bfloat16" if args.saved_model_int8_bfloat16 else
            "bfloat16" if args.saved_model_bfloat16 else "float32")
    theirs = ["int8", "float32"] + ([c + VMAP for c in ("int8", "float32")]
                                    if args.vmap else [])
    systems = [("saved_model", ours, 1, IN_FLIGHT, dict(args.env), serving_label(args, ours))]
    systems += [("ctranslate2", c, LATENCY_THREADS[0], 1, {}, f"CTranslate2 {c}")
                for c in theirs]
    commands = [worker_command(args, engine, precision, threads, search, serve=True,
                               in_flight=in_flight)
                for engine, precision, threads, in_flight, _, _ in systems]
    rates = taking_turns(commands, [env for *_, env, _ in systems],
                         ["sorted"] * args.throughput_rounds, args.turn_pause)
    turns = {label: r for (*_, label), r in zip(systems, rates)}
    print(f"  throughput taking turns: {turns}", file=sys.stderr)
    return turns


def setup_label(engine: str, threads: int, in_flight: int) -> str:
    if engine == "CTranslate2":
        return f"{threads} translator{'s' if threads > 1 else ''} of 1 thread, its batching"
    if in_flight > 1:
        return f"{in_flight} requests in flight, 1 thread each"
    return f"1 request at a time, {threads} threads"


def print_tables(args, results: dict, turns: dict):
    env = [] if not args.env else ["identical to the row without --env"]
    timed = {key: r for key, r in results.items()
             if "skipped" not in r and "sorted_rate" in r}
    # Each system at its best: ours sorted by length (as trainer.translate sends a file),
    # CTranslate2 with its own batching.
    reference = {c: results["CTranslate2", c, LATENCY_THREADS[0], 1].get("sorted_rate")
                 for c in ("float32", "int8")}
    ours = results["this project, SavedModel", "float32", LATENCY_THREADS[0], 1]["outputs"]
    _, target = ctranslate2_sentencepiece(args.ctranslate2)
    rows = [[name, precision, setup_label(name, threads, in_flight),
             f"{r['file_rate']:.1f}", f"{r['sorted_rate']:.1f}",
             *(f"{r['sorted_rate'] / reference[c]:.2f}x" if reference[c] else "-"
               for c in ("float32", "int8")),
             f"{r['bleu']:.2f}", f"{r['chrf']:.2f}",
             f"{statistics.mean(len(p) for p in target.encode(r['outputs'])):.1f}",
             f"{sum(a == b for a, b in zip(r['outputs'], ours))} of {len(ours)}",
             *([f"{r['identical']} of {len(r['outputs'])}" if "identical" in r else ""]
               if env else [])]
            for (name, precision, threads, in_flight), r in timed.items()]
    common.print_table(
        ["system", "precision", "setup", "sentences/s, file order",
         "sentences/s, sorted by length", "x CTranslate2 float32", "x CTranslate2 int8",
         "sacreBLEU", "chrF", "output pieces / sentence", "outputs = our float32's", *env],
        rows, text_columns=3,
        title=f"Throughput (2 cores, best of {args.repeats}, text in and out) and quality:")
    best_row(timed, reference)
    common.print_table(
        ["system", "precision", "threads", "file order", "sorted by length"],
        [[name, precision, threads, "{:.1f} / {:.1f}".format(*r["latency"]),
          "{:.1f} / {:.1f}".format(*r["sorted_latency"])]
         for (name, precision, threads, _), r in results.items() if "latency" in r],
        text_columns=2, title="Single-sentence latency, p50 / p95 ms over the first "
        f"{args.latency_sentences} sentences, one request at a time:")
    best_latency(results)
    if turns["latency"]:
        common.print_table(
            ["SavedModel", "threads", "SavedModel p50 / p95", "CTranslate2 float32 p50 / p95",
             "p50 ratio", "median of per-sentence ratios"],
            [[label, threads, f"{o50:.1f} / {o95:.1f}", f"{c50:.1f} / {c95:.1f}",
              f"{o50 / c50:.2f}x", f"{ratio:.2f}x"]
             for (label, threads), ((o50, o95), (c50, c95), ratio)
             in turns["latency"].items()],
            title="The same, our SavedModel and CTranslate2 float32 taking turns request by "
                  f"request (file order, {args.turn_pause * 1e3:.0f} ms between requests):")
    if turns["throughput"]:
        print_throughput_turns(args, turns["throughput"])
    skipped = [f"{n} {p}: {r['skipped']}" for (n, p, t, _), r in results.items()
               if "skipped" in r and t == LATENCY_THREADS[0]]
    if skipped:
        print("Skipped: " + "; ".join(skipped) + "\n")


def print_throughput_turns(args, rates: dict):
    """The throughput-turns table: each system's median sentences/s over the rounds, and
    ours over each CTranslate2 row as the geometric mean of the rounds' ratios (and
    their range): both sides of a ratio ran within seconds of each other."""
    (ours, our_rates), *others = rates.items()
    rows = [[ours, f"{statistics.median(our_rates):.1f}", "", ""]]
    for label, their_rates in others:
        ratios = [a / b for a, b in zip(our_rates, their_rates)]
        rows.append([label, f"{statistics.median(their_rates):.1f}",
                     f"{statistics.geometric_mean(ratios):.2f}x",
                     f"{min(ratios):.2f}x-{max(ratios):.2f}x"])
    common.print_table(
        ["system", "sentences/s (median)", "ours / it (geometric mean)", "rounds' range"],
        rows, text_columns=1,
        title=f"Throughput taking turns: our fastest export ({setup_label('ours', 1, IN_FLIGHT)}) "
              f"and CTranslate2 (2 translators of 1 thread), all loaded at once, one pass each "
              f"over the sentences sorted by length per round, {len(our_rates)} rounds, the "
              f"first to go rotating, {args.turn_pause * 1e3:.0f} ms between passes:")


def best_row(timed: dict, reference: dict):
    """The line each engine's best throughput (sorted by length) makes, at its best setup."""
    def best(engine):
        rates = {(p, t, f): r["sorted_rate"] for (n, p, t, f), r in timed.items()
                 if n.startswith(engine)}
        return max(rates.items(), key=lambda item: item[1]) if rates else (None, 0.0)
    (precision, threads, in_flight), ours = best("this project")
    lines = [f"Each at its best: ours {precision}, {setup_label('ours', threads, in_flight)}: "
             f"{ours:.1f} sentences/s"]
    for compute_type, rate in reference.items():
        if rate:
            lines.append(f"{ours / rate:.2f}x CTranslate2 {compute_type} ({rate:.1f})")
    print(", ".join(lines) + ".\n")


def best_latency(results: dict):
    """The line of each engine's best single-sentence p50 (file order), over its thread
    setups, and their ratio."""
    def best(engine, precision=None):
        found = [(r["latency"][0], p, t) for (n, p, t, _), r in results.items()
                 if n.startswith(engine) and "latency" in r and p in (precision or p)]
        return min(found) if found else None
    ours, theirs = best("this project"), best("CTranslate2", ("float32",))
    if ours and theirs:
        print(f"One sentence, each at its best thread setup (p50, file order): ours "
              f"{ours[1]} at {ours[2]} threads {ours[0]:.1f} ms, CTranslate2 float32 at "
              f"{theirs[2]} threads {theirs[0]:.1f} ms: {ours[0] / theirs[0]:.2f}x.\n")
