"""python -m trainer.translate --saved_model=DIR < in.txt > out.txt: translate lines.

One output line per input line, in order (an empty line translates to an empty line);
the input is read as bytes, so invalid UTF-8 is translated too (as U+FFFD). Lines are
batched by length; progress goes to stderr. DIR is an export version directory or an
export directory (its highest version is used).

Decoding options go through the export's signatures:
  - none of the flags below: `serving_default` (the export's beam size and alpha), or
    the signature --signature names;
  - --beam_size, --alpha, --stopping, --patience, --num_hypotheses,
    --max_extra_length, --prefix_file: `translate_with_options`, unset ones at the
    export's values (its export.json);
  - --temperature, --sample_topk, --sample_topp (with --seed): `sample`; --seed
    without one of them is refused, since no other signature samples.
--num_hypotheses=k prints k lines per input line, best first. --prefix_file holds one
target prefix per input line (an empty line: none): each translation starts with it.
"""

import re
import sys

from absl import flags

from keras_transformer.config import STOPPING_RULES
from trainer import cli

FLAGS = flags.FLAGS
flags.DEFINE_string("saved_model", None, "SavedModel of python -m trainer.export (a version "
                    "directory, or the export directory to use its highest version).")
flags.DEFINE_integer("batch_size", 64, "Sentences per call.")
flags.DEFINE_string("signature", None, "Signature that maps inputs to translations "
                    "(default serving_default; the decoding options choose their own).")
flags.DEFINE_integer("beam_size", None, "Beam size, 1 (greedy) to the export's "
                     "--max_beam_size (default: the export's beam size).")
flags.DEFINE_float("alpha", None, "Length penalty exponent, >= 0 (default: the export's).")
flags.DEFINE_enum("stopping", None, STOPPING_RULES, "When a sentence's beam search is done: "
                  "exact (no live beam can still win), transformers (generate()'s guess) or "
                  "first (patience x beam_size hypotheses have finished; CTranslate2's) "
                  "(default: the export's).")
flags.DEFINE_float("patience", None, "With --stopping=first, the finished hypotheses a "
                   "sentence waits for, as a multiple of the beam size (default: the export's).")
flags.DEFINE_integer("num_hypotheses", None, "Translations per input, best first, printed "
                     "as that many lines (default 1).")
flags.DEFINE_integer("max_extra_length", None, "Output tokens beyond the input's (default: "
                     "the export's, the paper's input + 50).")
flags.DEFINE_string("prefix_file", None, "A file of target prefixes, one per input line ("
                    "empty: none): each translation starts with its prefix.")
flags.DEFINE_float("temperature", None, "Sample at this temperature (0: greedy; default 1 "
                   "when sampling).")
flags.DEFINE_integer("sample_topk", None, "Sample among the k most probable tokens (0: all).")
flags.DEFINE_float("sample_topp", None, "Sample within the top-p nucleus, 0 < p <= 1 (1: all).")
flags.DEFINE_integer("seed", 0, "Seed of sampling (with --temperature, --sample_topk or "
                     "--sample_topp): the same seed and input give the same samples.")

BEAM_FLAGS = ("beam_size", "alpha", "stopping", "patience")
SAMPLING_FLAGS = ("temperature", "sample_topk", "sample_topp")
SHARED_FLAGS = ("num_hypotheses", "max_extra_length", "prefix_file")


def signature_and_options(decode):
    """(signature name, its scalar inputs) the flags ask for; decode: the export's
    DecodeConfig, for the options the flags leave unset."""
    import tensorflow as tf
    given = {name for name in BEAM_FLAGS + SAMPLING_FLAGS + SHARED_FLAGS
             if FLAGS[name].value is not None}
    if not given:
        return FLAGS.signature or "serving_default", {}
    if FLAGS.signature:
        cli.fail(f"--signature cannot be combined with --{', --'.join(sorted(given))}")
    if given & set(BEAM_FLAGS) and given & set(SAMPLING_FLAGS):
        cli.fail("--beam_size/--alpha/--stopping/--patience (beam search) and "
                 "--temperature/--sample_topk/"
                 "--sample_topp (sampling) exclude each other")
    shared = {"num_hypotheses": tf.constant(FLAGS.num_hypotheses or 1),
              "max_extra_length": tf.constant(decode.max_extra_length
                                              if FLAGS.max_extra_length is None
                                              else FLAGS.max_extra_length)}
    if given & set(SAMPLING_FLAGS):
        return "sample", {
            **shared,
            "temperature": tf.constant(1.0 if FLAGS.temperature is None else FLAGS.temperature,
                                       tf.float32),
            "top_k": tf.constant(FLAGS.sample_topk or 0),
            "top_p": tf.constant(1.0 if FLAGS.sample_topp is None else FLAGS.sample_topp,
                                 tf.float32),
            "seed": tf.constant(FLAGS.seed, tf.int64)}
    import dataclasses
    from trainer.serving.options import request_options
    try:
        asked = dataclasses.replace(decode, **{name: FLAGS[name].value for name in BEAM_FLAGS
                                               if FLAGS[name].value is not None})
    except ValueError as e:
        cli.fail(str(e))
    return "translate_with_options", {**request_options(asked), **shared}


def main(argv):
    del argv
    if not FLAGS.saved_model:
        cli.fail("--saved_model is required")
    if FLAGS.batch_size < 1:
        cli.fail("--batch_size must be at least 1")
    if FLAGS["seed"].present and all(FLAGS[name].value is None for name in SAMPLING_FLAGS):
        cli.fail("--seed seeds sampling: give it with --temperature, --sample_topk or "
                 "--sample_topp")
    import tensorflow as tf
    from keras_transformer import DecodeConfig
    from trainer.serving import client, saved_model
    try:
        path = saved_model.resolve(FLAGS.saved_model)
        signature, options = signature_and_options(
            DecodeConfig.from_dict(saved_model.read_info(path)))
        model = saved_model.load(path)
    except (FileNotFoundError, OSError, saved_model.ExportError) as e:
        cli.fail(str(e))
    if signature not in model.signatures:
        cli.fail(f"{FLAGS.saved_model} has no {signature} signature (it has "
                 f"{', '.join(sorted(model.signatures))}); export it again with this version "
                 "of trainer.export" if options else
                 f"--signature={signature} is not one of {sorted(model.signatures)}")
    lines = cli.read_lines(sys.stdin.buffer)
    prefixes = None
    if options:
        prefixes = cli.read_text(FLAGS.prefix_file) if FLAGS.prefix_file else [""] * len(lines)
        if len(prefixes) != len(lines):
            cli.fail(f"--prefix_file={FLAGS.prefix_file} has {len(prefixes)} lines for "
                     f"{len(lines)} input lines")
    try:
        translations = client.translate_lines(model, lines, FLAGS.batch_size, signature,
                                              cli.TranslationProgress(len(lines)), prefixes,
                                              **options)
    except tf.errors.InvalidArgumentError as e:
        # An option out of range: the signature's own message ("beam_size must be in ...").
        found = re.search(r"\w+ must be in \S+ \S+, got [^\]\s']+", e.message)
        cli.fail(found.group(0) if found else e.message.strip().splitlines()[0])
    # Bytes, so the output is UTF-8 whatever the locale.
    sys.stdout.buffer.write(b"".join(text.encode("utf-8") + b"\n" for text in translations))
    sys.stdout.flush()


if __name__ == "__main__":
    cli.run(main)
