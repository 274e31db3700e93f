"""The systems bench/decoding.py --ctranslate2 times, each at one thread count in a process of
its own (bench/decoding.py again, with --worker): its own thread pools, and no TensorFlow
beside CTranslate2. A library for bench/decoding.py; nothing here is run.

A worker loads one system, a signature of one of our SavedModels or CTranslate2 at one
compute type with SentencePiece around it, then either measures it alone (`worker`:
throughput, sacreBLEU and chrF, single-sentence latency; one JSON line) or, with --serve,
answers one-sentence requests from standard input (`serve`), so that two workers loaded at
once can take turns request by request (`taking_turns`). TensorFlow is imported inside the
functions that use it.
"""

import json
import os
import statistics
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Callable, List

import common

LATENCY_THREADS = (2, 1)  # on one sentence a second thread can cost more than it brings
# Our SavedModel serving as a server does: two requests in flight, each op on one thread
# (TensorFlow's pools: intra-op 1, inter-op 2), against one request at a time on 2 threads.
IN_FLIGHT = 2
PREVIOUS = "float32, previous code"  # the --previous_saved_model row
SHORTLIST = "shortlist"  # the --saved_model_shortlist row
VMAP = ", use_vmap"  # CTranslate2's rows with its vocabulary map (--vmap)
# The --xla rows: each export's XLA signature.
XLA = {"float32": "float32, translate_xla", "bfloat16": "bfloat16, translate_xla"}


def saved_model_translator(path: str, threads: int, signature: str = "serving_default",
                           in_flight: int = 1) -> Callable[[List[str]], List[str]]:
    """A signature of the SavedModel at `path`, with TensorFlow's intra-op pool of `threads`
    and an inter-op pool for `in_flight` requests at once of as many threads each."""
    import tensorflow as tf
    from trainer.serving import saved_model
    common.set_threads(threads, inter=threads * in_flight)
    function = saved_model.load(path).signatures[signature]

    def translate(texts):
        outputs = function(inputs=tf.constant(texts))["translations"].numpy()
        return [t.decode("utf-8") for t in outputs]
    return translate


def ctranslate2_translator(path: str, compute_type: str, threads: int, search: dict,
                           batch_size: int, use_vmap: bool = False
                           ) -> Callable[[List[str]], List[str]]:
    """CTranslate2 with sentencepiece around it, in its own best setup for `threads` cores
    (bench/README.md, "Giving CTranslate2 its full speed"): one translation per core
    (inter_threads, one intra-op thread each) and its own batching, a call on many texts
    sorted by length and cut into batches of `batch_size` that run side by side. One
    sentence runs on one thread, CTranslate2's fastest for a single request. `search`: the
    SavedModel's beam size, alpha and patience (CTranslate2's own rule: done once
    beam_size x patience hypotheses have finished, ranked by log-prob / length^alpha) and
    the longest output its model allows; use_vmap: rank only the vocabulary map's
    candidates (the directory's vmap.txt)."""
    import ctranslate2
    source, target = ctranslate2_sentencepiece(path)
    translator = ctranslate2.Translator(path, device="cpu", compute_type=compute_type,
                                        inter_threads=threads, intra_threads=1)

    def translate(texts):
        results = translator.translate_batch(
            source.encode(texts, out_type=str), max_batch_size=batch_size,
            batch_type="examples", beam_size=search["beam_size"],
            length_penalty=search["alpha"], patience=search["patience"],
            max_decoding_length=search["max_length"],
            min_decoding_length=0, suppress_sequences=[["<pad>"], ["<s>"]],
            use_vmap=use_vmap)
        return target.decode([r.hypotheses[0] for r in results])
    return translate


def ctranslate2_sentencepiece(path: str):
    """(source, target) SentencePieceProcessor of a CTranslate2 export: its spm.model, or
    a source's and a target's (separate vocabularies, converted models)."""
    import sentencepiece
    names = (("spm.model",) * 2 if os.path.exists(os.path.join(path, "spm.model")) else
             ("spm_source.model", "spm_target.model"))
    return tuple(sentencepiece.SentencePieceProcessor(model_file=os.path.join(path, name))
                 for name in names)


def throughput(translate, texts: List[str], batch_size: int, repeats: int, in_flight: int = 1):
    """(best sentences/s of `repeats` passes, translations in the order of texts), with
    `in_flight` calls at once, each taking the next batch of batch_size texts (as a
    server's concurrent requests); batch_size None: all texts in one call (CTranslate2
    batches them itself)."""
    step = batch_size or len(texts)
    batches = [texts[i:i + step] for i in range(0, len(texts), step)]
    with ThreadPoolExecutor(max_workers=in_flight) as pool:
        list(pool.map(translate, batches[:in_flight]))  # warm-up, each thread once
        best, outputs = float("inf"), []
        for _ in range(repeats):
            start = time.perf_counter()
            outputs = [t for batch in pool.map(translate, batches) for t in batch]
            best = min(best, time.perf_counter() - start)
    return len(texts) / best, outputs


def by_length(texts: List[str]) -> List[str]:
    """texts sorted by their number of words, as trainer.translate sends a file."""
    return sorted(texts, key=lambda t: len(t.split()))


def percentiles(times: List[float]):
    """(p50, p95) of a list of milliseconds."""
    times = sorted(times)
    return statistics.median(times), times[int(round(0.95 * (len(times) - 1)))]


