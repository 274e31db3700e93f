"""Plot: how did a run train? Its training curve, from its TensorBoard summaries.

    python bench/training_curve.py --model_dir=runs/small_multi30k --out=docs/multi30k_curve.png

Left: training loss (label-smoothed, per target token) and validation loss against the step.
Right: validation BLEU (sacreBLEU, detokenized) and chrF. Reads <model_dir>/train and
<model_dir>/eval, as written by python -m trainer.task. Not a benchmark: it reads a finished
run and draws what docs/multi30k.md shows.
"""

import argparse
import os

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import tensorflow as tf  # noqa: E402

# (summary directory, tag, label) of each panel's curves.
LOSSES = (("train", "loss", "training loss"), ("eval", "loss", "validation loss"))
QUALITY = (("eval", "bleu", "validation BLEU"), ("eval", "chrf", "validation chrF"))


def scalars(directory, tag):
    """Sorted [(step, value)] of one scalar summary in a TensorBoard directory."""
    values = {}
    if not os.path.isdir(directory):
        return []
    for name in sorted(os.listdir(directory)):
        for event in tf.compat.v1.train.summary_iterator(os.path.join(directory, name)):
            for value in event.summary.value:
                if value.tag == tag:
                    values[event.step] = float(tf.make_ndarray(value.tensor))
    return sorted(values.items())


def read_curves(model_dir):
    """{label: [(step, value)]} of every curve the run has."""
    curves = {}
    for subdir, tag, label in LOSSES + QUALITY:
        points = scalars(os.path.join(model_dir, subdir), tag)
        if points:
            curves[label] = points
    return curves


def plot(curves, title: str, out: str):
    """The two panels, written to `out` (PNG)."""
    figure, (losses, quality) = plt.subplots(1, 2, figsize=(11, 4))
    for axes, panel in ((losses, LOSSES), (quality, QUALITY)):
        for subdir, _, label in panel:
            if label in curves:
                axes.plot(*zip(*curves[label]), label=label,
                          marker=None if subdir == "train" else "o" if axes is quality else ".")
        axes.set_xlabel("step")
        axes.legend()
    losses.set_ylabel("label-smoothed cross-entropy per token")
    figure.suptitle(title)
    figure.tight_layout()
    os.makedirs(os.path.dirname(os.path.abspath(out)), exist_ok=True)
    figure.savefig(out, dpi=100)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model_dir", required=True)
    parser.add_argument("--out", required=True, help="PNG file to write.")
    args = parser.parse_args(argv)
    curves = read_curves(args.model_dir)
    plot(curves, os.path.basename(os.path.normpath(args.model_dir)), args.out)
    print(f"wrote {args.out}: " + ", ".join(f"{label} ({len(points)} points)"
                                            for label, points in curves.items()))


if __name__ == "__main__":
    main()
