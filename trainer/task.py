"""python -m trainer.task: train a Transformer, report validation BLEU, export a SavedModel.

With no flags it trains the tiny preset on the builtin number-words corpus (a few minutes on
a 2-core CPU). Recipes: --flagfile=trainer/flagfiles/{builtin,multi30k,wmt14_base,wmt14_big}.cfg
"""

import os
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
import sys

from absl import app, flags

FLAGS = flags.FLAGS

# What to train.
flags.DEFINE_string("config", "tiny", "Model preset: tiny, small, base or big.")
flags.DEFINE_list("hparams", [], "Overrides of TransformerConfig fields, e.g. "
                  "num_layers=2,key_dim=16,positional=learned (Table 3 rows).")
# On what.
flags.DEFINE_string("dataset", None, "'builtin' (default when no data flag is given) or "
                    "'tfds:<builder>/<config>', e.g. tfds:wmt14_translate/de-en.")
flags.DEFINE_string("train_src", None, "Training source text, one sentence per line (.gz ok).")
flags.DEFINE_string("train_tgt", None, "Training target text, line-aligned with --train_src.")
flags.DEFINE_string("eval_src", None, "Validation source text.")
flags.DEFINE_string("eval_tgt", None, "Validation target text.")
flags.DEFINE_string("source_lang", "en", "Source language (builtin and TFDS data).")
flags.DEFINE_string("target_lang", "de", "Target language (builtin and TFDS data).")
flags.DEFINE_string("tfds_data_dir", None, "TFDS data directory.")
flags.DEFINE_integer("vocab_size", None, "SentencePiece vocabulary size (default: sized to "
                     "the corpus, about 37000 for WMT-sized data).")
flags.DEFINE_bool("separate_vocabularies", False, "Separate source and target vocabularies.")
flags.DEFINE_integer("max_len", 64, "Longest sequence in subword tokens; longer pairs are "
                     "dropped and counted.")
flags.DEFINE_integer("batch_tokens", 2048, "Padded source (and target) tokens per batch and "
                     "replica.")
# Where.
flags.DEFINE_string("model_dir", None, "Checkpoints, vocabulary and summaries "
                    "(default runs/<run name>). Rerunning the same command resumes.")
flags.DEFINE_string("export_dir", None, "Where the SavedModel goes (default "
                    "saved_models/<run name>); 'none' skips the export.")
flags.DEFINE_string("run_name", None, "Names the default directories (default <config>_<data>).")
# How.
flags.DEFINE_integer("train_steps", 1000, "Total optimiser updates (resumed runs count from "
                     "the checkpoint).")
flags.DEFINE_enum("precision", None, ["float32", "mixed_float16", "mixed_bfloat16"],
                  "Default: mixed_float16 on GPUs, mixed_bfloat16 on CPUs with bfloat16 "
                  "units (AVX-512 BF16/AMX), else float32.")
flags.DEFINE_bool("jit_compile", False, "XLA-compile the training step.")
flags.DEFINE_integer("accum_steps", 1, "Microbatches accumulated per update.")
flags.DEFINE_integer("num_cpu_replicas", 0, "Split the CPU into N logical devices and mirror "
                     "over them (exercises multi-replica training without GPUs).")
flags.DEFINE_integer("warmup_steps", 400, "Learning-rate warm-up (section 5.3; the paper's "
                     "4000 is in the WMT flagfiles).")
flags.DEFINE_float("learning_rate_scale", 1.0, "Multiplies the learning-rate schedule.")
flags.DEFINE_integer("eval_every", 500, "Validation loss and BLEU every N updates.")
flags.DEFINE_integer("checkpoint_every", 250, "Checkpoint every N updates.")
flags.DEFINE_integer("keep_checkpoints", 5, "Checkpoints kept (average them with "
                     "python -m trainer.average).")
flags.DEFINE_integer("log_every", 10, "Progress and TensorBoard summaries every N updates.")
flags.DEFINE_integer("beam_size", 4, "Beam size for validation BLEU and the export.")
flags.DEFINE_float("alpha", 0.6, "Length penalty for validation BLEU and the export.")
flags.DEFINE_integer("bleu_sentences", 500, "Validation sentences translated for BLEU (0: all).")
flags.DEFINE_string("bleu_tokenize", "13a", "sacreBLEU tokenizer for validation BLEU "
                    "(the builtin corpus always uses 'char').")
flags.DEFINE_float("max_train_minutes", 0, "Stop training (with a checkpoint) after this many "
                   "minutes of this invocation, even before --train_steps (0: no limit).")
flags.DEFINE_integer("average_last", 0, "Export the mean of the last N checkpoints (the paper: "
                     "5 for base, 20 for big; 0 exports the last checkpoint).")
flags.DEFINE_integer("seed", 0, "Random seed (weights, dropout, shuffling, builtin corpus).")


def fail(message: str):
    """One line on stderr, exit status 2, before any work."""
    print(f"trainer.task: error: {message}", file=sys.stderr)
    sys.exit(2)


