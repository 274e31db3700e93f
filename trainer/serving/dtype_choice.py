"""The choice of `trainer.export --serving_dtype=auto --calibration=FILE`: build every serving
dtype, time each on this machine as a server runs it, keep the fastest that agrees with float32.

Which dtype is fastest depends on the CPU, and its flags do not tell: bfloat16 can be slower
than float32 on a CPU with AVX-512 BF16, and int8_bfloat16 the fastest on another. So each
candidate (float32, bfloat16, int8, int8_bfloat16; without the int8 ones under --xla) is
written as a SavedModel into a staging directory of the export directory (`.tmp-<uuid>`, never
a version a server sees), then timed in a Python process of its own that loads it as a server
does: TensorFlow's intra-op pool of 1 thread and inter-op pool of 2, two requests in flight,
TF_ONEDNN_ASSUME_FROZEN_WEIGHTS=1 and oneDNN's primitive cache at 16,384 (docs/serving.md),
the first `sentences` (SENTENCES) of the calibration file sorted by length in batches of 64.
Each process makes an untimed pass first (its translations are the ones compared with
float32's), then the candidates take turns, one timed pass each a round for `rounds` rounds
(the first of a round changing from round to round), so a drift of the machine's speed falls
on all alike; a candidate's figure is the median sentences/s of its rounds.

The agreement rule (`verdict`): a candidate whose translations equal float32's on fewer than
MIN_IDENTICAL of the sentences, or score below MIN_BLEU sacreBLEU with float32's as the
reference, is dropped; float32 always passes. The fastest kept one is published; the choice,
the rule and every candidate's figures go into its export.json ("serving_dtype_choice"), and
the table is printed. The choice holds for the kind of host it was measured on.
"""

import contextlib
import dataclasses
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Callable, Dict, Iterator, List, Sequence, Tuple

from trainer import cli
from trainer.model_dir import files

REFERENCE = "float32"
MIN_IDENTICAL = 0.8  # share of sentences whose translation equals float32's
MIN_BLEU = 80.0  # sacreBLEU against float32's translations
RULE = (f"kept if its translations equal {REFERENCE}'s on at least {MIN_IDENTICAL:.0%} of the "
        f"sentences and score at least {MIN_BLEU:g} sacreBLEU with {REFERENCE}'s as the "
        f"reference ({REFERENCE} always kept); the fastest kept is chosen")
SENTENCES = 512  # the calibration file's first lines that are timed
ROUNDS = 3
BATCH = 64
IN_FLIGHT = 2  # requests at once, each op on one thread: TensorFlow's pools 1 and 2
SERVER_ENV = {"TF_ONEDNN_ASSUME_FROZEN_WEIGHTS": "1",
              "ONEDNN_PRIMITIVE_CACHE_CAPACITY": str(cli.ONEDNN_PRIMITIVE_CACHE_CAPACITY)}


@dataclasses.dataclass
class Candidate:
    """One serving dtype's figures: the median and every round's sentences/s, the share of
    sentences translated as float32 translates them, sacreBLEU against float32's, and
    whether the rule kept it (reason: why not)."""

    serving_dtype: str
    sentences_per_second: float
    rounds: List[float]
    identical_to_float32: float
    bleu_vs_float32: float
    kept: bool = True
    reason: str = ""


def agreement(outputs: Sequence[str], reference: Sequence[str]) -> Tuple[float, float]:
    """(share of outputs equal to reference's, sacreBLEU of outputs with reference as the
    reference translations); identical lists are (1.0, 100.0)."""
    if list(outputs) == list(reference):
        return 1.0, 100.0
    import sacrebleu
    identical = sum(a == b for a, b in zip(outputs, reference)) / len(reference)
    return identical, sacrebleu.corpus_bleu(list(outputs), [list(reference)]).score


def verdict(serving_dtype: str, identical: float, bleu: float,
            reference: str = REFERENCE) -> str:
    """Why the agreement rule drops a candidate ("" when it keeps it); `reference` always
    passes."""
    if serving_dtype == reference:
        return ""
    if identical < MIN_IDENTICAL:
        return f"{identical:.1%} identical to {reference} (< {MIN_IDENTICAL:.0%})"
    if bleu < MIN_BLEU:
        return f"sacreBLEU {bleu:.1f} against {reference} (< {MIN_BLEU:g})"
    return ""


