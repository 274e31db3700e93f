"""One trainer per model directory: `trainer.task` holds LOCK_FILE in it for its whole run
(in multi-worker training, the chief does), so that a second trainer on the same directory
(a scheduler restarting a job whose first copy still runs) stops at once instead of
interleaving its checkpoints with the first's.

The lock is a file made with O_EXCL, holding {"host", "pid", "started", "process_start"};
it is removed when the run ends, however it ends but killed (kill -9, a lost machine).
A lock left so is taken over with one warning line when its process is gone: on the same
host, a pid that no longer runs, or runs another process (its start time, from /proc,
differs). Another host's lock cannot be checked from here: `--force_unlock` takes it over.
The readers (export, translate, evaluate, average, visualize) take no lock.
"""

import contextlib
import datetime
import json
import os
import socket
import time
from typing import Callable, Iterator, Optional

from trainer.model_dir.layout import ModelDirError, warn_on_stderr

LOCK_FILE = "trainer.lock"


@contextlib.contextmanager
def held(model_dir: str, force: bool = False,
         warn: Callable[[str], None] = warn_on_stderr) -> Iterator[str]:
    """Holds model_dir's lock for the `with` block (yields its path).

    Raises:
      ModelDirError: another live trainer holds it (one line naming it), or another host's
        trainer does and `force` is False; or model_dir is not a directory and cannot be
        made one.
    """
    path = os.path.join(model_dir, LOCK_FILE)
    if "://" in model_dir:
        warn(f"{model_dir}: no lock on a remote file system; make sure one trainer at a "
             "time writes it")
        yield path
        return
    _make_directory(model_dir)
    mine = _take(path, force, warn)
    try:
        yield path
    finally:
        if _read(path) == mine:  # not taken over meanwhile by --force_unlock
            os.remove(path)


def _make_directory(model_dir: str):
    """Makes model_dir (and its parents) unless it is a directory already.

    os.makedirs(exist_ok=True) still raises FileExistsError when the name is there but is
    no directory when it looks: a file or a dangling symlink, or a directory that another
    program removed or moved aside (a rename onto it, a cleanup) between its mkdir and its
    check. The first is one line; the second, made again.

    Raises:
      ModelDirError: model_dir, or a directory on its path, is something else.
    """
    for _ in range(5):
        try:
            os.makedirs(model_dir, exist_ok=True)
            return
        except FileExistsError:
            if os.path.lexists(model_dir) and not os.path.isdir(model_dir):
                raise ModelDirError(f"{model_dir} exists and is not a directory: use another "
                                    "--model_dir") from None
        except NotADirectoryError:
            raise ModelDirError(f"{model_dir} cannot be made: a part of its path is a file, "
                                "not a directory") from None
    raise ModelDirError(f"{model_dir} keeps disappearing as it is made: another program is "
                        "removing or moving it")


def _take(path: str, force: bool, warn: Callable[[str], None]) -> dict:
    mine = {"host": socket.gethostname(), "pid": os.getpid(),
            "started": datetime.datetime.now(datetime.timezone.utc).isoformat(
                timespec="seconds"),
            "process_start": _process_start(os.getpid())}
    for _ in range(5):  # a lock removed or taken over meanwhile: look again
        try:
            descriptor = os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
        except FileExistsError:
            holder = _read(path)
            if holder is None:  # removed since, or being written: look again shortly
                time.sleep(0.5)
                holder = _read(path)
            if holder is not None:
                _stop_or_take_over(path, holder, force, warn)
            elif os.path.exists(path):  # a trainer killed as it wrote the lock
                warn(f"{path}: taking over a damaged lock")
                with contextlib.suppress(FileNotFoundError):
                    os.remove(path)
            continue
        with os.fdopen(descriptor, "w") as f:
            json.dump(mine, f)
        return mine
    raise ModelDirError(f"{path}: another trainer keeps taking this model directory's lock; "
                        "stop it, or use another --model_dir")


def _stop_or_take_over(path: str, holder: dict, force: bool, warn: Callable[[str], None]):
    """Removes a lock whose trainer is gone (or `force`), else raises ModelDirError."""
    who = (f"trainer.task pid {holder.get('pid')} on host {holder.get('host')} since "
           f"{holder.get('started')}")
    here = holder.get("host") == socket.gethostname()
    if here and not _running(holder):
        warn(f"{path}: taking over the lock of {who}, which no longer runs")
    elif not here and force:
        warn(f"{path}: taking over the lock of {who} (--force_unlock)")
    elif here:
        raise ModelDirError(f"{os.path.dirname(path)} is being trained by {who} ({path}); "
                            "stop it first, or use another --model_dir")
    else:
        raise ModelDirError(f"{os.path.dirname(path)} is being trained by {who} ({path}); if "
                            "that trainer is gone, rerun with --force_unlock")
    with contextlib.suppress(FileNotFoundError):
        os.remove(path)


def _running(holder: dict) -> bool:
    """Whether the holder's process (same host) still runs: its pid is alive and, where
    /proc says, started when the lock says."""
    try:
        pid = int(holder["pid"])
        os.kill(pid, 0)
    except (KeyError, TypeError, ValueError, ProcessLookupError):
        return False
    except PermissionError:  # alive, another user's
        pass
    started = holder.get("process_start")
    return started is None or _process_start(pid) in (None, started)


def _process_start(pid: int) -> Optional[int]:
    """The process's start time in clock ticks since boot (/proc/PID/stat's 22nd field), or
    None where /proc cannot say."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            # The command name (field 2) may hold spaces: count fields after its ")".
            return int(f.read().rsplit(")", 1)[1].split()[19])
    except (OSError, IndexError, ValueError):
        return None


def _read(path: str) -> Optional[dict]:
    """The lock's contents, or None (no lock, or one not yet written whole)."""
    try:
        with open(path) as f:
            holder = json.load(f)
    except (OSError, ValueError):
        return None
    return holder if isinstance(holder, dict) else None
