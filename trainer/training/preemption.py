"""Preemption: a cloud's SIGTERM (or a user's Ctrl-C, SIGINT) ends training with a
checkpoint at the update in flight, so that the same command resumes from there.

One worker: the signal is noted, the update in flight finishes, the trainer writes a
checkpoint at that step and raises `Preempted`. Several workers (MultiWorkerMirroredStrategy)
must stop at the same step, or the ones still training wait forever in an all-reduce:
`tf.distribute.experimental.PreemptionCheckpointHandler` agrees on the step through the
coordination service (the signalled worker names its next step, every worker acknowledges,
all save after it), with this module's signal handlers as its termination watcher.
"""

import os
import shutil
import signal
import tempfile
import threading
import time
from typing import Callable, Optional

import tensorflow as tf

from trainer.training import distribute

# sysexits.h EX_TEMPFAIL: "a temporary failure ... the user is invited to retry". A
# scheduler that restarts on this status resumes the run.
PREEMPTED_STATUS = 75
SIGNALS = (signal.SIGTERM, signal.SIGINT)
_CHIEF_LINGER_SECONDS = 2.0


class Preempted(Exception):
    """Training stopped on a signal after writing a checkpoint: `step`, `checkpoint`."""

    def __init__(self, signal_name: str, step: int, checkpoint: str):
        super().__init__(f"preempted by {signal_name} at step {step}: wrote {checkpoint}; "
                         "the same command resumes from it")
        self.signal_name, self.step, self.checkpoint = signal_name, step, checkpoint


class PreemptionWatcher:
    """Notes SIGTERM and SIGINT, and after each update (`after_update`) checkpoints and
    raises `Preempted` once every worker has reached the agreed step.

    Args:
      strategy: the run's strategy (its cluster resolver under MultiWorkerMirroredStrategy).
      save: save(step, *save_args) writes the checkpoint of `step` (every worker takes
        part) and returns its path in the model directory.
    Use as a context manager: the previous signal handlers come back on exit.
    """

    def __init__(self, strategy: tf.distribute.Strategy, save: Callable[[int], str]):
        self.save = save
        self.received: Optional[str] = None  # the signal's name, once one came
        self._noted = threading.Event()
        self._previous = {}
        self._saved = None  # (step, path) of the checkpoint written on preemption
        self._handler = None
        self._scratch = None
        if distribute.cluster_workers() > 1:
            config = tf.distribute.experimental.TerminationConfig(
                termination_watcher_fn=self._noted.is_set, exit_fn=self._raise,
                save_fn=self._save, grace_period=0)
            # The handler counts updates from 0 in every process, so the workers agree on
            # the count; it would keep that count in the checkpoint it is given, where a
            # resumed chief and a resumed worker would read different values. Given an
            # empty checkpoint in a scratch directory, with `save` writing the real one,
            # it keeps nothing.
            self._scratch = tempfile.mkdtemp(prefix="preemption_")
            self._handler = tf.distribute.experimental.PreemptionCheckpointHandler(
                strategy.cluster_resolver, tf.train.Checkpoint(),
                os.path.join(self._scratch, "handler"), termination_config=config)

    def __enter__(self):
        if threading.current_thread() is threading.main_thread():
            for number in SIGNALS:
                self._previous[number] = signal.signal(number, self._note)
        return self

    def __exit__(self, *exc_info):
        for number, handler in self._previous.items():
            signal.signal(number, handler)
        self._previous.clear()
        if self._handler is not None:
            # Its threads wait on the coordination service: stop them while it still runs
            # (what the handler's __del__ would do, too late, at interpreter exit).
            # pylint: disable=protected-access
            self._handler._stop_cluster_wise_termination_watcher_thread()
            self._handler._stop_poll_termination_signal_thread()
            self._handler = None
            if self._saved is not None and distribute.is_chief():
                # The chief hosts the coordination service: it leaves last, or the other
                # workers' exits report a gRPC error (which their quiet console drops,
                # but not a verbose one).
                time.sleep(_CHIEF_LINGER_SECONDS)
        if self._scratch is not None:
            shutil.rmtree(self._scratch, ignore_errors=True)

    @property
    def noted(self) -> bool:
        """Whether this worker has received a signal (training stops soon)."""
        return self._noted.is_set()

    def _note(self, number, frame):
        del frame
        if self._noted.is_set() and number == signal.SIGINT:
            raise KeyboardInterrupt  # a second Ctrl-C does not wait for the checkpoint
        if self.received is None:
            self.received = signal.Signals(number).name
        self._noted.set()

    def after_update(self, step: int, *save_args):
        """Called after every update, `step` being the updates done: raises Preempted,
        after save(step, *save_args) wrote the checkpoint, when training must stop here."""
        if self._handler is not None:
            # Saves (self._save) and raises (self._raise) at the cluster's agreed step.
            self._handler.save_checkpoint_if_preempted(step, *save_args)
        elif self._noted.is_set():
            self._save(step, *save_args)
            self._raise()

    def _save(self, step: int, *save_args):
        self._saved = (step, self.save(step, *save_args))

    def _raise(self):
        step, path = self._saved
        raise Preempted(self.received or "a peer worker's preemption", step, path)
