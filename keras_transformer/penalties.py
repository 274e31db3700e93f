"""The length penalty lp(Y) a search divides a hypothesis' log-probability by to score it
(paper section 6.1: Wu et al.'s, 2016), one class each, registered by name as the stopping
rules are (keras_transformer.stopping).
"""

import tensorflow as tf

from keras_transformer.config import LENGTH_PENALTIES


class Gnmt:
    """Wu et al. (2016), lp(Y) = ((5 + |Y|) / 6)^alpha: the paper's (section 6.1)."""

    def __call__(self, length, alpha):
        return tf.pow((5.0 + length) / 6.0, alpha)


class Average:
    """lp(Y) = |Y|^alpha: Hugging Face's, Marian's, CTranslate2's and fairseq's (alpha 1:
    the mean log-probability per token)."""

    def __call__(self, length, alpha):
        return tf.pow(length, alpha)


# The length penalties by name; keras_transformer.config.LENGTH_PENALTIES names them for
# the flags. Adding one is a class here, a line in PENALTIES, and its name there.
PENALTIES = {"gnmt": Gnmt(), "average": Average()}
assert tuple(PENALTIES) == LENGTH_PENALTIES, "name a new penalty in config.LENGTH_PENALTIES"


def length_penalty(length, alpha, kind="gnmt"):
    """lp(Y), what a hypothesis' log-probability is divided by to score it: PENALTIES'
    `kind` (Gnmt, the paper's; Average). Both grow with |Y| for alpha >= 0, which the
    searches' early exit relies on.

    Args:
      length: int or float tensor of any shape, |Y| (EOS included).
      alpha: float, 0 turns the penalty off (lp = 1); or a tensor that broadcasts with
        `length` (one alpha per sentence).
      kind: one of LENGTH_PENALTIES.
    Returns:
      float32, the broadcast shape of `length` and `alpha`.

    Example:

    >>> from keras_transformer import length_penalty
    >>> round(float(length_penalty(7, 0.6)), 4)  # ((5 + 7) / 6)^0.6 = 2^0.6
    1.5157
    >>> round(float(length_penalty(4, 0.5, "average")), 4)  # 4^0.5
    2.0
    """
    if kind not in PENALTIES:
        raise ValueError(f"length_penalty must be one of {', '.join(PENALTIES)}, got {kind!r}")
    return PENALTIES[kind](tf.cast(length, tf.float32), alpha)
