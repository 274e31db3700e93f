"""The export as TF Serving runs it with --enable_batching, without the server binary:
requests merged along dimension 0 answer each request as it is answered alone.

TF Serving's BatchingSession concatenates each input of the requests it merges along
dimension 0 (translate_ids' source_ids only when they have the same width), runs the
signature once, and splits every output back by each request's rows. So a row's options
(translate_with_options: beam_size, alpha, stopping, patience, max_extra_length,
min_length, num_hypotheses; sample: temperature, top_k, top_p, seed, ...) travel as a
[batch] vector beside it, and the batch's padded outputs (k = the batch's largest
num_hypotheses, translate_ids' and attention's widths) are cut back to each row's own.
Here: that merge in this process (the float32 export exactly, the bfloat16 and int8 ones as
often as a merge of uniform options), TensorFlow's own batching op (BatchFunction) around
each signature of the export loaded as TF Serving loads it (a TF1 session: MetaGraph import,
restore op, init op) with concurrent callers and the warmup file, and a merged batch with
rows out of range. The options one by one: test_options_signatures.py."""

import concurrent.futures
import re
import threading
import time

import numpy as np
import pytest
import tensorflow as tf

from conftest import built_once, sources
from keras_transformer import DecodeConfig
from trainer.serving.options import request_inputs, request_options

pytestmark = pytest.mark.slow

OPTION_SIGNATURES = ("translate_with_options", "sample")
TEXTS = sources(6)


def texts(*strings):
    return np.array([s.encode() for s in strings], dtype=object)


def option_request(signature, inputs, prefixes=None, **options):
    """A request of `signature` as a client of a server with batching sends it: inputs,
    target_prefix and every option as [rows] numpy arrays; an option's value is a row's
    list or every row's scalar, the export's default (DecodeConfig's, num_hypotheses 1)
    when left out."""
    rows = len(inputs)
    request = {"inputs": texts(*inputs),
               "target_prefix": texts(*(prefixes or [""] * rows))}
    defaults = request_inputs(signature, DecodeConfig(), rows)
    for declared in request_options(signature):
        value = options.pop(declared.name, None)
        request[declared.name] = defaults[declared.name].numpy() if value is None else (
            tf.broadcast_to(tf.constant(value, declared.tf_dtype), [rows]).numpy())
    assert not options, f"not an option of {signature}: {sorted(options)}"
    return request


