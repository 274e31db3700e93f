"""python -m trainer.translate --saved_model=DIR < in.txt > out.txt: translate lines.

One output line per input line, in order (an empty line translates to an empty line);
the input is read as bytes, so invalid UTF-8 is translated too (as U+FFFD). Lines are
batched by length; progress goes to stderr. DIR is an export version directory or an
export directory (its highest version is used).
"""

import sys
import time

from absl import app, flags

FLAGS = flags.FLAGS


def load(saved_model: str):
    """The loaded SavedModel (tensorflow_text registers the tokenizer ops first)."""
    import tensorflow as tf
    import tensorflow_text  # noqa: F401  (registers the SentencePiece ops)
    from trainer import export
    return tf.saved_model.load(export.resolve(saved_model))


def read_lines(stream) -> list:
    """Lines of a binary stream without their line ends, as bytes."""
    data = stream.read()
    lines = data.split(b"\n")
    if lines and lines[-1] == b"":
        lines.pop()
    return [line.rstrip(b"\r") for line in lines]


class Progress:
    """Writes "translated n/total (s/s)" to stderr at most once a second and at the end."""

    def __init__(self, total: int, stream=sys.stderr):
        self.total, self.stream = total, stream
        self.start = self.last = time.monotonic()

    def __call__(self, done: int):
        now = time.monotonic()
        if now - self.last >= 1.0 or done == self.total:
            rate = done / max(now - self.start, 1e-9)
            print(f"translated {done}/{self.total} ({rate:.1f} sentences/s)", file=self.stream,
                  flush=True)
            self.last = now


def translate_lines(model, lines, batch_size: int = 64, signature: str = "serving_default",
                    progress=None) -> list:
    """Translations of `lines` (bytes or str) by the loaded SavedModel, one line each."""
    from trainer.translator import translate_texts
    outputs = translate_texts(model.signatures[signature], lines, batch_size, progress)
    # Keep one output line per input even if a translation holds a line break.
    return [" ".join(text.splitlines()) for text in outputs]


def _define_flags():
    # Only when run as a program, so that other programs can import this module.
    flags.DEFINE_string("saved_model", None, "SavedModel of python -m trainer.export (a version "
                        "directory, or the export directory to use its highest version).")
    flags.DEFINE_integer("batch_size", 64, "Sentences per call.")
    flags.DEFINE_string("signature", "serving_default", "Signature that maps inputs to "
                        "translations.")


def main(argv):
    if len(argv) > 1:
        _fail(f"unexpected arguments {argv[1:]}")
    if not FLAGS.saved_model:
        _fail("--saved_model is required")
    if FLAGS.batch_size < 1:
        _fail("--batch_size must be at least 1")
    try:
        model = load(FLAGS.saved_model)
    except (FileNotFoundError, OSError) as e:
        _fail(str(e))
    if FLAGS.signature not in model.signatures:
        _fail(f"--signature={FLAGS.signature} is not one of {sorted(model.signatures)}")
    lines = read_lines(sys.stdin.buffer)
    translations = translate_lines(model, lines, FLAGS.batch_size, FLAGS.signature,
                                   Progress(len(lines)))
    # Bytes, so the output is UTF-8 whatever the locale.
    sys.stdout.buffer.write(b"".join(text.encode("utf-8") + b"\n" for text in translations))
    sys.stdout.flush()


def _fail(message: str):
    print(f"trainer.translate: error: {message}", file=sys.stderr)
    sys.exit(2)


if __name__ == "__main__":
    _define_flags()
    app.run(main)
