"""The progress line tells the truth: the ETA of a run with a time budget is the budget's end,
and in a log file (not a terminal) every report is a line of its own."""

import io
import re
import time

import tensorflow as tf

from trainer.training.progress import TrainingProgress, StepStatistics


def statistics():
    return StepStatistics(*(tf.constant(v) for v in (3.5, 0.4, 900.0, 880.0, 1.2, 1.0, 1e-3)))


def eta_seconds(line):
    clock = re.search(r"ETA (\d+(?::\d\d)+)$", line).group(1)
    seconds = 0
    for part in clock.split(":"):
        seconds = 60 * seconds + int(part)
    return seconds


def test_with_a_time_budget_the_eta_is_the_budgets_end_not_train_steps(tmp_path):
    budget, steps = 60, 10 ** 6  # a million steps at 10 per 0.05 s: 5,000 s
    etas = []
    for deadline in (time.time() + budget, None):
        stream = io.StringIO()
        progress = TrainingProgress(str(tmp_path / str(len(etas))), train_steps=steps, log_every=10,
                               start_step=0, deadline=deadline, stream=stream)
        time.sleep(0.05)
        progress.update(10, statistics(), tokens=17800)
        etas.append(eta_seconds(stream.getvalue().splitlines()[-1]))
    assert budget - 5 <= etas[0] <= budget, etas
    assert etas[1] > 10 * budget, etas  # without a budget: train_steps at this pace


def test_in_a_log_file_every_report_is_one_line(tmp_path):
    stream = io.StringIO()  # not a terminal
    progress = TrainingProgress(str(tmp_path), train_steps=30, log_every=10, start_step=0,
                           stream=stream)
    for step in (10, 20, 30):
        progress.update(step, statistics(), tokens=1000)
    progress.close()
    lines = stream.getvalue().split("\n")
    assert lines[-1] == "" and "\r" not in stream.getvalue()
    assert [line.split()[1] for line in lines[:-1]] == ["10/30", "20/30", "30/30"]
