"""Validation during training: the label-smoothed loss and token accuracy over the
validation split, and sacreBLEU, chrF and exact match of beam search on its sentences,
through the same graph the export serves (training's one arrow into serving: validation
BLEU is then the served model's BLEU). Written to `<model_dir>/eval` for TensorBoard."""

import os
from typing import Callable, Dict

import numpy as np
import tensorflow as tf

from keras_transformer import (DecodeConfig, Transformer, correct_tokens,
                               label_smoothed_cross_entropy)
from trainer import metrics
from trainer.data.input_pipeline import Data
from trainer.serving.client import translate_texts
from trainer.serving.translator import Translator


class Validator:
    """Validates one model; calling it with a step returns and records the metrics.

    Args:
      model: the Transformer being trained (any dtype policy).
      data: the run's data (validation batches, texts and tokenizers).
      model_dir: summaries go to <model_dir>/eval.
      decode: the search for BLEU, the export's.
      bleu_sentences: how many validation sentences to translate (0: all); None skips
        translation (loss and accuracy only).
      bleu_tokenize: sacreBLEU's tokenizer ("13a", or "char" for the builtin corpus).
      log: where the one-time line naming the BLEU signature goes.
    """

    def __init__(self, model: Transformer, data: Data, model_dir: str,
                 decode: DecodeConfig = DecodeConfig(), bleu_sentences=0,
                 bleu_tokenize: str = "13a",
                 log: Callable[[str], None] = print):
        self.model, self.data, self.log = model, data, log
        # One trace for every batch shape.
        (source, target_input), target_output = data.eval_dataset().element_spec
        self.batch_sums = tf.function(self._batch_sums, autograph=False, input_signature=[
            tf.TensorSpec([None, None], spec.dtype)
            for spec in (source, target_input, target_output)])
        self.writer = tf.summary.create_file_writer(os.path.join(model_dir, "eval"))
        self.translator = None
        if bleu_sentences is not None:
            sources, references = data.eval_texts()
            if bleu_sentences:
                sources, references = sources[:bleu_sentences], references[:bleu_sentences]
            self.sources, self.references = list(sources), list(references)
            self.translator = Translator(model, data.tokenizers, decode)
            self.bleu_tokenize = bleu_tokenize
            self.signature = None

    def _batch_sums(self, source_ids, target_input_ids, target_output_ids):
        """float32 [3]: one batch's summed loss, target tokens and correct tokens (one
        graph per batch, the loss included: no eager ops over [batch, length, vocab])."""
        logits, packing = self.model.packed_logits((source_ids, target_input_ids),
                                                   training=False)
        target_output_ids = packing.pack(target_output_ids)  # [tokens]
        loss, tokens = label_smoothed_cross_entropy(target_output_ids, logits,
                                                    self.model.config.label_smoothing)
        return tf.stack([loss, tokens, correct_tokens(target_output_ids, logits)])

    def validation_loss(self) -> Dict[str, float]:
        """Label-smoothed loss and token accuracy over one pass of the validation split."""
        loss_sum, tokens, correct = np.sum(
            [self.batch_sums(source_ids, target_input_ids, target_output_ids).numpy()
             for (source_ids, target_input_ids), target_output_ids in self.data.eval_dataset()]
            or np.zeros([1, 3]), axis=0, dtype=np.float64)
        return {"loss": float(loss_sum / max(tokens, 1.0)),
                "token_accuracy": float(correct / max(tokens, 1.0))}

    def translation_scores(self) -> Dict[str, float]:
        """BLEU, chrF and exact match of beam search on the validation sentences."""
        hypotheses = translate_texts(self.translator.translate, self.sources)
        scores = metrics.corpus_scores(hypotheses, self.references, tokenize=self.bleu_tokenize)
        if self.signature is None:
            self.signature = str(scores["bleu"][1])
            self.log(f"validation BLEU: sacreBLEU {self.signature} on {len(self.sources)} "
                     "sentences")
        return {"bleu": scores["bleu"][0].score, "chrf": scores["chrf"][0].score,
                "exact_match": scores["exact_match"][0]}

    def __call__(self, step: int) -> Dict[str, float]:
        metrics = self.validation_loss()
        if self.translator is not None:
            metrics.update(self.translation_scores())
        with self.writer.as_default(step=step):
            for name, value in metrics.items():
                tf.summary.scalar(name, value)
        self.writer.flush()
        return metrics
