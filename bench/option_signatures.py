"""What the option signatures cost (bench/decoding.py --options): `translate_with_options`
against `serving_default` with the export's own settings, before and after a change
(--previous_saved_model), and the worst request a server's batching can merge, rows of
different beam sizes in one call, against the same rows sent apart. The flags are
bench/decoding.py's; its docstring says what each table measures. Also the option inputs
a loaded export's signature takes for a DecodeConfig (`signature_inputs`), an export of
earlier code's included, which bench/sweeps/decoding_options.py uses too. TensorFlow is
imported inside the functions that use it. A library; nothing here is run.
"""

import statistics
import time
from typing import Callable, Dict, List, NamedTuple, Tuple

import common

TEXT_INPUTS = ("inputs", "target_prefix")  # a signature's inputs that are not options
SMALL_BEAM = 1  # the beam of all the mixed request's rows but one


def signature_inputs(function, signature: str, decode, batch: int = None, **values) -> dict:
    """The option inputs that `function` (a loaded export's translate_with_options or
    sample) takes for `decode`'s settings, `values` on top
    (trainer.serving.options.request_inputs): scalars, or [batch] vectors when batch is
    given. An export of earlier code, whose options are scalars and which may lack some
    (min_length), gets scalars of those it has; asking it for another value than the
    default of one it lacks is a ValueError naming it."""
    from keras_transformer import DecodeConfig
    from trainer.serving.options import request_inputs
    specs = {name: spec for name, spec in function.structured_input_signature[1].items()
             if name not in TEXT_INPUTS}
    scalars = any(spec.shape.rank == 0 for spec in specs.values())
    inputs = request_inputs(signature, decode, None if scalars else batch, **values)
    unknown = sorted(set(specs) - set(inputs))
    if unknown:
        raise ValueError(f"{signature} takes options this code does not declare: {unknown}")
    given, defaults = {**decode.to_dict(), **values}, DecodeConfig().to_dict()
    lacking = sorted(name for name in set(inputs) - set(specs)
                     if given[name] != defaults[name])
    if lacking:
        raise ValueError(f"this export's {signature} has no {', '.join(lacking)} input: it "
                         "cannot ask for other values than the defaults")
    return {name: value for name, value in inputs.items() if name in specs}


def best_translations(function, options: Callable[[int], dict] = None):
    """fn(texts) -> translations numpy [batch] (bytes), the call waited for:
    serving_default's (no options), or an option signature's best hypothesis with
    options(batch) (every text's target prefix empty)."""
    import tensorflow as tf

    def translate(texts):
        inputs = tf.constant(texts)
        if options is None:
            return function(inputs=inputs)["translations"].numpy()
        return function(inputs=inputs, target_prefix=tf.fill(tf.shape(inputs), ""),
                        **options(len(texts)))["translations"][:, 0].numpy()
    return translate


def length_sorted_batches(texts: List[str], batch_size: int) -> List[List[str]]:
    """`texts` sorted by length in words, in batches of batch_size (the last one shorter)."""
    ordered = sorted(texts, key=lambda text: len(text.split()))
    return [ordered[i:i + batch_size] for i in range(0, len(ordered), batch_size)]


def passes_in_rounds(systems: Dict[str, Callable], batches, rounds: int):
    """({system: seconds of its pass per round}, {system: its translations in the
    batches' order}): each system, fn(texts) -> translations numpy [batch] (one request
    or more, waited for), makes one pass over the batches per round, one request at a
    time, after an untimed one (first calls at each shape: oneDNN's primitives, the
    allocator); the first to go rotates by round, so that a drift of the machine's speed
    falls on all alike."""
    for translate in systems.values():
        for batch in batches:
            translate(batch)
    names = list(systems)
    seconds, outputs = {name: [] for name in names}, {}
    for round_ in range(rounds):
        shift = round_ % len(names)
        for name in names[shift:] + names[:shift]:
            spent, found = 0.0, []
            for batch in batches:
                start = time.perf_counter()
                found.extend(systems[name](batch))
                spent += time.perf_counter() - start
            seconds[name].append(spent)
            outputs[name] = [text.decode("utf-8") for text in found]
    return seconds, outputs


class OptionsResult(NamedTuple):
    """What --options measured: the export's settings (`decode`), the exports measured
    (`labels`), the batches' sentences, each (export, signature)'s seconds per round and,
    per export, translate_with_options' outputs identical to serving_default's; the mixed
    request's sentences (full batches only), its large beam, its seconds per round sent
    as one request and apart, and its rows identical (all, the large beam's)."""
    decode: object
    labels: List[str]  # THIS, then PREVIOUS if measured
    sentences: int
    seconds: Dict[Tuple[str, str], List[float]]
    identical: Dict[str, int]
    mixed_sentences: int
    large_beam: int
    mixed_seconds: Dict[str, List[float]]
    mixed_identical: Tuple[int, int]


ONE_REQUEST, APART = "one request", "apart"
THIS, PREVIOUS = "this code", "previous code"  # the exports' rows


