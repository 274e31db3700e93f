"""Benchmark: how fast does this project decode, against CTranslate2 and keras-hub?

Each table is asked for by a flag, and one call can ask for several. Every table decodes
Multi30k test2016 (--src, --ref) with the search the SavedModel (--saved_model) was exported
with: its beam size, length penalty (form and alpha), stopping rule, patience and extra
output length, from its export.json (keras_transformer.DecodeConfig's, the paper's, for an
export without one).

--rules: each stopping rule's cost on the float32 export, its other settings its own:
sentences/s (translate_with_options with the rule as a request option, one request at a
time, sorted by length), sacreBLEU, row-steps (rows a step computes, summed over the run:
the search's work, counted in-process over the same batches) and steps per sentence
(row-steps / beam / sentences).

--options: what the option signatures cost, one request at a time on --src sorted by length
in batches of --batch_size, each system making one untimed pass, then one pass over them per
round, the first to go rotating, for --option_rounds rounds (4; sentences/s, best and median
of the rounds; a time ratio is the median of the rounds' ratios):
  - `serving_default` against `translate_with_options` given the export's settings as
    scalar options (trainer.serving.options.request_inputs), the best hypothesis kept, and
    how many translations are identical; with --previous_saved_model, the same two of that
    export (the same checkpoints exported by earlier code, whose options may be fewer, all
    scalars: its signature's inputs say which) in the same rounds: the options' cost
    before and after;
  - the worst request a server's batching can merge: in each full batch, the longest
    sentence at the export's max_beam_size (8 by default) and the others at beam 1, as one
    request of [batch] options (the search runs the largest beam and keeps each row to its
    own) against the same rows apart (the others in one request, the longest in another,
    their times summed), and how many translations are identical.
  The systems are bench/option_signatures.py.

--ctranslate2=CT2_DIR: our SavedModel against CTranslate2, on the same weights, sentences and
threads, each system in its own process (CTranslate2's without TensorFlow). CTranslate2 ranks
by log-prob / length^alpha and ends a sentence once beam x patience hypotheses have finished:
the race is at equal rules when the exports were made with --length_penalty=average
--stopping=first (the header's "rules" line says whether they were):
  - throughput (sentences/s, best of --repeats, 2 cores) in file order and sorted by
    length, text in and text out: our `serving_default` (tokenization in the graph) on
    batches of --batch_size, one request at a time on TensorFlow's pools of 2 threads, and
    two requests in flight of one intra-op thread each (as TF Serving runs concurrent
    requests); CTranslate2 in its own best setup on 2 cores: one call of
    `translate_batch` on all the sentences, which it sorts and cuts into batches of
    --batch_size itself, two batches at a time (inter_threads 2, intra_threads 1),
    SentencePiece encoding and decoding in Python around it. The ratio columns compare the
    rates sorted by length (how `trainer.translate` sends a file) with CTranslate2 float32's
    and int8's, and a line gives each engine at its best: its faster order (file order or
    sorted) and its best setup, both named;
  - single-sentence latency, p50 and p95 over the first --latency_sentences sentences sent
    one request at a time, in file order and sorted by length, with 2 threads and with 1,
    and a line with each engine at its best thread setup (p50, file order);
  - sacreBLEU and chrF of each system's translations against the references, their mean
    length in target pieces, and how many equal our float32 export's (the same search on
    the same weights: a system that decodes other outputs does other work);
  - our fastest setups, as this run's rows above measured them (not by name: on an Intel
    Xeon bfloat16 runs slower than float32), in the header's "our fastest" line beside the
    CPU flags: for throughput, our row (export or --xla signature, with --env or without,
    one request at a time or two in flight) of the most sentences/s sorted by length; for
    one sentence, our row (the same, and its thread count) of the lowest p50 in file
    order; --previous_saved_model's rows are not candidates. The turns race these:
  - the same single-sentence latency with two systems taking turns (--turns): our fastest
    setup for one sentence and CTranslate2 float32 at its thread count of the lower p50
    above, both loaded at once, send the same sentence one after the other, the first to go
    alternating, with --turn_pause (250 ms) between requests: CTranslate2's OpenMP threads
    (Intel OpenMP's default KMP_BLOCKTIME is 200 ms) and TensorFlow's pool keep spinning
    after a call, so with 20 ms between requests each engine's spinning threads steal the
    next request's cores. A virtual machine's speed drifts by a third within minutes,
    which decides the ratio of two rows timed minutes apart; taking turns, both see the
    same minutes.
  - the same for throughput (--throughput_rounds, 8 by default): our fastest setup for
    it and CTranslate2 int8 and float32 (and with --vmap, both with their vocabulary map;
    two translators of one thread each), all loaded at once, each making one pass over the
    sentences sorted by length per round, the first to go rotating: ours over each as the
    geometric mean of the rounds' ratios.
  Rows: each SavedModel given (--saved_model float32, --saved_model_bfloat16 from
  `python -m trainer.export --serving_dtype=bfloat16`, and so on for int8 and
  int8_bfloat16; --previous_saved_model: the same
  checkpoints exported by earlier code, a before/after in one run; --xla: the translate_xla
  signature of both exports, exported with --xla, its single-sentence shapes warmed up
  before timing) and the CTranslate2 model directory of the same checkpoints (`python -m
  trainer.export --format=ctranslate2 --quantization=float32`) loaded with compute_type
  float32, int8 and bfloat16 (where the CPU has it). With --env NAME=VALUE (repeatable),
  each serving_default row runs a second time with those variables set in its process
  (e.g. TF_ONEDNN_ASSUME_FROZEN_WEIGHTS=1), and the table counts the translations identical
  to the row without them. CTranslate2 suppresses <pad> and <s> (never in our outputs) and
  may stop at the model's positions - 1 tokens (ours: source + the extra length, at most
  that). About 18 minutes (23 with --xla --env), of which the pauses between turns take
  2 (--turn_pause x (2 x --latency_sentences + 3 x --throughput_rounds)).

--peers --model_dir=DIR: beam-search speed (float32) against keras-hub's BeamSampler and our
search without its key/value cache, in one process, on the first --sentences sentences (256
by default) in the same length-sorted batches of token ids and the same weights (the
export's: DIR is its model directory):
  ours, SavedModel         translate_ids (ids in, best hypothesis out) and serving_default
                           (text in and out);
  ours, in-process         keras_transformer.beam_search in a tf.function, with the cache
                           and (--uncached_batches) without it: every step reruns the decoder
                           over the whole prefix;
  keras-hub BeamSampler    on a model of keras-hub layers holding our weights
                           (bench/peers/keras_hub_transformer.py: cached the way
                           BartSeq2SeqLM.generate_step does), in a tf.function and XLA-
                           compiled (keras-hub's default for generate(); --no-keras_hub_xla
                           skips it).
  The searches differ, so they run different numbers of steps: ours keeps finished
  hypotheses aside and stops once no live beam can beat them; BeamSampler has no length
  penalty and no finished set and stops when every beam of every sentence holds an EOS. The
  table reports the beam steps each ran (ours counted in the in-process runs, which decode
  what the SavedModel decodes; BeamSampler's: the last first-EOS among all final beams), so
  ms per step compares one step's cost, and how many best outputs agree with ours. Each
  implementation decodes the first batch untimed (tracing; XLA: every batch, one compile
  per shape), then every batch once timed, taking turns batch by batch. About 7 minutes;
  needs keras-hub (bench/peers/__init__.py says how to install it).

The studies of our own search's settings are sweeps: bench/sweeps/decoding_options.py (what
translate_with_options and sample cost against serving_default) and
bench/sweeps/decoding_cache.py (what the key/value cache buys, by output length).

Speed depends on output lengths: a model that stops early (or never) decodes fewer (more)
steps, so measure a model trained on --src's data. Not a test: run it by hand from the
repository root, e.g.

  python bench/decoding.py --saved_model=EXPORT/1 --saved_model_bfloat16=EXPORT_BF16/1 \\
      --ctranslate2=CT2_DIR --env=TF_ONEDNN_ASSUME_FROZEN_WEIGHTS=1 \\
      --env=ONEDNN_PRIMITIVE_CACHE_CAPACITY=16384 --rules
  python bench/decoding.py --saved_model=EXPORT --peers --model_dir=runs/small_multi30k
  python bench/decoding.py --saved_model=EXPORT/1 --previous_saved_model=OLD_EXPORT/1 --options

The race's systems, setups and tables are bench/peers/ctranslate2_race.py; the keras-hub
implementations, bench/peers/decoding_runners.py. TensorFlow is imported inside the functions
that use it: the CTranslate2 workers (this script again, with --worker; their code is
bench/peers/decoding_workers.py) run without it.
"""

