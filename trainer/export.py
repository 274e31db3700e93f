"""python -m trainer.export --model_dir=DIR [--format=saved_model|ctranslate2|marian]
[--export_dir=DIR] [--export_weights=last|average|ema|best] [--average_last=N]
[--serving_dtype=float32|bfloat16|int8|int8_bfloat16|auto [--calibration=FILE]] [--xla]
[--shortlist=SRC,TGT] [--quantization=int8|...] [--source_lang=en --target_lang=de]:
write a model directory's model for serving.

--format=saved_model (the default) writes the next SavedModel version, for TF Serving or
any TensorFlow program with tensorflow_text (layout and signatures:
trainer/serving/saved_model.py). --format=ctranslate2 writes a CTranslate2 model directory
(trainer/serving/ctranslate2.py; needs `pip install -e ".[ctranslate2]"`).
--format=marian writes a Hugging Face Marian checkpoint that Transformers loads
(trainer/serving/marian.py), with a model card (README.md) naming --source_lang and
--target_lang, to publish on the Hub as OPUS-MT models are.

--serving_dtype says what a SavedModel computes in. Which dtype is fastest depends on the
CPU, so --serving_dtype=auto --calibration=FILE builds each, times it on this machine as a
server runs it, and keeps the fastest whose translations agree with float32's, printing the
table and recording it in export.json (trainer/serving/dtype_choice.py). The formats
are listed in trainer/serving/exporters.py; each flag below fills the option of the same
name of the formats that have one.

The search flags (--beam_size, --alpha, --length_penalty, --stopping, --patience,
--min_length; trainer/search_flags.py, from DecodeConfig's declarations) set a
SavedModel's search, that of every signature (--beam_size: also k of nbest); those not
given default to the model directory's settings (config.json's "decode": the training
run's flags, a converted checkpoint's generation settings), else the paper's. CTranslate2
takes them per request. --max_beam_size bounds what a request may ask of the
translate_with_options and sample signatures.
"""

import dataclasses
import os

from absl import flags

from keras_transformer.config import OPTIONS, DecodeConfig
from trainer import cli, search_flags
from trainer.serving import exporters
from trainer.serving.limits import LIMITS, ServingLimits
from trainer.serving.shortlist import ShortlistChoice

FLAGS = flags.FLAGS
flags.DEFINE_string("model_dir", None, "Model directory of python -m trainer.task.")
flags.DEFINE_enum("format", "saved_model", tuple(exporters.FORMATS),
                  "What to write: a SavedModel version (TF Serving), a CTranslate2 model "
                  "directory, or a Hugging Face Marian checkpoint (Transformers' MarianMTModel).")
flags.DEFINE_string("export_dir", None, "Where SavedModel versions go (default "
                    "saved_models/<name of model_dir>), or the CTranslate2 model directory "
                    "(default saved_models/<name of model_dir>-ctranslate2-<quantization>), "
                    "or the Marian checkpoint (default saved_models/<name of model_dir>-marian).")
flags.DEFINE_integer("average_last", 0, "Export the mean of the last N checkpoints "
                     "(paper: 5 for base, 20 for big); 0 exports the latest.")
flags.DEFINE_enum("export_weights", None, ("last", "average", "ema", "best"), "Which "
                  "weights: the latest checkpoint's, the mean of the last --average_last, the "
                  "moving average a run with --ema_decay keeps, or the best validation's of a "
                  "run with --keep_best (default: average when --average_last is set, else "
                  "last).")
# SavedModel: the search of every signature, and what a request may ask.
SEARCH_FLAGS = search_flags.define(
    search_flags.pick(OPTIONS, "beam_size", "alpha", "length_penalty", "stopping",
                      "patience", "min_length"), DecodeConfig(), prefix="SavedModel: ")
