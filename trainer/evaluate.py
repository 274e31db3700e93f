"""python -m trainer.evaluate --saved_model=DIR --src=test.en --ref=test.de [--tok_ref=...]:
translate a test set with an exported model and score it.

Prints
  - sacreBLEU on detokenized, cased output against the raw references (13a tokenization,
    the comparable number), with its signature;
  - chrF (sacreBLEU's chrF2), with its signature;
  - with --tok_ref: the tokenized, lowercased BLEU that Multi30k papers report: the output is
    lowercased, punctuation-normalised and tokenized as the official Multi30k files were
    (Moses lowercase.perl | normalize-punctuation.perl | tokenizer.perl, via sacremoses) and
    scored like multi-bleu.perl (no further tokenization, no smoothing) against the given
    pre-tokenized references (e.g. tok/test2016.lc.norm.tok.de).
"""

import sys
from typing import Dict, Sequence

from absl import app, flags

FLAGS = flags.FLAGS


def read_text(path: str) -> list:
    """Lines of a UTF-8 file (invalid bytes replaced), without line ends."""
    with open(path, "rb") as f:
        return f.read().decode("utf-8", errors="replace").splitlines()


def moses_tokenized(texts: Sequence[str], lang: str) -> list:
    """Lowercased, punctuation-normalised, Moses-tokenized texts (with Moses' HTML
    escaping, as in the official Multi30k tok/ files)."""
    from sacremoses import MosesPunctNormalizer, MosesTokenizer
    normalizer, tokenizer = MosesPunctNormalizer(lang=lang), MosesTokenizer(lang=lang)
    return [tokenizer.tokenize(normalizer.normalize(text.lower()), escape=True,
                               return_str=True) for text in texts]


def scores(hypotheses: Sequence[str], references: Sequence[str],
           tokenized_references: Sequence[str] = None, lang: str = "de") -> Dict[str, tuple]:
    """{"bleu": (BLEUScore, signature), "chrf": (CHRFScore, signature)[, "tok_bleu": ...]}."""
    import sacrebleu
    bleu, chrf = sacrebleu.BLEU(), sacrebleu.CHRF()
    out = {"bleu": (bleu.corpus_score(hypotheses, [references]), bleu.get_signature()),
           "chrf": (chrf.corpus_score(hypotheses, [references]), chrf.get_signature())}
    if tokenized_references is not None:
        tok_bleu = sacrebleu.BLEU(tokenize="none", smooth_method="none", force=True)
        out["tok_bleu"] = (tok_bleu.corpus_score(moses_tokenized(hypotheses, lang),
                                                 [list(tokenized_references)]),
                           tok_bleu.get_signature())
    return out


def _define_flags():
    # Only when run as a program, so that other programs can import this module.
    flags.DEFINE_string("saved_model", None, "SavedModel of python -m trainer.export (a version "
                        "directory, or the export directory to use its highest version).")
    flags.DEFINE_string("src", None, "Source sentences, one per line.")
    flags.DEFINE_string("ref", None, "Reference translations (raw, cased), line-aligned.")
    flags.DEFINE_string("tok_ref", None, "Lowercased, Moses-tokenized references for the "
                        "tokenized BLEU of Multi30k papers.")
    flags.DEFINE_string("lang", "de", "Target language, for the Moses normaliser and tokenizer.")
    flags.DEFINE_string("output", None, "Also write the translations here.")
    flags.DEFINE_integer("batch_size", 64, "Sentences per call.")


def main(argv):
    if len(argv) > 1:
        _fail(f"unexpected arguments {argv[1:]}")
    for name in ("saved_model", "src", "ref"):
        if not getattr(FLAGS, name):
            _fail(f"--{name} is required")
    try:
        sources, references = read_text(FLAGS.src), read_text(FLAGS.ref)
        tokenized = read_text(FLAGS.tok_ref) if FLAGS.tok_ref else None
    except OSError as e:
        _fail(str(e))
    for name, lines in (("ref", references), ("tok_ref", tokenized)):
        if lines is not None and len(lines) != len(sources):
            _fail(f"--{name} has {len(lines)} lines but --src has {len(sources)}")

    from trainer import translate
    try:
        model = translate.load(FLAGS.saved_model)
    except (FileNotFoundError, OSError) as e:
        _fail(str(e))
    hypotheses = translate.translate_lines(model, sources, FLAGS.batch_size,
                                           progress=translate.Progress(len(sources)))
    if FLAGS.output:
        with open(FLAGS.output, "w", encoding="utf-8") as f:
            f.writelines(h + "\n" for h in hypotheses)

    results = scores(hypotheses, references, tokenized, FLAGS.lang)
    bleu, signature = results["bleu"]
    print(f"sacreBLEU (detokenized, cased) {bleu}")
    print(f"  signature {signature}")
    chrf, signature = results["chrf"]
    print(f"chrF {chrf}")
    print(f"  signature {signature}")
    if "tok_bleu" in results:
        tok_bleu, _ = results["tok_bleu"]
        print(f"tokenized lowercased BLEU (Moses {FLAGS.lang}, multi-bleu.perl) {tok_bleu}")


def _fail(message: str):
    print(f"trainer.evaluate: error: {message}", file=sys.stderr)
    sys.exit(2)


if __name__ == "__main__":
    _define_flags()
    app.run(main)
