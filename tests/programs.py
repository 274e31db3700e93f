"""The command-line programs run in the test's own process: `program("task", *flags)` is
`python -m trainer.task *flags` without a Python and TensorFlow start-up of its own (about
5 s each), for the tests whose claim is what a program says, writes and returns. A claim
about the process itself (a signal, a fresh Python with only tensorflow and
tensorflow-text, the quiet console's filter, a lock between two processes, a full disk,
the README's commands as a user types them) keeps a real subprocess."""

import contextlib
import importlib
import io
import logging
import os
import subprocess
import sys
import tempfile
import traceback
import warnings
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def program(name: str, *args, cwd=REPO, stdin: bytes = b"") -> subprocess.CompletedProcess:
    """`python -m trainer.<name> *args` run in this process instead of a new one
    (trainer.cli.call): the program's flags, checks, work, messages and exit status, without
    a Python and TensorFlow start-up (about 5 s each). Returns a CompletedProcess of text:
    stdout, and stderr as the program's quiet console would show it: what the runtime wrote
    to file descriptor 2 meanwhile (trainer.console.shown: not its INFO lines), Python's
    warnings and WARNING logs, then the program's own lines, its last one last; an
    exception the program let out is its traceback and status 1, as in a process of its
    own. For a claim about what a program says and does; a claim about the process itself
    (a signal, a fresh Python, the console's filter, a lock between two processes, the
    README's commands as typed) keeps a subprocess."""
    from trainer import cli, console
    module = _program_module(name)
    argv = [f"trainer.{name}", *map(str, args)]
    out = io.TextIOWrapper(io.BytesIO(), encoding="utf-8", write_through=True)
    err = io.StringIO()
    log = logging.StreamHandler(err)
    log.setLevel(logging.WARNING)
    status = 0
    with tempfile.TemporaryFile() as runtime, _fd_to(2, runtime), _in_directory(cwd), \
            _stdin(stdin), _warnings_to(err), contextlib.redirect_stdout(out), \
            contextlib.redirect_stderr(err):
        logging.getLogger().addHandler(log)
        try:
            cli.call(module.main, argv)
        except SystemExit as e:
            status = e.code
        except Exception:  # noqa: BLE001 (what Python prints for a program that raised)
            err.write(traceback.format_exc())
            status = 1
        finally:
            logging.getLogger().removeHandler(log)
        runtime.seek(0)
        shown = b"".join(console.shown(runtime.read().splitlines(keepends=True)))
    return subprocess.CompletedProcess(argv, status, out.buffer.getvalue().decode("utf-8"),
                                       shown.decode("utf-8", errors="replace") + err.getvalue())


def _program_module(name: str):
    """trainer.<name>, its flags defined afresh and no other program's (programs share
    flag names, which absl's one FLAGS holds once)."""
    from absl import flags
    for module, defined in list(flags.FLAGS.flags_by_module_dict().items()):
        if module.startswith("trainer."):
            for flag in list(defined):
                if flag.name in flags.FLAGS:
                    delattr(flags.FLAGS, flag.name)
    module = f"trainer.{name}"
    if module in sys.modules:
        return importlib.reload(sys.modules[module])
    return importlib.import_module(module)


@contextlib.contextmanager
def _fd_to(fd: int, file):
    """File descriptor `fd` writes to `file` for the block."""
    saved = os.dup(fd)
    os.dup2(file.fileno(), fd)
    try:
        yield
    finally:
        os.dup2(saved, fd)
        os.close(saved)


@contextlib.contextmanager
def _in_directory(path):
    before = os.getcwd()
    os.chdir(path)
    try:
        yield
    finally:
        os.chdir(before)


@contextlib.contextmanager
def _stdin(data: bytes):
    before = sys.stdin
    sys.stdin = io.TextIOWrapper(io.BytesIO(data), encoding="utf-8")
    try:
        yield
    finally:
        sys.stdin = before


@contextlib.contextmanager
def _warnings_to(stream):
    """Python's warnings printed to `stream` under its default filters, as a fresh
    interpreter prints them (pytest records them otherwise)."""
    with warnings.catch_warnings():
        warnings.resetwarnings()
        warnings.simplefilter("default")
        for category in (DeprecationWarning, PendingDeprecationWarning, ImportWarning,
                         ResourceWarning):
            warnings.simplefilter("ignore", category)
        warnings.showwarning = lambda message, category, filename, lineno, file=None, \
            line=None: stream.write(warnings.formatwarning(message, category, filename,
                                                           lineno, line))
        yield


def succeeded(result: subprocess.CompletedProcess) -> subprocess.CompletedProcess:
    """result, or an AssertionError with its output if it failed (a build's, not a
    test's claim)."""
    if result.returncode != 0:
        raise AssertionError(f"{result.args} exited {result.returncode}:\n"
                             f"{result.stdout[-3000:]}\n{result.stderr[-3000:]}")
    return result
