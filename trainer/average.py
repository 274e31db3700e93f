"""python -m trainer.average --model_dir=DIR --last=N: average the last N checkpoints into
<model_dir>/averaged, a model directory of its own that `python -m trainer.export
--model_dir=DIR/averaged` exports (or export with `--average_last=N` directly).

The paper averages the last 5 (base) or 20 (big) checkpoints (trainer/model_dir/averaging.py).
"""

import os
import sys

from absl import flags

from trainer import cli

FLAGS = flags.FLAGS
flags.DEFINE_string("model_dir", None, "Model directory of python -m trainer.task.")
flags.DEFINE_integer("last", 5, "Number of most recent checkpoints to average (paper: 5 "
                     "for base, 20 for big).")


def main(argv):
    del argv
    if not FLAGS.model_dir:
        cli.fail("--model_dir is required")
    from trainer.data import vocabulary
    from trainer.model_dir import averaging
    try:
        # The averaged directory gets a copy of the vocabulary: it must be readable.
        vocabulary.load_or_train(FLAGS.model_dir, None)
        path, averaged = averaging.write_averaged(
            FLAGS.model_dir, FLAGS.last,
            warn=lambda message: print(f"{cli.program()}: {message}", file=sys.stderr))
    except (FileNotFoundError, ValueError) as e:
        cli.fail(str(e))
    print(f"averaged {len(averaged)} checkpoints "
          f"({', '.join(os.path.basename(p) for p in averaged)}) into {os.path.dirname(path)}")


if __name__ == "__main__":
    cli.run(main)