def choose(candidates: Sequence[Candidate]) -> Candidate:
    """The kept candidate of the highest sentences/s."""
    return max((c for c in candidates if c.kept), key=lambda c: c.sentences_per_second)


@contextlib.contextmanager
def fastest(model_dir: str, export_dir: str, options, dtypes: Sequence[str],
            write: Callable[[str, str, str, object], dict], sentences: int = SENTENCES,
            rounds: int = ROUNDS) -> Iterator[Tuple[files.StagingDirectory, dict]]:
    """(staging directory, export.json's info) of the fastest kept of `dtypes` (REFERENCE
    first), for the caller to publish inside the `with`; every candidate is written by
    write(model_dir, export_dir, path, options of that dtype) (saved_model.write) into a
    staging directory of export_dir, all removed on leaving but a published one. `options`:
    saved_model.Options with serving_dtype "auto"; its calibration file's first `sentences`
    are timed for `rounds` rounds."""
    texts = timed_texts(options.calibration, sentences)
    with contextlib.ExitStack() as stack:
        staged, infos = {}, {}
        for dtype in dtypes:
            staged[dtype] = stack.enter_context(files.staged_directory(export_dir))
            candidate = dataclasses.replace(
                options, serving_dtype=dtype,
                calibration=options.calibration if dtype == "int8_bfloat16" else "")
            print(f"serving_dtype=auto: building {dtype}", file=sys.stderr, flush=True)
            infos[dtype] = write(model_dir, export_dir, staged[dtype].path, candidate)
        candidates = measure({dtype: s.path for dtype, s in staged.items()}, texts, rounds)
        chosen = choose(candidates)
        print(table(candidates), flush=True)
        print(f"serving dtype: {chosen.serving_dtype}, the fastest kept on this machine",
              flush=True)
        record = {"chosen": chosen.serving_dtype, "rule": RULE,
                  "min_identical_to_float32": MIN_IDENTICAL, "min_bleu_vs_float32": MIN_BLEU,
                  "measured_on": {"host": host(), "calibration": options.calibration,
                                  "sentences": len(texts), "batch_size": BATCH,
                                  "in_flight": IN_FLIGHT, "intra_op_threads": 1,
                                  "inter_op_threads": IN_FLIGHT, "env": SERVER_ENV,
                                  "rounds": rounds, "figure": "median of the rounds"},
                  "candidates": [dataclasses.asdict(c) for c in candidates]}
        yield staged[chosen.serving_dtype], {**infos[chosen.serving_dtype],
                                             "serving_dtype_choice": record}


def timed_texts(path: str, sentences: int = SENTENCES, flag: str = "--calibration"
                ) -> List[str]:
    """The first `sentences` non-empty lines of the text file `path` (at most 1,000),
    sorted by length in words, as a server's batches would be; ValueError naming `flag`
    and the file if it has none."""
    from trainer.serving import calibration  # TensorFlow: not in a worker before its pools
    return sorted(calibration.read_sentences(path, flag)[:sentences],
                  key=lambda t: len(t.split()))


def measure(paths: Dict[str, str], texts: List[str], rounds: int) -> List[Candidate]:
    """Every SavedModel of paths ({name: version directory}, the reference of the
    agreement rule first: REFERENCE's) timed on texts in a worker process of its own,
    taking turns for `rounds` rounds, with the agreement rule applied. Each worker loads
    and answers its untimed pass before the next starts: none competes with another for
    the cores but in turn."""
    with contextlib.ExitStack() as stack:
        workers, outputs = {}, {}
        for dtype, path in paths.items():  # one loads and warms up at a time
            workers[dtype] = stack.enter_context(_Worker(path, texts))
            outputs[dtype] = workers[dtype].result()["outputs"]
        seconds = {dtype: [] for dtype in paths}
        order = list(paths)
        for r in range(rounds):
            for dtype in order[r % len(order):] + order[:r % len(order)]:
                seconds[dtype].append(workers[dtype].timed_pass())
    candidates, reference = [], next(iter(paths))
    for dtype in paths:
        identical, bleu = agreement(outputs[dtype], outputs[reference])
        rates = [round(len(texts) / s, 1) for s in seconds[dtype]]
        reason = verdict(dtype, identical, bleu, reference)
        candidates.append(Candidate(dtype, statistics.median(rates), rates,
                                    round(identical, 4), round(bleu, 2), kept=not reason,
                                    reason=reason))
    return candidates


