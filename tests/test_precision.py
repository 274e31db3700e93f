"""--precision=auto: measured on the machine, recorded in the model directory, kept on
resume, overridden by an explicit flag, and the chief's on every worker."""

import json
import os
import re
import subprocess
import sys

import pytest

from conftest import QUICK, REPO, free_port
from programs import program
from trainer.training.precision import MARGIN, RECORD, faster

AUTO = [*QUICK, "--precision=auto"]  # QUICK names float32: the last value counts
MEASURED = re.compile(r"^precision: (float32|mixed_bfloat16) \((?:([0-9.]+)x (\S+)|(\S+) "
                      r"([0-9.]+)x it, under .*) on this CPU: ([0-9,]+) against ([0-9,]+) "
                      r"tokens/s, measured in \d+ s; --precision= to choose\)$", re.M)


def record(model_dir):
    return json.loads((model_dir / RECORD).read_text())


def trained_in(stdout):
    """The precision of the run's model line ("... 1 replica(s), float32; model_dir ...")."""
    return re.search(r"replica\(s\), (\S+); model_dir", stdout).group(1)


def test_faster_keeps_float32_unless_bfloat16_is_the_margin_faster():
    assert faster({"float32": 100.0, "mixed_bfloat16": 153.0}) == "mixed_bfloat16"
    assert faster({"float32": 100.0, "mixed_bfloat16": 100.0 * MARGIN}) == "mixed_bfloat16"
    assert faster({"float32": 100.0, "mixed_bfloat16": 103.0}) == "float32"
    assert faster({"float32": 153.0, "mixed_bfloat16": 100.0}) == "float32"


@pytest.mark.slow
def test_auto_measures_records_keeps_on_resume_and_yields_to_the_flag(tmp_path):
    model_dir = tmp_path / "run"
    first = program("task", *AUTO, "--train_steps=2", f"--model_dir={model_dir}")
    assert first.returncode == 0, first.stderr[-3000:]
    # The measured line: the choice, its ratio to the other and both rates, as recorded.
    line = MEASURED.search(first.stdout)
    assert line, first.stdout
    saved = record(model_dir)
    rates = saved["rates"]
    assert saved["chosen_by"] == "measured" and set(rates) == {"float32", "mixed_bfloat16"}
    chosen = line.group(1)
    other, = set(rates) - {chosen}
    assert chosen == saved["precision"] == faster(rates) == trained_in(first.stdout)
    printed = float(line.group(2)) if line.group(2) else 1 / float(line.group(5))
    assert printed == pytest.approx(rates[chosen] / rates[other], abs=0.006)
    assert [float(line.group(i).replace(",", "")) for i in (6, 7)] == pytest.approx(
        [rates[chosen], rates[other]], abs=0.5)
    assert 0 < saved["seconds"] <= 60

    # An explicit flag wins over the record, and is recorded in turn.
    explicit = program("task", *QUICK, f"--precision={other}", "--train_steps=4",
                       f"--model_dir={model_dir}")
    assert explicit.returncode == 0, explicit.stderr[-3000:]
    assert "resumed from" in explicit.stdout and trained_in(explicit.stdout) == other
    assert record(model_dir)["precision"] == other

    # A resumed run keeps the recorded precision, which no measurement chose: nothing is
    # timed again.
    resumed = program("task", *AUTO, "--train_steps=6", f"--model_dir={model_dir}")
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert trained_in(resumed.stdout) == other
    assert f"precision: {other} (recorded in {RECORD}" in resumed.stdout
    assert "timing float32 against" not in resumed.stdout


@pytest.mark.slow
def test_every_worker_trains_in_the_chiefs_precision(tmp_path):
    """Two MultiWorkerMirroredStrategy workers on localhost, --precision=auto: the chief
    reads the record (mixed_float16, which no measurement picks, so a worker that chose
    for itself would differ) and the other worker trains in it too."""
    model_dir = tmp_path / "run"
    model_dir.mkdir()
    (model_dir / RECORD).write_text(json.dumps({"precision": "mixed_float16",
                                                "chosen_by": "flag"}))
    workers = [f"localhost:{free_port()}", f"localhost:{free_port()}"]
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2"}
    processes = [subprocess.Popen(
        [sys.executable, "-m", "trainer.task", *AUTO, "--train_steps=2",
         f"--model_dir={model_dir}"], cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        text=True, env={**env, "TF_CONFIG": json.dumps(
            {"cluster": {"worker": workers}, "task": {"type": "worker", "index": index}})})
        for index in range(2)]
    try:
        results = [p.communicate(timeout=300) for p in processes]
    finally:
        for process in processes:
            process.kill()
    assert [p.returncode for p in processes] == [0, 0], results[1][1][-3000:]
    chief, worker = (out for out, _ in results)
    assert trained_in(chief) == trained_in(worker) == "mixed_float16"
    assert "precision: mixed_float16 (the chief's)" in worker
    assert "timing float32 against" not in chief + worker