# Per signature, three requests of 1, 2 and 3 rows (6 in all, one batch of the batching
# op below), every row of the option signatures with options of its own: each option
# takes at least two values across the batch, and within a request too.
REQUESTS = {
    "serving_default": [{"inputs": texts(TEXTS[2])},
                        {"inputs": texts(TEXTS[0], "")},
                        {"inputs": texts(TEXTS[3], TEXTS[1], TEXTS[5])}],
    "nbest": [{"inputs": texts(TEXTS[5])},
              {"inputs": texts("", TEXTS[1])},
              {"inputs": texts(TEXTS[0], TEXTS[4], TEXTS[2])}],
    "attention": [{"inputs": texts(TEXTS[0])},
                  {"inputs": texts(TEXTS[5], "")},
                  {"inputs": texts(TEXTS[3], TEXTS[1], TEXTS[4])}],
    "score": [{"inputs": texts(TEXTS[1]), "targets": texts("dreihundert")},
              {"inputs": texts(TEXTS[4], ""), "targets": texts("", "")},
              {"inputs": texts(TEXTS[0], TEXTS[2], TEXTS[5]),
               "targets": texts("sieben", "", "neunhundert zwei")}],
    # One width (the server merges no others): pieces + EOS (3), 0-padded; an all-padding
    # row; an id past the vocabulary (UNK).
    "translate_ids": [
        {"source_ids": np.array([[5, 6, 7, 8, 3]], np.int32)},
        {"source_ids": np.array([[9, 3, 0, 0, 0], [0, 0, 0, 0, 0]], np.int32)},
        {"source_ids": np.array([[10, 11, 3, 0, 0], [12, 13, 14, 3, 0],
                                 [99999, 6, 3, 0, 0]], np.int32)}],
    "translate_with_options": [
        option_request("translate_with_options", [TEXTS[2]], beam_size=1, alpha=0.0,
                       stopping="exact", patience=1.0, max_extra_length=50, min_length=0,
                       num_hypotheses=1),
        option_request("translate_with_options", [TEXTS[1], ""], ["zwei", ""],
                       beam_size=[4, 2], alpha=[0.6, 1.0], stopping=["first", "transformers"],
                       patience=[2.0, 1.0], max_extra_length=[5, 50], min_length=[3, 0],
                       num_hypotheses=[3, 2]),
        option_request("translate_with_options", [TEXTS[4], TEXTS[0], TEXTS[5]],
                       ["", "drei", ""], beam_size=[8, 3, 2], alpha=[1.0, 0.0, 0.6],
                       stopping=["transformers", "exact", "first"], patience=[1.0, 1.0, 0.5],
                       max_extra_length=[10, 0, 50], min_length=[5, 0, 1],
                       num_hypotheses=[8, 1, 2])],
    "sample": [
        option_request("sample", [TEXTS[3]], temperature=1.0, top_k=0, top_p=1.0, seed=0,
                       num_hypotheses=1, max_extra_length=50, min_length=0),
        option_request("sample", [TEXTS[1], TEXTS[3]], ["zwei", ""], temperature=[0.5, 1.5],
                       top_k=[5, 0], top_p=[0.9, 0.5], seed=[7, 7], num_hypotheses=[3, 1],
                       max_extra_length=[10, 20], min_length=[2, 0]),
        option_request("sample", [TEXTS[0], TEXTS[4], ""], temperature=[0.0, 1.0, 2.0],
                       top_k=[1, 20, 0], top_p=[1.0, 0.95, 0.8], seed=[1, 2, 3],
                       num_hypotheses=[2, 8, 4], max_extra_length=[50, 5, 10],
                       min_length=[0, 3, 1])],
}
SIGNATURES = tuple(REQUESTS)


def rows(request) -> int:
    return len(next(iter(request.values())))


def merge(requests):
    """One request of `requests` concatenated along dimension 0, as BatchingSession merges."""
    return {name: np.concatenate([r[name] for r in requests]) for name in requests[0]}


def split(outputs, requests):
    """The outputs of a merged call cut back into each request's rows."""
    ends = np.cumsum([rows(r) for r in requests])
    return [{name: value[end - rows(r):end] for name, value in outputs.items()}
            for r, end in zip(requests, ends)]


def call(signature_function, request):
    """A TF2 signature's outputs, as numpy, on a request of numpy arrays."""
    return {name: value.numpy() for name, value in signature_function(
        **{k: tf.constant(v) for k, v in request.items()}).items()}


def answers(signature, request, outputs):
    """Each row's answer, cut to its own length: dicts of arrays, one per row, the same
    for a row alone or in a merged batch. Checks each row's padding on the way: past
    num_hypotheses (and on a row out of range) "" and -inf; past translate_ids' lengths 0."""
    out = []
    for i in range(rows(request)):
        row = {name: value[i] for name, value in outputs.items()}
        if signature == "translate_ids":
            length = row["lengths"]
            assert np.all(row["ids"][length:] == 0), (signature, i, row["ids"])
            row["ids"] = row["ids"][:length]
        elif signature == "attention":
            source, output = row["source_lengths"], row["output_lengths"]
            row["source_pieces"] = row["source_pieces"][:source]
            row["output_pieces"] = row["output_pieces"][:output]
            row["encoder_self_attention"] = row["encoder_self_attention"][:, :, :source,
                                                                          :source]
            row["encoder_decoder_attention"] = row["encoder_decoder_attention"][
                :, :, :output, :source]
        elif signature in OPTION_SIGNATURES:
            k = int(request["num_hypotheses"][i]) if row["error"] == b"" else 0
            for name in ("translations", "scores", "log_probs"):
                padding = b"" if name == "translations" else -np.inf
                assert np.all(row[name][k:] == padding), (signature, i, name, row[name])
                row[name] = row[name][:k]
        out.append(row)
    return out


