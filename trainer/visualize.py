"""python -m trainer.visualize --saved_model=DIR --text "..." --out=DIR: attention heatmaps.

One PNG per layer for encoder self-attention and for encoder-decoder attention, one heatmap
per head, drawn from the SavedModel's `attention` signature alone
(trainer/serving/attention_maps.py).
"""

from absl import flags

from trainer import cli

FLAGS = flags.FLAGS
flags.DEFINE_string("saved_model", None, "SavedModel of python -m trainer.export (a version "
                    "directory, or the export directory to use its highest version).")
flags.DEFINE_string("text", None, "The source sentence to translate and draw.")
flags.DEFINE_string("out", None, "Directory for the PNG files.")


def main(argv):
    del argv
    for name in ("saved_model", "text", "out"):
        if FLAGS[name].value is None:
            cli.fail(f"--{name} is required")
    if not FLAGS.text.strip():
        cli.fail("--text is empty: nothing to translate")
    from trainer.serving import attention_maps, saved_model
    try:
        model = saved_model.load(FLAGS.saved_model)
    except (FileNotFoundError, OSError, saved_model.ExportError) as e:
        cli.fail(str(e))
    maps = attention_maps.attention_maps(model, FLAGS.text)
    if not maps["source_pieces"]:
        cli.fail("--text has nothing to translate (no subwords)")
    print(f"translation: {maps['translation']}")
    for path in attention_maps.write_heatmaps(maps, FLAGS.out):
        print(path)


if __name__ == "__main__":
    cli.run(main)