import argparse
import os
import sys
from typing import List, NamedTuple

import common
import option_signatures
import results_file
from peers import ctranslate2_race, decoding_runners
from peers.decoding_workers import worker as run_worker

PEER_SENTENCES = 256  # --peers' default --sentences: keras-hub's tf.function row is slow


# ---------------------------------------------------------------- each stopping rule's cost


def measure_rules(args, export, texts) -> list:
    """[(rule, sentences/s, sacreBLEU, row-steps, steps per sentence)] of our float32
    export under each stopping rule (its other settings its own), on --src sorted by
    length in batches of --batch_size: translate_with_options one request at a time (2
    threads) for the time, and the same search in-process over a step that counts its rows
    (decoding_runners.counting_step) for the work."""
    import dataclasses
    import sacrebleu
    import tensorflow as tf
    from keras_transformer import beam_search
    from keras_transformer.config import STOPPING_RULES
    from trainer.serving import saved_model
    from trainer.serving.options import request_inputs
    references = common.read_lines(args.ref, args.sentences or 0)
    order = sorted(range(len(texts)), key=lambda i: len(texts[i].split()))
    batches = [order[i:i + args.batch_size] for i in range(0, len(order), args.batch_size)]
    signature = export.loaded.signatures["translate_with_options"]
    translator, _ = saved_model.build_translator(export.info["model_dir"], export.options)
    counts = decoding_runners.counters()
    rows = []
    for rule in STOPPING_RULES:
        decode = dataclasses.replace(export.decode, stopping=rule)
        options = request_inputs("translate_with_options", decode)

        def translate_all():
            outputs = [None] * len(texts)
            for batch in batches:
                inputs = tf.constant([texts[i] for i in batch])
                found = signature(inputs=inputs, target_prefix=tf.fill(tf.shape(inputs), ""),
                                  **options)["translations"][:, 0].numpy()
                for i, text in zip(batch, found):
                    outputs[i] = text.decode("utf-8")
            return outputs

        outputs = translate_all()
        rate = len(texts) / common.best_seconds(translate_all, args.repeats)
        best_only = dataclasses.replace(decode, num_hypotheses=1)
        counted = tf.function(lambda ids, decode=best_only: beam_search(
            decoding_runners.counting_step(translator.step(ids), counts), decode),
            input_signature=[tf.TensorSpec([None, None], tf.int32)], autograph=False)
        for counter in counts.values():
            counter.assign(0)
        for batch in batches:
            counted(translator.source_ids(tf.constant([texts[i] for i in batch])))
        row_steps = int(counts["rows"].numpy())
        rows.append((rule, rate, sacrebleu.corpus_bleu(outputs, [references]).score, row_steps,
                     row_steps / decode.beam_size / len(texts)))
        print(f"  stopping {rule}: {rows[-1]}", file=sys.stderr)
    return rows


