"""Sweep: which vocabulary shortlist (trainer.export --shortlist) keeps the translations?

The shortlist is made from --train_src/--train_tgt (Multi30k's train) with the model
directory's tokenizers, for each K (--frequent: the most frequent target pieces) and M
(--per_source: target pieces listed per source piece). On --src/--ref (val by default,
where K and M are chosen; test2016 to report), for each (K, M):

  coverage      the share of the references' target pieces (EOS included) that are
                candidates: of their own sentence's list (a request of one), and of their
                batch's (--batch_size sentences sorted by length, as trainer.translate
                sends a file)
  candidates    the mean number of candidates per batch, and per sentence
  sacreBLEU     of the beam search over the candidates, in-process on the export's
                weights and search, and its change from the full vocabulary's
  identical     the outputs equal to the full vocabulary's

Speed is bench/decoding.py's (--saved_model_shortlist, --vmap). Not a test: run it by hand
from the repository root,

  python bench/sweeps/shortlist.py --saved_model=saved_models/small_multi30k_float32
"""

import argparse
import dataclasses
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # bench/, for common
import common  # noqa: E402


def coverage(shortlist, sources, references, batches):
    """(per-sentence coverage, per-batch coverage, mean candidates per sentence, per
    batch): sources and references are id lists (references with EOS), batches lists of
    sentence indices."""
    from keras_transformer.shortlist import SPECIAL_IDS
    always = set(range(SPECIAL_IDS)) | set(shortlist.frequent.tolist())

    def candidates(indices):
        listed = shortlist.by_source[[s for i in indices for s in sources[i]]].ravel()
        return always | set(listed.tolist())

    def covered(sentence_sets):
        hits = total = 0
        for indices, allowed in sentence_sets:
            for i in indices:
                hits += sum(t in allowed for t in references[i])
                total += len(references[i])
        return hits / total

    singles = [([i], candidates([i])) for i in range(len(sources))]
    grouped = [(b, candidates(b)) for b in batches]
    return (covered(singles), covered(grouped), np.mean([len(c) for _, c in singles]),
            np.mean([len(c) for _, c in grouped]))


def parse_args():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--saved_model", required=True, help="a float32 export: its model "
                        "directory, weights and search are used in-process")
    parser.add_argument("--train_src", default=str(common.MULTI30K / "train.en.gz"))
    parser.add_argument("--train_tgt", default=str(common.MULTI30K / "train.de.gz"))
    parser.add_argument("--src", default=str(common.MULTI30K / "val.en"))
    parser.add_argument("--ref", default=str(common.MULTI30K / "val.de"))
    parser.add_argument("--frequent", default="0,50,100,200,500")
    parser.add_argument("--per_source", default="5,10,20,50")
    parser.add_argument("--batch_size", type=int, default=64)
    return parser.parse_args()


class Translations:
    """The export's beam search over --src (in batches of --batch_size sorted by length),
    in-process, over a shortlist's candidates or the whole vocabulary."""

    def __init__(self, translator, texts, batch_size):
        import tensorflow as tf
        from keras_transformer import TransformerStep, beam_search
        from keras_transformer.shortlist import Shortlist
        self.texts = texts
        order = sorted(range(len(texts)), key=lambda i: len(texts[i].split()))
        self.batches = [order[i:i + batch_size] for i in range(0, len(order), batch_size)]
        vocab_size = translator.model.config.vocab_size
        best_only = dataclasses.replace(translator.decode, num_hypotheses=1)

        def search(inputs, shortlist):
            source_ids = translator.source_ids(inputs)
            step = TransformerStep(translator.model, source_ids, weights=translator.step_weights,
                                   shortlist=shortlist)
            result = beam_search(step, best_only)
            return translator.best(source_ids, result)["translations"]

        # Two traces: the signature's shapes are unknown, so the trace cannot tell an empty
        # shortlist (the whole vocabulary) from another.
        texts_spec = tf.TensorSpec([None], tf.string)
        self.whole = tf.function(lambda inputs: search(inputs, None),
                                 input_signature=[texts_spec], autograph=False)
        self.shortlisted = tf.function(
            lambda inputs, frequent, by_source: search(
                inputs, Shortlist(frequent, by_source, vocab_size)),
            input_signature=[texts_spec, tf.TensorSpec([None], tf.int32),
                             tf.TensorSpec([None, None], tf.int32)], autograph=False)

    def of(self, frequent, by_source):
        """The translations of --src, in its order, over the shortlist (frequent,
        by_source); by_source with no rows: the whole vocabulary."""
        import tensorflow as tf
        outputs = [None] * len(self.texts)
        for batch in self.batches:
            inputs = tf.constant([self.texts[i] for i in batch])
            found = (self.whole(inputs) if len(by_source) == 0 else
                     self.shortlisted(inputs, frequent, by_source)).numpy()
            for i, text in zip(batch, found):
                outputs[i] = text.decode("utf-8")
        return outputs


