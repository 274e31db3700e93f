"""The recipes (trainer/flagfiles/*.cfg) as `python -m trainer.task --flagfile=F` reads them:
every line a flag of trainer.task with a value it takes, and a few updates run with every
flag as written but the data, the model's size and a GPU precision, so that a typo in a
recipe fails here and not 52 minutes into a run, or on 8 GPUs."""

import copy
import dataclasses
import json
import re
from pathlib import Path

import pytest
from absl import flags

from conftest import REPO
from programs import _program_module, program

RECIPES = sorted((REPO / "trainer" / "flagfiles").glob("*.cfg"))
# What a few updates on this machine put in place of a recipe's data and model: the builtin
# corpus at its own vocabulary size (the recipes' 8000 or 37000 pieces are more than its
# sentences hold), the tiny preset, float32 in place of a GPU's precision or of the 20 s
# that --precision=auto spends timing this CPU (tests/test_precision.py tests it), and
# validation BLEU on 16 sentences, not all 1,000 (an untrained model's translations run to
# the length limit).
DATA_AND_MODEL = {"dataset": "builtin", "train_src": "", "train_tgt": "", "eval_src": "",
                  "eval_tgt": "", "vocab_size": "500", "config": "tiny",
                  "precision": "float32", "bleu_sentences": "16"}


def recipe_flags(path: Path) -> dict:
    """{flag name: value as written} of a flagfile's lines (comments and blanks left out)."""
    written = {}
    for line in path.read_text().splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            name, _, value = line.partition("=")
            assert name.startswith("--") and name[2:] not in written, (path.name, line)
            written[name[2:]] = value
    return written


def test_training_md_gives_each_recipes_command_and_builtin_is_no_flags_at_all():
    """docs/training.md's table: a `--flagfile=` command for every recipe; and builtin.cfg
    is "the same as no flags": each of its values is trainer.task's default."""
    assert {path.stem for path in RECIPES} == {"builtin", "multi30k", "wmt14_base",
                                               "wmt14_big"}
    page = (REPO / "docs" / "training.md").read_text()
    for path in RECIPES:
        assert f"--flagfile=trainer/flagfiles/{path.name}" in page, path.name
    task = _program_module("task")

    def configs(*args):  # trainer.task's model, data and run configs from these flags
        flags.FLAGS.unparse_flags()
        flags.FLAGS(["trainer.task", *args])
        try:
            data = task.data_config()
            run = task.run_config(data)
            # No data flag reads the builtin corpus (trainer/data/sources.py), as builtin.cfg's
            # --dataset=builtin does.
            return task.model_config(), dataclasses.replace(data, dataset=data.dataset or "builtin"), run
        finally:
            flags.FLAGS.unparse_flags()

    assert configs(f"--flagfile={RECIPES[0].parent / 'builtin.cfg'}") == configs()


@pytest.mark.parametrize("path", RECIPES, ids=lambda p: p.stem)
def test_trainer_tasks_flags_parse_every_line_of_the_recipe_as_written(path):
    """absl's own parse of --flagfile (a copy of trainer.task's flags): each line names a
    flag of trainer.task, takes its value as written, and the file flags name files that
    exist from the repository root (where the README runs the recipe)."""
    _program_module("task")
    parsed = copy.deepcopy(flags.FLAGS)
    parsed.unparse_flags()
    parsed(["trainer.task", f"--flagfile={path}"])
    for name, value in recipe_flags(path).items():
        assert name in parsed, f"{path.name}: --{name} is not a flag of trainer.task"
        flag = parsed[name]
        assert flag.present, (path.name, name)
        assert flag.value == flag.parser.parse(value), (path.name, name, flag.value)
        if name in ("train_src", "train_tgt", "eval_src", "eval_tgt"):
            assert (REPO / value).is_file() or not (REPO.parent / "shared").is_dir(), (
                f"{path.name}: --{name}={value} is no file beside the repository")


def _few_updates(path: Path) -> list:
    """The recipe's flags with DATA_AND_MODEL's in place and as few updates as its export
    needs: one checkpoint an update, as many updates as it averages (at least 3)."""
    written = recipe_flags(path)
    updates = max(3, int(written.get("average_last", "0")))
    replaced = {**DATA_AND_MODEL, "train_steps": str(updates), "checkpoint_every": "1",
                "keep_checkpoints": str(max(updates, int(written.get("keep_checkpoints",
                                                                     "0")))),
                "warmup_steps": written.get("warmup_steps", "4000")}
    if written.get("dataset", "").startswith("tfds:"):
        replaced.update(source_lang="en", target_lang="de")
    return [f"--flagfile={path}", *(f"--{name}={value}" for name, value in replaced.items())]


# The recipes whose export runs here (30 s of tracing each): multi30k's moving average and
# wmt14_base's mean of its last 5. builtin.cfg's export is the main job's (no flags, the
# same configs: the test above), and wmt14_big's is base's with 20 for 5: their runs stop
# at the export (--export_dir=none) and check the checkpoints it would read.
EXPORTED = ("multi30k", "wmt14_base")


@pytest.mark.slow
@pytest.mark.parametrize("path", RECIPES, ids=lambda p: p.stem)
def test_each_recipe_trains_a_few_updates_and_keeps_the_weights_it_exports(path, tmp_path):
    """trainer.task on the recipe, with only the data, the model's size, the precision,
    the validation sentences and the counts of updates and checkpoints replaced: it trains,
    validates, keeps the checkpoints its export averages, and (EXPORTED) exports the
    weights the recipe names (the moving average, the mean of its last N) with its
    search."""
    written = recipe_flags(path)
    args = _few_updates(path)
    export_dir = tmp_path / "export" if path.stem in EXPORTED else "none"
    result = program("task", *args, f"--model_dir={tmp_path / 'run'}",
                     f"--export_dir={export_dir}", cwd=tmp_path)
    assert result.returncode == 0, (args, result.stdout[-2000:], result.stderr[-2000:])
    assert re.search(r"^step \d+: validation loss [0-9.]+", result.stdout, re.M), result.stdout
    average_last = int(written.get("average_last", "0"))
    checkpoints = sorted((tmp_path / "run").glob("ckpt-*.index"))
    assert len(checkpoints) >= max(average_last, 1), checkpoints
    if "dropout" in written.get("hparams", ""):
        dropout = float(re.search(r"dropout=([0-9.]+)", written["hparams"]).group(1))
        config = json.loads((tmp_path / "run" / "config.json").read_text())
        assert config["model"]["dropout"] == dropout
    if export_dir == "none":
        assert "exported SavedModel" not in result.stdout
        return
    info = json.loads((export_dir / "1" / "assets.extra" / "export.json").read_text())
    if written.get("export_weights") == "ema":
        assert info["weights"] == "ema", info["weights"]
    else:
        assert info["weights"] == "average" and len(info["checkpoints"]) == average_last, (
            info["weights"], info["checkpoints"])
    for name in ("length_penalty", "alpha", "stopping"):
        if name in written:
            assert str(info[name]) == written[name], (name, info[name])
