"""Plot a run's training curve from its TensorBoard summaries.

    python bench/training_curve.py --model_dir=runs/small_multi30k --out=docs/multi30k_curve.png

Left: training loss (label-smoothed, per target token) and validation loss against the step.
Right: validation BLEU (sacreBLEU, detokenized) and chrF. Reads <model_dir>/train and
<model_dir>/eval, as written by python -m trainer.task.
"""

import argparse
import os

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import tensorflow as tf  # noqa: E402


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


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model_dir", required=True)
    parser.add_argument("--out", required=True, help="PNG file to write.")
    args = parser.parse_args()
    train_dir, eval_dir = (os.path.join(args.model_dir, d) for d in ("train", "eval"))
    figure, (losses, quality) = plt.subplots(1, 2, figsize=(11, 4))
    for directory, tag, label in ((train_dir, "loss", "training loss"),
                                  (eval_dir, "loss", "validation loss")):
        points = scalars(directory, tag)
        if points:
            losses.plot(*zip(*points), label=label, marker="." if directory == eval_dir else None)
    losses.set_xlabel("step")
    losses.set_ylabel("label-smoothed cross-entropy per token")
    losses.legend()
    for tag, label in (("bleu", "validation BLEU"), ("chrf", "validation chrF")):
        points = scalars(eval_dir, tag)
        if points:
            quality.plot(*zip(*points), label=label, marker="o")
    quality.set_xlabel("step")
    quality.legend()
    figure.suptitle(os.path.basename(os.path.normpath(args.model_dir)))
    figure.tight_layout()
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    figure.savefig(args.out, dpi=100)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
