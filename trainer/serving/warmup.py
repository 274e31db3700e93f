"""TF Serving warmup requests: `assets.extra/tf_serving_warmup_requests`, one request per
signature, which TF Serving replays when it loads a version, so the first real request
does not pay for tracing and memory allocation."""

from typing import Sequence

import tensorflow as tf

from keras_transformer import DecodeConfig
from trainer.serving import options
from trainer.serving.limits import ServingLimits

SIGNATURES = ("serving_default", "translate_ids", "nbest", "score", "attention",
              "translate_with_options", "sample")
FILE = "tf_serving_warmup_requests"
# Short, empty and repeated text, so every signature runs once before the first request.
TEXTS = ("A man is riding a bicycle.", "", "twenty one")


def requests(model_name: str, decode: DecodeConfig, limits: ServingLimits = ServingLimits(),
             texts: Sequence[str] = TEXTS):
    """PredictRequest protos (tensorflow_serving.apis), one per signature, on `texts`,
    asking the options signatures for the export's own settings (`decode`), one value
    per input: the form a server with batching on merges."""
    from tensorflow_serving.apis import predict_pb2

    texts = [t.encode("utf-8") for t in texts]
    n = len(texts)
    inputs = {
        "serving_default": {"inputs": texts},
        # Pieces + EOS (3), an empty row, a shorter row.
        "translate_ids": {"source_ids": tf.constant([[5, 6, 3], [0, 0, 0], [7, 3, 0]],
                                                    tf.int32)},
        "nbest": {"inputs": texts},
        "score": {"inputs": texts, "targets": list(reversed(texts))},
        "attention": {"inputs": texts},
        # A prefix on one input; two hypotheses where the beam allows, so the search runs
        # as nbest does.
        "translate_with_options": {
            "inputs": texts, "target_prefix": [b"", b"", b"twenty"],
            **options.request_inputs("translate_with_options", decode, n,
                                     num_hypotheses=min(2, decode.beam_size))},
        "sample": {
            "inputs": texts, "target_prefix": [b"", b"", b"twenty"],
            **options.request_inputs("sample", decode, n,
                                     num_hypotheses=min(2, limits.max_beam_size),
                                     temperature=1.0, top_k=0, top_p=0.9, seed=0)},
    }
    out = []
    for signature in SIGNATURES:
        request = predict_pb2.PredictRequest()
        request.model_spec.name = model_name
        request.model_spec.signature_name = signature
        for name, value in inputs[signature].items():
            request.inputs[name].CopyFrom(tf.make_tensor_proto(value))
        out.append(request)
    return out


def write(path: str, model_name: str, decode: DecodeConfig,
          limits: ServingLimits = ServingLimits()):
    """Writes the warmup file: a TFRecord of PredictionLog protos."""
    from tensorflow_serving.apis import prediction_log_pb2

    with tf.io.TFRecordWriter(path) as writer:
        for request in requests(model_name, decode, limits):
            log = prediction_log_pb2.PredictionLog(
                predict_log=prediction_log_pb2.PredictLog(request=request))
            writer.write(log.SerializeToString())
