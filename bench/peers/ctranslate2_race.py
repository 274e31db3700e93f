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
from typing import NamedTuple

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


class Setup(NamedTuple):
    """One of our rows as a worker runs it again: its precision (the worker's), environment
    and row label, threads and requests in flight, and what this run's rows measured of it
    (sentences/s sorted by length, or single-sentence p50 ms in file order)."""
    precision: str
    env: dict
    label: str
    threads: int
    in_flight: int
    measured: float


# A row within this fraction of our fastest throughput row alternates with CTranslate2
# too: rows measured minutes apart cannot rank setups a few percent apart (on the AVX-512
# EPYC, int8_bfloat16 with and without --env: 350.7 and 368.0 sentences/s), while the
# alternation, all loaded at once, can rank them otherwise.
CONTENDER_MARGIN = 0.9


class Fastest(NamedTuple):
    """Our fastest setups as this run's rows measured them, which the turns run."""
    throughput: Setup  # the highest sentences/s sorted by length (as the turns' passes are)
    latency: Setup  # the lowest single-sentence p50, file order (as the turns send them)
    contenders: tuple = ()  # Setups that alternate for throughput: the fastest row, and the
    # next-fastest if it is within CONTENDER_MARGIN of it

    def describe_throughput(self) -> str:
        t = self.throughput
        return (f"{t.label}, {setup_label('ours', t.threads, t.in_flight)}, sorted by "
                f"length: {t.measured:.1f} sentences/s")

    def describe_latency(self) -> str:
        t = self.latency
        return (f"{t.label}, {t.threads} thread{'s' if t.threads > 1 else ''}, "
                f"p50 {t.measured:.1f} ms (file order)")

    def describe(self) -> str:
        return f"{self.describe_throughput()}; one sentence: {self.describe_latency()}"


class Race(NamedTuple):
    results: dict  # {(system, label, threads, in_flight): a worker's results}
    fastest: Fastest
    turns: dict  # {"latency": latency_turns', "throughput": throughput_turns'}


def our_rows(args, results: dict):
    """[(precision, environment, label, threads, in_flight, a worker's results)] of our
    rows that race: every SavedModel row but --previous_saved_model's (earlier code) and
    those skipped."""
    rows = []
    for name, engine, precision, env, label in ctranslate2_systems(args):
        if engine != "saved_model" or precision == PREVIOUS:
            continue
        for threads, in_flight in worker_setups(engine, precision):
            result = results[name, label, threads, in_flight]
            if "skipped" not in result:
                rows.append((precision, env, label, threads, in_flight, result))
    return rows


def best_order(result: dict):
    """(sentences/s, order) of a throughput row at its faster order."""
    return max((result["file_rate"], "file order"), (result["sorted_rate"], "sorted by length"))


def fastest(args, results: dict) -> Fastest:
    """Our row of the highest sentences/s sorted by length and our row of the lowest
    single-sentence p50 in file order, with their setups, among this run's rows."""
    rows = our_rows(args, results)
    throughput = max((Setup(p, env, label, t, f, r["sorted_rate"])
                      for p, env, label, t, f, r in rows if "sorted_rate" in r),
                     key=lambda s: s.measured)
    latency = min((Setup(p, env, label, t, f, r["latency"][0])
                   for p, env, label, t, f, r in rows if "latency" in r),
                  key=lambda s: s.measured)
    ranked = sorted((Setup(p, env, label, t, f, r["sorted_rate"])
                     for p, env, label, t, f, r in rows if "sorted_rate" in r),
                    key=lambda s: -s.measured)
    contenders = tuple(ranked[:1] + [s for s in ranked[1:2]
                                     if s.measured >= CONTENDER_MARGIN * throughput.measured])
    return Fastest(throughput, latency, contenders)


def lowest_p50(results: dict, engine: str, precision: str):
    """(p50 ms, threads) of a system's single-sentence rows at its best thread count
    (file order)."""
    return min((r["latency"][0], t) for (n, p, t, _), r in results.items()
               if n.startswith(engine) and p == precision and "latency" in r)


