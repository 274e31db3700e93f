"""Shared test set-up: quiet TensorFlow logs, where the Multi30k files are (and the skip of a test
that reads them where they are not), and what a test run builds once for all its tests and workers
(`built_once`): one tiny model trained and exported by the real `python -m trainer.task` (the
fixtures `exported`, `loaded`, `translator`, `sentencepiece`), which every export, signature and CLI
test shares, and the README's main job (`main_job`). Also what several test files share, so that no
test module imports another: the decoding tests' copy task (`copy_model`, `copy_sources`, `decode`,
...), the training tests' `data`, `make_trainer` and `one_update`, and the task tests' `QUICK` flags
and model-directory readers (`summaries`, `checkpoint_weights`, `exported_weights`, `latest_step`,
`free_port`)."""

import dataclasses
import fcntl
import hashlib
import os
import shutil
import socket
import subprocess
from pathlib import Path
from typing import Callable

import pytest

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

# After the log level, which TensorFlow reads when it is imported.
import keras  # noqa: E402
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

from keras_transformer import (EOS_ID, DecodeConfig, Transformer,  # noqa: E402
                               TransformerConfig, TransformerStep, sequence_log_probs)
from programs import program, succeeded  # noqa: E402 (the session's builds run them)
from suite_report import (pytest_addoption, pytest_runtest_logreport,  # noqa: E402,F401
                          pytest_runtest_makereport, pytest_runtest_setup,
                          pytest_sessionfinish, pytest_terminal_summary)

REPO = Path(__file__).resolve().parents[1]
# Multi30k as ../shared/data/multi30k holds it beside a development checkout, or where
# MULTI30K_DIR says (a clone from GitHub: python -m trainer.data.multi30k --output_dir=DIR).
MULTI30K = Path(os.environ.get("MULTI30K_DIR") or REPO.parent / "shared" / "data" / "multi30k")


def multi30k_missing(*names) -> str:
    """Why a test of the Multi30k files `names` (paths in MULTI30K) cannot run, naming the
    missing ones; "" when they are all there."""
    missing = [name for name in names if not (MULTI30K / name).is_file()]
    if not missing:
        return ""
    return (f"needs Multi30k's {', '.join(missing)} in {MULTI30K}: set MULTI30K_DIR to "
            "the directory of python -m trainer.data.multi30k --output_dir=DIR")


def needs_multi30k(*names):
    """A mark that skips a test (or a parametrized case) without those Multi30k files."""
    reason = multi30k_missing(*names)
    return pytest.mark.skipif(bool(reason), reason=reason)


def require_multi30k(*names) -> Path:
    """MULTI30K, in a fixture or test that reads `names` there; skips it without them."""
    reason = multi30k_missing(*names)
    if reason:
        pytest.skip(reason)
    return MULTI30K

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


_BUILT = set()  # what built_once has found or made, in this process


