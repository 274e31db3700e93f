"""Benchmark: how long do start-up, resume and preemption take? `python -m trainer.task` at
WMT sizes, fresh and resumed, and from a SIGTERM to its exit.

Four tables, from real runs of the command on a corpus of Multi30k's training pairs
repeated to the size asked for (plain text in a temporary directory; nothing is written
into the project), with the Multi30k recipe's flags (trainer/flagfiles/multi30k.cfg:
`small`, --batch_tokens=4096, --max_len=64, --vocab_size=8000, --ema_decay=0.9999):

  0. A checkpoint's size and time: the model checkpoint, the training stream's state
     beside it, and the seconds of a save (and of its stream state's part) at
     --checkpoint_steps (20,40,60), for the builtin run (its flagfile), and the recipe on
     Multi30k and on --checkpoint_pairs (default 1M) pairs.
  1. --resume_pairs (default 1M): the time from the command's start to its first
     update when it resumes at step 100, 1,000 and 10,000 (--steps), with the training
     stream restored from its saved state (trainer/training/stream.py) and, for
     comparison, replayed (the state deleted: how a checkpoint without one resumes). The
     checkpoints are made in a process of their own by the recipe's trainer (the
     RunConfig that trainer/task.py makes of the same flags, its moving average
     included), its stream advanced that many updates and saved at that step: what a
     run that trained would leave, minus the weights' values.
  2. --startup_pairs (default 4.5M): the time to the first update and the peak RSS of a
     fresh run (vocabulary on a 1M-pair sample, the counting pass, the model) and of the
     same command resumed from a checkpoint of step 1.
  3. --preempt_after (default 20,60): on Multi30k itself, the time from a SIGTERM, sent
     once the run has logged that many updates, to the exit with status 75 (the update
     in flight finished, its checkpoint and stream state written): what a cloud's
     grace period must cover.

Each run is stopped (SIGKILL) right after its first progress line. About 15 minutes. Not
a test: run it by hand from the repository root, alone on the machine, and copy the tables
into docs/performance.md:

  python bench/resume.py [--checkpoint_pairs=1000000 --checkpoint_steps=20,40,60]
                         [--resume_pairs=1000000 --steps=100,1000,10000]
                         [--startup_pairs=4500000] [--preempt_after=20,60]
                         [--skip_checkpoint | --skip_resume | --skip_startup |
                          --skip_preempt]

(--resume_pairs=29000 --steps=1 --startup_pairs=29000 --preempt_after=1, Multi30k once:
the same code paths in a few minutes.)
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

import common
import results_file

RECIPE = common.REPO / "trainer" / "flagfiles" / "multi30k.cfg"
FIRST_UPDATE = re.compile(r"^step (\d+)/")
QUIET = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2"}


def write_corpus(directory: Path, pairs: int) -> Tuple[str, str]:
    """train.en / train.de with `pairs` lines: Multi30k's training pairs, repeated."""
    directory.mkdir(parents=True, exist_ok=True)
    paths = []
    for language in ("en", "de"):
        lines = gzip.decompress((common.MULTI30K / f"train.{language}.gz").read_bytes()
                                ).splitlines(True)
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
    process = subprocess.Popen([sys.executable, "-m", "trainer.task", *flags], cwd=common.REPO,
                               stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                               env=QUIET)
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


# The recipe's trainer, built from the same flags as trainer.task builds it
# (trainer/main_job.py), its stream advanced and the trainer saved.
CHECKPOINT_AT = """
import dataclasses, sys, time
import keras
from absl import flags
from trainer import task
from trainer.data import input_pipeline, sources
from trainer.main_job import build_trainer
from trainer.model_dir import layout
from trainer.training import distribute, precision
flags.FLAGS(["trainer.task", *sys.argv[2:]])
data_config = task.data_config()
run = task.run_config(data_config)
strategy = distribute.make_strategy(run.num_cpu_replicas)
data = input_pipeline.build(sources.select(data_config), run.model_dir, data_config)
model_config = layout.load_config(run.model_dir)
run = dataclasses.replace(run, precision=precision.choose(model_config, data, run,
                                                          strategy).precision)
keras.utils.set_random_seed(run.seed)
trainer = build_trainer(model_config, data, run, strategy)
trainer.restore()
step = 0
for target in (int(s) for s in sys.argv[1].split(",")):
    for _ in range(target - step):
        trainer.stream.next()
    step = target
    trainer.optimizer.iterations.assign(step)
    start = time.perf_counter()
    trainer.stream.save(step)  # what trainer.save does, timed in its two parts
    middle = time.perf_counter()
    trainer.checkpointer.save(step)
    print(f"saved {step} {time.perf_counter() - start:.4f} {middle - start:.4f}", flush=True)
"""