def differences(got, expected):
    """Where rows' answers differ: texts and integers must be equal, floats within 1e-5;
    [] when they agree."""
    if len(got) != len(expected):
        return [f"{len(got)} rows, not {len(expected)}"]
    out = []
    for i, (row, alone) in enumerate(zip(got, expected)):
        if sorted(row) != sorted(alone):
            out.append(f"row {i}: outputs {sorted(row)}, not {sorted(alone)}")
            continue
        for name, value in alone.items():
            value, other = np.asarray(value), np.asarray(row[name])
            same = other.shape == value.shape and (
                np.array_equal(other, value) if value.dtype.kind in "OSUi" else
                np.allclose(other, value, rtol=1e-5, atol=1e-5))
            if not same:
                out.append(f"row {i} {name}: {other!r}, alone {value!r}")
    return out


def assert_same_answers(got, expected, where):
    wrong = differences(got, expected)
    assert not wrong, f"{where}: " + "; ".join(wrong)


def merged_answers(signature_function, signature, requests):
    """Each request's rows' answers in one call of them all merged."""
    merged = split(call(signature_function, merge(requests)), requests)
    return [answers(signature, r, m) for r, m in zip(requests, merged)]


def alone_answers(signature_function, signature, requests):
    """Each request's rows' answers in a call of its own."""
    return [answers(signature, r, call(signature_function, r)) for r in requests]


@pytest.mark.parametrize("signature", SIGNATURES)
def test_merged_requests_get_each_their_own_answer_in_float32(loaded, signature):
    requests = REQUESTS[signature]
    function = loaded.signatures[signature]
    merged = merged_answers(function, signature, requests)
    alone = alone_answers(function, signature, requests)
    for i, (got, expected) in enumerate(zip(merged, alone)):
        assert_same_answers(got, expected, f"{signature} request {i}")
    if signature in OPTION_SIGNATURES:
        assert all(e == b"" for r in alone for row in r for e in [row["error"]])
        # The options matter here: the same inputs with the first request's options
        # everywhere answer the other requests otherwise.
        first = {name: value[0] for name, value in requests[0].items()
                 if name not in ("inputs", "target_prefix")}
        for i, request in enumerate(requests[1:], 1):
            uniform = {**request, **{name: np.full_like(request[name], value)
                                     for name, value in first.items()}}
            other = answers(signature, uniform, call(function, uniform))
            assert differences(other, alone[i]), (signature, i)


# The exports that round: their merged rows may differ from the rows alone by a kernel's
# rounding (another batch shape), a merge of mixed options no more often than one of
# uniform options.
REDUCED = ("bfloat16", "int8")


@pytest.fixture(scope="module", params=REDUCED)
def reduced(request, exported, tmp_path_factory):
    """(serving dtype, the session's model exported so and loaded), exported once per test
    run (int8: the export test_export.py's int8_export makes)."""
    import tensorflow_text  # noqa: F401
    from trainer.serving import saved_model
    dtype = request.param

    def export(directory):
        saved_model.export(str(exported.model_dir), str(directory),
                           saved_model.Options(serving_dtype=dtype))

    version = built_once(tmp_path_factory, f"{dtype}_export", export, exported.model_dir) / "1"
    return dtype, tf.saved_model.load(str(version))


def option_rows(signature):
    """REQUESTS' rows of an option signature, each a request of its own."""
    merged = merge(REQUESTS[signature])
    return [{name: value[i:i + 1] for name, value in merged.items()}
            for i in range(rows(merged))]


# A merged row that differs from its row alone is a near tie that a kernel chosen for
# another batch shape breaks the other way; a mixed batch and a uniform one differ in
# shape (the batch's largest beam, its steps), so either may meet one such tie the other
# does not: one row of the six.
TOLERANCE = 1


@pytest.mark.parametrize("signature", OPTION_SIGNATURES)
def test_mixed_options_agree_with_the_rows_alone_as_often_as_uniform_ones(reduced,
                                                                          signature):
    """Per row: in the batch of every row with its own options (mixed), and in the batch
    of the same inputs all with that row's options (uniform), does the row translate as
    alone? The rows' inputs and options are the same in both; only the others' options
    differ."""
    dtype, loaded = reduced
    function = loaded.signatures[signature]
    requests = option_rows(signature)
    alone = [a[0] for a in alone_answers(function, signature, requests)]
    mixed = [a[0] for a in merged_answers(function, signature, requests)]
    uniform = []
    for i, request in enumerate(requests):
        batch = [{**r, **{name: request[name] for name in r
                          if name not in ("inputs", "target_prefix")}} for r in requests]
        uniform.append(merged_answers(function, signature, batch)[i][0])
    same = {name: sum(np.array_equal(row["translations"], a["translations"])
                      for row, a in zip(got, alone))
            for name, got in (("mixed", mixed), ("uniform", uniform))}
    assert same["mixed"] >= same["uniform"] - TOLERANCE, (dtype, signature, same)
    # A uniform batch that mostly disagreed would leave the comparison above weak.
    assert same["uniform"] >= len(requests) // 2, (dtype, signature, same)


