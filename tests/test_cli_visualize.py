"""python -m trainer.visualize: attention heatmaps from the SavedModel alone.

The pictures are read back pixel by pixel: plot_heads paints each weight w in viridis
(vmin 0, vmax 1), whose 8-bit colour is that of its step floor(256 w) of the colormap's 256,
so a cell's colour says its weight to within 1/256. A blank, constant, transposed,
wrong-layer or wrong-head picture paints other colours.
"""

import matplotlib
import matplotlib.image
import numpy as np
import pytest
import tensorflow as tf

from programs import program, succeeded

VIRIDIS = matplotlib.colormaps["viridis"]
# The colour of each step, as Agg writes it to a PNG: int [256, 3].
STEP_COLOURS = VIRIDIS(np.arange(VIRIDIS.N), bytes=True)[:, :3].astype(int)


def _runs(flags):
    """[start, stop) of each run of True in a 1-D bool array."""
    edges = np.flatnonzero(np.diff(np.concatenate([[0], flags.astype(int), [0]])))
    return list(zip(edges[::2], edges[1::2]))


def heatmap_boxes(image):
    """The heatmaps of a plot_heads PNG, float [height, width, 4], in reading order (head
    1 first) as pixel boxes (top, bottom, left, right): its coloured regions, since every
    viridis colour is far from grey and titles, labels, ticks and frames are grey."""
    rgb = image[..., :3]
    coloured = rgb.max(axis=-1) - rgb.min(axis=-1) > 0.1  # viridis: at least 0.27
    return [(top, bottom, left, right) for top, bottom in _runs(coloured.any(axis=1))
            for left, right in _runs(coloured[top:bottom].any(axis=0))]


def weight_steps(weights):
    """The viridis step (0..255) plot_heads paints each weight in: floor(256 w), 255 at 1."""
    return np.clip(np.floor(weights * VIRIDIS.N), 0, VIRIDIS.N - 1).astype(int)


def assert_draws(path, weights):
    """The PNG at `path` shows weights [heads, rows, columns]: a heatmap per head, in
    order, each of rows x columns cells painted the colour of its weight's step, or of the
    next step up or down (a weight within float rounding of a step's edge may fall either
    side); no heatmap of weights that span two steps or more is one flat colour."""
    image = matplotlib.image.imread(path)
    boxes = heatmap_boxes(image)
    assert len(boxes) == len(weights), f"{path}: {len(boxes)} heatmaps, {len(weights)} heads"
    for head, ((top, bottom, left, right), expected) in enumerate(zip(boxes, weights)):
        rows, columns = expected.shape
        # The centre pixel of each cell, away from the frame drawn over the edges.
        ys = (top + (np.arange(rows) + 0.5) * (bottom - top) / rows).astype(int)
        xs = (left + (np.arange(columns) + 0.5) * (right - left) / columns).astype(int)
        painted = np.round(image[ys[:, None], xs[None, :], :3] * 255).astype(int)
        steps = weight_steps(expected)  # [rows, columns]
        matches = [np.all(painted == STEP_COLOURS[np.clip(steps + offset, 0, VIRIDIS.N - 1)],
                          axis=-1) for offset in (0, -1, 1)]
        wrong = [tuple(cell) for cell in np.argwhere(~np.any(matches, axis=0)).tolist()]
        assert not wrong, (
            f"{path}, head {head + 1}: {len(wrong)} of {steps.size} cells are not painted the "
            f"colour of their weight, e.g. (row, column) {wrong[0]}: weight "
            f"{expected[wrong[0]]:.4f}, step {steps[wrong[0]]}")
        if np.ptp(steps) >= 2:
            panel = image[top:bottom, left:right, :3]
            assert panel.std(axis=(0, 1)).max() > 0, f"{path}, head {head + 1}: blank"


