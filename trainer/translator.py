"""Text in, text out: tokenizer -> model -> beam search -> detokenizer, in TF graph ops only.

The same `Translator` computes validation BLEU during training and is what the export
saves, so training-time BLEU and the served model translate identically.
"""

from typing import Callable, Dict, List, Sequence

import tensorflow as tf

from keras_transformer import Transformer
from keras_transformer.beam_search import beam_search
from trainer.tokenizer import EOS_ID, PAD_ID, Tokenizers


class Translator(tf.Module):
    """A trained model with its tokenizers and decoding settings.

    Args:
      model: the Transformer.
      tokenizers: its source and target tokenizers.
      beam_size, alpha: beam search settings (section 6.1: 4 and 0.6).
    """

    def __init__(self, model: Transformer, tokenizers: Tokenizers, beam_size: int = 4,
                 alpha: float = 0.6):
        super().__init__(name="translator")
        self.model = model
        self.source_tokenizer = tokenizers.source
        self.target_tokenizer = tokenizers.target
        self.beam_size = beam_size
        self.alpha = alpha

    def source_ids(self, inputs):
        """tf.string [batch] -> int32 [batch, src_len]: pieces + EOS, 0-padded, truncated so
        that the model's positions suffice; an empty input becomes an all-padding row."""
        pieces = self.source_tokenizer.tokenize(inputs)
        pieces = pieces[:, :self.model.config.max_length - 1]
        eos = tf.fill(tf.stack([pieces.nrows(), 1]), EOS_ID)
        ids = tf.concat([pieces, tf.RaggedTensor.from_tensor(eos)], axis=1)
        ids = tf.cast(ids.to_tensor(default_value=PAD_ID), tf.int32)
        # An input with no pieces (empty, whitespace) gets no EOS either: nothing to translate.
        return ids * tf.cast(pieces.row_lengths() > 0, tf.int32)[:, None]

    @tf.function(input_signature=[tf.TensorSpec([None], tf.string)])
    def translate(self, inputs):
        """tf.string [batch] -> {"translations": tf.string [batch], "scores": float32 [batch]};
        scores are the best hypothesis' log-probability / length penalty, 0 for an empty
        input (translated to the empty string)."""
        source_ids = self.source_ids(inputs)
        result = beam_search(self.model, source_ids, beam_size=self.beam_size, alpha=self.alpha)
        has_input = tf.reduce_any(source_ids != PAD_ID, axis=1)
        translations = self.target_tokenizer.detokenize(result.ids[:, 0])
        return {"translations": tf.where(has_input, translations, ""),
                "scores": tf.where(has_input, result.scores[:, 0], 0.0)}


def translate_texts(translate: Callable[[tf.Tensor], Dict[str, tf.Tensor]],
                    texts: Sequence[str], batch_size: int = 64,
                    progress: Callable[[int], None] = None) -> List[str]:
    """Translates `texts` with `translate` (Translator.translate or a loaded SavedModel's
    signature) in batches of similar length, returning them in the input order."""
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
