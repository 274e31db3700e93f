"""python -m trainer.translate --saved_model=DIR < in.txt > out.txt: translate lines.

One output line per input line, in order (an empty line translates to an empty line);
the input is read as bytes, so invalid UTF-8 is translated too (as U+FFFD). Lines are
batched by length; progress goes to stderr. DIR is an export version directory or an
export directory (its highest version is used).

Decoding options go through the export's signatures:
  - none of the flags below: `serving_default` (the export's beam size and alpha), or
    the signature --signature names;
  - --beam_size, --alpha, --stopping, --patience (beam search's), or only
    --max_extra_length, --min_length, --num_hypotheses, --prefix_file (both searches'):
    `translate_with_options`, unset ones at the export's values (its export.json);
  - --temperature, --sample_topk, --sample_topp (sampling's; with --seed, default 0,
    and the shared ones): `sample`; --seed without one of them is refused, since no
    other signature samples.
Each option's flag, help and range come from its declaration in DecodeConfig
(trainer/search_flags.py): a value out of its range is refused before the export is read,
and a beam_size (or num_hypotheses) above the export's --max_beam_size by the signature,
in one line naming it. --num_hypotheses=k prints k lines per input line, best first.
--prefix_file holds one target prefix per input line (an empty line: none): each
translation starts with it.
"""

import dataclasses
import sys
from typing import Any, Dict, Tuple

from absl import flags

from keras_transformer.config import OPTIONS, DecodeConfig
from keras_transformer.options import BEAM, SAMPLE
from trainer import cli, search_flags

FLAGS = flags.FLAGS
flags.DEFINE_string("saved_model", None, "SavedModel of python -m trainer.export (a version "
                    "directory, or the export directory to use its highest version).")
flags.DEFINE_integer("batch_size", 64, "Sentences per call.")
flags.DEFINE_string("signature", None, "Signature that maps inputs to translations "
                    "(default serving_default; the decoding options choose their own).")
# Every option a request may set, unset unless given: the export's value (its export.json).
SEARCH_FLAGS = search_flags.define(
    tuple(o for o in OPTIONS if o.request), None, unset="default: the export's",
    names={"top_k": "sample_topk", "top_p": "sample_topp"}, values={"seed": 0},
    notes={"num_hypotheses": "default: 1; printed as that many lines per input line"})
flags.DEFINE_string("prefix_file", None, "A file of target prefixes, one per input line ("
                    "empty: none): each translation starts with its prefix.")


def _flags_read_by(*searches) -> tuple:
    """The search flags of the options read by exactly `searches`, in declaration order."""
    return tuple(SEARCH_FLAGS[o.name] for o in OPTIONS
                 if o.name in SEARCH_FLAGS and set(o.searches) == set(searches))


BEAM_FLAGS = _flags_read_by(BEAM)
# --seed only seeds: a sampling flag of its own asks for the sample signature.
SAMPLING_FLAGS = tuple(flag for flag in _flags_read_by(SAMPLE) if flag != "seed")
SHARED_FLAGS = _flags_read_by(BEAM, SAMPLE) + ("prefix_file",)


class OptionError(ValueError):
    """A signature's `error` output named an option out of its range."""


def chosen_signature() -> Tuple[str, bool]:
    """(the signature the flags ask for, whether they set its options); flags that
    contradict each other end the program in one line."""
    given = {flag for flag in BEAM_FLAGS + SAMPLING_FLAGS + SHARED_FLAGS
             if FLAGS[flag].value is not None}
    if FLAGS["seed"].present and not given & set(SAMPLING_FLAGS):
        cli.fail(f"--seed seeds sampling: give it with {_listed(SAMPLING_FLAGS)}")
    if not given:
        return FLAGS.signature or "serving_default", False
    if FLAGS.signature:
        cli.fail(f"--signature cannot be combined with --{', --'.join(sorted(given))}")
    if given & set(BEAM_FLAGS) and given & set(SAMPLING_FLAGS):
        cli.fail(f"{_slashed(BEAM_FLAGS)} (beam search) and {_slashed(SAMPLING_FLAGS)} "
                 "(sampling) exclude each other")
    return ("sample" if given & set(SAMPLING_FLAGS) else "translate_with_options"), True