def print_rules_table(args, export, rows):
    d = export.decode
    common.print_table(
        ["stopping", "sentences/s", "sacreBLEU", "row-steps", "steps per sentence"],
        [[rule, f"{rate:.1f}", f"{bleu:.2f}", f"{row_steps:,}", f"{steps:.1f}"]
         for rule, rate, bleu, row_steps, steps in rows], text_columns=1,
        title=f"Each stopping rule's cost on our float32 export (beam {d.beam_size}, "
              f"{d.length_penalty} length penalty, alpha {d.alpha:g}, patience "
              f"{d.patience:g}; translate_with_options, one request at a time on 2 threads, "
              f"sorted by length; row-steps: rows a step computes, summed over the run):")


# ---------------------------------------------------------------- against keras-hub
# The implementations and their turns: bench/peers/decoding_runners.py.


class PeersResult(NamedTuple):
    implementations: list
    sentences: int
    batches: int
    source_tokens: int
    uncached_batches: int
    difference: float  # the largest |logit| difference of the two models


def measure_peers(args, export, texts, loads: List[float]) -> PeersResult:
    from trainer.serving import saved_model
    translator, _ = saved_model.build_translator(args.model_dir, export.options)
    batches, source_tokens = decoding_runners.sorted_batches(translator, texts, args.batch_size)
    impls, uncached = decoding_runners.our_implementations(export, translator)
    peers, difference = decoding_runners.keras_hub_implementations(
        export, translator.model, batches[len(batches) // 2][1], args.keras_hub_xla)
    impls += peers
    uncached_batches = len(batches) if args.uncached_batches < 0 else args.uncached_batches
    if uncached_batches:
        impls.append(uncached)
    decoding_runners.decode_in_turns(impls, batches, uncached, uncached_batches, loads)
    # Output tokens and steps of the text signature: those of translate_ids and of the
    # in-process cached search (the same weights and algorithm).
    impls[1].outputs = impls[0].outputs
    impls[0].steps = impls[1].steps = impls[2].steps
    return PeersResult(impls, len(texts), len(batches), source_tokens, uncached_batches,
                       difference)


def print_peers_table(args, peers: PeersResult):
    impls, reference = peers.implementations, peers.implementations[0].outputs
    print(f"{peers.sentences} sentences in {peers.batches} length-sorted batches of "
          f"{args.batch_size}, {peers.source_tokens:,} source tokens (pieces + EOS); uncached: "
          f"the first {peers.uncached_batches} batches; keras-hub's copy of our weights: max "
          f"|logit difference| {peers.difference:.1e} (teacher forcing):\n")
    rows = []
    for impl in impls:
        n, tokens = len(impl.outputs), sum(len(o) for o in impl.outputs)
        agree = sum(a == b for a, b in zip(impl.outputs, reference)) / n
        per_step = f"{1000 * impl.seconds / impl.steps:.1f}" if impl.steps else "-"
        rows.append([impl.name, n, f"{impl.seconds:.1f}", f"{n / impl.seconds:.1f}",
                     f"{tokens / impl.seconds:,.0f}", f"{tokens / n:.1f}",
                     impl.steps or "-", per_step, f"{100 * agree:.0f}%"])
    common.print_table(
        ["implementation", "sentences", "seconds", "sentences/s", "output tokens/s",
         "output tokens / sentence", "beam steps", "ms / step", "best output = ours"], rows)
    print("(beam steps of the SavedModel rows: the in-process cached search's, same "
          "weights and algorithm; ms / step: seconds over beam steps)\n")


# ---------------------------------------------------------------- main


def parse_args(argv):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--saved_model", required=True,
                        help="the float32 export (a version or its export directory)")
    parser.add_argument("--src", default=str(common.MULTI30K / "test2016.en"))
    parser.add_argument("--ref", default=str(common.MULTI30K / "test2016.de"))
    parser.add_argument("--sentences", type=int, default=None,
                        help="the first N sentences of --src (0: all; default: all, "
                             f"--peers {PEER_SENTENCES})")
    parser.add_argument("--batch_size", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=3, help="best of this many passes")
    parser.add_argument("--previous_saved_model", help="a float32 export of the same "
                        "checkpoints by earlier code: a before/after row (--ctranslate2, "
                        "--options)")
    ct2 = parser.add_argument_group("against CTranslate2")
    ct2.add_argument("--ctranslate2", help="the same checkpoints exported with "
                     "--format=ctranslate2 --quantization=float32: asks for this table")
    ct2.add_argument("--saved_model_bfloat16", help="the same checkpoints exported with "
                     "--serving_dtype=bfloat16")
    ct2.add_argument("--saved_model_int8", help="the same checkpoints exported with "
                     "--serving_dtype=int8")
    ct2.add_argument("--saved_model_int8_bfloat16", help="the same checkpoints exported "
                     "with --serving_dtype=int8_bfloat16 --calibration=FILE")
    ct2.add_argument("--saved_model_shortlist", help="the same checkpoints exported with "
                     "--shortlist (any --serving_dtype): its row is labelled shortlist")
    ct2.add_argument("--vmap", action="store_true", help="also run CTranslate2 float32 and "
                     "int8 with use_vmap=True (--ctranslate2 exported with --shortlist, "
                     "which writes its vmap.txt)")
    ct2.add_argument("--xla", action="store_true", help="also time the exports' translate_xla "
                     "signature (exported with --xla)")
    ct2.add_argument("--latency_sentences", type=int, default=200)
    ct2.add_argument("--env", action="append", default=[], metavar="NAME=VALUE",
                     help="also run each serving_default row with this environment variable "
                     "set in its process (repeatable: all of them in one more row each)")
    ct2.add_argument("--turns", action=argparse.BooleanOptionalAction, default=True,
                     help="also time one sentence with our fastest setup for it (as the "
                     "latency rows measured it) and CTranslate2 float32 taking turns request "
                     "by request")
    ct2.add_argument("--throughput_rounds", type=int, default=8,
                     help="also time throughput taking turns (with --no-turns too): our "
                     "fastest setup for it (as the throughput rows measured it) and "
                     "CTranslate2 int8 and float32, all loaded at once, one "
                     "pass each per round over the sentences sorted by length (0: not)")
    ct2.add_argument("--turn_pause", type=float, default=0.25, help="seconds between two "
                     "requests when taking turns (default 0.25): CTranslate2's OpenMP threads "
                     "(Intel OpenMP's default KMP_BLOCKTIME is 200 ms) and TensorFlow's pool keep "
                     "spinning after a call, so with 20 ms between requests each engine's "
                     "spinning threads steal the next request's cores")
    ct2.add_argument("--worker", help=argparse.SUPPRESS)  # engine:precision:threads
    ct2.add_argument("--serve", action="store_true", help=argparse.SUPPRESS)
    ct2.add_argument("--ctranslate2_search", help=argparse.SUPPRESS)  # ctranslate2_search's
    results_file.add_results_flag(parser, None)
    parser.add_argument("--rules", action="store_true", help="each stopping rule's cost on "
                        "the float32 export: sentences/s, sacreBLEU, row-steps and steps per "
                        "sentence")
    options = parser.add_argument_group("the option signatures' cost")
    options.add_argument("--options", action="store_true", help="asks for these tables: "
                         "serving_default against translate_with_options (before and after "
                         "with --previous_saved_model), and the worst mixed-beam request")
    options.add_argument("--option_rounds", type=int, default=4,
                         help="alternating rounds, one pass over the sentences each")
    peers = parser.add_argument_group("against keras-hub")
    peers.add_argument("--peers", action="store_true", help="asks for this table")
    peers.add_argument("--model_dir", help="the export's model directory (needed)")
    peers.add_argument("--uncached_batches", type=int, default=-1,
                       help="decode only the first N batches uncached too (-1: all, 0: none)")
    peers.add_argument("--keras_hub_xla", action=argparse.BooleanOptionalAction, default=True,
                       help="add keras-hub with XLA, its default for generate() (compiles "
                       "once per batch shape)")
    args = parser.parse_args(argv)
    check_args(parser, args)
    return args


def check_args(parser, args):
    if args.worker:
        return
    if not (args.ctranslate2 or args.peers or args.rules or args.options):
        parser.error("ask for a table: --ctranslate2=DIR, --rules, --options or --peers "
                     "(--cache is bench/sweeps/decoding_cache.py)")
    if args.options and args.option_rounds < 1:
        parser.error("--option_rounds must be at least 1")
    if args.peers and not args.model_dir:
        parser.error("--peers needs --model_dir, the export's model directory")
    bad = [e for e in args.env if "=" not in e]
    if bad:
        parser.error(f"--env takes NAME=VALUE, not {bad[0]!r}")
    args.env = [tuple(e.split("=", 1)) for e in args.env]
    if args.ctranslate2:
        common.require(["ctranslate2", "sacrebleu"], "--ctranslate2")
    if args.peers:
        common.require(["keras_hub"], "--peers")


def main(argv=None):
    args = parse_args(argv)
    if args.worker:
        return run_worker(args)
    export = common.Export(args.saved_model)
    texts = common.read_lines(args.src, args.sentences or 0)
    loads = [os.getloadavg()[0]]
    reports = []  # what each table prints, in the order measured
    if args.rules:
        rules = measure_rules(args, export, texts)
        reports.append(lambda: print_rules_table(args, export, rules))
    if args.options:
        previous = args.previous_saved_model and common.Export(args.previous_saved_model)
        costs = option_signatures.measure(args, export, texts, previous)
        reports.append(lambda: option_signatures.print_tables(args, costs))
    race = None
    if args.ctranslate2:
        race = ctranslate2_race.measure(args, ctranslate2_race.search(export))
        reports.append(lambda: ctranslate2_race.print_tables(args, race))
    if args.peers:
        peers = measure_peers(args, export, texts if args.sentences is not None else
                              texts[:PEER_SENTENCES], loads)
        reports.append(lambda: print_peers_table(args, peers))
    loads.append(os.getloadavg()[0])
    print_header(args, export, texts, loads, race)
    for report in reports:
        report()
    setting = (f"{len(texts)} sentences of {common.in_repository(args.src)}, batches of "
               f"{args.batch_size}")
    if args.ctranslate2:
        setting += "; " + ctranslate2_race.rules_line(export)
    results_file.write_results("decoding", results_name(args, export), setting,
                         packages=["ctranslate2", "keras-hub", "sacrebleu", "sentencepiece"])


def results_name(args, export) -> str:
    """The setting part of the results file's name: --results, or what the run compared."""
    if args.results is not None:
        return args.results
    parts = []
    if args.ctranslate2:
        equal = ctranslate2_race.rules_line(export).startswith("equal")
        parts.append("equal-rules-2inflight" if equal else "unequal-rules")
        if args.vmap:
            parts.append("shortlist")
    if args.peers:
        parts.append("keras-hub")
    if args.rules:
        parts.append("search-rules")
    if args.options:
        parts.append("options" + ("-before-after" if args.previous_saved_model else ""))
    return "-".join(parts) or "serving-default"


def print_header(args, export, texts, loads, race):
    """The lines above the tables; with the race, beside the CPU flags, our fastest setups
    as its rows measured them (the ones its turns ran)."""
    extra, peaks = [], None
    if args.ctranslate2:
        import ctranslate2
        import tensorflow as tf
        extra.append(f"CTranslate2 {ctranslate2.__version__}")
        peaks = (f"TensorFlow matmul {common.tf_matmul_peak(tf.float32, 5):.0f} GFLOP/s "
                 f"float32, {common.tf_matmul_peak(tf.bfloat16, 5):.0f} bfloat16 "
                 f"({common.MATMUL_SIZE}^3, this run)")
    if args.peers:
        import keras_hub
        extra.append(f"keras-hub {keras_hub.__version__}")
    common.print_header([
        ("machine", f"{common.describe()}, load average {common.load_average()} at the end"),
        ("our fastest", race and race.fastest.describe()),
        ("load", "1-min at the start, around the timed batches of --peers, at the end: "
                 + ", ".join(f"{load:.2f}" for load in loads) if args.peers else None),
        ("peak", peaks),
        ("versions", common.versions(*extra)),
        ("export", export.describe()),
        ("previous", args.previous_saved_model),
        ("bfloat16", args.saved_model_bfloat16),
        ("int8", args.saved_model_int8),
        ("int8_bfloat16", args.saved_model_int8_bfloat16),
        ("shortlist", args.saved_model_shortlist and " ".join(
            f"{k}={v}" for k, v in common.Export(args.saved_model_shortlist).info.get(
                "shortlist", {}).items())),
        ("ctranslate2", args.ctranslate2),
        ("rules", args.ctranslate2 and ctranslate2_race.rules_line(export)),
        ("data", f"{args.src} ({len(texts)} sentences), batches of {args.batch_size}"),
        ("command", common.command()),
    ])


if __name__ == "__main__":
    main()
