"""What the command-line programs share: how they start, fail, read lines and report
progress. Only the programs (trainer/task.py, translate.py, evaluate.py, export.py,
compare_exports.py, average.py, visualize.py, convert.py, data/multi30k.py) import this
module; the code below
them takes plain arguments. `run` runs a program's main in its own process, `call` in the
caller's (the tests', tests/programs.py).
"""

import atexit
import dataclasses
import errno
import os
import re
import shutil
import sys
import time
from typing import BinaryIO, Callable, List, Optional

from absl import app, flags

from trainer import console

# The status of a program stopped by a full disk: ENOSPC's number.
NO_SPACE_STATUS = errno.ENOSPC

# oneDNN's primitive cache, for the programs (a user's own value stands): a search's matmuls
# and softmaxes change shape from step to step (the rows still searching, the length of the
# keys), one pass over test2016 in batches of 64 makes 1,683 kernels, and at oneDNN's
# default of 1,024 the cache evicts each before the next batch needs it again: it compiles
# them again, a tenth of a busy server's time (bench/performance-notes.md, "oneDNN's
# primitive cache"). Read once, when TensorFlow first runs a oneDNN op.
ONEDNN_PRIMITIVE_CACHE_CAPACITY = 16384


# The programs `call` is running in this process, the innermost last.
_CALLED: List[str] = []


def program() -> str:
    """The running program as its user typed it, e.g. "trainer.task"."""
    if _CALLED:
        return _CALLED[-1]
    spec = getattr(sys.modules["__main__"], "__spec__", None)
    return spec.name if spec is not None else sys.argv[0]


def fail(message: str, status: int = 2):
    """Ends the program with one line on stderr: "<program>: error: <message>".

    Status 2 is for what the user can fix before any work (flags, files); 1 for a run
    that started and could not go on.
    """
    stop(f"error: {message}", status)


def stop(message: str, status: int):
    """Ends the program with one line on stderr, "<program>: <message>" (also for a stop
    that is not an error: a preempted run, which the same command resumes), the last one
    the quiet console shows, and ends the process there: what the program writes is
    written and flushed by then. (A program that `call` runs raises SystemExit(status)
    instead: the process is its caller's.)"""
    console.hush()
    print(f"{program()}: {message}", file=sys.stderr, flush=True)
    sys.stdout.flush()
    if _CALLED:
        raise SystemExit(status)
    # What is left is the runtime's teardown: no news (a peer worker's departure, seen by
    # the coordination service), and now and then tens of seconds of it, which a cloud's
    # grace period would have to cover (docs/performance.md, "Start-up, resume and
    # preemption").
    os._exit(status)


def run(main: Callable[[List[str]], None]):
    """absl's app.run(main), with TensorFlow's start-up lines hidden unless --verbosity
    or TF_CPP_MIN_LOG_LEVEL asks for them (trainer/console.py), a flag absl cannot parse
    reported as one line with status 2, any extra positional argument refused, and
    oneDNN's primitive cache at ONEDNN_PRIMITIVE_CACHE_CAPACITY unless the environment
    sets it."""

    def checked_main(argv):
        _refuse_arguments(argv)
        os.environ.setdefault("ONEDNN_PRIMITIVE_CACHE_CAPACITY",
                              str(ONEDNN_PRIMITIVE_CACHE_CAPACITY))
        if not console.verbose_requested(flags.FLAGS["verbosity"].present):
            console.quiet()
        _main_or_full_disk(main, argv)
        _exit_done()

    app.run(checked_main, flags_parser=_parse)


def _exit_done():
    """Ends a program whose main returned, with status 0: Python's exit handlers run
    (the quiet console passes on what is left in its pipe, logging flushes), and the
    process ends without the interpreter's teardown of TensorFlow's objects, which
    took 1.3-1.8 s after a short training run and does nothing a program needs: every file
    a program writes is written and closed (or flushed) by the time its main returns.
    Under a profiler or a tracer (cProfile, a debugger, coverage), which may write what it
    gathered once the program is over, Python's own exit."""
    if sys.getprofile() is not None or sys.gettrace() is not None:
        return
    atexit._run_exitfuncs()  # the handlers Python's own exit runs
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def call(main: Callable[[List[str]], None], argv: List[str]):
    """Runs a program's `main` in this process as `run` runs it in a process of its own:
    argv (argv[0] the program as `program` names it, e.g. "trainer.task") parsed into
    absl's flags from their defaults, the same one-line errors and statuses, raised as
    SystemExit(status) where `run` would end the process; SystemExit(0) when main returns.
    The console stays as it is (no `console.quiet`): the process is the caller's. The
    program's flags are the ones defined in this process, so one program's at a time
    (two programs define some of the same names): the caller's to arrange."""
    _CALLED.append(argv[0])
    try:
        flags.FLAGS.unparse_flags()
        remaining = _parse(argv)
        _refuse_arguments(remaining)
        _main_or_full_disk(main, remaining)
    finally:
        _CALLED.pop()
        sys.stdout.flush()
    raise SystemExit(0)