def asked_options() -> Dict[str, Any]:
    """{option name: value} of the search flags set (num_hypotheses: 1 unless given,
    whatever the export's), each checked against its range by DecodeConfig: a value out
    of it ends the program in one line. (Its bounds of the export's, max_beam_size, are
    the signature's to check.)"""
    asked = {"num_hypotheses": None, **{option: FLAGS[flag].value
                                        for option, flag in SEARCH_FLAGS.items()
                                        if FLAGS[flag].value is not None}}
    try:
        DecodeConfig(**asked)
    except ValueError as e:
        cli.fail(str(e))
    return asked


def raising_option_errors(translate):
    """`translate` (a signature), raising OptionError with the first row's `error` of a
    result that has one: an option out of the export's range (beam_size above its
    max_beam_size)."""

    def checked(*args, **kwargs):
        result = translate(*args, **kwargs)
        if "error" in result:
            errors = [error for error in result["error"].numpy().tolist() if error]
            if errors:
                raise OptionError(errors[0].decode("utf-8"))
        return result

    return checked


def _slashed(names) -> str:
    return "/".join(f"--{name}" for name in names)


def _listed(names) -> str:
    """--a, --b or --c."""
    named = [f"--{name}" for name in names]
    return f"{', '.join(named[:-1])} or {named[-1]}" if len(named) > 1 else named[0]


def main(argv):
    del argv
    if not FLAGS.saved_model:
        cli.fail("--saved_model is required")
    if FLAGS.batch_size < 1:
        cli.fail("--batch_size must be at least 1")
    signature, with_options = chosen_signature()
    asked = asked_options() if with_options else {}
    from trainer.serving import client, saved_model
    from trainer.serving.options import request_inputs
    try:
        path = saved_model.resolve(FLAGS.saved_model)
        export_decode = DecodeConfig.from_dict(saved_model.read_info(path))
        model = saved_model.load(path)
    except (FileNotFoundError, OSError, saved_model.ExportError) as e:
        cli.fail(str(e))
    # The signature's option inputs: the flags' values, the export's for the others.
    options = request_inputs(signature, dataclasses.replace(export_decode, **asked)) \
        if with_options else {}
    again = "export it again with this version of trainer.export"
    if signature not in model.signatures:
        cli.fail(f"{FLAGS.saved_model} has no {signature} signature (it has "
                 f"{', '.join(sorted(model.signatures))}); {again}" if with_options else
                 f"--signature={signature} is not one of {sorted(model.signatures)}")
    taken = set(model.signatures[signature].structured_input_signature[1])
    if set(options) - taken:
        cli.fail(f"{FLAGS.saved_model}'s {signature} signature takes no "
                 f"{', '.join(sorted(set(options) - taken))} (an older export); {again}")
    lines = cli.read_lines(sys.stdin.buffer)
    prefixes = None
    if with_options:
        prefixes = cli.read_text(FLAGS.prefix_file) if FLAGS.prefix_file else [""] * len(lines)
        if len(prefixes) != len(lines):
            cli.fail(f"--prefix_file={FLAGS.prefix_file} has {len(prefixes)} lines for "
                     f"{len(lines)} input lines")
    try:
        outputs = client.translate_texts(raising_option_errors(model.signatures[signature]),
                                         lines, FLAGS.batch_size,
                                         cli.TranslationProgress(len(lines)), prefixes,
                                         **options)
    except OptionError as e:
        cli.fail(str(e))
    # k lines per input line for a signature of k hypotheses, as client.translate_lines.
    rows = [row if isinstance(row, list) else [row] for row in outputs]
    translations = [" ".join(text.splitlines()) for row in rows for text in row]
    # Bytes, so the output is UTF-8 whatever the locale.
    sys.stdout.buffer.write(b"".join(text.encode("utf-8") + b"\n" for text in translations))
    sys.stdout.flush()


if __name__ == "__main__":
    cli.run(main)