def latency(translate, texts: List[str]):
    """(p50, p95) milliseconds of one-sentence requests, one at a time."""
    translate(texts[:1])
    return percentiles([common.seconds(lambda t=t: translate([t])) * 1e3 for t in texts])


def worker_translator(args, engine: str, precision: str, threads: int, texts: List[str],
                      in_flight: int = 1):
    """The translate function of one system in this worker process (None: a compute type
    this CPU lacks, reported as skipped); args: bench/decoding.py's."""
    if engine == "ctranslate2":
        try:
            return ctranslate2_translator(args.ctranslate2, precision.replace(VMAP, ""),
                                          threads, json.loads(args.ctranslate2_search),
                                          args.batch_size, use_vmap=precision.endswith(VMAP))
        except ValueError as e:
            print(json.dumps({"skipped": str(e)}))
            return None
    paths = {"float32": args.saved_model, "bfloat16": args.saved_model_bfloat16,
             "int8": args.saved_model_int8, "int8_bfloat16": args.saved_model_int8_bfloat16,
             SHORTLIST: args.saved_model_shortlist,
             PREVIOUS: args.previous_saved_model, XLA["float32"]: args.saved_model,
             XLA["bfloat16"]: args.saved_model_bfloat16}
    xla = precision in XLA.values()
    translate = saved_model_translator(paths[precision], threads,
                                       "translate_xla" if xla else "serving_default", in_flight)
    if xla:
        # A compile per batch size (up to trainer.serving.xla.MAX_BATCH; larger requests
        # run serving_default's search) and source-width bucket: warm the single-sentence
        # shapes up first, as a server's warmup requests would.
        start = time.perf_counter()
        for text in texts[:args.latency_sentences]:
            translate([text])
        print(f"translate_xla warm-up: {time.perf_counter() - start:.1f} s", file=sys.stderr)
    return translate


def worker(args):
    """One system at one thread count, one request or several in flight
    (--worker=engine:precision:threads:in_flight) in this process; prints its results as
    JSON, or with --serve answers requests from standard input (see serve). Several in
    flight: throughput only (a single sentence's latency is one request's). args:
    bench/decoding.py's."""
    engine, precision, threads, in_flight = args.worker.split(":")
    threads, in_flight = int(threads), int(in_flight)
    texts = common.read_lines(args.src, args.sentences or 0)
    translate = worker_translator(args, engine, precision, threads, texts, in_flight)
    if translate is None:
        return
    # CTranslate2 sorts and batches a call's texts itself: the file in one call.
    batch_size = None if engine == "ctranslate2" else args.batch_size
    if args.serve:
        return serve(translate, texts, batch_size, in_flight)
    result = {}
    if threads == LATENCY_THREADS[0] or in_flight > 1:
        references = common.read_lines(args.ref, args.sentences or 0)
        result["file_rate"], outputs = throughput(translate, texts, batch_size, args.repeats,
                                                  in_flight)
        result["sorted_rate"], _ = throughput(translate, by_length(texts), batch_size,
                                              args.repeats, in_flight)
        import sacrebleu
        result["bleu"] = sacrebleu.corpus_bleu(outputs, [references]).score
        result["chrf"] = sacrebleu.corpus_chrf(outputs, [references]).score
        result["outputs"] = outputs
    if in_flight > 1:
        print(json.dumps(result))
        return
    first = texts[:args.latency_sentences]
    result["latency"] = latency(translate, first)
    result["sorted_latency"] = latency(translate, by_length(first))
    print(json.dumps(result))


def serve(translate, texts: List[str], batch_size, in_flight: int):
    """A turn-taking worker: warms up on the first sentence, prints "ready", then answers
    each line on standard input until it closes: a line i translates texts[i] alone and
    prints the milliseconds it took; the line "sorted" translates all texts sorted by
    length, as `throughput` does (batches of batch_size, in_flight at once), and prints
    the sentences per second of that pass."""
    translate(texts[:1])
    print("ready", flush=True)
    texts_by_length = by_length(texts)
    for line in sys.stdin:
        if line.strip() == "sorted":
            rate, _ = throughput(translate, texts_by_length, batch_size, 1, in_flight)
            print(f"{rate:.3f}", flush=True)
        else:
            text = texts[int(line)]
            print(f"{common.seconds(lambda: translate([text])) * 1e3:.3f}", flush=True)


def taking_turns(commands, envs, requests: List[str], pause: float):
    """Each worker command's answers (`serve`'s) to the same requests, the workers (all
    loaded first) taking turns request by request, the first to go rotating from one
    request to the next, `pause` seconds before each request."""
    workers = [subprocess.Popen(c, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                                env={**os.environ, **e}) for c, e in zip(commands, envs)]
    try:
        for w in workers:
            if w.stdout.readline().strip() != "ready":
                raise RuntimeError(f"worker {w.args[-1]} did not start")
        answers = [[] for _ in workers]
        for i, request in enumerate(requests):
            first = i % len(workers)
            for k in [*range(first, len(workers)), *range(first)]:
                time.sleep(pause)
                workers[k].stdin.write(f"{request}\n")
                workers[k].stdin.flush()
                answers[k].append(float(workers[k].stdout.readline()))
        return answers
    finally:
        for w in workers:
            w.stdin.close()
            w.wait()
