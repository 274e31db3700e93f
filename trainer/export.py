"""python -m trainer.export --model_dir=DIR [--export_dir=DIR] [--average_last=N]: write a
model directory's model as the next SavedModel version, for TF Serving or any TensorFlow
program with tensorflow_text (layout and signatures: trainer/serving/saved_model.py).
"""

import os

from absl import flags

from trainer import cli

FLAGS = flags.FLAGS
flags.DEFINE_string("model_dir", None, "Model directory of python -m trainer.task.")
flags.DEFINE_string("export_dir", None, "Where versions go (default "
                    "saved_models/<name of model_dir>).")
flags.DEFINE_integer("average_last", 0, "Export the mean of the last N checkpoints "
                     "(paper: 5 for base, 20 for big); 0 exports the latest.")
flags.DEFINE_integer("beam_size", 4, "Beam size of every signature (and k of nbest).")
flags.DEFINE_float("alpha", 0.6, "Length penalty exponent.")


def main(argv):
    del argv
    if not FLAGS.model_dir:
        cli.fail("--model_dir is required")
    if FLAGS.beam_size < 1 or FLAGS.average_last < 0:
        cli.fail("--beam_size must be at least 1 and --average_last at least 0")
    export_dir = FLAGS.export_dir or os.path.join(
        "saved_models", os.path.basename(os.path.normpath(FLAGS.model_dir)))
    from trainer.serving import saved_model
    try:
        path = saved_model.export(FLAGS.model_dir, export_dir, FLAGS.beam_size, FLAGS.alpha,
                                  FLAGS.average_last)
    except (FileNotFoundError, ValueError) as e:
        cli.fail(str(e))
    print(f"exported SavedModel to {path}")


if __name__ == "__main__":
    cli.run(main)
