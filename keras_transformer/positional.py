"""Positional information added to the embeddings (paper section 3.5, Table 3 row E)."""

import keras
import numpy as np
import tensorflow as tf
from keras import ops

from keras_transformer.config import SINUSOID_LAYOUTS




def positional_encoding(length, d_model, start=0, layout="interleaved"):
    """The paper's sinusoids: PE(pos, 2i) = sin(pos / 10000^(2i/d_model)),
    PE(pos, 2i+1) = cos(pos / 10000^(2i/d_model)).

    Args:
      length: number of positions (a Python int or a scalar tensor).
      d_model: width of the encoding (even).
      start: the first position (incremental decoding encodes one later position; a
        fixed-size range keeps that XLA-compilable).
      layout: "interleaved", the formula's columns; or "concatenated", the same values
        with the sines in columns 0 .. d_model/2 - 1 and the cosines after them.
    Returns:
      float32 [length, d_model] for positions start .. start + length - 1; with the
      interleaved layout, sines in even columns, cosines in odd ones.
    """
    positions = ops.cast(start + ops.arange(length), "float32")[:, None]  # [length, 1]
    two_i = np.arange(0, d_model, 2, dtype=np.float32)  # [d_model / 2]
    angles = positions / np.power(10000.0, two_i / d_model)[None, :]  # [length, d_model / 2]
    if layout == "concatenated":
        return ops.concatenate([ops.sin(angles), ops.cos(angles)], axis=-1)
    # Interleave so that column 2i is sin and 2i+1 is cos, exactly as in the formula.
    return ops.reshape(ops.stack([ops.sin(angles), ops.cos(angles)], axis=-1),
                       (length, d_model))


@keras.saving.register_keras_serializable(package="keras_transformer")
class PositionalEncoding(keras.layers.Layer):
    """Adds positional information to embeddings [batch, length, d_model].

    Args:
      d_model: embedding width.
      max_length: positions available to the "learned" kind.
      kind: "sinusoidal" (fixed, any length) or "learned" (a trained
        [max_length, d_model] table, Table 3 row E). Defaults to "sinusoidal".
      layout: the sinusoids' columns, one of SINUSOID_LAYOUTS (see positional_encoding).
        Defaults to "interleaved", the paper's.

    Call: (x [batch, length, d_model], start=0) -> x + PE[start:start + length].
    `start` lets incremental decoding add the encoding of a single later position. With
    the batch's `packing` (keras_transformer.packing), x is packed, [tokens, d_model], and
    each token gets its position's encoding.

    Example:

    >>> import keras
    >>> from keras_transformer import PositionalEncoding
    >>> positions = PositionalEncoding(d_model=4, max_length=16)
    >>> encoded = keras.ops.convert_to_numpy(positions(keras.ops.zeros((1, 2, 4))))
    >>> [[round(float(v), 3) for v in row] for row in encoded[0]]
    [[0.0, 1.0, 0.0, 1.0], [0.841, 0.54, 0.01, 1.0]]
    """

    def __init__(self, d_model, max_length, kind="sinusoidal", layout="interleaved", **kwargs):
        super().__init__(**kwargs)
        if kind not in ("sinusoidal", "learned"):
            raise ValueError(f"kind must be 'sinusoidal' or 'learned', got {kind!r}")
        if layout not in SINUSOID_LAYOUTS:
            raise ValueError(f"layout must be one of {SINUSOID_LAYOUTS}, got {layout!r}")
        self.d_model = d_model
        self.max_length = max_length
        self.kind = kind
        self.layout = layout

    def build(self, input_shape=None):
        if self.kind == "learned":
            self.position_embeddings = self.add_weight(
                name="position_embeddings", shape=(self.max_length, self.d_model),
                initializer=keras.initializers.RandomNormal(stddev=0.02))
        self.built = True

    def call(self, x, start=0, packing=None):
        if packing is not None:  # each token gets its own position's encoding
            if self.kind == "learned":
                table = self.position_embeddings
            else:
                table = self.table(packing.shape[1])
            return x + ops.cast(ops.take(table, packing.positions, axis=0), x.dtype)
        length = ops.shape(x)[1]
        if self.kind == "learned":
            table = ops.slice(self.position_embeddings, (start, 0), (length, self.d_model))
        else:
            table = self.table(length, start)
        return x + ops.cast(table, x.dtype)[None, :, :]

    def step_weights(self, length):
        """PE[0:length], [length, d_model] in the compute dtype: the table incremental
        decoding indexes, computed (or read) once per search."""
        if self.kind == "learned":
            table = tf.convert_to_tensor(self.position_embeddings)[:length]
        else:
            table = self.table(length)
        return tf.cast(table, self.compute_dtype)

    def table(self, length, start=0):
        """The sinusoids of positions start .. start + length - 1, float32
        [length, d_model], in this layer's layout."""
        return positional_encoding(length, self.d_model, start, self.layout)

    def step(self, x, index, weights):
        """`call` in incremental decoding: x [rows, d_model] at position `index` (scalar)
        -> x + PE[index], in the table's dtype (the residual stream's: float32 in an
        int8_bfloat16 step, keras_transformer.quantization.static_step_weights)."""
        return tf.cast(x, weights.dtype) + weights[index]

    def get_config(self):
        return {**super().get_config(), "d_model": self.d_model,
                "max_length": self.max_length, "kind": self.kind, "layout": self.layout}
