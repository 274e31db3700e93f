"""Benchmark: start-up of `python -m trainer.task` at WMT sizes, fresh and resumed.

Two tables, from real runs of the command on a corpus of Multi30k's training pairs
repeated to the size asked for (plain text in a temporary directory; nothing is written
into the project), with the Multi30k recipe's flags (trainer/flagfiles/multi30k.cfg:
`small`, --batch_tokens=4096, --max_len=64, --vocab_size=8000):

  1. --resume_pairs (default 1M): the time from the command's start to its first
     update when it resumes at step 100, 1,000 and 10,000 (--steps), with the training
     stream restored from its saved state (trainer/training/training_stream.py) and, for
     comparison, replayed (the state deleted: how every resume worked before). The
     checkpoints are made in-process by advancing the real stream that many updates and
     saving the trainer at that step, which is what a run that trained would leave
     (minus the weights' values).
  2. --startup_pairs (default 4.5M): the time to the first update and the peak RSS of a
     fresh run (vocabulary on a 1M-pair sample, the counting pass, the model) and of the
     same command resumed after a SIGTERM.
  3. --preempt_after (default 20,60): on Multi30k itself, the time from a SIGTERM, sent
     once the run has logged that many updates, to the exit with status 75 (the update
     in flight finished, its checkpoint and stream state written): what a cloud's
     grace period must cover (issue 13: 30 s on this machine for the recipe).

Each run is stopped (SIGKILL) right after its first progress line. Not a test: run it
by hand, alone on the machine, and copy the tables into the README:

  python bench/resume.py [--resume_pairs=1000000 --steps=100,1000,10000]
                         [--startup_pairs=4500000] [--preempt_after=20,60]
                         [--skip_resume | --skip_startup | --skip_preempt]
"""

import argparse
import gzip
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import List, Tuple

import machine
from machine import MULTI30K

REPO = Path(__file__).resolve().parents[1]
RECIPE = REPO / "trainer" / "flagfiles" / "multi30k.cfg"
FIRST_UPDATE = re.compile(r"^step (\d+)/")


def write_corpus(directory: Path, pairs: int) -> Tuple[str, str]:
    """train.en / train.de with `pairs` lines: Multi30k's training pairs, repeated."""
    directory.mkdir(parents=True, exist_ok=True)
    paths = []
    for language in ("en", "de"):
        lines = gzip.decompress((MULTI30K / f"train.{language}.gz").read_bytes()).splitlines(True)
        path = directory / f"train.{language}"
        with open(path, "wb") as f:
            for start in range(0, pairs, len(lines)):
                f.writelines(lines[:min(len(lines), pairs - start)])
        paths.append(str(path))
    return paths[0], paths[1]


def task_flags(corpus: Tuple[str, str], model_dir: Path) -> List[str]:
    return [f"--flagfile={RECIPE}", f"--train_src={corpus[0]}", f"--train_tgt={corpus[1]}",
            f"--model_dir={model_dir}", "--export_dir=none", "--log_every=1",
            "--max_train_minutes=0", "--train_steps=1000000"]


