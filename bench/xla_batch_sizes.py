"""From what batch size does translate_xla's XLA search stop paying? Its answer is the
signature's XLA_MAX_BATCH: larger requests run translate's search.

For each --batch_sizes B, the first --sentences test2016 sentences in requests of B, through
the two searches a translate_xla export holds, on the same weights (the model directory's,
`--average_last` as the export):

  translate's search      beam_search on a growing cache, finished sentences dropped
                          (serving_default, and translate_xla above XLA_MAX_BATCH);
  fixed shapes, XLA       Translator.fixed_shape_search: beam_search(fixed_shapes=True)
                          compiled by XLA (translate_xla up to XLA_MAX_BATCH).

Every request runs once untimed first (traces, and XLA's compile per batch size and width
bucket), then the best of --repeats passes is timed. Not a test: run it by hand from the
repository root,

  python bench/xla_batch_sizes.py --model_dir=runs/small_multi30k --average_last=5 [--threads=1]
"""

import argparse
import sys
import time
from pathlib import Path

import tensorflow as tf

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import machine  # noqa: E402
from trainer.serving import saved_model  # noqa: E402


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model_dir", required=True)
    parser.add_argument("--average_last", type=int, default=0)
    parser.add_argument("--src", default=str(machine.MULTI30K / "test2016.en"))
    parser.add_argument("--batch_sizes", default="1,2,4,8,16")
    parser.add_argument("--sentences", type=int, default=64)
    parser.add_argument("--threads", type=int, default=0, help="Intra- and inter-op threads "
                        "(0: TensorFlow's default, one per core).")
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args(argv)
    machine.set_threads(args.threads)
    with open(args.src, encoding="utf-8") as f:
        texts = f.read().splitlines()[:args.sentences]
    translator, _ = saved_model.build_translator(args.model_dir,
                                                 average_last=args.average_last)
    growing, xla = "translate's search", "fixed shapes, XLA"
    searches = {  # tf.string [batch] -> something to wait for
        growing: lambda texts: translator.translate(texts)["translations"],
        xla: tf.function(lambda texts: translator.fixed_shape_search(
            translator.source_ids(texts))[1].ids, reduce_retracing=True),
    }
    rates = {}  # (search, batch size) -> sentences/s
    for batch_size in map(int, args.batch_sizes.split(",")):
        requests = [tf.constant(texts[i:i + batch_size])
                    for i in range(0, len(texts), batch_size)]
        for name, search in searches.items():
            for request in requests:  # untimed: traces and compiles
                search(request).numpy()
            best = min(machine.seconds(lambda: [search(request).numpy()
                                                for request in requests])
                       for _ in range(args.repeats))
            rates[name, batch_size] = len(texts) / best
        print(f"batch {batch_size}: " + ", ".join(
            f"{name} {rates[name, batch_size]:.1f}" for name in searches), file=sys.stderr,
            flush=True)

    machine.print_run(args.threads)
    sizes = sorted({size for _, size in rates})
    print(f"| search, beam {translator.beam_size}, sentences/s over the first "
          f"{len(texts)} | " + " | ".join(f"batch {size}" for size in sizes) + " |")
    print("|---|" + "---:|" * len(sizes))
    for name in searches:
        print(f"| {name} | " + " | ".join(f"{rates[name, size]:.1f}" for size in sizes) + " |")
    print("| XLA / translate's | " + " | ".join(
        f"{rates[xla, size] / rates[growing, size]:.2f}x" for size in sizes) + " |")


if __name__ == "__main__":
    start = time.perf_counter()
    main()
    print(f"({time.perf_counter() - start:.0f} s)")
