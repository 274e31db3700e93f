"""Sweep: from what batch size does translate_xla's XLA search stop paying? Its answer is
trainer.serving.xla.MAX_BATCH: larger requests run translate's search.

For each --batch_sizes B, the first --sentences test2016 sentences in requests of B, through
the two searches a translate_xla export holds, on the same weights (the model directory's,
--export_weights / --average_last as the export):

  translate's search      beam_search on a growing cache, finished sentences dropped
                          (serving_default, and translate_xla above MAX_BATCH);
  fixed shapes, XLA       XlaRoute.fixed_shape_search: beam_search(fixed_shapes=True)
                          compiled by XLA (translate_xla up to MAX_BATCH).

Every request runs once untimed first (traces, and XLA's compile per batch size and width
bucket), then the best of --repeats passes is timed. Not a test: run it by hand from the
repository root,

  python bench/sweeps/xla_batch_sizes.py --model_dir=runs/small_multi30k --average_last=5 \\
      [--threads=1]
"""

import argparse
import sys
from pathlib import Path

import tensorflow as tf

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # bench/, for common
import common  # noqa: E402
from trainer.model_dir.weights import KINDS, WeightsChoice  # noqa: E402
from trainer.serving import saved_model, xla  # noqa: E402

GROWING, FIXED = "translate's search", "fixed shapes, XLA"


def measure(args, texts):
    """({(search, batch size): sentences/s}, the Translator)."""
    options = saved_model.Options(weights=WeightsChoice(args.export_weights, args.average_last))
    translator, _ = saved_model.build_translator(args.model_dir, options)
    route = xla.XlaRoute(translator)
    searches = {  # tf.string [batch] -> something to wait for
        GROWING: lambda texts: translator.translate(texts)["translations"],
        FIXED: tf.function(lambda texts: route.fixed_shape_search(
            translator.source_ids(texts))[1].ids, reduce_retracing=True),
    }
    rates = {}
    for batch_size in map(int, args.batch_sizes.split(",")):
        requests = [tf.constant(texts[i:i + batch_size])
                    for i in range(0, len(texts), batch_size)]
        for name, search in searches.items():
            for request in requests:  # untimed: traces and compiles
                search(request).numpy()
            best = common.best_seconds(
                lambda: [search(request).numpy() for request in requests], args.repeats)
            rates[name, batch_size] = len(texts) / best
        print(f"batch {batch_size}: " + ", ".join(
            f"{name} {rates[name, batch_size]:.1f}" for name in searches), file=sys.stderr,
            flush=True)
    return rates, translator


def print_report(args, rates, translator, sentences: int):
    common.print_header([
        ("machine", f"{common.describe()}, load average {common.load_average()} at the end"),
        ("versions", common.versions()),
        ("threads", args.threads or "default"),
        ("command", common.command()),
    ])
    sizes = sorted({size for _, size in rates})
    common.print_table(
        [f"search, beam {translator.decode.beam_size}, sentences/s over the first "
         f"{sentences}", *(f"batch {size}" for size in sizes)],
        [[name, *(f"{rates[name, size]:.1f}" for size in sizes)] for name in (GROWING, FIXED)]
        + [["XLA / translate's", *(f"{rates[FIXED, size] / rates[GROWING, size]:.2f}x"
                                   for size in sizes)]])


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model_dir", required=True)
    parser.add_argument("--export_weights", choices=KINDS, default=None)
    parser.add_argument("--average_last", type=int, default=0)
    parser.add_argument("--src", default=str(common.MULTI30K / "test2016.en"))
    parser.add_argument("--batch_sizes", default="1,2,4,8,16")
    parser.add_argument("--sentences", type=int, default=64)
    parser.add_argument("--threads", type=int, default=0, help="Intra- and inter-op threads "
                        "(0: TensorFlow's default, one per core).")
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args(argv)
    common.set_threads(args.threads)
    texts = common.read_lines(args.src, args.sentences)
    rates, translator = measure(args, texts)
    print_report(args, rates, translator, len(texts))


if __name__ == "__main__":
    common.timed_main(main)
