"""The model directory's small files are written whole, also by several workers at once
(the workers of a MultiWorkerMirroredStrategy share one model directory)."""

import subprocess
import sys

import pytest

from conftest import REPO

# A worker: imports TensorFlow, says so, waits for the word, then writes one file 300 times.
WRITER = """
import sys
from trainer.model_dir.files import write_atomically
path, letter = sys.argv[1], sys.argv[2]
print("ready", flush=True)
sys.stdin.readline()
for _ in range(300):
    write_atomically(path, letter * 10000)
"""


@pytest.mark.slow
def test_two_workers_writing_one_file_at_once_both_succeed_and_leave_it_whole(tmp_path):
    path = tmp_path / "config.json"
    writers = [subprocess.Popen([sys.executable, "-c", WRITER, str(path), letter], cwd=REPO,
                                stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True)
               for letter in "ab"]
    for writer in writers:
        assert writer.stdout.readline().strip() == "ready", writer.stderr.read()
    for writer in writers:  # both start writing at once
        writer.stdin.write("go\n")
        writer.stdin.flush()
    errors = [writer.communicate(timeout=300)[1] for writer in writers]
    assert [writer.returncode for writer in writers] == [0, 0], errors
    assert path.read_text() in ("a" * 10000, "b" * 10000)
    assert [p.name for p in tmp_path.iterdir()] == ["config.json"]  # no temporary file left
