"""A full disk (trainer/cli.py): a program whose write runs out of space prints one line
naming it and exits 28 (ENOSPC), leaving no unfinished files; the trainer's last good
checkpoint stays, and the same command resumes from it once there is space. On a small
tmpfs mounted here, which needs root (CI runs as root)."""

import contextlib
import os
import subprocess
import sys

import pytest

from conftest import REPO, _env

pytestmark = pytest.mark.slow

NO_SPACE_STATUS = 28


@contextlib.contextmanager
def tmpfs(path, megabytes):
    """A tmpfs of `megabytes` mounted at path (made) for the block; skips the test where
    this process may not mount one."""
    if os.geteuid() != 0:
        pytest.skip("mounting a small tmpfs needs root (CI runs as root)")
    path.mkdir()
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={megabytes}m", "tmpfs",
                              str(path)], capture_output=True, text=True)
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {mounted.stderr.strip()}")
    try:
        yield path
    finally:
        subprocess.run(["umount", "-l", str(path)], check=False)


def run(args):
    return subprocess.run([sys.executable, "-m", *args], cwd=REPO, env=_env(),
                          capture_output=True, text=True, timeout=900)


def unfinished(root):
    return [os.path.join(d, n) for d, dirs, names in os.walk(root) for n in dirs + names
            if n.endswith("_temp") or ".tmp-" in n or "tempstate" in n]


def test_a_full_disk_stops_the_trainer_in_one_line_and_the_run_resumes(tmp_path):
    with tmpfs(tmp_path / "disk", 6) as disk:
        # The builtin run: its checkpoint at step 20 (a 3.2 MB model and optimizer, 0.3 MB
        # of stream state) fits, the one at step 40 does not.
        task = ["trainer.task", "--train_steps=40", "--checkpoint_every=20", "--eval_every=0",
                "--export_dir=none", "--precision=float32", f"--model_dir={disk / 'model'}"]
        full = run(task)
        assert full.returncode == NO_SPACE_STATUS, full.stderr[-3000:]
        line = full.stderr.strip().splitlines()[-1]
        assert line.startswith(f"trainer.task: error: no space left on device writing "
                               f"{disk / 'model'}/")
        assert line.endswith(" (removed); the files written before it are intact")
        assert "Traceback" not in full.stderr
        assert unfinished(disk) == []
        assert (disk / "model" / "ckpt-20.index").exists()
        subprocess.run(["mount", "-o", "remount,size=200m", str(disk)], check=True)
        resumed = run(task)
        assert resumed.returncode == 0, resumed.stderr[-3000:]
        assert f"resumed from {disk / 'model' / 'ckpt-20'} at step 20" in resumed.stdout


def test_a_full_disk_stops_an_export_and_leaves_nothing(exported, tmp_path):
    with tmpfs(tmp_path / "disk", 2) as disk:
        (disk / "filler").write_bytes(b"\0" * (1024 * 1024 + 512 * 1024))
        result = run(["trainer.export", f"--model_dir={exported.model_dir}",
                      f"--export_dir={disk / 'export'}"])
        assert result.returncode == NO_SPACE_STATUS, result.stderr[-3000:]
        line = result.stderr.strip().splitlines()[-1]
        assert line.startswith(f"trainer.export: error: no space left on device writing {disk}/")
        assert sorted(os.listdir(disk)) in (["filler"], ["export", "filler"])
        assert unfinished(disk) == []
        if (disk / "export").exists():
            assert os.listdir(disk / "export") == []
