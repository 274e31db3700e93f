"""The README's Quick start comes out as printed: the main job (`python -m trainer.task` with
no flags, as the README runs it) trains a model that gets the builtin validation set right
and ends by translating the README's example, and the README's "try the export" block, run
as written, prints what the README says it prints. The README's Python blocks (the library
in ten lines, loading the export) run as written beside it."""

import re
import subprocess
import sys

import pytest

from conftest import MAIN_JOB, REPO, _env, run

# With test_ctranslate2, which uses the same main job's model (conftest.main_job).
pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("main_job")]


def quick_start_blocks():
    """The ```bash blocks of the README's Quick start section, in order."""
    readme = (REPO / "README.md").read_text(encoding="utf-8")
    section = re.search(r"^## Quick start\n(.+?)^## ", readme, re.S | re.M).group(1)
    return re.findall(r"```bash\n(.+?)```", section, re.S)


def test_the_quick_start_has_the_set_up_commands_ci_runs_and_an_example():
    setup, example = quick_start_blocks()
    ci = (REPO / ".ci" / "run").read_text()
    test_command = next(line for line in setup.splitlines() if "pytest" in line)
    assert test_command in ci
    assert "pip install -e . && python -m trainer.task" in setup.splitlines()
    assert "python -m trainer.translate" in example and "\n# " in example


def test_the_main_job_translates_the_readmes_example_as_printed(main_job):
    setup, example = quick_start_blocks()
    # The main job as the README runs it, after its `pip install -e . &&` (done by CI).
    main_job_line = next(line for line in setup.splitlines() if "python -m trainer.task" in line)
    assert main_job_line.split("&&")[-1].strip() == MAIN_JOB
    job_output, directory = main_job.stdout, main_job.directory

    final = re.search(r"^final: .*exact_match ([0-9.]+)", job_output, re.M)
    assert final and float(final.group(1)) >= 0.998, job_output[-2000:]
    sentence = re.search(r'echo "([^"]+)"', example).group(1)
    printed = re.search(r"^# (.+)$", example, re.M).group(1)
    assert f"example through the export: {sentence} -> {printed}" in job_output, \
        job_output[-2000:]

    # The README's block, as written, in the directory the main job ran in.
    commands = "\n".join(line for line in example.splitlines()
                         if line.strip() and not line.startswith("#"))
    result = subprocess.run(["bash", "-c", commands], cwd=directory, env=_env(),
                            capture_output=True, timeout=600)
    assert result.returncode == 0, result.stderr.decode(errors="replace")[-2000:]
    assert result.stdout.decode("utf-8") == printed + "\n"

    # The README's Python: train with compile/fit, then load the main job's export.
    readme = (REPO / "README.md").read_text(encoding="utf-8")
    fit, load = re.findall(r"```python\n(.+?)```", readme, re.S)
    assert "model.fit(" in fit and "tf.saved_model.load(" in load
    run([sys.executable, "-c", fit], cwd=directory, env=_env())
    loaded = run([sys.executable, "-c", load], cwd=directory, env=_env())
    assert b"einundzwanzig" in loaded.stdout


def test_the_main_job_run_again_resumes_and_exports_version_2(main_job, tmp_path):
    """The README: "Run again, it resumes and exports version 2". The same command in a
    copy of the main job's directory (the shared one stays as built): it resumes at the
    last step, trains nothing, and writes saved_models/tiny_builtin/2 beside an unchanged
    version 1. (It runs the main job a second time: the claim is about that run.)"""
    import shutil
    directory = tmp_path / "again"
    shutil.copytree(main_job.directory, directory)
    version_1 = directory / "saved_models" / "tiny_builtin" / "1"
    before = (version_1 / "saved_model.pb").read_bytes()
    job = run(["bash", "-c", MAIN_JOB], cwd=directory, env=_env(), timeout=600)
    stdout = job.stdout.decode()
    assert "resumed from runs/tiny_builtin/ckpt-1000 at step 1000" in stdout, stdout[-2000:]
    assert "already at step 1000 of 1000; nothing to train" in stdout
    assert "exported SavedModel to saved_models/tiny_builtin/2" in stdout
    assert sorted(p.name for p in version_1.parent.iterdir()) == ["1", "2"]
    assert (version_1 / "saved_model.pb").read_bytes() == before
