"""python -m trainer.convert --from=marian --input=DIR --model_dir=OUT: a pretrained model
of another toolkit as a model directory of this project.

--from=marian reads a Hugging Face Marian checkpoint as downloaded, e.g. one of the
OPUS-MT models (config.json, model.safetensors, source.spm, target.spm, vocab.json):
trainer/conversion/marian.py says what maps to what. OUT is then an ordinary model
directory: `trainer.export` (SavedModel or CTranslate2), `trainer.translate`,
`trainer.evaluate`, `trainer.visualize` and `trainer.task --init_from=OUT` take it as they
take a trained one. docs/pretrained.md has the whole path, from the download to serving
and fine-tuning. The formats are listed in trainer/conversion/__init__.py.
"""

from absl import flags

from trainer import cli
from trainer.conversion import FORMATS, ConversionError, converter

FLAGS = flags.FLAGS
flags.DEFINE_enum("from", "marian", tuple(FORMATS), "The input's format: marian, a "
                  "Hugging Face MarianMTModel checkpoint (the OPUS-MT models).")
flags.DEFINE_string("input", None, "The downloaded checkpoint's directory.")
flags.DEFINE_string("model_dir", None, "The model directory to write (new, or empty).")
flags.DEFINE_string("normalize_punctuation", None, "A language code (the checkpoint's "
                    "source language, e.g. en): normalize every input with Moses' "
                    "punctuation rules for it before SentencePiece, as OPUS-MT's training "
                    "data was; stored in the model directory. Default: none, as Hugging "
                    "Face's MarianTokenizer tokenizes (Transformers 5.24 does not apply its "
                    "normalizer).")


def main(argv):
    del argv
    for name in ("input", "model_dir"):
        if not FLAGS[name].value:
            cli.fail(f"--{name} is required")
    module = converter(FLAGS["from"].value)
    try:
        config = module.convert(FLAGS.input, FLAGS.model_dir,
                                normalize_punctuation=FLAGS.normalize_punctuation)
    except (ConversionError, OSError) as e:
        cli.fail(str(e))
    vocabulary = (f"{config.vocab_size} pieces" if config.share_embeddings else
                  f"{config.input_vocab_size} source and {config.vocab_size} target pieces")
    print(f"converted {FLAGS.input} into {FLAGS.model_dir}: {config.depth} layers, "
          f"d_model {config.d_model}, {config.activation}, vocabulary {vocabulary}")


if __name__ == "__main__":
    cli.run(main)
