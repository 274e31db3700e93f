"""python -m trainer.compare_exports --saved_model=A,B[,...] --sentences=FILE: which of these
SavedModel exports serves fastest on this machine.

Each export is timed as `trainer.export --serving_dtype=auto` times its candidates
(trainer/serving/dtype_choice.py): in a process of its own with two requests in flight of one
thread each and the oneDNN settings, on FILE's first --count sentences sorted by length in
batches of 64, one untimed pass and then --rounds passes each, the exports taking turns. The
first export is the reference of the agreement rule: an export whose translations equal its
translations on fewer than 80% of the sentences, or score below 80 sacreBLEU against them, is
marked dropped. Prints one row per export and the fastest kept.

This is the check of a serving host: the exports of one model in each serving dtype (the
float32 one first), copied to the host, compared there, say on 256 sentences of the
validation set's source side.
"""

import os

from absl import flags

from trainer import cli

FLAGS = flags.FLAGS
flags.DEFINE_list("saved_model", None, "SavedModel exports (version directories, or export "
                  "directories to use their highest version), comma-separated; the first "
                  "is the reference of the agreement rule.")
flags.DEFINE_string("sentences", None, "Source sentences, one per line.")
flags.DEFINE_integer("count", 256, "The file's first sentences that are timed (at most "
                     "1,000).")
flags.DEFINE_integer("rounds", 3, "Timed passes per export, the exports taking turns.")


def main(argv):
    del argv
    if not FLAGS.saved_model or not FLAGS.sentences:
        cli.fail("--saved_model and --sentences are required")
    if FLAGS.count < 1 or FLAGS.rounds < 1:
        cli.fail("--count and --rounds must be at least 1")
    from trainer.serving import dtype_choice, saved_model  # TensorFlow starts here
    try:
        paths = {}
        for path in FLAGS.saved_model:
            version = saved_model.resolve(path)
            dtype = saved_model.read_info(version).get("serving_dtype", "float32")
            paths[f"{dtype} ({os.path.normpath(version)})"] = version
        if len(paths) < len(FLAGS.saved_model):
            raise ValueError("--saved_model names the same version twice")
        texts = dtype_choice.timed_texts(FLAGS.sentences, FLAGS.count, "--sentences")
    except (FileNotFoundError, ValueError) as e:  # ExportError too
        cli.fail(str(e))
    print(f"timing {len(paths)} exports on {len(texts)} sentences of {FLAGS.sentences}, "
          f"{FLAGS.rounds} rounds, on {dtype_choice.host()}", flush=True)
    candidates = dtype_choice.measure(paths, texts, FLAGS.rounds)
    print(dtype_choice.table(candidates))
    print(f"fastest kept: {dtype_choice.choose(candidates).serving_dtype}")


if __name__ == "__main__":
    cli.run(main)