# TensorFlow's batching op around each signature, as TF Serving's in-graph batching puts it:
# a batch runs once it holds MAX_BATCH rows (the three requests of a signature in REQUESTS;
# a warmup request's callers), or when TIMEOUT has passed since its first caller.
MAX_BATCH = 6
TIMEOUT = 120.0


class BatchedSession:
    """An export loaded as TF Serving loads it: the MetaGraph imported into a TF1 session,
    its restore op and init op (the vocabularies' assets) run by the SavedModel loader.
    Each signature is there as TF Serving runs it (`run(..., batched=False)`), and behind
    a BatchFunction op of its own (`run`): the function the signature's graph calls, fed
    by the signature's placeholders, which the op concatenates across concurrent
    session.run calls along dimension 0 and splits back."""

    def __init__(self, version):
        import tensorflow_text  # noqa: F401  (TF Serving builds register its ops)
        self.graph = tf.Graph()
        self.session = tf.compat.v1.Session(graph=self.graph)
        meta_graph = tf.compat.v1.saved_model.loader.load(self.session, ["serve"],
                                                          str(version))
        self.signatures = {name: meta_graph.signature_def[name] for name in SIGNATURES}
        self.batched = {name: self._batched(name) for name in SIGNATURES}

    def _batched(self, name):
        signature = self.signatures[name]
        outputs = {k: self.graph.get_tensor_by_name(v.name)
                   for k, v in signature.outputs.items()}
        (call,) = {t.op for t in outputs.values()}  # the signature's function call
        # Its inputs: the signature's placeholders, then what the function captures (the
        # variables, the tokenizers' resources).
        count = len(signature.inputs)
        inputs, captured = list(call.inputs[:count]), list(call.inputs[count:])
        assert sorted(t.name for t in inputs) == sorted(
            v.name for v in signature.inputs.values()), name
        with self.graph.as_default():
            batched = tf.raw_ops.BatchFunction(
                in_tensors=inputs, captured_tensors=captured, f=call.get_attr("f"),
                Tout=call.get_attr("Tout"), num_batch_threads=1, max_batch_size=MAX_BATCH,
                batch_timeout_micros=int(TIMEOUT * 1e6), allowed_batch_sizes=[],
                shared_name=f"batch_{name}")
        position = {t.name: i for i, t in enumerate(call.outputs)}
        return {k: batched[position[t.name]] for k, t in outputs.items()}

    def run(self, name, request, batched=True):
        """The signature's outputs (numpy) on a request of numpy arrays."""
        signature = self.signatures[name]
        fetches = self.batched[name] if batched else {k: v.name for k, v in
                                                      signature.outputs.items()}
        return self.session.run(fetches, {signature.inputs[k].name: v
                                          for k, v in request.items()})


@pytest.fixture(scope="module")
def served(exported):
    served = BatchedSession(exported.version_dir)
    yield served
    served.session.close()


def concurrently(served, calls):
    """served.run(signature, request) of every (signature, request) in `calls`, each in a
    thread of its own, all started at once; (their outputs, in order; the seconds taken)."""
    start = threading.Barrier(len(calls))

    def run(signature, request):
        start.wait()
        return served.run(signature, request)

    began = time.monotonic()
    with concurrent.futures.ThreadPoolExecutor(len(calls)) as pool:
        outputs = [f.result() for f in [pool.submit(run, *c) for c in calls]]
    return outputs, time.monotonic() - began


