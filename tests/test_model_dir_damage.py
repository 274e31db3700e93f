"""A model directory and an export that a crash, a full disk or a changed command has left
behind, as a user meets them: real files cut short, the real programs (their main, in this
process: programs.program). Each case ends in one line that names the file or flag (exit
2), or in a run that goes on from what is intact with one line saying so."""

import json
import shutil

import pytest
import tensorflow as tf

from conftest import REPO
from programs import program

pytestmark = pytest.mark.slow

# The flags of conftest's `exported` run, which wrote checkpoints at steps 15 and 30.
EXPORTED_RUN = ["--warmup_steps=30", "--eval_every=0", "--checkpoint_every=15",
                "--log_every=5", "--export_dir=none"]


def cut_short(path):
    """Truncates a file to half its size, as a crash mid-write or a full disk leaves it."""
    data = path.read_bytes()
    path.write_bytes(data[:len(data) // 2])


def one_error_line(result, name):
    """Asserts that `result` ended with status 2 and one line from trainer.<name>, no
    traceback; returns that line."""
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert result.returncode == 2, result.stderr[-3000:]
    assert "Traceback" not in result.stderr, result.stderr[-3000:]
    assert lines[-1].startswith(f"trainer.{name}: error: "), lines[-3:]
    return lines[-1]


@pytest.fixture
def model_dir(exported, tmp_path):
    """A copy of the session's trained model directory (checkpoints 15 and 30)."""
    copy = tmp_path / "run"
    shutil.copytree(exported.model_dir, copy)
    assert [path.rsplit("/", 1)[1] for path in
            tf.train.get_checkpoint_state(str(copy)).all_model_checkpoint_paths] == \
        ["ckpt-15", "ckpt-30"]
    return copy


def test_a_newest_checkpoint_cut_short_is_passed_over_with_one_warning(model_dir, tmp_path):
    """By the export, and by a resume, which also starts a moving average the checkpoint
    lacks from its weights, with one line."""
    cut_short(model_dir / "ckpt-30.data-00000-of-00001")
    export = program("export", f"--model_dir={model_dir}",
                     f"--export_dir={tmp_path / 'export'}", cwd=tmp_path)
    assert export.returncode == 0, export.stderr[-3000:]
    warnings = [line for line in export.stderr.splitlines() if "damaged" in line]
    assert len(warnings) == 1 and f"{model_dir}/ckpt-30 is damaged" in warnings[0], warnings
    info = json.loads((tmp_path / "export" / "1" / "assets.extra" / "export.json").read_text())
    assert info["checkpoints"] == [f"{model_dir}/ckpt-15"]

    # The resume also asks for a moving average, which the checkpoint lacks.
    resumed = program("task", *EXPORTED_RUN, "--train_steps=20", "--ema_decay=0.999",
                      f"--model_dir={model_dir}", cwd=REPO)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert f"warning: checkpoint {model_dir}/ckpt-30 is damaged" in resumed.stdout
    assert f"resumed from {model_dir}/ckpt-15 at step 15" in resumed.stdout
    said = [line for line in resumed.stdout.splitlines() if "moving average" in line]
    assert said == [f"{model_dir}/ckpt-15 holds no moving average of the weights: "
                    "--ema_decay=0.999 starts one from its weights at step 15"], said
    # The run wrote its own step 20 over the damaged files' successor, with the average.
    assert tf.train.latest_checkpoint(str(model_dir)).endswith("ckpt-20")
    names = {name for name, _ in tf.train.list_variables(str(model_dir / "ckpt-20"))}
    assert any(name.startswith("moving_average/") for name in names)


@pytest.mark.parametrize("damaged, other", [("config.json", "export"),
                                            ("spm.model", "average")])
def test_a_half_written_config_or_vocabulary_is_one_line_naming_it(model_dir, tmp_path,
                                                                   damaged, other):
    cut_short(model_dir / damaged)
    flags = {"export": [f"--export_dir={tmp_path / 'export'}"], "average": ["--last=2"]}
    for name, flags, cwd in [(other, flags[other], tmp_path),
                             ("task", [*EXPORTED_RUN, "--train_steps=40"], REPO)]:
        line = one_error_line(program(name, *flags, f"--model_dir={model_dir}", cwd=cwd), name)
        assert f"{model_dir}/{damaged}" in line, line
    assert not (tmp_path / "export").exists()


def test_a_damaged_checkpoint_index_is_one_line_not_a_fresh_start(model_dir, tmp_path):
    """TensorFlow takes a directory whose `checkpoint` index does not parse for one without
    checkpoints: a trainer would start over on top of them. Every program stops instead."""
    index = model_dir / "checkpoint"
    cut_short(index)
    for name, flags, cwd in [("export", [f"--export_dir={tmp_path / 'export'}"], tmp_path),
                             ("task", [*EXPORTED_RUN, "--train_steps=40"], REPO)]:
        line = one_error_line(program(name, *flags, f"--model_dir={model_dir}", cwd=cwd), name)
        assert line.startswith(f"trainer.{name}: error: {index}, the index of the checkpoints "
                               "beside it, cannot be used (it does not parse)"), line
    assert sorted(path.name for path in model_dir.glob("ckpt-*.index")) == [
        "ckpt-15.index", "ckpt-30.index"]


def test_a_flag_that_contradicts_the_checkpoint_is_one_line_naming_both(model_dir):
    """The checkpoint was written without float16 loss scaling; mixed_float16 lays the
    optimizer's state out differently."""
    result = program("task", *EXPORTED_RUN, "--train_steps=40", "--precision=mixed_float16",
                     f"--model_dir={model_dir}", cwd=REPO)
    line = one_error_line(result, "task")
    assert "--precision=mixed_float16 contradicts" in line
    assert f"{model_dir}/ckpt-30" in line


def test_a_damaged_export_is_one_line_for_every_program_that_reads_it(exported, tmp_path):
    export = tmp_path / "export"
    shutil.copytree(exported.export_dir, export)
    (tmp_path / "in.txt").write_text("one\n")
    cut_short(export / "1" / "assets.extra" / "export.json")
    translate = program("translate", f"--saved_model={export}", "--beam_size=2",
                        cwd=tmp_path)
    assert "export.json is damaged" in one_error_line(translate, "translate")
    cut_short(export / "1" / "saved_model.pb")
    for name, flags in [("translate", []),
                        ("evaluate", [f"--src={tmp_path / 'in.txt'}",
                                      f"--ref={tmp_path / 'in.txt'}"]),
                        ("visualize", ["--text=one", f"--out={tmp_path / 'png'}"])]:
        line = one_error_line(program(name, f"--saved_model={export}", *flags, cwd=tmp_path),
                              name)
        assert f"{export}/1" in line, line
