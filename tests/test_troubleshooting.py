"""docs/troubleshooting.md's messages, each made by the program it names: a table of rows
(the command, the message as the doc writes it, the exit status), each run as that
program runs (tests/programs.py: its main, flags and one-line failure, in this process;
test_cli checks that this says what a process of its own says; trainer.data.multi30k,
whose flags only its __main__ defines, in a process of its own), with a check that every
row's message is the doc's own words, so that neither drifts from the other. The rows are
the doc's messages that no other test makes a program print.

A message is written as the doc writes it: its placeholders (DIR, PATH, N, M) stand for
what the row names, and "..." for what the doc leaves out. Most rows stop at a flag or a
file, before any model is read (a fraction of a second each); those that read a model
directory or an export copy the session's (`exported`), damage the copy, and are marked
slow (the fixture trains and exports). The missing ctranslate2 extra is a ctranslate2
that does not import (sys.modules holds None for it), as where it is not installed."""

import dataclasses
import json
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Callable, Dict, Sequence, Tuple

import pytest

from conftest import REPO, _env
from programs import program

DOC = REPO / "docs" / "troubleshooting.md"


@dataclasses.dataclass(frozen=True)
class Command:
    """A row's program's arguments, and what else it runs with."""

    args: Sequence[str]
    names: Dict[str, str] = dataclasses.field(default_factory=dict)  # placeholder: value
    stdin: bytes = b""
    env: Dict[str, str] = dataclasses.field(default_factory=dict)
    absent: Tuple[str, ...] = ()  # modules the program cannot import (not installed)


class Given:
    """What a row's command reads, made in the test's own directory: files, directories,
    a model directory that holds only its config.json, and copies of the session's model
    directory and export (which no row may change)."""

    def __init__(self, tmp_path: Path, request):
        self.tmp, self._request = tmp_path, request

    def path(self, name: str) -> Path:
        return self.tmp / name

    def directory(self, name: str) -> Path:
        (self.tmp / name).mkdir()
        return self.tmp / name

    def file(self, name: str, text: str) -> Path:
        (self.tmp / name).write_text(text)
        return self.tmp / name

    def config_only(self, **fields) -> Path:
        """A model directory of config.json alone, the tiny preset's (with `fields`): what
        trainer.export reads before it looks for checkpoints."""
        from keras_transformer import TransformerConfig
        from trainer.model_dir import layout
        directory = self.tmp / "config_only"
        layout.save_config(str(directory), TransformerConfig.tiny(vocab_size=64, **fields))
        return directory

    @property
    def exported(self):
        return self._request.getfixturevalue("exported")

    def model_dir(self) -> Path:
        """A copy of the session's model directory (checkpoints 15 and 30, spm.model)."""
        copy = self.tmp / "model"
        shutil.copytree(self.exported.model_dir, copy, ignore=shutil.ignore_patterns(
            "train", "eval", "trainer.lock"))
        return copy

    def export(self) -> Path:
        """A copy of the session's export version."""
        copy = self.tmp / "export" / "1"
        shutil.copytree(self.exported.version_dir, copy)
        return copy


@dataclasses.dataclass(frozen=True)
class Row:
    program: str  # trainer.<program>
    message: str  # as docs/troubleshooting.md writes it
    status: int
    command: Callable[[Given], Command]
    model: bool = False  # reads the session's model (slow)
    process: bool = False  # a process of its own: a program whose flags only its __main__ defines


def every_checkpoint_damaged(given: Given) -> Command:
    model_dir = given.model_dir()
    for data in model_dir.glob("ckpt-*.data-*"):
        data.write_bytes(data.read_bytes()[:100])  # cut short, as a crash leaves it
    return Command([f"--model_dir={model_dir}", f"--export_dir={given.path('out')}"],
                   {"DIR": str(model_dir)})


def without_checkpoints(given: Given) -> Command:
    model_dir = given.model_dir()
    for path in [model_dir / "checkpoint", *model_dir.glob("ckpt-*")]:
        path.unlink()
    return Command([f"--model_dir={model_dir}", f"--export_dir={given.path('out')}"],
                   {"DIR": str(model_dir)})


def unreadable_vocabulary(given: Given) -> Command:
    model_dir = given.model_dir()
    vocabulary = model_dir / "spm.model"
    vocabulary.write_bytes(vocabulary.read_bytes()[:50])
    return Command([f"--model_dir={model_dir}", "--export_dir=none", "--train_steps=31"],
                   {"PATH": str(vocabulary)})


