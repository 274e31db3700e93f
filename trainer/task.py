"""python -m trainer.task: train a Transformer, report validation BLEU, export a SavedModel.

With no flags it trains the tiny preset on the builtin number-words corpus (about 2 minutes
of training on a 2-core CPU, 3 with TensorFlow's start, validation and the export), then
translates the README's example through the export. Recipes:
--flagfile=trainer/flagfiles/{builtin,multi30k,wmt14_base,wmt14_big}.cfg

This module only parses flags: they become a TransformerConfig, a DataConfig and a
RunConfig with its DecodeConfig (checked before TensorFlow starts), which
trainer.main_job.train_and_export
runs. Flag defaults are the dataclasses' defaults.

The search flags (--beam_size, --alpha, --length_penalty, --stopping, --patience,
--min_length; trainer/search_flags.py, from DecodeConfig's declarations) set the search of
validation BLEU and of the export, and are stored in the model directory (config.json's
"decode"), where python -m trainer.export takes its defaults.
"""

import dataclasses
import json
import os

from absl import flags

from keras_transformer.config import OPTIONS, PRESETS, TransformerConfig
from trainer import cli, search_flags
from trainer.config import (AUTO_PRECISION, PRECISIONS, SUBWORD_MODELS, TRAINED_DECODE,
                            DataConfig, RunConfig, default_run_name, file_list)

FLAGS = flags.FLAGS

# What to train.
flags.DEFINE_string("config", "tiny", f"Model preset: {', '.join(PRESETS)}.")
flags.DEFINE_list("hparams", [], "Overrides of TransformerConfig fields, e.g. "
                  "num_layers=2,key_dim=16,positional=learned (Table 3 rows).")
# On what.
flags.DEFINE_string("dataset", DataConfig.dataset, "'builtin' (default when no data flag is "
                    "given) or 'tfds:<builder>/<config>', e.g. tfds:wmt14_translate/de-en.")
flags.DEFINE_string("train_src", None, "Training source text, one sentence per line (.gz ok); "
                    "several corpora as a comma-separated list.")
flags.DEFINE_string("train_tgt", None, "Training target text, line-aligned with --train_src "
                    "(as many files).")
flags.DEFINE_list("train_weights", None, "With several training corpora: the share of "
                  "training pairs drawn from each, e.g. 0.7,0.3 (default: by their sizes).")
flags.DEFINE_string("eval_src", None, "Validation source text.")
flags.DEFINE_string("eval_tgt", None, "Validation target text.")
flags.DEFINE_string("source_lang", DataConfig.source_lang, "Source language (builtin, TFDS).")
flags.DEFINE_string("target_lang", DataConfig.target_lang, "Target language (builtin, TFDS).")
flags.DEFINE_string("tfds_data_dir", DataConfig.tfds_data_dir, "TFDS data directory.")
flags.DEFINE_integer("vocab_size", DataConfig.vocab_size, "SentencePiece vocabulary size "
                     "(default: sized to the corpus, about 37000 for WMT-sized data).")
flags.DEFINE_bool("separate_vocabularies", DataConfig.separate_vocabularies,
                  "Separate source and target vocabularies.")
flags.DEFINE_string("normalize_punctuation", DataConfig.normalize_punctuation, "A language "
                    "code (en, de, fr, ...): normalize every source text with Moses' "
                    "punctuation rules for that language (sacremoses' MosesPunctNormalizer), "
                    "in training and in the model's exports; stored in the model directory. "
                    "Default: none.")
flags.DEFINE_enum("subword_model", DataConfig.subword_model, SUBWORD_MODELS,
                  "SentencePiece model: byte-pair encoding (the paper's) or unigram.")
flags.DEFINE_list("spm_model", None, "An existing SentencePiece model to train on instead "
                  "of building a vocabulary (ids pad 0, unk 1, bos 2, eos 3), or a source's and "
                  "a target's, comma-separated.")