def first_update(flags: List[str]) -> Tuple[float, float, List[str]]:
    """Runs trainer.task until its first progress line; returns (seconds from start to
    that line, peak RSS in GB, the lines it printed before)."""
    start = time.perf_counter()
    process = subprocess.Popen([sys.executable, "-m", "trainer.task", *flags], cwd=REPO,
                               stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                               env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2"})
    lines = []
    for line in process.stdout:
        if FIRST_UPDATE.match(line):
            seconds = time.perf_counter() - start
            break
        lines.append(line.rstrip())
    else:
        raise RuntimeError("trainer.task ended before its first update:\n" + "\n".join(lines[-20:]))
    process.send_signal(signal.SIGKILL)
    _, _, usage = os.wait4(process.pid, 0)
    return seconds, usage.ru_maxrss / 1e6, lines


def checkpoint_at(model_dir: Path, corpus: Tuple[str, str], step: int):
    """A checkpoint of `step` in model_dir (which has the vocabulary and config.json):
    the recipe's trainer with its stream advanced by `step` updates, saved."""
    code = f"""
import json, sys, keras
from keras_transformer import TransformerConfig
from trainer import config as config_lib
from trainer.data import input_pipeline, sources
from trainer.training import distribute, model_dir as model_dir_lib
from trainer.training.run import build_trainer
keras.utils.set_random_seed(0)
data_config = config_lib.DataConfig(train_src={corpus[0]!r}, train_tgt={corpus[1]!r},
    eval_src="{MULTI30K}/val.en", eval_tgt="{MULTI30K}/val.de", max_len=64, batch_tokens=4096,
    vocab_size=8000)
data = input_pipeline.build(sources.select(data_config), {str(model_dir)!r}, data_config)
run = config_lib.RunConfig(model_dir={str(model_dir)!r}, precision="float32")
trainer = build_trainer(model_dir_lib.load_config({str(model_dir)!r}), data, run,
                        distribute.make_strategy(0))
trainer.restore()
for _ in range({step}):
    trainer.stream.next()
trainer.optimizer.iterations.assign({step})
trainer.save({step})
"""
    subprocess.run([sys.executable, "-c", code], cwd=REPO, check=True,
                   env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2"})


def resume_table(directory: Path, pairs: int, steps: List[int]):
    corpus = write_corpus(directory, pairs)
    base = directory / "fresh"
    seconds, rss, _ = first_update(task_flags(corpus, base))
    print(f"fresh run on {pairs:,} pairs: first update after {seconds:.1f} s "
          f"(vocabulary, counts), peak RSS {rss:.2f} GB", flush=True)
    rows = []
    for step in steps:
        model_dir = directory / f"step{step}"
        model_dir.mkdir()
        for name in ("spm.model", "config.json", "data_counts.json"):
            shutil.copy(base / name, model_dir / name)
        start = time.perf_counter()
        checkpoint_at(model_dir, corpus, step)
        prepared = time.perf_counter() - start
        restored, _, lines = first_update(task_flags(corpus, model_dir))
        assert any("training stream restored" in line for line in lines), lines
        shutil.rmtree(model_dir / "training_stream")
        replayed, _, lines = first_update(task_flags(corpus, model_dir))
        assert any("replaying" in line for line in lines), lines
        rows.append((step, restored, replayed, prepared))
        print(f"  step {step}: restored {restored:.1f} s, replayed {replayed:.1f} s", flush=True)
    print(f"\nTime from start to the first update of a resumed run, {pairs:,} pairs, "
          "the Multi30k recipe's flags (batch_tokens 4096, small):\n")
    print("| resumed at step | stream restored | stream replayed (before) |")
    print("|---:|---:|---:|")
    for step, restored, replayed, _ in rows:
        print(f"| {step:,} | {restored:.1f} s | {replayed:.1f} s |")


def startup_table(directory: Path, pairs: int):
    corpus = write_corpus(directory, pairs)
    model_dir = directory / "startup"
    rows = []
    fresh, fresh_rss, _ = first_update(task_flags(corpus, model_dir))
    rows.append(("fresh (vocabulary, counting pass, model)", fresh, fresh_rss))
    # A checkpoint to resume from, as a preempted run leaves it.
    checkpoint_at(model_dir, corpus, 1)
    resumed, resumed_rss, lines = first_update(task_flags(corpus, model_dir))
    assert any("training stream restored" in line for line in lines), lines
    rows.append(("resumed (counts cached, stream restored)", resumed, resumed_rss))
    print(f"\nStart-up on {pairs:,} pairs ({os.path.getsize(corpus[0]) / 1e6:.0f} + "
          f"{os.path.getsize(corpus[1]) / 1e6:.0f} MB of text), the Multi30k recipe's flags:\n")
    print("| run | time to first update | peak RSS |")
    print("|---|---:|---:|")
    for name, seconds, rss in rows:
        print(f"| {name} | {seconds / 60:.1f} min ({seconds:.0f} s) | {rss:.2f} GB |")


def preemption_table(directory: Path, after_steps: List[int]):
    corpus = (str(MULTI30K / "train.en.gz"), str(MULTI30K / "train.de.gz"))
    rows = []
    for after in after_steps:
        model_dir = directory / f"preempt{after}"
        process = subprocess.Popen(
            [sys.executable, "-m", "trainer.task", *task_flags(corpus, model_dir)], cwd=REPO,
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
            env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2"})
        for line in process.stdout:
            match = FIRST_UPDATE.match(line)
            if match and int(match.group(1)) >= after:
                break
        else:
            raise RuntimeError("trainer.task ended before the signal:\n"
                               + process.stderr.read()[-3000:])
        # The rest of stdout, each line with the time it came (the progress line of the
        # update in flight tells how long that update took).
        stdout = []
        drain = threading.Thread(target=lambda: stdout.extend(
            (time.perf_counter(), line) for line in process.stdout))
        drain.start()
        signalled = time.perf_counter()
        process.send_signal(signal.SIGTERM)
        stderr, said = [], None
        for line in process.stderr:
            stderr.append(line)
            if said is None and "preempted by SIGTERM" in line:
                said = time.perf_counter() - signalled
        process.wait(timeout=600)
        seconds = time.perf_counter() - signalled
        drain.join()
        last = "".join(stderr).strip().splitlines()[-1]
        assert process.returncode == 75 and said is not None, "".join(stderr)[-3000:]
        steps = [(at - signalled, line) for at, line in stdout if FIRST_UPDATE.match(line)]
        in_flight = f"{steps[-1][0]:.1f} s" if steps else "-"
        rows.append((after, in_flight, said, seconds, last))
        print(f"  SIGTERM after {after} updates: last update logged after {in_flight}, its "
              f"line after {said:.1f} s, exit 75 after {seconds:.1f} s", flush=True)
    print("\nFrom SIGTERM to exit, the Multi30k recipe's flags on Multi30k (the update in "
          "flight's progress line, the program's last line, the exit):\n")
    print("| signalled after | update in flight logged | last line | exit | the last line |")
    print("|---:|---:|---:|---:|---|")
    for after, in_flight, said, seconds, last in rows:
        print(f"| {after} updates | {in_flight} | {said:.1f} s | {seconds:.1f} s | `{last}` |")


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--resume_pairs", type=int, default=1_000_000)
    parser.add_argument("--steps", default="100,1000,10000")
    parser.add_argument("--startup_pairs", type=int, default=4_500_000)
    parser.add_argument("--skip_resume", action="store_true")
    parser.add_argument("--skip_startup", action="store_true")
    parser.add_argument("--preempt_after", default="20,60")
    parser.add_argument("--skip_preempt", action="store_true")
    args = parser.parse_args()
    print(machine.describe(), flush=True)
    with tempfile.TemporaryDirectory() as directory:
        if not args.skip_resume:
            resume_table(Path(directory) / "resume",
                         args.resume_pairs, [int(s) for s in args.steps.split(",")])
        if not args.skip_startup:
            startup_table(Path(directory) / "startup", args.startup_pairs)
        if not args.skip_preempt:
            preemption_table(Path(directory), [int(s) for s in args.preempt_after.split(",")])


if __name__ == "__main__":
    main()