def checkpoint_at(model_dir: Path, flags: List[str], steps: List[int]) -> List[float]:
    """Checkpoints of `steps` in model_dir (which has the vocabulary, config.json and the
    data counts): the trainer of these trainer.task flags with its stream advanced to each
    step, saved there; returns each save's (seconds, of which the stream state's)."""
    output = subprocess.run([sys.executable, "-c", CHECKPOINT_AT, ",".join(map(str, steps)),
                             *flags], cwd=common.REPO, check=True, env=QUIET,
                            stdout=subprocess.PIPE, text=True).stdout
    return [(float(line.split()[2]), float(line.split()[3])) for line in output.splitlines()
            if line.startswith("saved ")]


def megabytes(directory: Path, pattern: str) -> float:
    """The size of the files matching `pattern` under `directory`, in MB."""
    return sum(path.stat().st_size for path in directory.glob(pattern)) / 1e6


def measure_checkpoints(directory: Path, pairs: int, steps: List[int]):
    """[(run, its training pairs, model checkpoint MB, stream state MB, [seconds of each
    checkpoint])] for the builtin run, and the recipe's on Multi30k and on `pairs` pairs."""
    multi30k = (str(common.MULTI30K / "train.en.gz"), str(common.MULTI30K / "train.de.gz"))
    builtin = common.REPO / "trainer" / "flagfiles" / "builtin.cfg"
    runs = [("builtin run", "20,000", lambda model_dir: [
                f"--flagfile={builtin}", f"--model_dir={model_dir}", "--export_dir=none",
                "--log_every=1"]),
            ("Multi30k, recipe", "29,000", lambda model_dir: task_flags(multi30k, model_dir)),
            (f"{pairs:,} pairs, recipe", f"{pairs:,}", lambda model_dir: task_flags(
                write_corpus(directory / "corpus", pairs), model_dir))]
    rows = []
    for index, (name, size, flags_of) in enumerate(runs):
        model_dir = directory / f"checkpoints{index}"
        flags = flags_of(model_dir)
        first_update(flags)  # the vocabulary, config.json and the counts
        shutil.rmtree(model_dir / "training_stream", ignore_errors=True)
        seconds = checkpoint_at(model_dir, flags, steps)
        step = steps[-1]
        rows.append((name, size, megabytes(model_dir, f"ckpt-{step}.*"),
                     megabytes(model_dir, f"training_stream/*/ckpt-{step}.*"), seconds))
        print(f"  {name}: model {rows[-1][2]:.1f} MB, stream state {rows[-1][3]:.2f} MB, "
              f"saves {', '.join(f'{s:.2f} ({t:.2f})' for s, t in seconds)} s", flush=True)
    return rows