flags.DEFINE_float("subword_sampling", DataConfig.subword_sampling, "Subword regularization: "
                   "training sentences get a segmentation sampled with this alpha each time "
                   "they are read (bpe: the BPE-dropout rate, e.g. 0.1; unigram: Kudo's "
                   "smoothing); 0: one segmentation.")
flags.DEFINE_integer("max_len", DataConfig.max_len, "Longest sequence in subword tokens; "
                     "longer pairs are dropped and counted.")
flags.DEFINE_integer("batch_tokens", DataConfig.batch_tokens, "Padded source (and target) "
                     "tokens per batch and replica.")
# Where.
flags.DEFINE_string("model_dir", None, "Checkpoints, vocabulary and summaries "
                    "(default runs/<run name>). Rerunning the same command resumes.")
flags.DEFINE_string("export_dir", None, "Where the SavedModel goes (default "
                    "saved_models/<run name>); 'none' skips the export.")
flags.DEFINE_string("run_name", None, "Names the default directories (default <config>_<data>).")
# How.
flags.DEFINE_integer("train_steps", RunConfig.train_steps, "Total optimiser updates (resumed "
                     "runs count from the checkpoint).")
flags.DEFINE_enum("precision", RunConfig.precision, (AUTO_PRECISION, *PRECISIONS),
                  "auto: on a CPU, time the model's forward and backward pass on the run's "
                  "batches in float32 and mixed_bfloat16 (at most a minute, out of "
                  "--max_train_minutes) and keep the faster; on GPUs mixed_float16. The "
                  "choice is recorded in the model directory (precision.json), and a resumed "
                  "run keeps it unless this flag names another.")
flags.DEFINE_bool("jit_compile", RunConfig.jit_compile, "XLA-compile the training step.")
flags.DEFINE_integer("accum_steps", RunConfig.accum_steps, "Microbatches accumulated per update.")
flags.DEFINE_integer("num_cpu_replicas", RunConfig.num_cpu_replicas, "Split the CPU into N "
                     "logical devices and mirror over them (multi-replica training without GPUs).")
flags.DEFINE_integer("warmup_steps", RunConfig.warmup_steps, "Learning-rate warm-up (section "
                     "5.3; the paper's 4000 is in the WMT flagfiles).")
flags.DEFINE_float("learning_rate_scale", RunConfig.learning_rate_scale,
                   "Multiplies the learning-rate schedule.")
flags.DEFINE_float("cooldown", RunConfig.cooldown, "Decay the learning rate linearly to 0 over "
                   "this last fraction of the run (of --train_steps, or of "
                   "--max_train_minutes if that ends first); 0: the schedule as it is.")
flags.DEFINE_string("dropout_schedule", RunConfig.dropout_schedule, "P_drop over the run, "
                    "rate@start pieces such as 0.2@0,0.3@0.4 (0.2, then 0.3 from 40%% of the "
                    "run, measured as --cooldown measures it); needs dropout > 0 "
                    "(--hparams). Recorded in the model directory: a resumed run keeps it. "
                    "Default: the model's fixed dropout.")
flags.DEFINE_integer("eval_every", RunConfig.eval_every, "Validation loss and BLEU every N "
                     "updates and at the end (0: never).")
flags.DEFINE_integer("checkpoint_every", RunConfig.checkpoint_every, "Checkpoint every N updates.")
flags.DEFINE_integer("keep_checkpoints", RunConfig.keep_checkpoints, "Checkpoints kept (average "
                     "them with python -m trainer.average).")
flags.DEFINE_integer("log_every", RunConfig.log_every, "Progress and TensorBoard summaries every "
                     "N updates.")
# The search of validation BLEU and of the export.
SEARCH_FLAGS = search_flags.define(
    search_flags.pick(OPTIONS, "beam_size", "alpha", "length_penalty", "stopping",
                      "patience", "min_length"), TRAINED_DECODE)
flags.DEFINE_integer("bleu_sentences", RunConfig.bleu_sentences, "Validation sentences "
                     "translated for BLEU (0: all).")
