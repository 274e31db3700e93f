"""What python -m trainer.task and python -m trainer.export ship, read from the files they
write: --export_weights=ema ships the moving average a run with --ema_decay keeps,
--average_last=N the mean of the last N checkpoints, and a run again into the same
directories resumes where the last one stopped and exports the next version (the README's
"Run again, it resumes and exports version 2").

One model directory for the module (`runs`, built once): its own, since the session's model
(`exported`) keeps no moving average. The task runs twice and the export once into it, a
few updates each, so that a test reads the weights the programs wrote."""

import json
import re

import numpy as np
import pytest
import tensorflow as tf

from conftest import QUICK, built_once, checkpoint_weights, exported_weights, latest_step
from programs import program, succeeded

pytestmark = pytest.mark.slow

# A checkpoint every 2 updates, all of them kept, and a moving average of the weights.
FLAGS = [*QUICK, "--checkpoint_every=2", "--keep_checkpoints=10", "--ema_decay=0.9"]
# The first run: 4 updates (checkpoints 2 and 4), the moving average exported (version 1).
FIRST = ["--train_steps=4", "--export_weights=ema"]
# The second, into the same directories: on to update 6, the mean of checkpoints 4 and 6
# exported (version 2).
SECOND = ["--train_steps=6", "--average_last=2"]
# Then trainer.export of the moving average of checkpoint 6 (version 3).
EXPORT = ["--export_weights=ema"]


def _train_export_train_export(root):
    """The two trainer.task runs and trainer.export into root/model and root/export;
    their stdout in root/<first, second, export>.txt."""
    dirs = [f"--model_dir={root / 'model'}", f"--export_dir={root / 'export'}"]
    for name, command in [("first", ["task", *FLAGS, *FIRST, *dirs]),
                          ("second", ["task", *FLAGS, *SECOND, *dirs]),
                          ("export", ["export", *EXPORT, *dirs])]:
        (root / f"{name}.txt").write_text(succeeded(program(*command, cwd=root)).stdout)


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    return built_once(tmp_path_factory, "task_exports", _train_export_train_export, FLAGS,
                      FIRST, SECOND, EXPORT)


def moving_average(checkpoint):
    """The moving average a checkpoint holds, read from its file by name: one array per
    trainable variable, in the model's order."""
    reader = tf.train.load_checkpoint(str(checkpoint))
    names = [name for name in reader.get_variable_to_shape_map()
             if re.fullmatch(r"moving_average/averages/\d+/\.ATTRIBUTES/VARIABLE_VALUE", name)]
    assert names, f"{checkpoint} holds no moving average"
    return [reader.get_tensor(f"moving_average/averages/{i}/.ATTRIBUTES/VARIABLE_VALUE")
            for i in range(len(names))]


def export_info(version):
    return json.loads((version / "assets.extra" / "export.json").read_text())


def assert_ships(version, want, other):
    """Every variable of export `version` is `want`'s (allclose: a mean's rounding), and
    most differ from `other`'s: the comparison tells the two apart."""
    shipped = exported_weights(version)
    assert [w.shape for w in shipped] == [w.shape for w in want]
    for weight, expected in zip(shipped, want):
        np.testing.assert_allclose(weight, expected, rtol=1e-6, atol=1e-7)
    assert sum(not np.allclose(weight, w, rtol=1e-6, atol=1e-7)
               for weight, w in zip(shipped, other)) > len(other) / 2


def test_task_export_weights_ema_ships_the_checkpoints_moving_average(runs):
    """trainer.task --ema_decay --export_weights=ema: version 1 holds the moving average of
    its last checkpoint, not that checkpoint's weights."""
    model_dir, version = runs / "model", runs / "export" / "1"
    checkpoint = model_dir / "ckpt-4"
    assert export_info(version)["checkpoints"] == [str(checkpoint)]
    assert_ships(version, moving_average(checkpoint), checkpoint_weights(model_dir, checkpoint))


def test_export_export_weights_ema_ships_the_latest_checkpoints_moving_average(runs):
    """trainer.export --export_weights=ema of the directory the second run left: the
    moving average of checkpoint 6 (the second run kept it going), not its weights."""
    model_dir, version = runs / "model", runs / "export" / "3"
    checkpoint = model_dir / "ckpt-6"
    assert f"to {version}" in (runs / "export.txt").read_text()
    assert export_info(version)["checkpoints"] == [str(checkpoint)]
    assert_ships(version, moving_average(checkpoint), checkpoint_weights(model_dir, checkpoint))


def test_task_average_last_ships_the_mean_of_the_last_checkpoints(runs):
    """trainer.task --average_last=2: version 2 holds the mean of checkpoints 4 and 6, the
    last two of the three (2, 4, 6) the directory holds, and not the last one's weights."""
    model_dir, version = runs / "model", runs / "export" / "2"
    last_two = [model_dir / "ckpt-4", model_dir / "ckpt-6"]
    assert export_info(version)["checkpoints"] == [str(c) for c in last_two]
    assert list(tf.train.get_checkpoint_state(str(model_dir)).all_model_checkpoint_paths) == [
        str(model_dir / f"ckpt-{step}") for step in (2, 4, 6)]
    four, six = (checkpoint_weights(model_dir, c) for c in last_two)
    assert_ships(version, [(a + b) / 2 for a, b in zip(four, six)], six)


def test_a_run_again_resumes_where_the_last_stopped_and_exports_the_next_version(runs):
    """The second trainer.task into the first's directories: it resumes from the first's
    checkpoint 4, trains updates 5 and 6 only, and writes export version 2 beside version 1,
    which it leaves as it was."""
    model_dir, export_dir = runs / "model", runs / "export"
    first, second = ((runs / f"{name}.txt").read_text() for name in ("first", "second"))
    assert "resumed from" not in first
    assert f"exported SavedModel to {export_dir / '1'}\n" in first
    assert f"resumed from {model_dir / 'ckpt-4'} at step 4" in second
    logged = [int(step) for step in re.findall(r"^step (\d+)/", second, re.M)]
    assert logged and min(logged) > 4 and max(logged) == 6, second
    assert f"exported SavedModel to {export_dir / '2'}\n" in second
    assert export_info(export_dir / "2")["version"] == 2
    assert latest_step(str(model_dir)) == 6
    # Version 1 is still the first run's: the moving average of checkpoint 4.
    assert export_info(export_dir / "1")["weights"] == "ema"
    for weight, want in zip(exported_weights(export_dir / "1"),
                            moving_average(model_dir / "ckpt-4")):
        np.testing.assert_array_equal(weight, want)
