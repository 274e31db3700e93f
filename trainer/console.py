"""A quiet console for the command-line programs: TensorFlow's start-up lines hidden.

TensorFlow's C++ runtime writes to the process's stderr before its logging is set up
(the "All log messages before absl::InitializeLog()" banner), so neither
TF_CPP_MIN_LOG_LEVEL nor absl's --verbosity reaches those lines: the oneDNN banner
(twice, once for TensorFlow and once for tensorflow_text), the CUDA probe on a machine
without GPUs ("failed call to cuInit"), the CPU-feature notice and per-op INFO lines.
`quiet` reroutes file descriptor 2 through a filter that drops INFO lines and the known
start-up notices, and passes everything else (real warnings and errors) through.
Python's own stderr bypasses the filter, so tracebacks and error messages never wait on it.
Once a program writes its last line (`hush`), the filter drops the rest: what the
runtime prints while the process exits.
"""

import atexit
import logging
import os
import re
import sys
import threading
from typing import Iterable, Iterator

# "I0000 00:00:1795358625.906897    2420 port.cc:153] ..." or "I1122 14:43:48.424800 ..."
_LOG_LINE = re.compile(rb"^([IWEF])\d{4} [\d:.]+\s+\d+ \S+:\d+\] ")
# Lines that are not INFO but carry no news on a healthy CPU run.
_NOTICES = (
    b"All log messages before absl::InitializeLog() is called are written to STDERR",
    b"failed call to cuInit",  # the CUDA probe on a machine without a GPU
    b"oneDNN supports DT_INT64 only on platforms with AVX-512",  # falls back, harmless
)
_HUSHED = threading.Event()
_WRITING = threading.Lock()  # held by the filter while it passes a line on


def verbose_requested(verbosity_flag_given: bool) -> bool:
    """Whether the user asked to see TensorFlow's own lines: absl's --verbosity, or
    TF_CPP_MIN_LOG_LEVEL set to 0 (INFO) or 1 (WARNING)."""
    return verbosity_flag_given or os.environ.get("TF_CPP_MIN_LOG_LEVEL") in ("0", "1")


def quiet():
    """Hides TensorFlow's INFO lines and start-up notices from stderr for the rest of
    the process; call before importing TensorFlow."""
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    logging.getLogger().setLevel(logging.WARNING)  # absl's handler, TF's Python INFO
    logging.getLogger("tensorflow").setLevel(logging.WARNING)
    sys.stderr.flush()
    original = os.dup(2)
    # Python writes straight to the original stderr, without the filter in between.
    sys.stderr = open(os.dup(original), "w", buffering=1, encoding=sys.stderr.encoding,
                      errors="backslashreplace")
    read_end, write_end = os.pipe()
    os.dup2(write_end, 2)
    os.close(write_end)
    thread = threading.Thread(target=_forward, args=(read_end, original), daemon=True)
    thread.start()

    def restore():
        os.dup2(original, 2)  # the pipe loses its last writer: the filter reads to the end
        thread.join(timeout=5)

    atexit.register(restore)


def hush():
    """Drops what TensorFlow's C++ runtime writes to stderr from now on, when `quiet` is
    on: the program is about to write its last line (called first, so that nothing still
    in the filter's pipe lands after it). For example a preempted worker's
    coordination agent, which reports a gRPC error on exit when the chief, which hosts the
    coordination service, has already gone."""
    with _WRITING:  # a line the filter is passing on lands before the program's last
        _HUSHED.set()


def shown(lines: Iterable[bytes]) -> Iterator[bytes]:
    """Of the lines the runtime writes to file descriptor 2 (each with its line end),
    those `quiet` passes on: not the INFO lines, nor the start-up notices, nor the
    continuation lines of either."""
    hiding = False  # continuation lines belong to the message before them
    for line in lines:
        match = _LOG_LINE.match(line)
        if match or line.startswith(b"WARNING: All log messages"):
            hiding = (match is not None and match.group(1) == b"I") or any(
                notice in line for notice in _NOTICES)
        if not hiding:
            yield line


def _forward(read_end: int, out: int):
    with open(read_end, "rb", buffering=0) as pipe:
        for line in shown(iter(_line_reader(pipe), b"")):
            with _WRITING:
                if not _HUSHED.is_set():
                    os.write(out, line)


def _line_reader(pipe):
    buffer = bytearray()

    def next_line() -> bytes:
        while b"\n" not in buffer:
            chunk = pipe.read(65536)
            if not chunk:
                line = bytes(buffer)
                buffer.clear()
                return line
            buffer.extend(chunk)
        end = buffer.index(b"\n") + 1
        line = bytes(buffer[:end])
        del buffer[:end]
        return line

    return next_line
