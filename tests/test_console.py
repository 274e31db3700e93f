"""The quiet console: a program's last line stays its last, whatever TensorFlow's runtime
writes to file descriptor 2 meanwhile (from its threads) or would write at exit (after the
interpreter's exit handlers). A real subprocess, writing to fd 2 as the C++ runtime does."""

import subprocess
import sys

from conftest import REPO

PROGRAM = r"""
import atexit, os, sys, threading, time
from trainer import cli, console

# What the runtime's destructors would write after the exit handlers (registered before
# quiet(), so after the console's own): cli.stop ends the process before any of them.
atexit.register(lambda: os.write(2, b"E0000 00:00:2.0 7 agent.cc:1] at exit\n"
                                    b":UNKNOWN:Error received from peer\n"))
console.quiet()
os.write(2, b"I0000 00:00:1.0 7 port.cc:1] an INFO line\n")
os.write(2, b"W0000 00:00:1.0 7 x.cc:1] a warning while running\n")
time.sleep(0.5)  # the filter passes the warning on while the program runs

def coordination_agent():  # a runtime thread reporting, without pause, until the end
    while True:
        os.write(2, b"E0000 00:00:2.0 8 agent.cc:2] a peer has gone\n")

threading.Thread(target=coordination_agent, daemon=True).start()
time.sleep(0.2)
cli.stop("preempted at step 8", 0)
"""


def test_the_programs_last_line_is_the_last_on_stderr_whatever_the_runtime_writes_after():
    for _ in range(3):  # the runtime's thread races the program's last line
        result = subprocess.run([sys.executable, "-c", PROGRAM], cwd=REPO, capture_output=True,
                                timeout=60)
        assert result.returncode == 0, result.stderr.decode()
        lines = result.stderr.decode().splitlines()
        assert lines[-1] == "-c: preempted at step 8", lines[-5:]
        assert "W0000 00:00:1.0 7 x.cc:1] a warning while running" in lines
        assert not any("INFO line" in line or "at exit" in line or "Error received" in line
                       for line in lines), lines
