"""Translating many texts from Python through a translation signature: an exported
SavedModel's, or an in-process `Translator`'s (validation BLEU)."""

from typing import Callable, Dict, List, Optional, Sequence, Union

import tensorflow as tf

Text = Union[str, bytes]


def translate_texts(translate: Callable[..., Dict[str, tf.Tensor]],
                    texts: Sequence[Text], batch_size: int = 64,
                    progress: Optional[Callable[[int], None]] = None,
                    target_prefixes: Optional[Sequence[Text]] = None,
                    **options) -> List[Union[str, List[str]]]:
    """Translates `texts` with `translate` (Translator.translate or a loaded SavedModel's
    signature) in batches of similar length, returning them in the input order.

    Each batch is passed as `inputs` (positionally when there are no other inputs), with
    its `target_prefix` when target_prefixes (one per text) is given, and `options` (the
    option inputs of translate_with_options or sample, scalars). A text's result is its
    translation, or its list of hypotheses when the signature returns [batch, k].
    `progress`, if given, is called with the number of texts done after each batch.
    """
    if target_prefixes is not None and len(target_prefixes) != len(texts):
        raise ValueError(f"{len(target_prefixes)} target prefixes for {len(texts)} texts")
    order = sorted(range(len(texts)), key=lambda i: len(texts[i]))
    out = [""] * len(texts)
    for start in range(0, len(order), batch_size):
        chunk = order[start:start + batch_size]
        inputs = tf.constant([texts[i] for i in chunk])
        if target_prefixes is None and not options:
            result = translate(inputs)
        else:
            if target_prefixes is not None:
                options["target_prefix"] = tf.constant([target_prefixes[i] for i in chunk])
            result = translate(inputs=inputs, **options)
        for i, row in zip(chunk, result["translations"].numpy().tolist()):
            out[i] = [t.decode("utf-8") for t in row] if isinstance(row, list) \
                else row.decode("utf-8")
        if progress is not None:
            progress(min(start + batch_size, len(order)))
    return out


def translate_lines(model, lines: Sequence[Text], batch_size: int = 64,
                    signature: str = "serving_default",
                    progress: Optional[Callable[[int], None]] = None,
                    target_prefixes: Optional[Sequence[Text]] = None,
                    **options) -> List[str]:
    """Translations of `lines` by a loaded SavedModel's `signature`, one line each, or k
    consecutive lines each (best first) for a signature that returns k hypotheses; a
    line break inside a translation becomes a space. target_prefixes and options: as
    `translate_texts`."""
    outputs = translate_texts(model.signatures[signature], lines, batch_size, progress,
                              target_prefixes, **options)
    rows = [row if isinstance(row, list) else [row] for row in outputs]
    return [" ".join(text.splitlines()) for row in rows for text in row]
