"""Translating many texts from Python through a translation signature: an exported
SavedModel's, or an in-process `Translator`'s (validation BLEU)."""

from typing import Callable, Dict, List, Optional, Sequence, Union

import tensorflow as tf

Text = Union[str, bytes]


def translate_texts(translate: Callable[[tf.Tensor], Dict[str, tf.Tensor]],
                    texts: Sequence[Text], batch_size: int = 64,
                    progress: Optional[Callable[[int], None]] = None) -> List[str]:
    """Translates `texts` with `translate` (Translator.translate or a loaded SavedModel's
    signature) in batches of similar length, returning them in the input order.

    `progress`, if given, is called with the number of texts done after each batch.
    """
    order = sorted(range(len(texts)), key=lambda i: len(texts[i]))
    out = [""] * len(texts)
    for start in range(0, len(order), batch_size):
        chunk = order[start:start + batch_size]
        result = translate(tf.constant([texts[i] for i in chunk]))
        for i, text in zip(chunk, result["translations"].numpy()):
            out[i] = text.decode("utf-8")
        if progress is not None:
            progress(min(start + batch_size, len(order)))
    return out


def translate_lines(model, lines: Sequence[Text], batch_size: int = 64,
                    signature: str = "serving_default",
                    progress: Optional[Callable[[int], None]] = None) -> List[str]:
    """Translations of `lines` by a loaded SavedModel's `signature`, one line each (a
    line break inside a translation becomes a space)."""
    outputs = translate_texts(model.signatures[signature], lines, batch_size, progress)
    return [" ".join(text.splitlines()) for text in outputs]
