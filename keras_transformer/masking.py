"""Attention masks. True means "may attend"; every mask broadcasts to
[batch, heads, query_len, key_len]."""

from keras import ops

from keras_transformer.special_ids import PAD_ID

# The logit a masked key gets. Attention logits are always float32 (attention.py), where
# exp(-1e9 - max) is exactly 0, so a masked key has no weight at all.
MASKED_LOGIT = -1e9


def padding_mask(ids):
    """Mask of the non-padding keys of `ids`.

    Args:
      ids: int [batch, key_len] token ids, PAD_ID where padded.
    Returns:
      bool [batch, 1, 1, key_len].

    Example:

    >>> import keras
    >>> from keras_transformer import padding_mask
    >>> ids = keras.ops.convert_to_tensor([[5, 6, 3], [7, 3, 0]])  # pieces, EOS, padding
    >>> keras.ops.convert_to_numpy(padding_mask(ids)[:, 0, 0]).tolist()
    [[True, True, True], [True, True, False]]
    """
    return ops.not_equal(ids, PAD_ID)[:, None, None, :]


def causal_mask(query_len, key_len=None):
    """Mask that lets position i attend to positions <= i (section 3.2.3, decoder).

    Returns:
      bool [1, 1, query_len, key_len].

    Example:

    >>> import keras
    >>> from keras_transformer import causal_mask
    >>> keras.ops.convert_to_numpy(causal_mask(3)[0, 0]).astype(int).tolist()
    [[1, 0, 0], [1, 1, 0], [1, 1, 1]]
    """
    key_len = query_len if key_len is None else key_len
    query_positions = ops.arange(query_len)[:, None]
    key_positions = ops.arange(key_len)[None, :]
    return (key_positions <= query_positions)[None, None, :, :]