def measure(args, export: common.Export, texts: List[str],
            previous: common.Export = None) -> OptionsResult:
    """The tables' figures of `export` and, if given, `previous` (the same checkpoints
    exported by earlier code) on `texts`."""
    from trainer.serving.limits import ServingLimits
    exports = [(THIS, export)] + ([(PREVIOUS, previous)] if previous else [])
    batches = length_sorted_batches(texts, args.batch_size)
    systems = {}
    for label, each in exports:
        signatures = each.loaded.signatures
        with_options = signatures["translate_with_options"]
        systems[label, "serving_default"] = best_translations(signatures["serving_default"])
        scalars = signature_inputs(with_options, "translate_with_options", each.decode)
        systems[label, "translate_with_options"] = best_translations(
            with_options, lambda _, scalars=scalars: scalars)
    seconds, outputs = passes_in_rounds(systems, batches, args.option_rounds)
    identical = {label: sum(a == b for a, b in zip(outputs[label, "serving_default"],
                                                   outputs[label, "translate_with_options"]))
                 for label, _ in exports}
    large = ServingLimits.from_dict(export.info).max_beam_size
    full = [batch for batch in batches if len(batch) == args.batch_size]
    mixed_seconds, mixed_identical = {}, (0, 0)
    if full and args.batch_size > 1:
        mixed_seconds, mixed_outputs = passes_in_rounds(
            mixed_systems(export, large), full, args.option_rounds)
        pairs = list(zip(mixed_outputs[ONE_REQUEST], mixed_outputs[APART]))
        mixed_identical = (sum(a == b for a, b in pairs),
                           sum(a == b for a, b in pairs[args.batch_size - 1::args.batch_size]))
    return OptionsResult(export.decode, [label for label, _ in exports], len(texts), seconds,
                         identical, args.batch_size * len(full), large, mixed_seconds,
                         mixed_identical)


def mixed_systems(export: common.Export, large: int) -> Dict[str, Callable]:
    """A batch's rows but the last (the longest) at SMALL_BEAM and the last at `large`, the
    export's other settings: as one request of [batch] options, and apart (the others in
    one request, the last in another, each of [rows] options)."""
    import tensorflow as tf
    function = export.loaded.signatures["translate_with_options"]

    def options(beams):
        inputs = signature_inputs(function, "translate_with_options", export.decode,
                                  len(beams))
        return {**inputs, "beam_size": tf.constant(beams, tf.int32)}

    def one_request(texts):
        beams = [SMALL_BEAM] * (len(texts) - 1) + [large]
        return best_translations(function, lambda _: options(beams))(texts)

    def apart(texts):
        small = best_translations(function, lambda n: options([SMALL_BEAM] * n))
        alone = best_translations(function, lambda _: options([large]))
        return list(small(texts[:-1])) + list(alone(texts[-1:]))

    return {ONE_REQUEST: one_request, APART: apart}


def _rates(sentences: int, seconds: List[float]) -> List[str]:
    """[best, median] sentences/s of the rounds."""
    return [f"{sentences / min(seconds):.1f}", f"{sentences / statistics.median(seconds):.1f}"]


def _median_ratio(numerators: List[float], denominators: List[float]) -> str:
    return f"{statistics.median(a / b for a, b in zip(numerators, denominators)):.3f}"


def print_tables(args, result: OptionsResult):
    """The two tables and their summary line."""
    d, rounds, labels = result.decode, args.option_rounds, result.labels
    rows = []
    for label in labels:
        for signature in ("serving_default", "translate_with_options"):
            times = result.seconds[label, signature]
            own = _median_ratio(times, result.seconds[label, "serving_default"])
            previous = (_median_ratio(times, result.seconds[labels[1], signature])
                        if len(labels) > 1 else "-")
            same = ("-" if signature == "serving_default" else
                    f"{result.identical[label]} of {result.sentences}")
            rows.append([label, signature, *_rates(result.sentences, times), own, previous,
                         same])
    common.print_table(
        ["export", "signature", "sentences/s, best", "sentences/s, median",
         "time / serving_default", "time / previous code's", "= serving_default"], rows,
        text_columns=2,
        title=f"serving_default against translate_with_options with the export's settings "
              f"(beam {d.beam_size}, {d.length_penalty} length penalty, alpha {d.alpha:g}, "
              f"stopping {d.stopping}; scalar options, the best hypothesis): "
              f"{result.sentences} sentences of {common.in_repository(args.src)} sorted by "
              f"length in batches of {args.batch_size}, one request at a time, {rounds} "
              f"alternating rounds (times: the median of the rounds' ratios):")
    if not result.mixed_seconds:
        common.print_summary(f"mixed beams: no full batch of {args.batch_size} sentences "
                             "to mix")
        return
    n, small = args.batch_size, SMALL_BEAM
    times = result.mixed_seconds
    common.print_table(
        ["requests", "sentences/s, best", "sentences/s, median", "time / apart"],
        [[f"one: {n - 1} rows at beam {small} and 1 at beam {result.large_beam}",
          *_rates(result.mixed_sentences, times[ONE_REQUEST]),
          _median_ratio(times[ONE_REQUEST], times[APART])],
         [f"apart: the {n - 1} rows at beam {small}, then the row at beam "
          f"{result.large_beam} (times summed)", *_rates(result.mixed_sentences, times[APART]),
          "1.000"]],
        title=f"The worst mixed request: in each of the {result.mixed_sentences // n} full "
              f"length-sorted batches of {n}, the longest sentence at beam "
              f"{result.large_beam} (the export's max_beam_size) and the others at beam "
              f"{small} ([batch] options, the export's other settings), as one request "
              f"against apart; translate_with_options, one request at a time, {rounds} "
              f"alternating rounds:")
    same, large_same = result.mixed_identical
    common.print_summary(
        f"mixed beams: {same} of {result.mixed_sentences} translations identical between "
        f"one request and apart ({large_same} of {result.mixed_sentences // n} at beam "
        f"{result.large_beam})")
