"""Sweep: does XLA on the step body alone pay, with the growing cache of the exported search?

translate_xla (trainer/serving/xla.py) compiles a whole search on fixed shapes, and loses on
batches of more than 4 sentences (bench/sweeps/xla_batch_sizes.py). This compiles only the
step: the export's own search (keras_transformer.beam_search: a growing cache,
finished sentences leave the batch) over a step whose body (the decoder's step and the
log-softmax) `tf.function(jit_compile=True)` compiles for each shape it meets: rows (beams
of the sentences still searching), cache length and source width. Each export given
(--saved_model, repeatable: its weights, serving dtype and search) runs both steps on the
first --sentences test2016 sentences sorted by length, in batches of --batch_size:

  cold      seconds of the first pass: the trace, and for XLA a compile per new shape;
  warm      sentences/s, the best of --repeats passes once every shape is compiled (a
            bound: a server meets new shapes for as long as it runs);
  identical the compiled step's translations equal to the graph step's.

Not a test: run it by hand from the repository root,

  python bench/sweeps/xla_step.py --saved_model=saved_models/small_multi30k_float32 \\
      --saved_model=saved_models/small_multi30k_bfloat16
"""

import argparse
import sys
import time
from pathlib import Path

import tensorflow as tf

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # bench/, for common
import common  # noqa: E402


def compiled(step):
    """A search's step (keras_transformer.search.WrappedStep) whose call XLA compiles, once
    per shape; everything else is the wrapped step's."""
    from keras_transformer.search import WrappedStep

    class Compiled(WrappedStep):
        def around(self, inner):  # each variant of the inner step compiled on its own
            wrapper = super().around(inner)
            wrapper.call = tf.function(inner.__call__, jit_compile=True)
            return wrapper

        def __call__(self, seqs, i, state):
            return self.call(seqs, i, state)

    step = Compiled(step)
    step.call = tf.function(step.inner.__call__, jit_compile=True)
    return step


def translate_function(translator, compile_step: bool):
    """tf.string [batch] -> translations, with the export's search (its DecodeConfig)
    over the graph step or the compiled one."""
    import dataclasses
    from keras_transformer import beam_search
    best_only = dataclasses.replace(translator.decode, num_hypotheses=1)

    @tf.function(input_signature=[tf.TensorSpec([None], tf.string)], autograph=False)
    def translate(inputs):
        source_ids = translator.source_ids(inputs)
        step = translator.step(source_ids)
        result = beam_search(compiled(step) if compile_step else step, best_only)
        return translator.best(source_ids, result)["translations"]
    return translate


def measure(path, batches, repeats):
    """[(step, cold seconds, warm sentences/s, translations)] of one export."""
    from trainer.serving import saved_model
    export = common.Export(path)
    translator, _ = saved_model.build_translator(export.info["model_dir"], export.options)
    sentences = sum(map(len, batches))
    rows = []
    for name, compile_step in (("graph", False), ("XLA", True)):
        translate = translate_function(translator, compile_step)

        def run_all():
            return [t.decode("utf-8") for batch in batches
                    for t in translate(tf.constant(batch)).numpy()]
        start = time.perf_counter()
        outputs = run_all()
        cold = time.perf_counter() - start
        warm = sentences / common.best_seconds(run_all, repeats)
        rows.append((name, cold, warm, outputs))
        print(f"{path} {name}: cold {cold:.1f} s, warm {warm:.1f} sentences/s",
              file=sys.stderr, flush=True)
    return export, rows


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--saved_model", action="append", required=True)
    parser.add_argument("--src", default=str(common.MULTI30K / "test2016.en"))
    parser.add_argument("--sentences", type=int, default=256)
    parser.add_argument("--batch_size", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()

    texts = common.read_lines(args.src)
    texts = sorted(texts, key=lambda t: len(t.split()))[:args.sentences]
    batches = [texts[i:i + args.batch_size] for i in range(0, len(texts), args.batch_size)]
    table = []
    descriptions = []
    for path in args.saved_model:
        export, rows = measure(path, batches, args.repeats)
        descriptions.append(("export", export.describe()))
        graph = rows[0]
        for name, cold, warm, outputs in rows:
            table.append([path, name, f"{cold:.1f}", f"{warm:.1f}", f"{warm / graph[2]:.2f}x",
                          f"{sum(a == b for a, b in zip(outputs, graph[3]))}"])
    common.print_header([
        ("machine", f"{common.describe()}, load average {common.load_average()} at the end"),
        ("versions", common.versions()), *descriptions,
        ("data", f"the {len(texts)} shortest sentences of {args.src}, batches of "
                 f"{args.batch_size}"),
        ("command", common.command())])
    common.print_table(["export", "step body", "cold pass, s", "warm, sentences/s",
                        "x graph", f"identical of {len(texts)}"], table, text_columns=2,
                       title="The export's search over a graph step and an XLA-compiled one:")


if __name__ == "__main__":
    common.timed_main(main)
