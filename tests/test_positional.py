"""Positional encodings (section 3.5)."""

import math

import numpy as np

from keras_transformer import PositionalEncoding, positional_encoding


def test_sinusoids_equal_the_formula_element_by_element():
    length, d_model = 50, 16
    got = np.asarray(positional_encoding(length, d_model))
    for pos in range(length):
        for i in range(d_model // 2):
            angle = pos / 10000 ** (2 * i / d_model)
            assert math.isclose(got[pos, 2 * i], math.sin(angle), abs_tol=1e-5)
            assert math.isclose(got[pos, 2 * i + 1], math.cos(angle), abs_tol=1e-5)


def test_the_concatenated_layout_puts_every_sine_before_every_cosine():
    """Marian's (OPUS-MT's) layout: the same values, column 2i's sine in column i and
    column 2i + 1's cosine in column d_model / 2 + i; a layer with that layout adds it."""
    length, d_model = 20, 16
    interleaved = np.asarray(positional_encoding(length, d_model))
    concatenated = np.asarray(positional_encoding(length, d_model, layout="concatenated"))
    np.testing.assert_array_equal(concatenated[:, :d_model // 2], interleaved[:, 0::2])
    np.testing.assert_array_equal(concatenated[:, d_model // 2:], interleaved[:, 1::2])
    layer = PositionalEncoding(d_model=d_model, max_length=32, layout="concatenated")
    np.testing.assert_allclose(layer(np.zeros((1, length, d_model), "float32"))[0],
                               concatenated, atol=1e-6)
    np.testing.assert_allclose(layer(np.zeros((1, 1, d_model), "float32"), start=7)[0, 0],
                               concatenated[7], atol=1e-6)


def test_offset_encoding_matches_the_full_table():
    """Incremental decoding adds PE[start] to a single position."""
    layer = PositionalEncoding(d_model=8, max_length=32)
    x = np.zeros((1, 1, 8), "float32")
    np.testing.assert_allclose(layer(x, start=7)[0, 0], np.asarray(positional_encoding(8, 8))[7],
                               atol=1e-6)


def test_learned_positions_are_trainable_weights_of_max_length():
    layer = PositionalEncoding(d_model=8, max_length=20, kind="learned")
    out = layer(np.zeros((2, 5, 8), "float32"))
    assert out.shape == (2, 5, 8)
    assert [tuple(w.shape) for w in layer.trainable_weights] == [(20, 8)]
    np.testing.assert_allclose(out[0], layer.position_embeddings.numpy()[:5], atol=1e-6)