def table(candidates: Sequence[Candidate]) -> str:
    """One row per candidate: sentences/s, identical to the first's, sacreBLEU against
    them, kept or why dropped."""
    width = max(14, *(len(c.serving_dtype) + 1 for c in candidates))
    rows = [f"{'serving_dtype':<{width}} {'sentences/s':>11} {'identical':>9} "
            f"{'sacreBLEU':>9}  kept"]
    for c in candidates:
        rows.append(f"{c.serving_dtype:<{width}} {c.sentences_per_second:>11.1f} "
                    f"{c.identical_to_float32:>9.1%} {c.bleu_vs_float32:>9.1f}  "
                    f"{'kept' if c.kept else 'dropped: ' + c.reason}")
    return "\n".join(rows)


def host() -> str:
    """The CPU's model name (/proc/cpuinfo), else Python's platform.processor()."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    import platform
    return platform.processor() or platform.machine()


class _Worker:
    """A `python -m trainer.serving.dtype_choice` process serving one SavedModel: it reads
    a JSON request ({"path", "texts"}) on stdin, answers {"outputs"} after its untimed
    pass, then {"seconds"} of a timed pass for each "time" line."""

    def __init__(self, path: str, texts: List[str]):
        self.path = path
        self.log = tempfile.TemporaryFile()
        env = {**os.environ, **SERVER_ENV}
        env.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
        self.process = subprocess.Popen(
            [sys.executable, "-m", "trainer.serving.dtype_choice"], stdin=subprocess.PIPE,
            stdout=subprocess.PIPE, stderr=self.log, env=env, text=True, encoding="utf-8")
        self._send(json.dumps({"path": path, "texts": texts}))

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        if self.process.poll() is None:
            self.process.stdin.close()
            try:
                self.process.wait(timeout=60)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        self.log.close()

    def _send(self, line: str):
        self.process.stdin.write(line + "\n")
        self.process.stdin.flush()

    def result(self) -> dict:
        """The worker's next answer; RuntimeError with its stderr's end if it died."""
        for line in self.process.stdout:
            if line.startswith("{"):
                return json.loads(line)
        self.process.wait()
        self.log.seek(0)
        tail = self.log.read().decode("utf-8", errors="replace")[-2000:]
        raise RuntimeError(f"timing {self.path} failed (status {self.process.returncode}):"
                           f"\n{tail}")

    def timed_pass(self) -> float:
        self._send("time")
        return self.result()["seconds"]


def _worker():
    """The worker's side of _Worker: TensorFlow's pools set before anything runs, the
    SavedModel loaded as a server loads it, serving_default on batches of BATCH with
    IN_FLIGHT requests at once."""
    request = json.loads(sys.stdin.readline())
    import tensorflow as tf
    tf.config.threading.set_intra_op_parallelism_threads(1)
    tf.config.threading.set_inter_op_parallelism_threads(IN_FLIGHT)
    import tensorflow_text  # noqa: F401  (registers the SentencePiece ops)
    function = tf.saved_model.load(request["path"]).signatures["serving_default"]
    texts = request["texts"]
    batches = [texts[i:i + BATCH] for i in range(0, len(texts), BATCH)]

    def translate(batch):
        outputs = function(inputs=tf.constant(batch))["translations"].numpy()
        return [t.decode("utf-8") for t in outputs]

    with ThreadPoolExecutor(max_workers=IN_FLIGHT) as pool:

        def translate_all():  # IN_FLIGHT batches at once, each the next one left
            futures = [pool.submit(translate, batch) for batch in batches]
            return [t for future in futures for t in future.result()]

        print(json.dumps({"outputs": translate_all()}), flush=True)
        for line in sys.stdin:
            start = time.perf_counter()
            translate_all()
            print(json.dumps({"seconds": time.perf_counter() - start}), flush=True)


if __name__ == "__main__":
    _worker()