def config_module():
    """keras_transformer/config.py loaded on its own: pure Python, so flags are checked
    before TensorFlow is imported (its start-up logging would bury a one-line error)."""
    import importlib.util
    name = "keras_transformer.config"
    if name in sys.modules:
        return sys.modules[name]
    path = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                        "keras_transformer", "config.py")
    spec = importlib.util.spec_from_file_location("_transformer_config", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def model_config_from_flags(vocab_size: int, config_class=None):
    """The one place that turns flags into a TransformerConfig."""
    TransformerConfig = config_class or config_module().TransformerConfig
    overrides = {}
    fields = TransformerConfig.__dataclass_fields__
    for item in FLAGS.hparams:
        key, _, value = item.partition("=")
        if key not in fields or key == "vocab_size":
            raise ValueError(f"--hparams: unknown field {key!r}")
        default = getattr(TransformerConfig(), key)
        kind = type(default) if default is not None else int
        overrides[key] = (value.lower() in ("1", "true", "yes") if kind is bool
                          else None if value.lower() == "none" else kind(value))
    return TransformerConfig.preset(FLAGS.config, vocab_size=vocab_size, **overrides)


def check_flags():
    """Errors a user can fix, found before any data is read or model built."""
    PRESETS = config_module().PRESETS
    if FLAGS.config not in PRESETS:
        fail(f"unknown preset --config={FLAGS.config}; choose one of {', '.join(PRESETS)}")
    if FLAGS.batch_tokens < FLAGS.max_len:
        fail(f"--batch_tokens={FLAGS.batch_tokens} is smaller than --max_len={FLAGS.max_len}: "
             "a longest sentence would not fit in a batch")
    for name in ("train_src", "train_tgt", "eval_src", "eval_tgt"):
        path = getattr(FLAGS, name)
        if path and not os.path.exists(path):
            fail(f"--{name}={path}: no such file")
    try:
        model_config_from_flags(vocab_size=1000)
    except (ValueError, TypeError) as e:
        fail(str(e))


def run_name() -> str:
    if FLAGS.run_name:
        return FLAGS.run_name
    if FLAGS.train_src:
        data = os.path.basename(os.path.dirname(os.path.abspath(FLAGS.train_src))) or "files"
    else:
        data = (FLAGS.dataset or "builtin").replace("tfds:", "").replace("/", "-")
    return f"{FLAGS.config}_{data}"


def main(argv):
    if len(argv) > 1:
        fail(f"unexpected arguments {argv[1:]}")
    check_flags()
    from trainer import distribute  # TF is imported only after the flags are checked
    strategy = distribute.make_strategy(FLAGS.num_cpu_replicas)

    import keras
    from trainer import evaluation, input_pipeline, model_dir as model_dir_lib
    from trainer import sources, train

    keras.utils.set_random_seed(FLAGS.seed)
    name = run_name()
    model_dir = FLAGS.model_dir or os.path.join("runs", name)
    try:
        source = sources.select(
            dataset=FLAGS.dataset, train_files=(FLAGS.train_src, FLAGS.train_tgt),
            eval_files=(FLAGS.eval_src, FLAGS.eval_tgt), source_lang=FLAGS.source_lang,
            target_lang=FLAGS.target_lang, data_dir=FLAGS.tfds_data_dir,
            builtin_seed=FLAGS.seed)
        data = input_pipeline.build(
            source, model_dir,
            input_pipeline.PipelineConfig(max_len=FLAGS.max_len, batch_tokens=FLAGS.batch_tokens,
                                          seed=FLAGS.seed),
            vocab_size=FLAGS.vocab_size, separate_vocabularies=FLAGS.separate_vocabularies)
    except (sources.DataError, ValueError) as e:
        fail(str(e))
    print(f"data: {data.report}", flush=True)
    tokenizers = data.tokenizers
    from keras_transformer import TransformerConfig
    config = model_config_from_flags(tokenizers.target.vocab_size, TransformerConfig)
    if FLAGS.separate_vocabularies:
        import dataclasses
        config = dataclasses.replace(config, share_embeddings=False,
                                     source_vocab_size=tokenizers.source.vocab_size)
    try:
        model_dir_lib.save_config(model_dir, config)
    except ValueError as e:
        fail(str(e))
    run = train.RunConfig(
        model_dir=model_dir, train_steps=FLAGS.train_steps,
        precision=FLAGS.precision or distribute.default_precision(),
        jit_compile=FLAGS.jit_compile, accum_steps=FLAGS.accum_steps,
        warmup_steps=FLAGS.warmup_steps, learning_rate_scale=FLAGS.learning_rate_scale,
        eval_every=FLAGS.eval_every, checkpoint_every=FLAGS.checkpoint_every,
        keep_checkpoints=FLAGS.keep_checkpoints, log_every=FLAGS.log_every,
        beam_size=FLAGS.beam_size, alpha=FLAGS.alpha, bleu_sentences=FLAGS.bleu_sentences,
        max_train_minutes=FLAGS.max_train_minutes)
    print(f"model: {FLAGS.config} ({config.num_layers} layers, d_model {config.d_model}, "
          f"vocabulary {config.vocab_size}), {strategy.num_replicas_in_sync} replica(s), "
          f"{run.precision}, model_dir {model_dir}", flush=True)
    builtin = isinstance(source, sources.BuiltinSource)
    bleu = evaluation.BleuEvaluator(data, run.beam_size, run.alpha, run.bleu_sentences,
                                    tokenize="char" if builtin else FLAGS.bleu_tokenize)
    if builtin:
        print("validation BLEU counts character n-grams: the builtin targets are 1-3 German "
              "words", flush=True)
    trainer = train.Trainer(config, run, data, strategy, evaluate_bleu=bleu)
    try:
        results = trainer.train()
    except train.TrainingError as e:
        print(f"trainer.task: {e}", file=sys.stderr)
        sys.exit(1)
    if results:
        print("final: " + ", ".join(f"{k} {v:.4g}" for k, v in sorted(results.items())))
    export_dir = FLAGS.export_dir or os.path.join("saved_models", name)
    if export_dir.lower() != "none" and distribute.is_chief():
        from trainer import export
        path = export.export(model_dir, export_dir, beam_size=run.beam_size, alpha=run.alpha,
                             average_last=FLAGS.average_last)
        print(f"exported SavedModel to {path}")


def run():
    app.run(main)


if __name__ == "__main__":
    run()
