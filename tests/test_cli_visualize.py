"""python -m trainer.visualize: attention heatmaps from the SavedModel alone."""

import subprocess
import sys

import matplotlib.image
import pytest
import tensorflow as tf

from conftest import run

# Each test runs the programs in subprocesses, or uses the model they trained.
pytestmark = pytest.mark.slow


def test_visualize_draws_every_layer_of_both_attentions_with_a_panel_per_head(exported,
                                                                             loaded,
                                                                             tmp_path):
    text = "three hundred and twenty-five"
    result = run([sys.executable, "-m", "trainer.visualize",
                  f"--saved_model={exported.version_dir}", f"--text={text}", "--out=maps"],
                 cwd=tmp_path)
    expected = loaded.signatures["serving_default"](inputs=tf.constant([text]))
    stdout = result.stdout.decode().splitlines()
    assert stdout[0] == "translation: " + expected["translations"][0].numpy().decode()
    names = sorted(p.name for p in (tmp_path / "maps").iterdir())
    assert names == sorted(f"{kind}_layer{i}.png" for i in (1, 2)
                           for kind in ("encoder_self_attention", "encoder_decoder_attention"))
    for name in names:
        image = matplotlib.image.imread(tmp_path / "maps" / name)
        height, width = image.shape[:2]
        # Four heads side by side (the tiny preset): a wide image.
        assert width > 2 * height > 200


def test_visualize_refuses_empty_text_with_one_line(tmp_path):
    result = subprocess.run([sys.executable, "-m", "trainer.visualize", "--saved_model=x",
                             "--text=  ", f"--out={tmp_path}"], capture_output=True, timeout=60)
    assert result.returncode == 2
    assert result.stderr.decode().strip() == ("trainer.visualize: error: --text is empty: "
                                              "nothing to translate")