def main():
    args = parse_args()
    common.require(["sacrebleu"], "this sweep")

    import sacrebleu
    from keras_transformer import EOS_ID
    from keras_transformer.shortlist import Shortlist
    from trainer.data.tokenizer import Tokenizers
    from trainer.serving import saved_model
    from trainer.serving.shortlist import read_pairs

    export = common.Export(args.saved_model)
    translator, _ = saved_model.build_translator(export.info["model_dir"], export.options)
    config = translator.model.config
    tokenizers = Tokenizers(translator.source_tokenizer, translator.target_tokenizer)
    train = read_pairs(args.train_src, args.train_tgt, tokenizers)
    texts, references = common.read_lines(args.src), common.read_lines(args.ref)
    sources, reference_ids = read_pairs(args.src, args.ref, tokenizers)
    reference_ids = [ids + [EOS_ID] for ids in reference_ids]
    translations = Translations(translator, texts, args.batch_size)

    full = translations.of(np.arange(config.vocab_size, dtype=np.int32),
                           np.full([0, 1], EOS_ID, np.int32))
    full_bleu = sacrebleu.corpus_bleu(full, [references]).score
    rows = [["full vocabulary", "", "100.0%", "100.0%", f"{config.vocab_size}",
             f"{config.vocab_size}", f"{full_bleu:.2f}", "", f"{len(full)}"]]
    for k in map(int, args.frequent.split(",")):
        for m in map(int, args.per_source.split(",")):
            shortlist = Shortlist.from_corpus(*train, config.input_vocab_size,
                                              config.vocab_size, k, m)
            single, batched, per_sentence, per_batch = coverage(
                shortlist, sources, reference_ids, translations.batches)
            outputs = translations.of(shortlist.frequent, shortlist.by_source)
            bleu = sacrebleu.corpus_bleu(outputs, [references]).score
            rows.append([k, m, f"{100 * single:.1f}%", f"{100 * batched:.1f}%",
                         f"{per_sentence:.0f}", f"{per_batch:.0f}", f"{bleu:.2f}",
                         f"{bleu - full_bleu:+.2f}",
                         f"{sum(a == b for a, b in zip(outputs, full))}"])
            print(rows[-1], file=sys.stderr)
    print_results(args, export, train, texts, rows)


def print_results(args, export, train, texts, rows):
    common.print_header([("machine", common.describe()), ("export", export.describe()),
                         ("train", f"{args.train_src}, {args.train_tgt} "
                                   f"({len(train[0])} pairs)"),
                         ("data", f"{args.src} ({len(texts)} sentences), batches of "
                                  f"{args.batch_size} sorted by length"),
                         ("command", common.command())])
    common.print_table(["K (frequent)", "M (per source)", "coverage, sentence",
                        f"coverage, batch of {args.batch_size}", "candidates / sentence",
                        "candidates / batch", "sacreBLEU", "change",
                        f"identical of {len(texts)}"], rows, text_columns=1,
                       title="A shortlist's coverage of the references and its translations:")


if __name__ == "__main__":
    main()
