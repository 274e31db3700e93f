"""python -m trainer.export --model_dir=DIR [--export_dir=DIR] [--average_last=N]
[--export_weights=last|average|ema]
[--precision=float32|bfloat16] [--format=saved_model|ctranslate2]
[--quantization=int8|int16|float32]: write a model directory's model for serving.

--format=saved_model (the default) writes the next SavedModel version, for TF Serving or
any TensorFlow program with tensorflow_text (layout and signatures:
trainer/serving/saved_model.py). --format=ctranslate2 writes a CTranslate2 model directory
(trainer/serving/ctranslate2_export.py; needs `pip install -e ".[ctranslate2]"`).
"""

import os

from absl import flags

from trainer import cli

FORMATS = ("saved_model", "ctranslate2")
FLAGS = flags.FLAGS
flags.DEFINE_string("model_dir", None, "Model directory of python -m trainer.task.")
flags.DEFINE_enum("format", "saved_model", FORMATS, "What to write: a SavedModel version "
                  "(TF Serving) or a CTranslate2 model directory.")
flags.DEFINE_string("export_dir", None, "Where SavedModel versions go (default "
                    "saved_models/<name of model_dir>), or the CTranslate2 model directory "
                    "(default saved_models/<name of model_dir>-ctranslate2-<quantization>).")
flags.DEFINE_integer("average_last", 0, "Export the mean of the last N checkpoints "
                     "(paper: 5 for base, 20 for big); 0 exports the latest.")
flags.DEFINE_enum("export_weights", None, ("last", "average", "ema"), "Which weights: "
                  "the latest checkpoint's, the mean of the last --average_last, or the "
                  "moving average a run with --ema_decay keeps (default: average when "
                  "--average_last is set, else last).")
flags.DEFINE_integer("beam_size", 4, "SavedModel: beam size of every signature (and k of "
                     "nbest). CTranslate2 takes it per request.")
flags.DEFINE_float("alpha", 0.6, "SavedModel: length penalty exponent.")
flags.DEFINE_integer("max_beam_size", 8, "SavedModel: the largest beam_size (and number of "
                     "samples) a client may ask of the translate_with_options and sample "
                     "signatures.")
flags.DEFINE_enum("precision", "float32", ("float32", "bfloat16"), "SavedModel: what the "
                  "graph computes in; bfloat16 (bfloat16 weights and matmuls, float32 "
                  "softmaxes and scores) is faster on CPUs with AVX-512 BF16 or AMX.")
flags.DEFINE_bool("xla", False, "SavedModel: also export translate_xla, serving_default with "
                  "the search of requests of up to 4 sentences compiled by XLA, faster for "
                  "small requests (a compile per new batch size and source width bucket; "
                  "larger requests run serving_default's search; TF Serving needs "
                  "--xla_cpu_compilation_enabled).")
flags.DEFINE_string("quantization", "int8", "CTranslate2: the weights' type (int8, "
                    "int8_float32, int16, float32, bfloat16, int8_bfloat16).")


def main(argv):
    del argv
    if not FLAGS.model_dir:
        cli.fail("--model_dir is required")
    if FLAGS.beam_size < 1 or FLAGS.max_beam_size < 1 or FLAGS.average_last < 0:
        cli.fail("--beam_size and --max_beam_size must be at least 1 and --average_last "
                 "at least 0")
    name = os.path.basename(os.path.normpath(FLAGS.model_dir))
    if FLAGS.format == "ctranslate2":
        try:
            import ctranslate2  # noqa: F401
        except ImportError:
            cli.fail('--format=ctranslate2 needs the ctranslate2 extra: '
                     'pip install -e ".[ctranslate2]"')
        export_dir = FLAGS.export_dir or os.path.join(
            "saved_models", f"{name}-ctranslate2-{FLAGS.quantization}")
        from trainer.data import tokenizer as tokenizer_lib
        from trainer.serving import ctranslate2_export
        from trainer.training import checkpoint_averaging
        try:
            model, _ = checkpoint_averaging.final_model(FLAGS.model_dir, FLAGS.average_last,
                                                        FLAGS.export_weights)
            tokenizers = tokenizer_lib.load_or_train(FLAGS.model_dir, None)
            path = ctranslate2_export.export(model, tokenizers, export_dir, FLAGS.quantization)
        except (FileNotFoundError, ValueError) as e:
            cli.fail(str(e))
        print(f"exported CTranslate2 model ({FLAGS.quantization}) to {path}")
        return
    export_dir = FLAGS.export_dir or os.path.join("saved_models", name)
    from trainer.serving import saved_model
    try:
        path = saved_model.export(FLAGS.model_dir, export_dir, FLAGS.beam_size, FLAGS.alpha,
                                  FLAGS.average_last, FLAGS.precision, FLAGS.export_weights,
                                  FLAGS.max_beam_size, FLAGS.xla)
    except (FileNotFoundError, ValueError) as e:
        cli.fail(str(e))
    print(f"exported SavedModel to {path}")


if __name__ == "__main__":
    cli.run(main)
