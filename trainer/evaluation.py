"""Validation metrics from translations: sacreBLEU on detokenized, cased output, chrF and
exact match."""

from typing import Dict

import sacrebleu

from keras_transformer import Transformer
from trainer.input_pipeline import Data
from trainer.translator import Translator, translate_texts


class BleuEvaluator:
    """Translates (the first `max_sentences` of) the validation split with beam search and
    scores it against the references.

    Args:
      data: the run's data (validation texts and tokenizers).
      beam_size, alpha: beam search settings.
      max_sentences: how many validation sentences to translate (0: all).
      tokenize: sacreBLEU tokenizer: "13a" (standard) or "char", for targets of one to
        three words like the builtin corpus' German compounds, which have no word 4-grams.
    """

    def __init__(self, data: Data, beam_size: int = 4, alpha: float = 0.6,
                 max_sentences: int = 0, tokenize: str = "13a"):
        sources, references = data.eval_texts()
        if max_sentences:
            sources, references = sources[:max_sentences], references[:max_sentences]
        self.sources, self.references = list(sources), list(references)
        self.tokenizers, self.beam_size, self.alpha = data.tokenizers, beam_size, alpha
        self.bleu = sacrebleu.BLEU(tokenize=tokenize)
        self.chrf = sacrebleu.CHRF()
        self._translators = {}
        self.signature = None

    def __call__(self, model: Transformer) -> Dict[str, float]:
        if id(model) not in self._translators:  # one trace per model, not per evaluation
            self._translators[id(model)] = Translator(model, self.tokenizers, self.beam_size,
                                                      self.alpha)
        hypotheses = translate_texts(self._translators[id(model)].translate, self.sources)
        exact = sum(h == r for h, r in zip(hypotheses, self.references))
        bleu = self.bleu.corpus_score(hypotheses, [self.references]).score
        if self.signature is None:
            self.signature = str(self.bleu.get_signature())
            print(f"validation BLEU: sacreBLEU {self.signature} on {len(self.sources)} "
                  "sentences", flush=True)
        return {"bleu": bleu,
                "chrf": self.chrf.corpus_score(hypotheses, [self.references]).score,
                "exact_match": exact / max(len(self.references), 1)}