def another_model(given: Given) -> Command:
    model_dir = given.model_dir()
    return Command([f"--model_dir={model_dir}", "--hparams=num_layers=1",
                    "--export_dir=none", "--train_steps=31"], {"DIR": str(model_dir)})


def key_dim_not_value_dim(given: Given) -> Command:
    """A model directory of the session's vocabulary and a tiny model whose values are
    wider than its keys, in a checkpoint of its initial weights (what CTranslate2 cannot
    hold does not depend on them: nothing is trained)."""
    import tensorflow as tf

    from keras_transformer import Transformer, TransformerConfig
    from trainer.model_dir import layout
    model_dir = given.directory("wide_values")
    shutil.copy(given.exported.model_dir / "spm.model", model_dir)
    saved = json.loads((given.exported.model_dir / "config.json").read_text())["model"]
    config = dataclasses.replace(TransformerConfig.from_dict(saved), key_dim=8, value_dim=16)
    layout.save_config(str(model_dir), config)
    model = Transformer(config)
    model.build()
    tf.train.CheckpointManager(tf.train.Checkpoint(model=model), str(model_dir), 1,
                               checkpoint_name="ckpt").save(checkpoint_number=1)
    return Command([f"--model_dir={model_dir}", "--format=ctranslate2",
                    f"--export_dir={given.path('out')}"])


def an_older_export(given: Given) -> Command:
    """A SavedModel with serving_default alone, as an export older than the option
    signatures has it (the rows need no model to stop there)."""
    import tensorflow as tf
    module = tf.Module()
    module.translate = tf.function(lambda inputs: {"translations": inputs},
                                   input_signature=[tf.TensorSpec([None], tf.string)])
    version = given.path("old") / "1"
    tf.saved_model.save(module, str(version),
                        signatures={"serving_default": module.translate})
    return Command([f"--saved_model={version}", "--beam_size=2"], {"PATH": str(version)},
                   stdin=b"one\n")


def prefixes_for_other_lines(given: Given) -> Command:
    prefixes = given.file("prefixes.txt", "Eins\nZwei\n")
    return Command([f"--saved_model={given.exported.version_dir}",
                    f"--prefix_file={prefixes}"], {"PATH": str(prefixes), "N": "2", "M": "3"},
                   stdin=b"one\ntwo\nthree\n")


def unreadable_export(given: Given) -> Command:
    version = given.export()
    graph = version / "saved_model.pb"
    graph.write_bytes(graph.read_bytes()[:200])
    return Command([f"--saved_model={version}"], {"PATH": str(version)}, stdin=b"one\n")


def evaluate_ref_lines(given: Given) -> Command:
    src = given.file("test.en", "one\ntwo\nthree\n")
    ref = given.file("test.de", "eins\nzwei\n")
    return Command([f"--saved_model={given.path('none')}", f"--src={src}", f"--ref={ref}"],
                   {"N": "2", "M": "3"})


def used_directory(given: Given) -> Command:
    given.directory("used")
    given.file("used/notes.txt", "mine")
    return Command([f"--output_dir={given.path('used')}"], {"DIR": str(given.path("used"))})


def averaged_over_fewer(given: Given) -> Command:
    model_dir = given.model_dir()
    return Command([f"--model_dir={model_dir}", "--last=5"], {"N": "2", "DIR": str(model_dir)})


def exported_over_fewer(given: Given) -> Command:
    model_dir = given.model_dir()
    return Command([f"--model_dir={model_dir}", "--average_last=5", "--format=ctranslate2",
                    f"--export_dir={given.path('out')}"], {"N": "2", "DIR": str(model_dir)})


def early_stopping_on_two_workers(given: Given) -> Command:
    cluster = {"cluster": {"worker": ["localhost:1", "localhost:2"]},
               "task": {"type": "worker", "index": 0}}
    return Command(["--early_stopping=3", f"--model_dir={given.path('run')}"],
                   env={"TF_CONFIG": json.dumps(cluster)})


def run_dir(*flags):
    return lambda given: Command([*flags, f"--model_dir={given.path('run')}"])


def required(flag: str, *given_flags):
    """The row of `--saved_model is required`, for `flag` (the doc: "and --src, ...")."""
    return lambda given: Command(list(given_flags), {"--saved_model": flag})