# The two tests of the batching ops share one session (its ops' functions take most of a
# minute to instantiate): one worker runs them under --dist loadgroup.
@pytest.mark.xdist_group("batching_session")
def test_concurrent_callers_through_tensorflows_batching_op_get_their_own_answers(served):
    """Three callers per signature, all seven signatures at once. A batching op runs a
    batch once it holds MAX_BATCH rows, which only all three callers' rows make, or at
    TIMEOUT: answers well before TIMEOUT come from merged calls. Where a batch pads (the
    option signatures' k columns, attention's source width), each caller sees the
    batch's size, not its own."""
    for name, requests in REQUESTS.items():
        assert sum(rows(r) for r in requests) == MAX_BATCH, name
        # First one caller holding a whole batch, which instantiates the op's function
        # before the callers race: it answers as the requests alone.
        whole = answers(name, merge(requests), served.run(name, merge(requests)))
        assert_same_answers(whole, [a for r in requests for a in answers(
            name, r, served.run(name, r, batched=False))], f"{name} merged")
    calls = [(name, request) for name, requests in REQUESTS.items() for request in requests]
    outputs, seconds = concurrently(served, calls)
    assert seconds < TIMEOUT / 2, f"{seconds:.0f} s: some batch was not full, not merged"
    alone = [served.run(name, request, batched=False) for name, request in calls]
    for (name, request), got, expected in zip(calls, outputs, alone):
        assert_same_answers(answers(name, request, got), answers(name, request, expected),
                            f"{name} caller of {rows(request)} rows")
    for name, key in (("translate_with_options", "translations"), ("sample", "translations"),
                      ("attention", "source_pieces")):
        widths = [(got[key].shape[1], own[key].shape[1])
                  for (n, _), got, own in zip(calls, outputs, alone) if n == name]
        assert len({own for _, own in widths}) > 1, (name, widths)  # alone: their own
        assert {got for got, _ in widths} == {max(own for _, own in widths)}, (name, widths)


def warmup_requests(version):
    """(signature, request of numpy arrays) of every PredictionLog of the export's warmup
    file, as TF Serving reads it."""
    from tensorflow_serving.apis import prediction_log_pb2
    path = version / "assets.extra" / "tf_serving_warmup_requests"
    out = []
    for record in tf.data.TFRecordDataset(str(path)):
        log = prediction_log_pb2.PredictionLog.FromString(record.numpy())
        request = log.predict_log.request
        out.append((request.model_spec.signature_name,
                    {k: tf.make_ndarray(v) for k, v in request.inputs.items()}))
    return out


def filling_a_batch(request):
    """Callers of `request`'s rows, as sent and reversed in turn, whose rows fill one batch
    (MAX_BATCH rows, the last one cut short)."""
    callers, total = [], 0
    while total < MAX_BATCH:
        taken = min(rows(request), MAX_BATCH - total)
        step = -1 if len(callers) % 2 else 1
        callers.append({k: v[::step][:taken] for k, v in request.items()})
        total += taken
    return callers


@pytest.mark.xdist_group("batching_session")
def test_the_warmup_file_replays_through_the_batching_ops(served, exported):
    """Each warmup request among callers of its rows reversed, filling one batch per
    signature: every request answered, the option signatures' rows without error, each
    caller as alone. A scalar option, which a server without batching takes, fails at the
    batching op: only [batch] vectors merge, what the warmup file sends."""
    replayed = warmup_requests(exported.version_dir)
    assert sorted(name for name, _ in replayed) == sorted(SIGNATURES)
    calls = []
    for name, request in replayed:
        assert all(value.ndim >= 1 for value in request.values()), name
        assert rows(request) <= MAX_BATCH, name
        calls += [(name, caller) for caller in filling_a_batch(request)]
    outputs, seconds = concurrently(served, calls)
    assert seconds < TIMEOUT / 2, f"{seconds:.0f} s: some batch was not full, not merged"
    for (name, request), got in zip(calls, outputs):
        assert all(value.shape[0] == rows(request) for value in got.values()), name
        if name in OPTION_SIGNATURES:
            assert got["error"].tolist() == [b""] * rows(request), (name, got["error"])
        assert_same_answers(answers(name, request, got),
                            answers(name, request, served.run(name, request, batched=False)),
                            f"warmup {name}")
    name, request = next(c for c in replayed if c[0] == "translate_with_options")
    scalar = {**request, "beam_size": np.int32(2)}
    served.run(name, scalar, batched=False)  # fine without batching
    with pytest.raises(tf.errors.InvalidArgumentError, match="at least one dimension"):
        served.run(name, scalar)


