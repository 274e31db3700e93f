"""Sweep: what do the decoding options cost against serving_default?

The SavedModel's (--saved_model) `serving_default` on Multi30k test2016 (--src) in
length-sorted batches as trainer.translate sends them (sentences/s, target tokens/s: output
subwords + EOS), beside, in alternate rounds (best of --repeats each),
`translate_with_options` given the same settings as request inputs (and whether its outputs
are identical), its greedy (beam_size 1) request and `sample` (unrestricted, top_k 10,
top_p 0.9); with --previous_saved_model, that export's `sample` requests too, in the same
rounds (and how many samples agree): a before/after of a change to sampling. The settings
are the export's: its beam size, alpha and extra output length, from its export.json
(keras_transformer.DecodeConfig's, the paper's, for an export without one). Not a test: run
it by hand from the repository root,

  python bench/sweeps/decoding_options.py --saved_model=EXPORT [--previous_saved_model=OLD]
"""

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # bench/, for common
import common  # noqa: E402
from option_signatures import signature_inputs  # noqa: E402


def option_requests(decode) -> dict:
    """{row: (signature, the settings on top of `decode`'s)}: translate_with_options given
    serving_default's settings and greedy, and sample's three restrictions."""
    return {
        f"translate_with_options, beam {decode.beam_size}": ("translate_with_options", {}),
        "translate_with_options, beam 1 (greedy)": ("translate_with_options",
                                                    dict(beam_size=1, alpha=0.0)),
        **{f"sample, {name}": ("sample", dict(top_k=top_k, top_p=top_p))
           for name, top_k, top_p in (("unrestricted", 0, 1.0), ("top_k 10", 10, 1.0),
                                      ("top_p 0.9", 0, 0.9))},
    }


def requests(export: common.Export, previous):
    """({row: (signature function, its scalar inputs)}: serving_default first, then the
    option requests this export has, and those of `previous` (an Export, or None) that are
    sample requests; {a previous export's row: this export's})."""
    loaded = export.loaded
    runs = {export.serving_row: (loaded.signatures["serving_default"], {})}
    twins = {}
    for name, (signature, values) in option_requests(export.decode).items():
        if signature in loaded.signatures:
            function = loaded.signatures[signature]
            runs[f"SavedModel {name}"] = (function, signature_inputs(
                function, signature, export.decode, **values))
        if previous is not None and signature == "sample" and \
                signature in previous.loaded.signatures:
            function = previous.loaded.signatures[signature]
            runs[f"previous export's {name}"] = (function, signature_inputs(
                function, signature, previous.decode, **values))
            twins[f"previous export's {name}"] = f"SavedModel {name}"
    return runs, twins


def measure(args, export: common.Export, texts):
    """Table rows (name, sentences, best seconds, target tokens) of serving_default and
    the option requests, timed in alternate rounds; whether translate_with_options with
    serving_default's settings gave its translations; and, for --previous_saved_model
    (whose sample requests join the rounds), how many of each request's translations are
    this export's."""
    previous = common.Export(args.previous_saved_model) if args.previous_saved_model else None
    runs, twins = requests(export, previous)
    best, outputs = {}, {}
    for _ in range(args.repeats):
        for name, (translate, options) in runs.items():
            outputs[name], seconds = common.timed_translation(translate, texts,
                                                              args.batch_size, **options)
            best[name] = min(best.get(name, float("inf")), seconds)
    rows = [(name, len(texts), best[name], common.target_tokens(export.processor, outputs[name]))
            for name in runs]
    names = list(runs)
    same = len(names) > 1 and outputs[names[0]] == outputs[names[1]]
    agreeing = {name: sum(a == b for a, b in zip(outputs[name], outputs[ours]))
                for name, ours in twins.items()}
    return rows, same, agreeing


def print_report(args, export: common.Export, rows, same: bool, agreeing: dict,
                 sentences: int):
    common.print_header([
        ("machine", f"{common.describe()}, load average {common.load_average()} at the end"),
        ("versions", common.versions()),
        ("export", export.describe()),
        ("previous", args.previous_saved_model),
        ("data", f"{args.src} ({sentences} sentences), batches of {args.batch_size}"),
        ("command", common.command()),
    ])
    common.print_speed_table(rows, "Decoding options against serving_default, length-sorted "
                                   f"batches, best of {args.repeats} alternate rounds:")
    if len(rows) > 1:
        print(f"{rows[1][0]} / serving_default time: {rows[1][2] / rows[0][2]:.3f}; "
              f"identical translations: {'yes' if same else 'no'}")
    for name, count in agreeing.items():
        print(f"{name}: the same translation as this export's on {count} of {sentences}")
    print()


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--saved_model", required=True,
                        help="the export (a version or its export directory)")
    parser.add_argument("--src", default=str(common.MULTI30K / "test2016.en"))
    parser.add_argument("--sentences", type=int, default=0,
                        help="the first N sentences of --src (0: all)")
    parser.add_argument("--batch_size", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=3, help="alternate rounds")
    parser.add_argument("--previous_saved_model", help="an export of the same checkpoints "
                        "by earlier code: its sample requests in the same rounds")
    args = parser.parse_args(argv)
    export = common.Export(args.saved_model)
    texts = common.read_lines(args.src, args.sentences)
    rows, same, agreeing = measure(args, export, texts)
    print_report(args, export, rows, same, agreeing, len(texts))


if __name__ == "__main__":
    common.timed_main(main)
