"""Attention masks. True means "may attend"; every mask broadcasts to
[batch, heads, query_len, key_len]. Padding id is 0 throughout the project."""

import keras
from keras import ops

PAD_ID = 0


def padding_mask(ids):
    """Mask of the non-padding keys of `ids`.

    Args:
      ids: int [batch, key_len] token ids, PAD_ID where padded.
    Returns:
      bool [batch, 1, 1, key_len].
    """
    return ops.not_equal(ids, PAD_ID)[:, None, None, :]


def causal_mask(query_len, key_len=None):
    """Mask that lets position i attend to positions <= i (section 3.2.3, decoder).

    Returns:
      bool [1, 1, query_len, key_len].
    """
    key_len = query_len if key_len is None else key_len
    query_positions = ops.arange(query_len)[:, None]
    key_positions = ops.arange(key_len)[None, :]
    return (key_positions <= query_positions)[None, None, :, :]


def large_negative(dtype):
    """A large negative logit that stays finite in `dtype` (float16 max is 65504)."""
    dtype = keras.backend.standardize_dtype(dtype)
    return -1e9 if dtype in ("float32", "float64") else -3e4
