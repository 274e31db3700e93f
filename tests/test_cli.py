"""A program run in the tests' own process (trainer.cli.call, tests/programs.py) says and
returns what it does in a process of its own (trainer.cli.run): the tests that check a
program's messages that way check what a user sees."""

import contextlib
import io
import subprocess
import sys

import pytest

from conftest import REPO, _env
from programs import program
from trainer.config import DataConfig


@pytest.mark.parametrize("flags", [["--config=huge"], ["--no_such_flag=1"], ["extra"],
                                   ["--max_len=128", "--batch_tokens=64"]],
                         ids=["bad_value", "unknown_flag", "positional", "checked_config"])
def test_a_program_in_this_process_says_what_it_says_in_its_own(flags, tmp_path):
    """The same status and stdout, and the same stderr: one line, named after the
    program (these stop before TensorFlow, so its start-up lines do not differ)."""
    args = [*flags, f"--model_dir={tmp_path / 'run'}"]
    own = subprocess.run([sys.executable, "-m", "trainer.task", *args], cwd=REPO, env=_env(),
                         capture_output=True, text=True, timeout=60)
    here = program("task", *args)
    assert (here.returncode, here.stdout, here.stderr) == (own.returncode, own.stdout,
                                                           own.stderr)
    assert own.returncode == 2 and own.stderr.startswith("trainer.task: error: ")
    assert len(own.stderr.splitlines()) == 1, own.stderr


def test_flags_start_from_their_defaults_in_every_call(tmp_path):
    """A flag given to one call is not left set for the next one: absl's FLAGS is the
    process's, and the program's flags are parsed afresh. (A file as --model_dir: a run
    that got past the flags' checks stops there, before any work.)"""
    taken = tmp_path / "taken"
    taken.write_text("not a model directory\n")
    first = program("task", "--max_len=16", "--batch_tokens=8", f"--model_dir={taken}")
    assert first.stderr.startswith(
        "trainer.task: error: batch_tokens=8 is less than max_len=16:"), first.stderr
    # max_len back at its default: 32 tokens are too few for it, as they were not for 16.
    second = program("task", "--batch_tokens=32", f"--model_dir={taken}")
    assert second.stderr.startswith("trainer.task: error: batch_tokens=32 is less than "
                                    f"max_len={DataConfig.max_len}:"), second.stderr


def test_call_parses_each_call_from_the_flags_defaults(tmp_path):
    """trainer.cli.call itself, the in-process run of tests/programs.py, gives a program
    its flags from their defaults on every call: trainer.task's main called again through
    it, its flags not defined afresh in between (programs.program does that too, which
    hides a call that kept the last call's flags), does not see the first call's
    --max_len. (A file as --model_dir: a run past the flags' checks stops there.)"""
    from trainer import cli
    taken = tmp_path / "taken"
    taken.write_text("not a model directory\n")
    first = program("task", "--max_len=16", "--batch_tokens=8", f"--model_dir={taken}")
    assert first.stderr.startswith(
        "trainer.task: error: batch_tokens=8 is less than max_len=16:"), first.stderr
    err = io.StringIO()
    with contextlib.redirect_stderr(err), pytest.raises(SystemExit) as stopped:
        cli.call(sys.modules["trainer.task"].main,
                 ["trainer.task", "--batch_tokens=32", f"--model_dir={taken}"])
    assert stopped.value.code == 2
    assert err.getvalue().startswith("trainer.task: error: batch_tokens=32 is less than "
                                     f"max_len={DataConfig.max_len}:"), err.getvalue()


# A program whose main returns: what it printed, and a file its exit handler writes.
_RETURNING = """
import atexit, os, sys
from trainer import cli

def main(argv):
    marker = os.path.join(os.path.dirname(os.path.abspath(__file__)), "marker")
    atexit.register(lambda: open(marker, "w").write("exit handler ran"))
    print("the program's last line")

sys.argv = ["returning"]
cli.run(main)
"""


@pytest.mark.parametrize("profiled", [False, True], ids=["plain", "under_cprofile"])
def test_a_program_whose_main_returns_ends_with_its_output_and_exit_handlers(profiled,
                                                                            tmp_path):
    """run ends the process without the interpreter's teardown once main returns: status
    0, stdout (a pipe, so buffered) all there, the exit handlers run; under cProfile,
    which writes its profile once the program is over, the profile is there too."""
    script, marker, profile = tmp_path / "returning.py", tmp_path / "marker", tmp_path / "prof"
    script.write_text(_RETURNING)
    command = [sys.executable, *(["-m", "cProfile", "-o", str(profile)] if profiled else []),
               str(script)]
    env = {k: v for k, v in _env().items() if k != "PYTHONUNBUFFERED"}  # Python's default
    result = subprocess.run(command, cwd=REPO, env=env, capture_output=True, text=True,
                            timeout=60)
    assert (result.returncode, result.stdout) == (0, "the program's last line\n"), result.stderr
    assert marker.read_text() == "exit handler ran"
    assert profile.exists() == profiled


_CACHE_CAPACITY = """
import os, sys
from trainer import cli

sys.argv = ["capacity"]
cli.run(lambda argv: print(os.environ["ONEDNN_PRIMITIVE_CACHE_CAPACITY"]))
"""


@pytest.mark.parametrize("given", [None, "2048"], ids=["default", "the_users"])
def test_a_program_runs_with_onednns_primitive_cache_at_the_searchs_size_unless_set(given,
                                                                                   tmp_path):
    """The programs' oneDNN primitive cache holds a pass of a search's kernels
    (cli.ONEDNN_PRIMITIVE_CACHE_CAPACITY, above oneDNN's 1,024), set before TensorFlow
    runs anything; a value in the user's environment stands."""
    from trainer import cli
    script = tmp_path / "capacity.py"
    script.write_text(_CACHE_CAPACITY)
    env = {k: v for k, v in _env().items() if k != "ONEDNN_PRIMITIVE_CACHE_CAPACITY"}
    result = subprocess.run([sys.executable, str(script)], cwd=REPO,
                            env={**env, **({"ONEDNN_PRIMITIVE_CACHE_CAPACITY": given} if given
                                           else {})},
                            capture_output=True, text=True, timeout=60)
    expected = given or str(cli.ONEDNN_PRIMITIVE_CACHE_CAPACITY)
    assert (result.returncode, result.stdout) == (0, f"{expected}\n"), result.stderr
    assert cli.ONEDNN_PRIMITIVE_CACHE_CAPACITY > 1024
