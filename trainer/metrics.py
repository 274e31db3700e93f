"""Corpus scores of translations: sacreBLEU on detokenized, cased text (the comparable
number), chrF, exact match, and the tokenized, lowercased BLEU that Multi30k papers report.
Validation during training and `python -m trainer.evaluate` both score here.
"""

from typing import Dict, Optional, Sequence

import sacrebleu


def moses_tokenized(texts: Sequence[str], lang: str) -> list:
    """Lowercased, punctuation-normalised, Moses-tokenized texts (with Moses' HTML
    escaping, as in the official Multi30k tok/ files: lowercase.perl |
    normalize-punctuation.perl | tokenizer.perl, via sacremoses)."""
    from sacremoses import MosesPunctNormalizer, MosesTokenizer
    normalizer, tokenizer = MosesPunctNormalizer(lang=lang), MosesTokenizer(lang=lang)
    return [tokenizer.tokenize(normalizer.normalize(text.lower()), escape=True,
                               return_str=True) for text in texts]


def corpus_scores(hypotheses: Sequence[str], references: Sequence[str], tokenize: str = "13a",
                  tokenized_references: Optional[Sequence[str]] = None,
                  lang: str = "de") -> Dict[str, tuple]:
    """Scores of `hypotheses` against one reference each.

    Args:
      hypotheses, references: detokenized text, aligned.
      tokenize: sacreBLEU's tokenizer: "13a" (standard) or "char", for targets of one to
        three words like the builtin corpus' German compounds, which have no word 4-grams.
      tokenized_references: with these (lowercased, Moses-tokenized, e.g.
        tok/test2016.lc.norm.tok.de), also the BLEU of multi-bleu.perl on `moses_tokenized`
        hypotheses: no further tokenization, no smoothing.
      lang: the target language, for the Moses normaliser and tokenizer.
    Returns:
      {"bleu": (BLEUScore, signature), "chrf": (CHRFScore, signature), "exact_match":
      (fraction, None)[, "tok_bleu": (BLEUScore, signature)]}.
    """
    bleu, chrf = sacrebleu.BLEU(tokenize=tokenize), sacrebleu.CHRF()
    exact = sum(h == r for h, r in zip(hypotheses, references)) / max(len(references), 1)
    out = {"bleu": (bleu.corpus_score(hypotheses, [references]), bleu.get_signature()),
           "chrf": (chrf.corpus_score(hypotheses, [references]), chrf.get_signature()),
           "exact_match": (exact, None)}
    if tokenized_references is not None:
        tok_bleu = sacrebleu.BLEU(tokenize="none", smooth_method="none", force=True)
        out["tok_bleu"] = (tok_bleu.corpus_score(moses_tokenized(hypotheses, lang),
                                                 [list(tokenized_references)]),
                           tok_bleu.get_signature())
    return out