ROWS = {
    # trainer.<name>, every program: what absl and trainer.cli refuse.
    "task-misspelt_flag": Row(
        "task", "trainer.task: error: Unknown command line flag 'beam_sise'. Did you mean: "
        "beam_size ?", 2, run_dir("--beam_sise=4")),
    "task-positional": Row(
        "task", "trainer.task: error: unexpected arguments ['extra']", 2,
        run_dir("extra")),
    # trainer.task's flags.
    "task-ema": Row("task", "export_weights=ema needs a moving average: set ema_decay", 2,
                    run_dir("--export_weights=ema")),
    "task-best": Row("task", "export_weights=best needs keep_best (the metric to rank by)", 2,
                     run_dir("--export_weights=best")),
    "task-average": Row(
        "task", "export_weights=average needs average_last (checkpoints to average)", 2,
        run_dir("--export_weights=average")),
    "task-validations": Row(
        "task", "keep_best and early_stopping need validations: set eval_every", 2,
        run_dir("--keep_best=loss", "--eval_every=0")),
    "task-early_stopping": Row(
        "task", "--early_stopping needs one worker: only the chief validates, and the other "
        "workers would train on", 2, early_stopping_on_two_workers),
    "task-init_from": Row(
        "task", "--init_from=DIR: DIR/config.json cannot be read (FileNotFoundError): is it a "
        "model directory?", 2, lambda given: Command(
            [f"--init_from={given.directory('empty')}", f"--model_dir={given.path('run')}"],
            {"DIR": str(given.path("empty"))})),
    # trainer.task's model directory.
    "task-another_model": Row(
        "task", "DIR holds a different model (saved vs asked: {...}); use another --model_dir",
        2, another_model, model=True),
    "task-vocabulary": Row(
        "task", "PATH is not a readable SentencePiece model (...); restore it from a copy, or "
        "use another model directory", 2, unreadable_vocabulary, model=True),
    # trainer.export and trainer.average.
    "export-model_dir": Row("export", "--model_dir is required", 2, lambda given: Command([])),
    "average-model_dir": Row("average", "--model_dir is required", 2,
                             lambda given: Command([])),
    "export-not_a_model_dir": Row(
        "export", "DIR/config.json not found: is DIR a model directory of python -m "
        "trainer.task?", 2, lambda given: Command(
            [f"--model_dir={given.directory('empty')}"], {"DIR": str(given.path("empty"))})),
    "export-no_checkpoint": Row("export", "no checkpoint in DIR", 2, without_checkpoints,
                                model=True),
    "export-every_checkpoint_damaged": Row(
        "export", "every checkpoint in DIR is damaged", 2, every_checkpoint_damaged,
        model=True),
    "export-averaging": Row(
        "export", "averaging needs the number of checkpoints: --average_last=N", 2,
        lambda given: Command([f"--model_dir={given.config_only()}",
                               "--export_weights=average"])),
    "export-only_n": Row(
        "export", "warning: only N checkpoints in DIR; averaging them", 0, exported_over_fewer,
        model=True),
    "average-only_n": Row(
        "average", "trainer.average: only N checkpoints in DIR; averaging them", 0,
        averaged_over_fewer, model=True),
    "export-no_moving_average": Row(
        "export", "PATH holds no moving average of the weights: train with --ema_decay to keep "
        "one", 2, lambda given: Command(
            [f"--model_dir={given.model_dir()}", "--export_weights=ema"],
            {"PATH": str(given.path("model") / "ckpt-30")}), model=True),
    "export-no_best": Row(
        "export", "no best checkpoint in DIR/best: train with --keep_best", 2,
        lambda given: Command([f"--model_dir={given.config_only()}", "--export_weights=best"],
                              {"DIR": str(given.path("config_only"))})),
    "export-ctranslate2_key_dim": Row(
        "export", "CTranslate2 needs key_dim == value_dim; ...", 2, key_dim_not_value_dim,
        model=True),
    "export-ctranslate2_extra": Row(
        "export", "trainer.export: error: --format=ctranslate2 needs the ctranslate2 extra: "
        'pip install -e ".[ctranslate2]"', 2, lambda given: Command(
            [f"--model_dir={given.config_only()}", "--format=ctranslate2"],
            absent=("ctranslate2",))),
    "average-last": Row(
        "average", "--last must be at least 1, got N", 2, lambda given: Command(
            [f"--model_dir={given.model_dir()}", "--last=0"], {"N": "0"}), model=True),
    # trainer.translate, trainer.evaluate and trainer.visualize.
    "translate-saved_model": Row("translate", "--saved_model is required", 2,
                                 required("--saved_model")),
    "evaluate-saved_model": Row("evaluate", "--saved_model is required", 2,
                                required("--saved_model", "--src=a", "--ref=b")),
    "evaluate-src": Row("evaluate", "--saved_model is required", 2,
                        required("--src", "--saved_model=a", "--ref=b")),
    "evaluate-ref": Row("evaluate", "--saved_model is required", 2,
                        required("--ref", "--saved_model=a", "--src=b")),
    "visualize-saved_model": Row("visualize", "--saved_model is required", 2,
                                 required("--saved_model", "--text=a", "--out=b")),
    "visualize-text": Row("visualize", "--saved_model is required", 2,
                          required("--text", "--saved_model=a", "--out=b")),
    "visualize-out": Row("visualize", "--saved_model is required", 2,
                         required("--out", "--saved_model=a", "--text=b")),
    "translate-no_version": Row(
        "translate", "PATH holds neither saved_model.pb nor a version directory; export one "
        "with python -m trainer.export", 2, lambda given: Command(
            [f"--saved_model={given.directory('empty')}"], {"PATH": str(given.path("empty"))})),
    "translate-unreadable": Row(
        "translate", "PATH is not a readable SavedModel (...); export it again with python -m "
        "trainer.export", 2, unreadable_export, model=True),
    "translate-older_export": Row(
        "translate", "PATH has no translate_with_options signature (it has ...); export it "
        "again with this version of trainer.export", 2, an_older_export),
    "translate-prefix_file": Row(
        "translate", "--prefix_file=PATH has N lines for M input lines", 2,
        prefixes_for_other_lines, model=True),
    "evaluate-ref_lines": Row("evaluate", "--ref has N lines but --src has M", 2,
                              evaluate_ref_lines),
    # trainer.data.multi30k.
    "multi30k-used_directory": Row(
        "data.multi30k", "trainer.data.multi30k: error: DIR exists and is not empty: download "
        "into a new directory", 2, used_directory, process=True),
}