LIMIT_FLAGS = search_flags.define(LIMITS, ServingLimits(), prefix="SavedModel: ")
flags.DEFINE_enum("serving_dtype", "float32",
                  ("float32", "bfloat16", "int8", "int8_bfloat16", "auto"),
                  "SavedModel: what the graph computes in: float32; bfloat16 (bfloat16 "
                  "weights and matmuls, float32 softmaxes and scores); int8 (the decoding "
                  "step's matmuls on int8 weights and inputs, oneDNN's int8 kernel; the "
                  "rest float32); int8_bfloat16 (the encoder's and the step's matmuls int8, "
                  "each input rounded by a range measured on --calibration's sentences; the "
                  "rest bfloat16); auto: each of them built and timed on --calibration's "
                  "sentences on this machine, two requests in flight as a server runs them, "
                  "and the fastest kept whose translations equal float32's on at least 80% "
                  "of them and score at least 80 sacreBLEU against float32's (without the "
                  "int8 ones under --xla). Which is fastest depends on the CPU: export with "
                  "auto on the kind of host that will serve.")
flags.DEFINE_string("calibration", "", "SavedModel, --serving_dtype=int8_bfloat16 or auto: a "
                    "text file of source sentences, one per line (its first 1,000 are read; "
                    "the validation set's source side, say), that the bfloat16 model "
                    "translates to measure the largest input of each int8 matmul; auto also "
                    "times each dtype on its first 512.")
flags.DEFINE_bool("xla", False, "SavedModel: also export translate_xla, serving_default with "
                  "the search of requests of up to 4 sentences compiled by XLA, faster for "
                  "small requests (a compile per new batch size and source width bucket; "
                  "larger requests run serving_default's search; TF Serving needs "
                  "--xla_cpu_compilation_enabled).")
flags.DEFINE_string("shortlist", "", "SRC,TGT: a parallel corpus (two line-aligned text "
                    "files) to make a vocabulary shortlist from: every beam search then ranks "
                    "only the --shortlist_frequent most frequent target pieces and the "
                    "--shortlist_per_source pieces listed for each of its batch's source "
                    "pieces (faster with large vocabularies). SavedModel: stored in it; "
                    "CTranslate2: written as vmap.txt (translate with use_vmap=True).")
flags.DEFINE_integer("shortlist_frequent", ShortlistChoice.shortlist_frequent,
                     "The most frequent target pieces a shortlist always holds (K).")
flags.DEFINE_integer("shortlist_per_source", ShortlistChoice.shortlist_per_source,
                     "The target pieces a shortlist lists for each source piece, those that "
                     "co-occur with it in most sentence pairs (M).")
flags.DEFINE_string("source_lang", None, "Marian: the source language's code (en, de, ...), "
                    "which the model card (README.md) lists for the Hugging Face Hub.")
flags.DEFINE_string("target_lang", None, "Marian: the target language's code.")
flags.DEFINE_string("quantization", "int8", "CTranslate2: the weights' type (int8, "
                    "int8_float32, int16, float32, bfloat16, int8_bfloat16).")


def _decode(model_dir: str) -> DecodeConfig:
    """The model directory's decoding settings, with the search flags given on the
    command line (or in a flagfile) on top."""
    from trainer.model_dir import layout  # TensorFlow starts here, after the flags
    return dataclasses.replace(layout.load_decode(model_dir),
                               **search_flags.given(SEARCH_FLAGS))


def main(argv):
    del argv
    if not FLAGS.model_dir:
        cli.fail("--model_dir is required")
    exporter = exporters.exporter(FLAGS.format)
    try:
        given = {}
        if "decode" in {field.name for field in dataclasses.fields(exporter.Options)}:
            given["decode"] = _decode(FLAGS.model_dir)
        options = cli.config_from_flags(exporter.Options, **given)
        name = os.path.basename(os.path.normpath(FLAGS.model_dir))
        export_dir = FLAGS.export_dir or exporter.default_dir(name, options)
        path = exporter.export(FLAGS.model_dir, export_dir, options)
    except (FileNotFoundError, ValueError, exporters.MissingExtra) as e:  # ModelDirError too
        cli.fail(str(e))
    print(f"exported {exporter.DESCRIPTION} to {path}")


if __name__ == "__main__":
    cli.run(main)
