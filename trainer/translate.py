"""python -m trainer.translate --saved_model=DIR < in.txt > out.txt: translate lines.

One output line per input line, in order (an empty line translates to an empty line);
the input is read as bytes, so invalid UTF-8 is translated too (as U+FFFD). Lines are
batched by length; progress goes to stderr. DIR is an export version directory or an
export directory (its highest version is used).
"""

import sys

from absl import flags

from trainer import cli

FLAGS = flags.FLAGS
flags.DEFINE_string("saved_model", None, "SavedModel of python -m trainer.export (a version "
                    "directory, or the export directory to use its highest version).")
flags.DEFINE_integer("batch_size", 64, "Sentences per call.")
flags.DEFINE_string("signature", "serving_default", "Signature that maps inputs to "
                    "translations.")


def main(argv):
    del argv
    if not FLAGS.saved_model:
        cli.fail("--saved_model is required")
    if FLAGS.batch_size < 1:
        cli.fail("--batch_size must be at least 1")
    from trainer.serving import client, saved_model
    try:
        model = saved_model.load(FLAGS.saved_model)
    except (FileNotFoundError, OSError) as e:
        cli.fail(str(e))
    if FLAGS.signature not in model.signatures:
        cli.fail(f"--signature={FLAGS.signature} is not one of {sorted(model.signatures)}")
    lines = cli.read_lines(sys.stdin.buffer)
    translations = client.translate_lines(model, lines, FLAGS.batch_size, FLAGS.signature,
                                          cli.Progress(len(lines)))
    # Bytes, so the output is UTF-8 whatever the locale.
    sys.stdout.buffer.write(b"".join(text.encode("utf-8") + b"\n" for text in translations))
    sys.stdout.flush()


if __name__ == "__main__":
    cli.run(main)