def print_checkpoint_table(rows, steps: List[int]):
    def median(values):
        return sorted(values)[len(values) // 2]

    common.print_table(
        ["run", "training pairs", "model checkpoint", "stream state", "a checkpoint (median)",
         "of which the stream state"],
        [[name, size, f"{model:.1f} MB", f"{stream:.2f} MB",
          f"{median([total for total, _ in seconds]):.2f} s",
          f"{median([part for _, part in seconds]):.2f} s"]
         for name, size, model, stream, seconds in rows],
        text_columns=1, title="\nA checkpoint's size and time: the model's (weights, optimizer, "
        f"moving average) and the training stream's state, saved at steps {steps}:")


def measure_resume(directory: Path, pairs: int, steps: List[int]):
    """[(step, seconds to the first update with the stream restored, replayed)]."""
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
        checkpoint_at(model_dir, task_flags(corpus, model_dir), [step])
        restored, _, lines = first_update(task_flags(corpus, model_dir))
        assert any("training stream restored" in line for line in lines), lines
        shutil.rmtree(model_dir / "training_stream")
        replayed, _, lines = first_update(task_flags(corpus, model_dir))
        assert any("replaying" in line for line in lines), lines
        rows.append((step, restored, replayed))
        print(f"  step {step}: restored {restored:.1f} s, replayed {replayed:.1f} s", flush=True)
    return rows


def print_resume_table(rows, pairs: int):
    common.print_table(
        ["resumed at step", "stream restored", "stream replayed"],
        [[f"{step:,}", f"{restored:.1f} s", f"{replayed:.1f} s"]
         for step, restored, replayed in rows],
        title=f"\nTime from start to the first update of a resumed run, {pairs:,} pairs, the "
              "Multi30k recipe's flags (batch_tokens 4096, small):")


def measure_startup(directory: Path, pairs: int):
    """([(run, seconds to the first update, peak RSS GB)], the corpus' two files)."""
    corpus = write_corpus(directory, pairs)
    model_dir = directory / "startup"
    rows = []
    fresh, fresh_rss, _ = first_update(task_flags(corpus, model_dir))
    rows.append(("fresh (vocabulary, counting pass, model)", fresh, fresh_rss))
    # A checkpoint to resume from, as a preempted run leaves it.
    checkpoint_at(model_dir, task_flags(corpus, model_dir), [1])
    resumed, resumed_rss, lines = first_update(task_flags(corpus, model_dir))
    assert any("training stream restored" in line for line in lines), lines
    rows.append(("resumed (counts cached, stream restored)", resumed, resumed_rss))
    return rows, corpus


def print_startup_table(rows, corpus, pairs: int):
    megabytes = " + ".join(f"{os.path.getsize(path) / 1e6:.0f}" for path in corpus)
    common.print_table(
        ["run", "time to first update", "peak RSS"],
        [[name, f"{seconds / 60:.1f} min ({seconds:.0f} s)", f"{rss:.2f} GB"]
         for name, seconds, rss in rows],
        title=f"\nStart-up on {pairs:,} pairs ({megabytes} MB of text), the Multi30k recipe's "
              "flags:")


def preempt(model_dir: Path, after: int):
    """One run on Multi30k, SIGTERM once it has logged `after` updates: (seconds from the
    signal to the update in flight's line, to the program's last line, to the exit; that
    line)."""
    corpus = (str(common.MULTI30K / "train.en.gz"), str(common.MULTI30K / "train.de.gz"))
    process = subprocess.Popen(
        [sys.executable, "-m", "trainer.task", *task_flags(corpus, model_dir)], cwd=common.REPO,
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=QUIET)
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
    assert process.returncode == 75 and said is not None, "".join(stderr)[-3000:]
    steps = [at - signalled for at, line in stdout if FIRST_UPDATE.match(line)]
    in_flight = f"{steps[-1]:.1f} s" if steps else "-"
    return in_flight, said, seconds, "".join(stderr).strip().splitlines()[-1]


def measure_preemption(directory: Path, after_steps: List[int]):
    rows = []
    for after in after_steps:
        in_flight, said, seconds, last = preempt(directory / f"preempt{after}", after)
        rows.append((after, in_flight, said, seconds, last))
        print(f"  SIGTERM after {after} updates: last update logged after {in_flight}, its "
              f"line after {said:.1f} s, exit 75 after {seconds:.1f} s", flush=True)
    return rows


def print_preemption_table(rows):
    common.print_table(
        ["signalled after", "update in flight logged", "last line", "exit", "the last line"],
        [[f"{after} updates", in_flight, f"{said:.1f} s", f"{seconds:.1f} s", f"`{last}`"]
         for after, in_flight, said, seconds, last in rows],
        text_columns=(0, 4),
        title="\nFrom SIGTERM to exit, the Multi30k recipe's flags on Multi30k "
        "(the update in flight's progress line, the program's last line, the exit):")


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--resume_pairs", type=int, default=1_000_000)
    parser.add_argument("--steps", default="100,1000,10000")
    parser.add_argument("--startup_pairs", type=int, default=4_500_000)
    parser.add_argument("--skip_resume", action="store_true")
    parser.add_argument("--skip_startup", action="store_true")
    parser.add_argument("--preempt_after", default="20,60")
    parser.add_argument("--skip_preempt", action="store_true")
    parser.add_argument("--checkpoint_pairs", type=int, default=1_000_000)
    parser.add_argument("--checkpoint_steps", default="20,40,60")
    parser.add_argument("--skip_checkpoint", action="store_true")
    results_file.add_results_flag(parser, None)
    args = parser.parse_args(argv)
    parts = [name for name, skip in (("checkpoints", args.skip_checkpoint),
                                     ("resume", args.skip_resume),
                                     ("startup", args.skip_startup),
                                     ("preemption", args.skip_preempt)) if not skip]
    if args.results is None:  # the default: what this run measures
        args.results = "-".join(parts)
    common.print_header([("machine", common.describe()), ("command", common.command())])
    with tempfile.TemporaryDirectory() as directory:
        if not args.skip_checkpoint:
            steps = [int(s) for s in args.checkpoint_steps.split(",")]
            print_checkpoint_table(measure_checkpoints(
                Path(directory) / "checkpoints", args.checkpoint_pairs, steps), steps)
        if not args.skip_resume:
            rows = measure_resume(Path(directory) / "resume", args.resume_pairs,
                                  [int(s) for s in args.steps.split(",")])
            print_resume_table(rows, args.resume_pairs)
        if not args.skip_startup:
            print_startup_table(*measure_startup(Path(directory) / "startup",
                                                 args.startup_pairs), args.startup_pairs)
        if not args.skip_preempt:
            print_preemption_table(measure_preemption(
                Path(directory), [int(s) for s in args.preempt_after.split(",")]))
    results_file.write_results("resume", args.results,
                         "python -m trainer.task with the Multi30k recipe's flags: "
                         + ", ".join(parts))


if __name__ == "__main__":
    main()