def expected_line(row: Row, names: Dict[str, str]) -> "re.Pattern":
    """The line row.message says the program prints: its placeholders replaced by what
    `names` gives (each where it is a word of its own), "..." anything, and
    "trainer.<program>: error: " before a failure's message that does not name it."""
    message = row.message
    if row.status and not message.startswith("trainer."):
        message = f"trainer.{row.program}: error: {message}"
    pieces = []
    for piece in message.split("..."):
        if names:
            words = re.compile("|".join(rf"(?<![\w-]){re.escape(name)}(?![\w-])"
                                        for name in sorted(names, key=len, reverse=True)))
            piece = words.sub(lambda m: names[m.group(0)], piece)
        pieces.append(re.escape(piece))
    return re.compile("^" + ".*".join(pieces) + "$")


def doc_text() -> str:
    return " ".join(DOC.read_text("utf-8").split())


@pytest.mark.parametrize("row", [pytest.param(row, id=name, marks=[pytest.mark.slow] *
                                              row.model) for name, row in ROWS.items()])
def test_a_program_prints_the_docs_message_with_its_status(row, tmp_path, request,
                                                           monkeypatch):
    """The program stops (or warns) with the doc's message, on stderr, as one line of its
    own: for a failure its last, "trainer.<program>: error: <message>", with the status
    the doc gives."""
    command = row.command(Given(tmp_path, request))
    for name, value in command.env.items():
        monkeypatch.setenv(name, value)
    for module in command.absent:
        monkeypatch.setitem(sys.modules, module, None)  # `import module` raises ImportError
    if row.process:  # no TensorFlow: a fraction of a second
        result = subprocess.run([sys.executable, "-m", f"trainer.{row.program}", *command.args],
                                cwd=tmp_path, env={**_env(), **command.env}, input=command.stdin,
                                capture_output=True, timeout=60)
        result.stdout, result.stderr = result.stdout.decode(), result.stderr.decode()
    else:
        result = program(row.program, *command.args, cwd=tmp_path, stdin=command.stdin)
    lines = result.stderr.strip().splitlines()
    assert result.returncode == row.status, result
    expected = expected_line(row, command.names)
    if row.status:
        assert "Traceback" not in result.stderr, result.stderr
        assert lines and expected.match(lines[-1]), (expected.pattern, result.stderr)
    else:
        assert [line for line in lines if expected.match(line)], (expected.pattern,
                                                                 result.stderr)


def test_every_rows_message_is_the_docs_own_words():
    """A row's message, placeholders and all, is a message of docs/troubleshooting.md as
    it writes it (from its opening backquote)."""
    doc = doc_text()
    missing = [name for name, row in ROWS.items() if f"`{row.message}" not in doc]
    assert not missing, missing