def measure(args, search: dict) -> Race:
    """Every system's rows, then the turns of our fastest setups (`fastest`, as the rows
    measured them) against CTranslate2."""
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
    best = fastest(args, results)
    print(f"  our fastest: {best.describe()}", file=sys.stderr)
    turns = {"latency": {}, "throughput": {}}
    if args.turns:
        turns["latency"] = latency_turns(args, search, best.latency,
                                         lowest_p50(results, "CTranslate2", "float32")[1])
    if args.throughput_rounds:
        turns["throughput"] = throughput_turns(args, search, best.contenders)
    return Race(results, best, turns)


def latency_turns(args, search: dict, ours: Setup, their_threads: int):
    """{(label, threads, CTranslate2's threads): ((p50, p95) ours, (p50, p95) CTranslate2
    float32, the median of per-sentence ratios)}: our fastest setup for one sentence and
    CTranslate2 float32 at its fastest thread count (both as the rows measured them)
    taking turns request by request."""
    commands = [worker_command(args, "saved_model", ours.precision, ours.threads, search,
                               serve=True),
                worker_command(args, "ctranslate2", "float32", their_threads, search,
                               serve=True)]
    mine, theirs = taking_turns(commands, [ours.env, {}],
                                [str(i) for i in range(args.latency_sentences)],
                                args.turn_pause)
    key = (ours.label, ours.threads, their_threads)
    turns = {key: (percentiles(mine), percentiles(theirs),
                   statistics.median(a / b for a, b in zip(mine, theirs)))}
    print(f"  taking turns, {key}: {turns[key]}", file=sys.stderr)
    return turns


def throughput_turns(args, search: dict, ours: tuple):
    """{system label: sentences/s of each round}: our contenders for throughput (the rows'
    fastest, and a runner-up close to it: `Fastest.contenders`) first, then CTranslate2
    at each compute type (with its
    vocabulary map too, with --vmap; two translators of one thread each), all loaded at
    once, taking turns pass by pass over the length-sorted sentences for
    --throughput_rounds rounds, the first to go rotating."""
    theirs = ["int8", "float32"] + ([c + VMAP for c in ("int8", "float32")]
                                    if args.vmap else [])
    systems = [("saved_model", s.precision, s.threads, s.in_flight, s.env,
                f"{s.label}, {setup_label('ours', s.threads, s.in_flight)}") for s in ours]
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


def print_tables(args, race: Race):
    results, turns = race.results, race.turns
    env = [] if not args.env else ["identical to the row without --env"]
    timed = {key: r for key, r in results.items()
             if "skipped" not in r and "sorted_rate" in r}
    # The ratio columns: ours sorted by length (as trainer.translate sends a file) over
    # CTranslate2 sorted by length, with its own batching.
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
    common.print_summary(best_row(args, results))
    common.print_table(
        ["system", "precision", "threads", "file order", "sorted by length"],
        [[name, precision, threads, "{:.1f} / {:.1f}".format(*r["latency"]),
          "{:.1f} / {:.1f}".format(*r["sorted_latency"])]
         for (name, precision, threads, _), r in results.items() if "latency" in r],
        text_columns=2, title="Single-sentence latency, p50 / p95 ms over the first "
        f"{args.latency_sentences} sentences, one request at a time:")
    common.print_summary(best_latency(race))
    if turns["latency"]:
        common.print_table(
            ["SavedModel", "threads", "CTranslate2 float32 threads", "SavedModel p50 / p95",
             "CTranslate2 float32 p50 / p95", "p50 ratio", "median of per-sentence ratios"],
            [[label, threads, their_threads, f"{o50:.1f} / {o95:.1f}",
              f"{c50:.1f} / {c95:.1f}", f"{o50 / c50:.2f}x", f"{ratio:.2f}x"]
             for (label, threads, their_threads), ((o50, o95), (c50, c95), ratio)
             in turns["latency"].items()],
            title="The same, our fastest setup for one sentence as the rows above measured "
                  f"it ({race.fastest.describe_latency()}) and CTranslate2 float32 at its "
                  "fastest thread count measured in alternation request by request (file "
                  "order, "
                  f"{args.turn_pause * 1e3:.0f} ms between requests):")
    if turns["throughput"]:
        print_throughput_turns(args, race.fastest, turns["throughput"])
    skipped = [f"{n} {p}: {r['skipped']}" for (n, p, t, _), r in results.items()
               if "skipped" in r and t == LATENCY_THREADS[0]]
    if skipped:
        print("Skipped: " + "; ".join(skipped) + "\n")