flags.DEFINE_string("bleu_tokenize", RunConfig.bleu_tokenize, "sacreBLEU tokenizer for "
                    "validation BLEU (the builtin corpus always uses 'char').")
flags.DEFINE_float("max_train_minutes", RunConfig.max_train_minutes, "Stop training (with a "
                   "checkpoint) after this many minutes of this invocation, even before "
                   "--train_steps (0: no limit).")
flags.DEFINE_integer("average_last", RunConfig.average_last, "Export the mean of the last N "
                     "checkpoints (the paper: 5 for base, 20 for big; 0 exports the last).")
flags.DEFINE_float("ema_decay", RunConfig.ema_decay, "Keep an exponential moving average "
                   "of the weights with this decay (e.g. 0.9999) in the checkpoints; 0: none.")
flags.DEFINE_enum("export_weights", RunConfig.export_weights,
                  ("last", "average", "ema", "best"),
                  "What the export ships: the last checkpoint's weights, the mean of the "
                  "last --average_last, the moving average (--ema_decay) or the best "
                  "validation's checkpoint (--keep_best) (default: average when "
                  "--average_last is set, else last).")
flags.DEFINE_enum("keep_best", None, ("bleu", "chrf", "loss"), "Keep the checkpoint of "
                  "the best validation score in <model_dir>/best, apart from the rotating "
                  "ones (export it with --export_weights=best).")
flags.DEFINE_integer("early_stopping", RunConfig.early_stopping, "Stop after this many "
                     "validations without an improvement (in --keep_best's metric, BLEU "
                     "without it) of at least --early_stopping_min_delta, then export; 0: never.")
flags.DEFINE_float("early_stopping_min_delta", RunConfig.early_stopping_min_delta,
                   "The smallest change of the metric that counts as an improvement.")
flags.DEFINE_bool("force_unlock", RunConfig.force_unlock, "Take over the model directory's "
                  "lock (trainer.lock) even when a trainer on another host holds it; that "
                  "trainer must be gone. A lock of this host's whose process is gone is taken "
                  "over without it.")
flags.DEFINE_string("init_from", None, "Start from another model directory's weights (a "
                    "trained one, or one of python -m trainer.convert): its vocabulary and "
                    "architecture, a new step count, a fresh optimizer and schedule "
                    "(--warmup_steps applies). Fine-tuning; see docs/pretrained.md.")
flags.DEFINE_integer("seed", RunConfig.seed, "Random seed (weights, dropout, shuffling, "
                     "builtin corpus).")
flags.DEFINE_bool("deterministic", RunConfig.deterministic, "TensorFlow's op determinism: the "
                  "same weights, bit for bit, however often the run is killed and resumed "
                  "(CPU, one replica; not with --max_train_minutes or --subword_sampling).")


# What a model is (its weights' shapes and what they compute), as opposed to how it trains
# (dropout, label smoothing): --init_from fixes the first, the flags may change the second.
TRAINING_FIELDS = ("dropout", "attention_dropout", "label_smoothing")


def model_config() -> TransformerConfig:
    """--config with --hparams (or --init_from's model with --hparams' training fields);
    its vocabulary size is set once the vocabulary exists."""
    if FLAGS.init_from:
        return init_model_config(FLAGS.init_from)
    if FLAGS.config not in PRESETS:
        raise ValueError(f"unknown preset --config={FLAGS.config}; choose one of "
                         f"{', '.join(PRESETS)}")
    return TransformerConfig.preset(FLAGS.config, **hparams())


def hparams() -> dict:
    """--hparams as {TransformerConfig field: value}."""
    fields = {field.name: field for field in dataclasses.fields(TransformerConfig)}
    overrides = {}
    for item in FLAGS.hparams:
        key, _, value = item.partition("=")
        if key not in fields or key == "vocab_size":
            raise ValueError(f"--hparams: unknown field {key!r}")
        default = fields[key].default
        kind = type(default) if default is not None else int
        overrides[key] = (value.lower() in ("1", "true", "yes") if kind is bool
                          else None if value.lower() == "none" else kind(value))
    return overrides


