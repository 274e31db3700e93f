"""python -m trainer.evaluate --saved_model=DIR --src=test.en --ref=test.de [--tok_ref=...]:
translate a test set with an exported model and score it.

Prints
  - sacreBLEU on detokenized, cased output against the raw references (13a tokenization,
    the comparable number), with its signature;
  - chrF (sacreBLEU's chrF2), with its signature;
  - with --tok_ref: the tokenized, lowercased BLEU that Multi30k papers report (the output
    lowercased, punctuation-normalised and Moses-tokenized as the official Multi30k files
    were, scored like multi-bleu.perl against e.g. tok/test2016.lc.norm.tok.de).
"""

from absl import flags

from trainer import cli

FLAGS = flags.FLAGS
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
    del argv
    for name in ("saved_model", "src", "ref"):
        if not FLAGS[name].value:
            cli.fail(f"--{name} is required")
    try:
        sources, references = cli.read_text(FLAGS.src), cli.read_text(FLAGS.ref)
        tokenized = cli.read_text(FLAGS.tok_ref) if FLAGS.tok_ref else None
    except OSError as e:
        cli.fail(str(e))
    for name, lines in (("ref", references), ("tok_ref", tokenized)):
        if lines is not None and len(lines) != len(sources):
            cli.fail(f"--{name} has {len(lines)} lines but --src has {len(sources)}")

    from trainer.serving import client, saved_model
    from trainer import metrics
    try:
        model = saved_model.load(FLAGS.saved_model)
    except (FileNotFoundError, OSError, saved_model.ExportError) as e:
        cli.fail(str(e))
    hypotheses = client.translate_lines(model, sources, FLAGS.batch_size,
                                        progress=cli.TranslationProgress(len(sources)))
    if FLAGS.output:
        with open(FLAGS.output, "w", encoding="utf-8") as f:
            f.writelines(h + "\n" for h in hypotheses)

    scores = metrics.corpus_scores(hypotheses, references, tokenized_references=tokenized,
                                lang=FLAGS.lang)
    print(f"sacreBLEU (detokenized, cased) {scores['bleu'][0]}")
    print(f"  signature {scores['bleu'][1]}")
    print(f"chrF {scores['chrf'][0]}")
    print(f"  signature {scores['chrf'][1]}")
    if "tok_bleu" in scores:
        print(f"tokenized lowercased BLEU (Moses {FLAGS.lang}, multi-bleu.perl) "
              f"{scores['tok_bleu'][0]}")


if __name__ == "__main__":
    cli.run(main)