# Rows out of range, each option with its range and value as the error names them.
BAD = {
    "translate_with_options": (
        option_request("translate_with_options", [TEXTS[0]] * 4, beam_size=[12, 4, 2, 2],
                       num_hypotheses=[1, 5, 1, 1], stopping=["exact", "exact", "never",
                                                              "first"],
                       patience=[1.0, 1.0, 1.0, 0.0]),
        [r"beam_size must be in \[1, 8\], got 12",
         r"num_hypotheses must be in \[1, beam_size=4\], got 5",
         r"stopping must be one of exact, transformers, first, got never",
         r"patience must be in \(0.0, inf\), got 0"]),
    "sample": (
        option_request("sample", [TEXTS[0]] * 4, top_p=[1.5, 1.0, 1.0, 1.0],
                       temperature=[1.0, -1.0, 1.0, 1.0], num_hypotheses=[1, 1, 9, 1],
                       top_k=[0, 0, 0, -3]),
        [r"top_p must be in \(0.0, 1\], got 1.5",
         r"temperature must be in \[0.0, inf\), got -1",
         r"num_hypotheses must be in \[1, 8\], got 9",
         r"top_k must be in \[0, inf\), got -3"]),
}


@pytest.mark.parametrize("signature", OPTION_SIGNATURES)
def test_a_row_out_of_range_in_a_merged_batch_is_its_error_alone(loaded, signature):
    """A request of rows out of range (one option each) between good ones: each bad
    row's error names its option, range and value, its translations are "" and its
    scores -inf; every other row answers as alone, and the bad rows as they do alone."""
    function = loaded.signatures[signature]
    bad, messages = BAD[signature]
    good = REQUESTS[signature]
    requests = [good[0], bad, *good[1:]]
    assert len(messages) == rows(bad)
    outputs = split(call(function, merge(requests)), requests)
    for name in ("translations", "scores", "log_probs"):
        padding = b"" if name == "translations" else -np.inf
        assert np.all(outputs[1][name] == padding), (name, outputs[1][name])
    for error, message in zip(outputs[1]["error"], messages):
        assert re.fullmatch(message, error.decode()), (error, message)
    alone = alone_answers(function, signature, requests)
    for i, (request, got, expected) in enumerate(zip(requests, outputs, alone)):
        assert_same_answers(answers(signature, request, got), expected,
                            f"{signature} request {i}")
    assert all(row["error"] == b"" for r in alone[:1] + alone[2:] for row in r)


@pytest.mark.parametrize("signature", OPTION_SIGNATURES)
def test_scalar_options_still_work_without_batching_and_a_vector_of_another_length_fails(
        loaded, signature):
    """A scalar is every row's value (today's clients, a server without batching); a
    [batch] vector must hold one value per input: another length, or another rank, fails
    the call with InvalidArgument naming the option."""
    function = loaded.signatures[signature]
    inputs = {"inputs": texts(*TEXTS[:3]), "target_prefix": texts("", "zwei", "")}
    values = {"beam_size": 3, "num_hypotheses": 2, "min_length": 2} if (
        signature == "translate_with_options") else {"num_hypotheses": 2, "seed": 11,
                                                       "temperature": 0.7, "top_k": 10}
    scalars = {k: v.numpy() for k, v in request_inputs(signature, DecodeConfig(),
                                                       **values).items()}
    vectors = option_request(signature, TEXTS[:3], ["", "zwei", ""], **values)
    assert all(np.ndim(v) == 0 for v in scalars.values())
    got = call(function, {**inputs, **scalars})
    assert_same_answers(answers(signature, vectors, got),
                        answers(signature, vectors, call(function, vectors)),
                        f"{signature} scalars")
    option = request_options(signature)[0].name
    for wrong in (vectors[option][:2], np.append(vectors[option], vectors[option][:1]),
                  vectors[option][:, None]):
        with pytest.raises(tf.errors.InvalidArgumentError,
                           match=f"{option} must be a scalar or hold one value per input"):
            call(function, {**vectors, option: wrong})
