"""Attention heatmaps from a SavedModel's `attention` signature (paper section 4: "Not
only do individual attention heads clearly learn to perform different tasks, many appear
to exhibit behavior related to the syntactic and semantic structure of the sentences").

  <out>/encoder_self_attention_layer<i>.png     one heatmap per head: source x source
  <out>/encoder_decoder_attention_layer<i>.png  one heatmap per head: output x source

Rows are the attending positions (queries), columns the attended ones (keys); each row
sums to 1. Layers are numbered from 1 (bottom).
"""

import os
from typing import List

import numpy as np
import tensorflow as tf


def attention_maps(model, text) -> dict:
    """The `attention` signature's outputs for one sentence (str or bytes), cropped to its
    pieces: source_pieces [src_len], output_pieces [tgt_len] (str lists),
    encoder_self_attention [layers, heads, src_len, src_len], encoder_decoder_attention
    [layers, heads, tgt_len, src_len] (numpy), translation (str)."""
    out = model.signatures["attention"](inputs=tf.constant([text]))
    src, tgt = int(out["source_lengths"][0]), int(out["output_lengths"][0])

    def strings(pieces, n):
        return [p.decode("utf-8", errors="replace") for p in pieces[0, :n].numpy()]

    return {"translation": out["translations"][0].numpy().decode("utf-8"),
            "source_pieces": strings(out["source_pieces"], src),
            "output_pieces": strings(out["output_pieces"], tgt),
            "encoder_self_attention": out["encoder_self_attention"][0, :, :, :src, :src].numpy(),
            "encoder_decoder_attention":
                out["encoder_decoder_attention"][0, :, :, :tgt, :src].numpy()}


def plot_heads(weights: np.ndarray, rows: List[str], columns: List[str], title: str,
               path: str, row_label: str = "query"):
    """One figure with a heatmap per head: weights [heads, len(rows), len(columns)]."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    heads = weights.shape[0]
    per_row = min(heads, 4)
    grid = (heads + per_row - 1) // per_row
    cell = 0.28  # inches per token
    size = (max(3.0, cell * len(columns) + 1.5) * per_row,
            max(3.0, cell * len(rows) + 1.5) * grid)
    fig, axes = plt.subplots(grid, per_row, figsize=size, squeeze=False)
    for head, ax in enumerate(axes.flat):
        if head >= heads:
            ax.axis("off")
            continue
        ax.imshow(weights[head], cmap="viridis", vmin=0.0, vmax=1.0, aspect="auto")
        ax.set_title(f"head {head + 1}", fontsize=9)
        ax.set_xticks(range(len(columns)), columns, rotation=90, fontsize=7)
        ax.set_yticks(range(len(rows)), rows, fontsize=7)
        if head % per_row == 0:
            ax.set_ylabel(row_label, fontsize=8)
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def write_heatmaps(maps: dict, out_dir: str) -> List[str]:
    """Writes one PNG per layer and attention kind; returns their paths."""
    os.makedirs(out_dir, exist_ok=True)
    source, output = maps["source_pieces"], maps["output_pieces"]
    paths = []
    kinds = (("encoder_self_attention", source, "encoder self-attention", "source"),
             ("encoder_decoder_attention", output, "encoder-decoder attention", "output"))
    for key, rows, label, row_label in kinds:
        for layer, weights in enumerate(maps[key]):
            path = os.path.join(out_dir, f"{key}_layer{layer + 1}.png")
            plot_heads(weights, rows, source,
                       f"{label}, layer {layer + 1}: {maps['translation']!r}", path, row_label)
            paths.append(path)
    return paths