def init_model_config(init_from: str) -> TransformerConfig:
    """The model of --init_from's config.json, with --hparams' training fields; a flag
    that asks for another architecture is a ValueError naming it."""
    path = os.path.join(init_from, "config.json")
    try:
        with open(path) as f:
            saved = TransformerConfig.from_dict(json.load(f)["model"])
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise ValueError(f"--init_from={init_from}: {path} cannot be read ({type(e).__name__}):"
                         " is it a model directory?") from None
    if FLAGS["config"].present:
        raise ValueError(f"--config={FLAGS.config} contradicts --init_from={init_from}, whose "
                         "architecture its config.json holds: drop --config")
    overrides = hparams()
    for key, value in overrides.items():
        if key not in TRAINING_FIELDS and value != getattr(saved, key):
            raise ValueError(f"--hparams={key}={value} contradicts --init_from={init_from}, "
                             f"whose {key} is {getattr(saved, key)}")
    return dataclasses.replace(saved, **overrides)


def data_config() -> DataConfig:
    for name in ("train_src", "train_tgt", "eval_src", "eval_tgt"):
        for path in file_list(getattr(FLAGS, name)):
            if not os.path.exists(path):
                raise ValueError(f"--{name}={path}: no such file")
    weights = None
    if FLAGS.train_weights is not None:
        try:
            weights = tuple(float(w) for w in FLAGS.train_weights)
        except ValueError:
            raise ValueError(f"--train_weights={','.join(FLAGS.train_weights)}: "
                             "not a list of numbers") from None
    spm_model = tuple(FLAGS.spm_model) if FLAGS.spm_model else None
    return cli.config_from_flags(DataConfig, train_weights=weights, spm_model=spm_model)


def run_config(data: DataConfig) -> RunConfig:
    model = os.path.basename(os.path.normpath(FLAGS.init_from)) if FLAGS.init_from else None
    name = FLAGS.run_name or default_run_name(model or FLAGS.config, data)
    export_dir = FLAGS.export_dir or os.path.join("saved_models", name)
    return cli.config_from_flags(
        RunConfig, model_dir=FLAGS.model_dir or os.path.join("runs", name),
        export_dir=None if export_dir.lower() == "none" else export_dir)


def main(argv):
    del argv
    try:  # every check a user can act on, before TensorFlow starts
        model, data = model_config(), data_config()
        run = run_config(data)
        if run.early_stopping and len(json.loads(os.environ.get("TF_CONFIG", "{}")).get(
                "cluster", {}).get("worker", [])) > 1:
            raise ValueError("--early_stopping needs one worker: only the chief validates, "
                             "and the other workers would train on")
        if run.dropout_schedule and model.dropout == 0:
            raise ValueError("--dropout_schedule needs dropout > 0 (--hparams=dropout=...): "
                             "the model has no dropout to schedule")
        if run.deterministic and data.subword_sampling:
            raise ValueError("--deterministic contradicts --subword_sampling: SentencePiece "
                             "draws the segmentations from a generator no checkpoint holds")
    except (ValueError, TypeError) as e:
        cli.fail(str(e))
    from trainer.data.sources import DataError
    from trainer.data.tokenizer import VocabularyError
    from trainer.model_dir.layout import ModelDirError
    from trainer.training.preemption import PREEMPTED_STATUS, Preempted
    from trainer.main_job import train_and_export
    from trainer.training.loop import TrainingError
    try:
        train_and_export(model, data, run, log=lambda line: print(line, flush=True))
    except (DataError, VocabularyError, ModelDirError) as e:
        cli.fail(str(e))
    except TrainingError as e:
        cli.fail(str(e), status=1)
    except Preempted as e:
        cli.stop(str(e), PREEMPTED_STATUS)


if __name__ == "__main__":
    cli.run(main)
