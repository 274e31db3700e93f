"""Sweep: which stopping rule and length penalty should a model directory search with?

On --src/--ref (Multi30k's val by default: choose there, report test2016 once after), the
model directory's weights (the export's: --saved_model names the export, whose model
directory, weights and beam size are used in-process) are searched with every stopping rule
(exact, transformers, first) x length penalty (gnmt, average) x --alphas, each in
length-sorted batches of --batch_size, over a step that counts its rows:

  sacreBLEU, tokenized BLEU   of the outputs (tokenized: Multi30k's, against --tok_ref)
  row-steps                   rows a step computed, summed over the run: the search's work
  steps / sentence            row-steps / beam / sentences
  = exact                     outputs equal to the exact rule's at the same penalty and alpha

and, per rule, the best alpha of each penalty. The choice the issue asks for (docs/
multi30k.md, "The search"): the cheapest rule by row-steps whose best sacreBLEU stays within
0.1 of the exact rule's best. Not a test: run it by hand from the repository root,

  python bench/sweeps/search_rules.py --saved_model=saved_models/small_multi30k
"""

import argparse
import dataclasses
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # bench/, for common
import common  # noqa: E402
from peers import decoding_runners  # noqa: E402


def parse_args():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--saved_model", required=True, help="an export: its model directory, "
                        "weights and beam size are used in-process")
    parser.add_argument("--src", default=str(common.MULTI30K / "val.en"))
    parser.add_argument("--ref", default=str(common.MULTI30K / "val.de"))
    parser.add_argument("--tok_ref", default=str(common.MULTI30K / "tok" /
                                                 "val.lc.norm.tok.de"))
    parser.add_argument("--alphas", default="0.6,1.0,1.4,1.8")
    parser.add_argument("--batch_size", type=int, default=64)
    return parser.parse_args()


class Searches:
    """The model directory's search over --src in length-sorted batches, with any
    DecodeConfig of its beam size, counting the rows every step computes."""

    def __init__(self, translator, texts, batch_size):
        import tensorflow as tf
        from keras_transformer import beam_search
        self.translator, self.texts = translator, texts
        order = sorted(range(len(texts)), key=lambda i: len(texts[i].split()))
        self.batches = [order[i:i + batch_size] for i in range(0, len(order), batch_size)]
        self.counts = decoding_runners.counters()
        self.functions = {}
        self.beam_search, self.tf = beam_search, tf

    def function(self, length_penalty):
        """A traced search per penalty form; alpha and the rule are scalar tensors."""
        tf, translator = self.tf, self.translator
        if length_penalty not in self.functions:
            @tf.function(input_signature=[tf.TensorSpec([None], tf.string),
                                          tf.TensorSpec([], tf.float32),
                                          tf.TensorSpec([], tf.string)], autograph=False)
            def search(inputs, alpha, stopping):
                decode = dataclasses.replace(translator.decode, alpha=alpha, num_hypotheses=1,
                                             length_penalty=length_penalty, stopping=stopping)
                source_ids = translator.source_ids(inputs)
                step = decoding_runners.counting_step(translator.step(source_ids), self.counts)
                return translator.best(source_ids, self.beam_search(step, decode))
            self.functions[length_penalty] = search
        return self.functions[length_penalty]

    def run(self, stopping, length_penalty, alpha):
        """(translations in --src's order, row-steps)."""
        tf = self.tf
        for counter in self.counts.values():
            counter.assign(0)
        search, outputs = self.function(length_penalty), [None] * len(self.texts)
        for batch in self.batches:
            found = search(tf.constant([self.texts[i] for i in batch]), tf.constant(alpha),
                           tf.constant(stopping))["translations"].numpy()
            for i, text in zip(batch, found):
                outputs[i] = text.decode("utf-8")
        return outputs, int(self.counts["rows"].numpy())


def main():
    args = parse_args()
    from keras_transformer.config import LENGTH_PENALTIES, STOPPING_RULES
    from trainer import metrics
    from trainer.serving import saved_model
    export = common.Export(args.saved_model)
    translator, _ = saved_model.build_translator(export.info["model_dir"], export.options)
    texts, references = common.read_lines(args.src), common.read_lines(args.ref)
    tokenized = common.read_lines(args.tok_ref) if Path(args.tok_ref).exists() else None
    searches, beam = Searches(translator, texts, args.batch_size), translator.decode.beam_size
    results = {}  # (stopping, penalty, alpha) -> (sacreBLEU, tokenized BLEU, row-steps, outputs)
    for length_penalty in LENGTH_PENALTIES:
        for alpha in map(float, args.alphas.split(",")):
            for stopping in STOPPING_RULES:
                outputs, row_steps = searches.run(stopping, length_penalty, alpha)
                scores = metrics.corpus_scores(outputs, references,
                                               tokenized_references=tokenized)
                results[stopping, length_penalty, alpha] = (
                    scores["bleu"][0].score,
                    scores["tok_bleu"][0].score if tokenized else float("nan"),
                    row_steps, outputs)
                print(f"{stopping} {length_penalty} {alpha}: "
                      f"{results[stopping, length_penalty, alpha][:3]}", file=sys.stderr,
                      flush=True)
    print_results(args, export, texts, beam, results)


def print_results(args, export, texts, beam, results):
    common.print_header([("machine", common.describe()), ("export", export.describe()),
                         ("data", f"{args.src} ({len(texts)} sentences), batches of "
                                  f"{args.batch_size} sorted by length"),
                         ("command", common.command())])
    rows = []
    for (stopping, penalty, alpha), (bleu, tok_bleu, row_steps, outputs) in results.items():
        exact = results["exact", penalty, alpha][3]
        rows.append([stopping, penalty, f"{alpha:g}", f"{bleu:.2f}", f"{tok_bleu:.2f}",
                     f"{row_steps:,}", f"{row_steps / beam / len(texts):.1f}",
                     f"{sum(a == b for a, b in zip(outputs, exact))}"])
    common.print_table(["stopping", "length penalty", "alpha", "sacreBLEU", "tokenized BLEU",
                        "row-steps", "steps / sentence", f"= exact (of {len(texts)})"],
                       rows, text_columns=2,
                       title=f"Each rule and length penalty on {args.src}, beam {beam}:")
    best = {}
    for (stopping, penalty, alpha), (bleu, _, row_steps, _) in results.items():
        if (stopping, penalty) not in best or bleu > best[stopping, penalty][1]:
            best[stopping, penalty] = (alpha, bleu, row_steps)
    top = max(bleu for (stopping, _), (_, bleu, _) in best.items() if stopping == "exact")
    common.print_table(
        ["stopping", "length penalty", "best alpha", "sacreBLEU", "from exact's best",
         "row-steps"],
        [[stopping, penalty, f"{alpha:g}", f"{bleu:.2f}", f"{bleu - top:+.2f}",
          f"{row_steps:,}"] for (stopping, penalty), (alpha, bleu, row_steps) in best.items()],
        text_columns=2, title="Each rule's best alpha (by sacreBLEU), per length penalty:")
    within = [(row_steps, stopping, penalty, alpha)
              for (stopping, penalty), (alpha, bleu, row_steps) in best.items()
              if bleu >= top - 0.1]
    row_steps, stopping, penalty, alpha = min(within)
    print(f"The cheapest within 0.1 of the exact rule's best ({top:.2f}): stopping={stopping} "
          f"--length_penalty={penalty} --alpha={alpha:g} ({row_steps:,} row-steps).\n")


if __name__ == "__main__":
    main()
