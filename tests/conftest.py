"""Shared test set-up: quiet TensorFlow logs, paths to the shared data, and one tiny
model trained and exported once per session by the real `python -m trainer.task` in a
subprocess (the fixtures `exported`, `loaded`, `translator`, `sentencepiece`), which every
export, signature and CLI test shares (under pytest-xdist, all workers: trained once)."""

import dataclasses
import fcntl
import os
import subprocess
import sys
from pathlib import Path

import pytest

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

REPO = Path(__file__).resolve().parents[1]
SHARED_DATA = REPO.parent / "shared" / "data"
MULTI30K = SHARED_DATA / "multi30k"

_CACHE = {}


@dataclasses.dataclass(frozen=True)
class Exported:
    model_dir: Path
    export_dir: Path
    version_dir: Path
    task_stdout: str


def run(args, cwd, timeout=600, input=None, env=None):
    """Runs a command, failing the test with its output if it fails."""
    result = subprocess.run(args, cwd=cwd, input=input, capture_output=True, timeout=timeout,
                            env=env)
    if result.returncode != 0:
        raise AssertionError(f"{args} exited {result.returncode}:\n"
                             f"{result.stdout.decode(errors='replace')[-3000:]}\n"
                             f"{result.stderr.decode(errors='replace')[-3000:]}")
    return result


def _train_and_export(root: Path) -> Exported:
    """Trains and exports in `root`, unless a run there has already done so (under
    pytest-xdist, every worker's session asks for the same directory, one at a time)."""
    model_dir, export_dir = root / "model", root / "export"
    stdout = root / "task_stdout.txt"  # written once the run has succeeded
    if not stdout.exists():
        # 30 steps: a model that translates badly but fast; the tests check plumbing and
        # properties that hold for any weights.
        result = run([sys.executable, "-m", "trainer.task", "--train_steps=30",
                      "--warmup_steps=30", "--eval_every=0", "--checkpoint_every=15",
                      "--log_every=30", f"--model_dir={model_dir}",
                      f"--export_dir={export_dir}"], cwd=root, env=_env())
        stdout.write_bytes(result.stdout)
    return Exported(model_dir, export_dir, export_dir / "1", stdout.read_text())


@dataclasses.dataclass(frozen=True)
class MainJob:
    directory: Path
    stdout: str


# The main job as the README runs it: `python -m trainer.task` with no flags.
MAIN_JOB = "python -m trainer.task"


@pytest.fixture(scope="session")
def main_job(tmp_path_factory) -> MainJob:
    """The README's main job, run once in a fresh directory by the files of the
    xdist_group "main_job" (one worker): runs/tiny_builtin and saved_models/tiny_builtin
    there are a model that translates the builtin corpus."""
    if "main_job" not in _CACHE:
        directory = tmp_path_factory.mktemp("main_job")
        job = run(["bash", "-c", MAIN_JOB], cwd=directory, env=_env(), timeout=1200)
        _CACHE["main_job"] = MainJob(directory, job.stdout.decode("utf-8"))
    return _CACHE["main_job"]


def _session_directory(tmp_path_factory, name: str):
    """(directory, lock) for what the whole test run shares: a fresh directory, or under
    pytest-xdist the one all workers share (beside their own), with an exclusive lock
    that the caller holds until it has made or found what it needs there."""
    if "PYTEST_XDIST_WORKER" not in os.environ:
        directory = tmp_path_factory.mktemp(name)
        return directory, None
    directory = tmp_path_factory.getbasetemp().parent / name
    directory.mkdir(exist_ok=True)
    lock = open(directory.parent / f"{name}.lock", "w")
    fcntl.flock(lock, fcntl.LOCK_EX)
    return directory, lock


def _env():
    return {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2", "PYTHONPATH": str(REPO)}


@pytest.fixture(scope="session")
def exported(tmp_path_factory) -> Exported:
    if "exported" not in _CACHE:
        directory, lock = _session_directory(tmp_path_factory, "export_session")
        try:
            _CACHE["exported"] = _train_and_export(directory)
        finally:
            if lock is not None:
                lock.close()  # releases it
    return _CACHE["exported"]


@pytest.fixture(scope="session")
def loaded(exported):
    """The export loaded in this process (tensorflow_text imported first)."""
    if "loaded" not in _CACHE:
        import tensorflow as tf
        import tensorflow_text  # noqa: F401
        _CACHE["loaded"] = tf.saved_model.load(str(exported.version_dir))
    return _CACHE["loaded"]


@pytest.fixture(scope="session")
def translator(exported):
    """The in-process Translator of the exported model directory (float32, latest
    checkpoint), what the export saved."""
    if "translator" not in _CACHE:
        from trainer.serving import saved_model
        _CACHE["translator"] = saved_model.build_translator(str(exported.model_dir))[0]
    return _CACHE["translator"]


@pytest.fixture(scope="session")
def sentencepiece(exported):
    """The exported vocabulary (assets/spm.model) in the sentencepiece package."""
    import sentencepiece as spm
    return spm.SentencePieceProcessor(model_file=str(exported.version_dir / "assets" /
                                                     "spm.model"))


def sources(n: int):
    """n different sentences of the builtin corpus' source language (English numbers)."""
    from trainer.data import builtin_corpus
    return [builtin_corpus.english(7 + 389 * i) for i in range(n)]


def pytest_collection_modifyitems(config, items):
    """The files that train a model of their own (an xdist_group, each on one worker) take
    the longest: they start first, so that the short tests fill in beside them instead of
    leaving a worker idle while the last of them runs alone."""
    items.sort(key=lambda item: item.get_closest_marker("xdist_group") is None)
