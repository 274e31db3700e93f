"""The model directory's files are written whole, also by several workers at once (the
workers of a MultiWorkerMirroredStrategy share one model directory); so are the directories
that exports, conversions and averages publish."""

import subprocess
import sys
from pathlib import Path

import pytest

from conftest import REPO
from trainer.model_dir import files

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


# A directory (an export, a conversion, an average) is published whole by one rename.

def test_a_staged_directory_appears_whole_under_its_name_and_leaves_no_staging(tmp_path):
    with files.staged_directory(str(tmp_path)) as staging:
        (Path(staging.path) / "weights").write_text("new")
        assert not (tmp_path / "model").exists(), "nothing under the name before publishing"
        assert staging.publish(str(tmp_path / "model")) == str(tmp_path / "model")
    assert [p.name for p in tmp_path.iterdir()] == ["model"]
    assert (tmp_path / "model" / "weights").read_text() == "new"


def test_a_failed_write_leaves_nothing_and_the_old_directory_as_it_was(tmp_path):
    (tmp_path / "model").mkdir()
    (tmp_path / "model" / "weights").write_text("old")
    with pytest.raises(OSError, match="No space left"):
        with files.staged_directory(str(tmp_path)) as staging:
            (Path(staging.path) / "weights").write_text("half")
            raise OSError(28, "No space left on device")
    assert [p.name for p in tmp_path.iterdir()] == ["model"]
    assert (tmp_path / "model" / "weights").read_text() == "old"


def test_replace_swaps_in_the_new_directory_and_removes_the_old(tmp_path):
    (tmp_path / "model").mkdir()
    (tmp_path / "model" / "stale").write_text("old")
    with files.staged_directory(str(tmp_path)) as staging:
        (Path(staging.path) / "weights").write_text("new")
        staging.publish(str(tmp_path / "model"), replace=True)
    assert [p.name for p in tmp_path.iterdir()] == ["model"]
    assert [p.name for p in (tmp_path / "model").iterdir()] == ["weights"]


def test_without_replace_a_taken_name_is_refused_and_the_staging_kept_for_another(tmp_path):
    (tmp_path / "1").mkdir()
    (tmp_path / "1" / "saved_model.pb").write_text("another export's")
    with files.staged_directory(str(tmp_path)) as staging:
        (Path(staging.path) / "saved_model.pb").write_text("ours")
        with pytest.raises(FileExistsError):
            staging.publish(str(tmp_path / "1"))
        staging.publish(str(tmp_path / "2"))  # the next version, as an exporter does
    assert (tmp_path / "1" / "saved_model.pb").read_text() == "another export's"
    assert (tmp_path / "2" / "saved_model.pb").read_text() == "ours"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["1", "2"]


def test_two_writers_stage_apart(tmp_path):
    with files.staged_directory(str(tmp_path)) as first, \
            files.staged_directory(str(tmp_path)) as second:
        assert first.path != second.path
        first.publish(str(tmp_path / "a"))
        second.publish(str(tmp_path / "b"))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a", "b"]


def test_a_directory_is_published_only_in_the_parent_it_was_staged_in(tmp_path):
    (tmp_path / "elsewhere").mkdir()
    with files.staged_directory(str(tmp_path)) as staging:
        with pytest.raises(ValueError, match="is not in"):
            staging.publish(str(tmp_path / "elsewhere" / "model"))
    assert [p.name for p in tmp_path.iterdir()] == ["elsewhere"]