def assert_pictures_tell_apart(weights):
    """Weights [layers, heads, rows, columns] whose pictures assert_draws tells apart: each
    head's differ from every other head's, of its layer or another, and from their own
    transpose, by more than two steps in some cell, and span more than two steps."""
    matrices = [(layer + 1, head + 1, w) for layer, heads in enumerate(weights)
                for head, w in enumerate(heads)]
    for layer, head, w in matrices:
        assert np.ptp(w) > 2 / VIRIDIS.N, f"layer {layer}, head {head}: nearly constant"
        if w.shape[0] == w.shape[1]:
            assert np.abs(w - w.T).max() > 2 / VIRIDIS.N, f"layer {layer}, head {head}"
        for other_layer, other_head, other in matrices:
            if (other_layer, other_head) != (layer, head):
                assert np.abs(w - other).max() > 2 / VIRIDIS.N, (
                    f"layer {layer}, head {head} and layer {other_layer}, head {other_head}")


@pytest.mark.slow  # runs the program on the model the tests trained
def test_visualize_draws_every_layer_of_both_attentions_with_a_panel_per_head(exported,
                                                                             loaded,
                                                                             tmp_path):
    text = "three hundred and twenty-five"
    result = succeeded(program("visualize", f"--saved_model={exported.version_dir}",
                               f"--text={text}", "--out=maps", cwd=tmp_path))
    expected = loaded.signatures["serving_default"](inputs=tf.constant([text]))
    stdout = result.stdout.splitlines()
    assert stdout[0] == "translation: " + expected["translations"][0].numpy().decode()
    names = sorted(p.name for p in (tmp_path / "maps").iterdir())
    assert names == sorted(f"{kind}_layer{i}.png" for i in (1, 2)
                           for kind in ("encoder_self_attention", "encoder_decoder_attention"))
    returned = loaded.signatures["attention"](inputs=tf.constant([text]))
    source, output = int(returned["source_lengths"][0]), int(returned["output_lengths"][0])
    weights = {  # [layers, heads, rows, columns]
        "encoder_self_attention": returned["encoder_self_attention"][0, :, :, :source, :source],
        "encoder_decoder_attention":
            returned["encoder_decoder_attention"][0, :, :, :output, :source]}
    # The sentence's 7 source pieces attend in ways a picture tells apart: any two heads
    # differ by 0.097 (24 steps) or more in some cell, a head and its transpose by 0.066
    # (16). The 30-update model's encoder-decoder attention is near 1/7 everywhere (two
    # heads differ by under a step), so those pictures are checked only against their own
    # weights; the test below draws encoder-decoder weights made to differ.
    assert_pictures_tell_apart(weights["encoder_self_attention"].numpy())
    for kind in weights:
        for layer, layer_weights in enumerate(weights[kind].numpy()):
            assert_draws(tmp_path / "maps" / f"{kind}_layer{layer + 1}.png", layer_weights)


@pytest.mark.slow
def test_heatmaps_paint_each_head_of_each_layer_its_own_weights(tmp_path):
    from trainer.serving import attention_maps
    rng = np.random.default_rng(0)
    # 2 layers of 5 heads (4 heatmaps to a row, then 1), each row of weights peaked at
    # random: any two heads differ by 0.41 (105 steps) or more in some cell.
    maps = {"translation": "t0 t1", "source_pieces": [f"s{i}" for i in range(6)],
            "output_pieces": ["t0", "t1", "</s>"],
            "encoder_self_attention": rng.dirichlet(np.full(6, 0.3), size=(2, 5, 6)),
            "encoder_decoder_attention": rng.dirichlet(np.full(6, 0.3), size=(2, 5, 3))}
    paths = attention_maps.write_heatmaps(maps, str(tmp_path))
    kinds = ("encoder_self_attention", "encoder_decoder_attention")
    assert paths == [str(tmp_path / f"{kind}_layer{layer}.png") for kind in kinds
                     for layer in (1, 2)]
    for kind in kinds:
        assert_pictures_tell_apart(maps[kind])
        for layer, layer_weights in enumerate(maps[kind]):
            assert_draws(tmp_path / f"{kind}_layer{layer + 1}.png", layer_weights)


def test_visualize_refuses_empty_text_with_one_line(tmp_path):
    result = program("visualize", "--saved_model=x", "--text=  ", f"--out={tmp_path}")
    assert result.returncode == 2
    assert result.stderr.strip() == ("trainer.visualize: error: --text is empty: "
                                     "nothing to translate")