def _parse(argv: List[str]) -> List[str]:
    try:
        return flags.FLAGS(argv)
    except flags.Error as e:
        fail(str(e))


def _refuse_arguments(argv: List[str]):
    if len(argv) > 1:
        fail(f"unexpected arguments {argv[1:]}")


def _main_or_full_disk(main: Callable[[List[str]], None], argv: List[str]):
    """main(argv), with a full disk, whatever wrote, as one line and status 28."""
    try:
        main(argv)
    except Exception as e:  # noqa: BLE001 (a full disk, whatever wrote; others re-raised)
        path = no_space(e)
        if path is None:
            raise
        fail(f"no space left on device writing {remove_unfinished(path)} (removed); the "
             "files written before it are intact", status=NO_SPACE_STATUS)


def no_space(error: BaseException) -> Optional[str]:
    """The path of the write that ran out of disk space, if that is what `error` (or an
    error that led to it) says: an OSError ENOSPC, or TensorFlow's ResourceExhaustedError
    "<path>; No space left on device" (a checkpoint's SaveV2); else None."""
    seen = set()
    while error is not None and id(error) not in seen:
        seen.add(id(error))
        if isinstance(error, OSError) and error.errno == errno.ENOSPC:
            return str(error.filename or "?")
        match = re.search(r"(\S+); No space left on device", str(error))
        if match:
            return match.group(1)
        error = error.__cause__ or error.__context__
    return None


def remove_unfinished(path: str) -> str:
    """Removes what a failed write of `path` left: TensorFlow's checkpoint staging
    directory (<prefix>_temp), a staging directory or a temporary file of
    trainer/model_dir/files.py (.tmp-<uuid>), or the file itself. Returns what it
    removed."""
    parts = path.split(os.sep)
    for i, part in enumerate(parts):
        if part.endswith("_temp") or ".tmp-" in part:
            unfinished = os.sep.join(parts[:i + 1])
            break
    else:
        unfinished = path
    if os.path.isdir(unfinished):
        shutil.rmtree(unfinished, ignore_errors=True)
    elif os.path.exists(unfinished):
        os.remove(unfinished)
    return unfinished


def config_from_flags(cls, **given):
    """The dataclass `cls` with every field that has a flag of its name set from that
    flag, every field that is itself a dataclass filled the same way, `given` on top, and
    the other fields at their defaults: where a program's flags become a config."""
    values = {}
    for field in dataclasses.fields(cls):
        default = (field.default_factory() if field.default_factory is not dataclasses.MISSING
                   else field.default)
        if dataclasses.is_dataclass(default):
            values[field.name] = config_from_flags(type(default))
        elif field.name in flags.FLAGS:
            values[field.name] = flags.FLAGS[field.name].value
    return cls(**{**values, **given})


def read_lines(stream: BinaryIO) -> List[bytes]:
    """Lines of a binary stream, split at "\\n" only, without their line ends ("\\r\\n"
    too); the bytes are kept as they are, so invalid UTF-8 reaches the model, which reads
    it as U+FFFD."""
    lines = stream.read().split(b"\n")
    if lines and lines[-1] == b"":
        lines.pop()
    return [line.rstrip(b"\r") for line in lines]


def read_text(path: str) -> List[str]:
    """`read_lines` of a file, decoded from UTF-8 (invalid bytes replaced)."""
    with open(path, "rb") as f:
        return [line.decode("utf-8", errors="replace") for line in read_lines(f)]


class TranslationProgress:
    """Writes "translated n/total (s/s)" to stderr at most once a second and at the end."""

    def __init__(self, total: int, stream=None):
        self.total, self.stream = total, stream
        self.start = self.last = time.monotonic()

    def __call__(self, done: int):
        now = time.monotonic()
        if now - self.last >= 1.0 or done == self.total:
            rate = done / max(now - self.start, 1e-9)
            print(f"translated {done}/{self.total} ({rate:.1f} sentences/s)",
                  file=self.stream or sys.stderr, flush=True)
            self.last = now
