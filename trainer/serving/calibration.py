"""Calibration of an int8_bfloat16 export (`trainer.export --serving_dtype=int8_bfloat16
--calibration=FILE`): the bfloat16 model translates the file's sentences with the export's
search, every matmul of its encoder and decoding step recording the largest magnitude of its
inputs (keras_transformer.quantization.Observed), and each matmul's int8 kernel then rounds
its inputs by that range (StaticInt8Kernel).

A user's sentences of the kind the server will translate serve best; the validation set's
source side is the usual choice. Inputs larger than calibration saw are clipped to its
range.
"""

import sys
from typing import List

import tensorflow as tf

from keras_transformer import DecodeConfig, Transformer
from keras_transformer.quantization import observed_step_weights, static_step_weights
from trainer.cli import read_text
from trainer.serving.translator import Translator

# The file's first lines calibration translates, and how many at once.
SENTENCES = 1000
BATCH = 64


def read_sentences(path: str, flag: str = "--calibration") -> List[str]:
    """The first SENTENCES non-empty lines of the text file path; a ValueError naming
    `flag` (the program's flag that gave it) when there are none."""
    try:
        lines = read_text(path)
    except OSError as e:
        raise ValueError(f"{flag}={path} cannot be read ({e.strerror}); give a text "
                         "file of source sentences, one per line") from None
    sentences = [line for line in lines if line.strip()][:SENTENCES]
    if not sentences:
        raise ValueError(f"{flag}={path} holds no sentence; give a text file of "
                         "source sentences, one per line")
    return sentences


def calibrated_step_weights(float32_model: Transformer, model: Transformer, tokenizers,
                            decode: DecodeConfig, path: str) -> dict:
    """model's step weights, with its encoder's ("encoder": Transformer.encoder_weights),
    every matmul a StaticInt8Kernel: model is float32_model in bfloat16; the input ranges
    are measured by model translating path's sentences (`read_sentences`) with decode's
    search."""
    sentences = sorted(read_sentences(path), key=len)
    length = model.config.max_length

    def with_encoder(model):  # the encoder's int8 too
        return {**model.step_weights(length), "encoder": model.encoder_weights()}

    weights = with_encoder(model)
    observed, largest = observed_step_weights(weights)
    translator = Translator(model, tokenizers, decode, step_weights=observed)
    print(f"calibrating int8 inputs on {len(sentences)} sentences of {path}", file=sys.stderr)
    for start in range(0, len(sentences), BATCH):
        translator.translate(tf.constant(sentences[start:start + BATCH]))
    ranges = {name: float(variable.numpy()) for name, variable in largest.items()}
    unused = [name for name, value in ranges.items() if value == 0.0]
    if unused:
        raise ValueError(f"calibration never ran {', '.join(unused)}")
    return static_step_weights(weights, with_encoder(float32_model), ranges)