def built_once(tmp_path_factory, name: str, build: Callable[[Path], object], *key) -> Path:
    """The directory that build(directory) fills, made once per test run and shared by
    every test that reads it, under pytest-xdist by every worker: the run's
    <basetemp>/built/<name>-<hash of key>, where `key` is what makes it (a program's
    flags, the directory it reads). The first worker to ask builds it under a file lock
    while the others wait; a build that raises is not marked done, so whoever asks next
    builds it again (and fails the same way). A test that changes what it finds there
    works on a copy (shutil.copytree), since every other test reads the same files."""
    directory = _built_directory(tmp_path_factory) / "-".join(
        [name, hashlib.sha1(repr(key).encode()).hexdigest()[:10]])
    if directory in _BUILT:
        return directory
    with open(f"{directory}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes
        done = Path(f"{directory}.done")
        if not done.exists():
            shutil.rmtree(directory, ignore_errors=True)  # a failed build's leftovers
            directory.mkdir()
            build(directory)
            done.touch()
    _BUILT.add(directory)
    return directory


def _built_directory(tmp_path_factory) -> Path:
    """Where `built_once` builds: this run's, which all its workers share under
    pytest-xdist (the parent of each worker's base temporary directory)."""
    base = tmp_path_factory.getbasetemp()
    directory = (base.parent if "PYTEST_XDIST_WORKER" in os.environ else base) / "built"
    directory.mkdir(exist_ok=True)
    return directory


# The session's model: 30 steps, a model that translates badly but fast; the tests check
# plumbing and properties that hold for any weights.
EXPORTED_FLAGS = ["--train_steps=30", "--warmup_steps=30", "--eval_every=0",
                  "--checkpoint_every=15", "--log_every=30"]


def _train_and_export(root: Path):
    """python -m trainer.task with EXPORTED_FLAGS into root/model and root/export (in
    this process: what is tested is what it made); its stdout in root/task_stdout.txt."""
    result = succeeded(program("task", *EXPORTED_FLAGS, f"--model_dir={root / 'model'}",
                               f"--export_dir={root / 'export'}", cwd=root))
    (root / "task_stdout.txt").write_text(result.stdout)


@dataclasses.dataclass(frozen=True)
class MainJob:
    directory: Path
    stdout: str


# The main job as the README runs it: `python -m trainer.task` with no flags.
MAIN_JOB = "python -m trainer.task"


def _run_main_job(directory: Path):
    """The README's command as a user types it, in a shell, in `directory`; its stdout
    in directory/main_job_stdout.txt."""
    job = run(["bash", "-c", MAIN_JOB], cwd=directory, env=_env(), timeout=1200)
    (directory / "main_job_stdout.txt").write_bytes(job.stdout)


@pytest.fixture(scope="session")
def main_job(tmp_path_factory) -> MainJob:
    """The README's main job, run once per test run in a fresh directory (the files
    that read it share the xdist_group "main_job", one worker, which its 3 minutes keep
    busy): runs/tiny_builtin and saved_models/tiny_builtin there are a model that
    translates the builtin corpus."""
    directory = built_once(tmp_path_factory, "main_job", _run_main_job, MAIN_JOB)
    return MainJob(directory, (directory / "main_job_stdout.txt").read_text("utf-8"))


def _env():
    return {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2", "PYTHONPATH": str(REPO)}


@pytest.fixture(scope="session")
def exported(tmp_path_factory) -> Exported:
    """The session's model (EXPORTED_FLAGS: checkpoints 15 and 30) and its export, trained
    once per test run for every worker."""
    root = built_once(tmp_path_factory, "exported", _train_and_export, EXPORTED_FLAGS)
    return Exported(root / "model", root / "export", root / "export" / "1",
                    (root / "task_stdout.txt").read_text())


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


# The decoding tests' copy task (test_decoding.py, test_decoding_options.py).

VOCAB = 16
# A 23-token output limit keeps the loops short; each test names any other limit.
CONFIG = dataclasses.replace(TransformerConfig.tiny(vocab_size=VOCAB), max_length=24,
                             dropout=0.0)
ANY_IDS = [tf.TensorSpec([None, None], tf.int32)]


def copy_batch(rng, batch, max_tokens=8):
    """Copy task: source = target = tokens + EOS, 0-padded to max_tokens + 1."""
    lengths = rng.integers(2, max_tokens + 1, size=batch)
    tokens = rng.integers(4, VOCAB, size=(batch, max_tokens + 1)).astype("int32")
    ids = np.where(np.arange(max_tokens + 1) < lengths[:, None], tokens, 0).astype("int32")
    ids[np.arange(batch), lengths] = EOS_ID
    return ids


@pytest.fixture(scope="module")
def copy_model():
    """A model trained briefly on the copy task: it ends outputs with EOS, but is
    unsure enough that beams differ (about 6 s on 2 CPU cores)."""
    keras.utils.set_random_seed(0)
    model = Transformer(CONFIG)
    model.build()
    optimizer = keras.optimizers.Adam(3e-3)

    @tf.function
    def train_step(ids):
        target_input_ids = tf.concat([tf.fill([tf.shape(ids)[0], 1], 2), ids[:, :-1]], 1)
        with tf.GradientTape() as tape:
            logits = model((ids, target_input_ids), training=True)
            losses = keras.losses.sparse_categorical_crossentropy(ids, logits, from_logits=True)
            weights = tf.cast(ids != 0, tf.float32)
            loss = tf.reduce_sum(losses * weights) / tf.reduce_sum(weights)
        optimizer.apply_gradients(zip(tape.gradient(loss, model.trainable_variables),
                                      model.trainable_variables))

    rng = np.random.default_rng(0)
    for _ in range(100):
        train_step(copy_batch(rng, 64))
    return model


@pytest.fixture(scope="module")
def copy_sources():
    """The copy-task sources most decoding tests decode: 6 of them (`copy_batch`, seed 1)."""
    return copy_batch(np.random.default_rng(1), batch=6)


_TRACED = {}


# Among `decode`'s keyword arguments, TransformerStep's options; the others are
# DecodeConfig's.
_STEP_OPTIONS = ("target_prefix", "use_cache", "fixed_shapes", "weights", "shortlist")


def decode(search, model, source_ids, **settings):
    """`search` (beam_search, greedy_search, sample_search) over the model's
    TransformerStep with the DecodeConfig of `settings` (and the step's options among
    them), in a tf.function with unknown batch and length, as an
    export runs it (traced once per search, model and arguments: tracing dominates these
    tests)."""
    key = (search, model, tuple(sorted(settings.items())))
    if key not in _TRACED:
        options = {name: settings.pop(name) for name in _STEP_OPTIONS if name in settings}
        # The exact rule, whatever the library's default: the reference searches are it.
        config = DecodeConfig(**{"stopping": "exact", **settings})
        _TRACED[key] = tf.function(
            lambda ids: search(TransformerStep(model, ids, **options), config),
            input_signature=ANY_IDS)
    return tf.nest.map_structure(lambda t: t.numpy(), _TRACED[key](source_ids))


def recomputed_log_probs(model, source_ids, result, extra_length=50):
    """sequence_log_probs of every returned hypothesis, [batch, beam], without the EOS a
    search forces at a hypothesis' maximum length (it scores 0)."""
    batch, beam, width = result.ids.shape
    max_lengths = np.minimum(np.count_nonzero(source_ids, axis=1) + extra_length,
                             model.config.max_length - 1)
    ids = result.ids.copy()
    rows, hypotheses = np.nonzero(result.lengths == max_lengths[:, None])
    ids[rows, hypotheses, result.lengths[rows, hypotheses] - 1] = 0
    log_probs = tf.function(lambda s, t: sequence_log_probs(model, s, t),
                            input_signature=ANY_IDS * 2)(
        np.repeat(source_ids, beam, axis=0), ids.reshape(batch * beam, width))
    return log_probs.numpy().reshape(batch, beam)


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    """The builtin corpus (seed 3: 2000 training and 50 validation pairs) through the
    input pipeline, with a vocabulary of its own per test module."""
    from trainer.config import DataConfig
    from trainer.data import input_pipeline
    from trainer.data.sources import BuiltinSource
    source = BuiltinSource(seed=3, train_size=2000, eval_size=50)
    return input_pipeline.build(source, str(tmp_path_factory.mktemp("vocab")),
                                DataConfig(max_len=32, batch_tokens=512, seed=0))


INITIAL_WEIGHTS = {}


def make_trainer(data, tmp_path, name, **run):
    """A trainer whose model starts from the same weights as every other one here."""
    from trainer.config import RunConfig
    from trainer.main_job import build_trainer
    from trainer.training import distribute
    config = TransformerConfig.tiny(vocab_size=data.tokenizers.target.vocab_size, dropout=0.0)
    run = RunConfig(model_dir=str(tmp_path / name), warmup_steps=50,
                    **{"precision": "float32", **run})
    trainer = build_trainer(config, data, run, distribute.make_strategy(0))
    weights = INITIAL_WEIGHTS.setdefault(config, trainer.model.get_weights())
    trainer.model.set_weights(weights)
    return trainer


def one_update(trainer):
    """One update of `trainer` from its stream's next batch (a run with accum_steps 1, as
    `make_trainer` builds); returns its StepStatistics."""
    trainer.update.accumulate(trainer.stream.next())
    return trainer.update.apply()


# The task tests' flags and model-directory readers (test_task.py, test_preemption.py,
# test_training.py).

# No validation (--eval_every=0): it would add a beam-search trace to every run.
# An explicit --precision: two runs compared must not differ by what a measurement chose.
QUICK = ["--max_len=32", "--batch_tokens=512", "--eval_every=0", "--bleu_sentences=10",
         "--export_dir=none", "--log_every=5", "--warmup_steps=50", "--precision=float32"]


def summaries(model_dir, tag, sub="train"):
    """{step: value} of a scalar summary written by the trainer."""
    values = {}
    directory = os.path.join(model_dir, sub)
    for name in sorted(os.listdir(directory)):
        for event in tf.compat.v1.train.summary_iterator(os.path.join(directory, name)):
            for value in event.summary.value:
                if value.tag == tag:
                    values[event.step] = float(tf.make_ndarray(value.tensor))
    return values


def checkpoint_weights(model_dir, checkpoint=None):
    """Every weight of a model directory's checkpoint (default: the newest), restored as
    trainer.export restores it (by object, whatever names the checkpoint gives them), as
    arrays in the model's order (`model.weights`)."""
    from trainer.model_dir import layout
    return [w.numpy() for w in layout.restore_model(str(model_dir), checkpoint and
                                                    str(checkpoint)).weights]


def exported_weights(version):
    """Every weight an export version saved, as arrays in the model's order (the export
    saves them as a list, "weights/<i>")."""
    reader = tf.train.load_checkpoint(str(Path(version) / "variables" / "variables"))
    count = sum(name.startswith("weights/") for name in reader.get_variable_to_shape_map())
    return [reader.get_tensor(f"weights/{i}/.ATTRIBUTES/VARIABLE_VALUE") for i in range(count)]


def latest_step(model_dir):
    latest = tf.train.latest_checkpoint(model_dir)
    return int(latest.rsplit("-", 1)[1]) if latest else 0


def free_port():
    with socket.socket() as s:
        s.bind(("localhost", 0))
        return s.getsockname()[1]


# Fixtures that train, export or trace a search: a test that reads one is slow (it is left
# out of the fast loop, -m "not slow", whatever its own marks say).
SLOW_FIXTURES = {"exported", "loaded", "translator", "sentencepiece", "main_job", "copy_model",
                 "data"}


def pytest_collection_modifyitems(config, items):
    """A test that reads a fixture of SLOW_FIXTURES is marked slow. The files that train a
    model of their own (an xdist_group, each on one worker) take the longest: they start
    first, so that the short tests fill in beside them instead of leaving a worker idle
    while the last of them runs alone. (Starting every subprocess test first as well was
    no faster: 19:13 against 16:57-17:40 in bench/runs.md.)"""
    for item in items:
        if SLOW_FIXTURES & set(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.slow)
    items.sort(key=lambda item: item.get_closest_marker("xdist_group") is None)


_LIBC = None


@pytest.fixture(scope="module", autouse=True)
def _memory_back_to_the_system():
    """When a module ends, `decode`'s traced searches of its models go, and what they held
    goes back to the system (glibc keeps freed heap in its arenas otherwise). TensorFlow's
    oneDNN allocator keeps its own pool at its peak whatever one does: a worker's resident
    memory is the most its tests held at once."""
    yield
    _TRACED.clear()
    if os.environ.get("SUITE_NO_TRIM"):
        return
    import ctypes
    import gc
    gc.collect()
    global _LIBC
    _LIBC = _LIBC or ctypes.CDLL("libc.so.6")
    _LIBC.malloc_trim(0)