def print_throughput_turns(args, fastest: Fastest, rates: dict):
    """The throughput-turns table: each system's median sentences/s over the rounds, and
    ours over each CTranslate2 row as the geometric mean of the rounds' ratios (and
    their range): both sides of a ratio ran within seconds of each other. Of our
    contenders, the one of the highest median is ours in the ratios."""
    systems = list(rates.items())
    mine, others = systems[:len(fastest.contenders)], systems[len(fastest.contenders):]
    rows = [[label, f"{statistics.median(r):.1f}", "", ""] for label, r in mine]
    _, our_rates = max(mine, key=lambda item: statistics.median(item[1]))
    for label, their_rates in others:
        ratios = [a / b for a, b in zip(our_rates, their_rates)]
        rows.append([label, f"{statistics.median(their_rates):.1f}",
                     f"{statistics.geometric_mean(ratios):.2f}x",
                     f"{min(ratios):.2f}x-{max(ratios):.2f}x"])
    common.print_table(
        ["system", "sentences/s (median)", "ours / it (geometric mean)", "rounds' range"],
        rows, text_columns=1,
        title=f"Throughput measured in alternation: our fastest setup as the throughput "
              f"rows measured it ({fastest.describe_throughput()}), with the next-fastest if within "
              f"{1 - CONTENDER_MARGIN:.0%} of it, and CTranslate2 "
              f"({setup_label('CTranslate2', LATENCY_THREADS[0], 1)}), all loaded at once, "
              f"one pass each over the sentences sorted by length per round, "
              f"{len(our_rates)} rounds, the first to go rotating, "
              f"{args.turn_pause * 1e3:.0f} ms between passes:")


def best_row(args, results: dict) -> str:
    """The line of each engine's best throughput, each at its faster order (file order or
    sorted by length) and its best setup: ours over our racing rows, CTranslate2 float32
    and int8 in its own setup."""
    rate, order, label, threads, in_flight = max(
        (*best_order(r), label, t, f) for _, _, label, t, f, r in our_rows(args, results)
        if "sorted_rate" in r)
    line = (f"Each at its best order and setup: ours {label}, "
            f"{setup_label('ours', threads, in_flight)}, {order}: {rate:.1f} sentences/s")
    for compute_type in ("float32", "int8"):
        theirs = results["CTranslate2", compute_type, LATENCY_THREADS[0], 1]
        if "sorted_rate" in theirs:
            their_rate, their_order = best_order(theirs)
            line += (f"; {rate / their_rate:.2f}x CTranslate2 {compute_type} "
                     f"({setup_label('CTranslate2', LATENCY_THREADS[0], 1)}, {their_order}: "
                     f"{their_rate:.1f})")
    return line + "."


def best_latency(race: Race) -> str:
    """The line of each engine's best single-sentence p50 (file order) over its setups,
    ours and CTranslate2 float32's, and their ratio."""
    ours = race.fastest.latency
    theirs, threads = lowest_p50(race.results, "CTranslate2", "float32")
    return (f"One sentence, each at its best thread setup: ours "
            f"{race.fastest.describe_latency()}; CTranslate2 float32, {threads} "
            f"thread{'s' if threads > 1 else ''}, p50 {theirs:.1f} ms: "
            f"{ours.measured / theirs:.2f}x.")
