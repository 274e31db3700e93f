"""The main job as a Python call: `train_and_export(model_config, data_config, run)`
does what `python -m trainer.task` does, from plain configs (trainer/config.py). It sits
above the training and serving rooms because it uses both: it trains, then exports.

    strategy -> data (vocabulary, counts) -> config.json -> precision (given, recorded or
    measured) -> model, optimizer, checkpoints
    -> Trainer.train() with validation -> SavedModel export (the chief) -> one example
    translated through the export
"""

import contextlib
import dataclasses
import time
from typing import Callable, Optional

import keras
import tensorflow as tf

from keras_transformer import Transformer, TransformerConfig
from trainer.config import PRECISIONS, DataConfig, RunConfig
from trainer.data import input_pipeline, sources
from trainer.data import vocabulary
from trainer.data.tokenizer import Tokenizers
from trainer.model_dir import layout, lock
from trainer.model_dir.ema import MovingAverage
from trainer.model_dir.weights import WeightsChoice
from trainer.serving import client, saved_model
from trainer.training import distribute, dropout_schedule, precision
from trainer.training.checkpointing import Checkpointer
from trainer.training.dropout_schedule import DropoutSchedule, ScheduledRate
from trainer.training.loop import Trainer
from trainer.training.update import make_optimizer
from trainer.training.validation import Validator


def sized_to_vocabulary(model_config: TransformerConfig,
                        tokenizers: Tokenizers) -> TransformerConfig:
    """The model config with the vocabulary's size; separate vocabularies give the
    source its own embedding (share_embeddings=False)."""
    if tokenizers.shared_ids:
        return dataclasses.replace(model_config, vocab_size=tokenizers.target.vocab_size)
    return dataclasses.replace(model_config, vocab_size=tokenizers.target.vocab_size,
                               share_embeddings=False,
                               source_vocab_size=tokenizers.source.vocab_size)


def build_trainer(model_config: TransformerConfig, data: input_pipeline.Data, run: RunConfig,
                  strategy, validator_args: Optional[dict] = None,
                  log: Callable[[str], None] = print) -> Trainer:
    """A Trainer given its parts: the model (run.precision, one of PRECISIONS: `auto` is
    resolved before, `trainer.training.precision.choose`), optimizer and, with
    run.ema_decay, the moving average of the weights and, with run.dropout_schedule, the
    schedule's state built in the strategy's scope, its
    checkpointer and, with `validator_args` (Validator's keyword arguments), its validator
    on the chief."""
    if run.precision not in PRECISIONS:
        raise ValueError(f"build_trainer needs one of {PRECISIONS}, got {run.precision!r}")
    with strategy.scope():
        model = Transformer(model_config, dtype=run.precision)
        model.build()
        optimizer = make_optimizer(model_config, run)
        optimizer.build(model.trainable_variables)
        moving_average = (MovingAverage(model.trainable_variables, run.ema_decay)
                          if run.ema_decay else None)
        dropout = (ScheduledRate(DropoutSchedule.parse(run.dropout_schedule))
                   if run.dropout_schedule else None)
    checkpointer = Checkpointer(model, optimizer, run.model_dir, run.keep_checkpoints,
                                moving_average, dropout)
    validator = None
    if validator_args is not None and distribute.is_chief():
        validator = Validator(model, data, run.model_dir, log=log, **validator_args)
    return Trainer(model, optimizer, data, strategy, run, checkpointer, validator, log)


def initialize(trainer: Trainer, init_from: str, log: Callable[[str], None] = print):
    """Sets the trainer's model (and moving average) to the weights of init_from's newest
    intact checkpoint: a new run's start from another model (fine-tuning)."""
    path = layout.intact_checkpoints(init_from, warn=lambda m: log(f"warning: {m}"))[-1]
    try:
        tf.train.Checkpoint(model=trainer.model).restore(path).expect_partial() \
            .assert_existing_objects_matched()
    except AssertionError as e:
        raise layout.ModelDirError(f"{path} does not hold the weights of the model its "
                                   f"config.json describes ({' '.join(str(e).split())[:100]})"
                                   ) from None
    if trainer.checkpointer.moving_average is not None:
        trainer.checkpointer.moving_average.reset(trainer.model.trainable_variables)
    log(f"initialized from {path}: its weights, with a fresh optimizer and schedule")


def _with_dropout_schedule(model_config: TransformerConfig, run: RunConfig,
                           log: Callable[[str], None]) -> RunConfig:
    """run with its dropout schedule: the flag's, recorded in the model directory, or
    the one recorded there (`dropout_schedule.resolve`)."""
    schedule = dropout_schedule.resolve(run.dropout_schedule, run.model_dir,
                                        distribute.is_chief(), log)
    if schedule is not None and model_config.dropout == 0:
        raise layout.ModelDirError(
            f"{run.model_dir}/{dropout_schedule.RECORD} holds a dropout schedule, but this "
            "model's dropout is 0: train it with dropout > 0 (--hparams=dropout=...)")
    return dataclasses.replace(run, dropout_schedule=str(schedule) if schedule else "")


def _with_precision(model_config: TransformerConfig, data: input_pipeline.Data,
                    run: RunConfig, strategy, log: Callable[[str], None]) -> RunConfig:
    """run with its precision chosen (`precision.choose`); a measurement's time comes off
    the time budget, and the seed is set again, so that the model starts from the weights
    an explicit --precision gives it."""
    start = time.time()
    choice = precision.choose(model_config, data, run, strategy, log)
    spent = (time.time() - start) / 60
    run = dataclasses.replace(run, precision=choice.precision)
    if run.max_train_minutes and spent > 0.01:
        run = dataclasses.replace(run, max_train_minutes=max(run.max_train_minutes - spent,
                                                             0.01))
        log(f"time budget: {run.max_train_minutes:.1f} minutes left for training")
    keras.utils.set_random_seed(run.seed)
    return run


def train_and_export(model_config: TransformerConfig, data_config: DataConfig, run: RunConfig,
                     log: Callable[[str], None] = print) -> Optional[str]:
    """Trains (or resumes) the run in run.model_dir and exports it to run.export_dir.

    model_config's vocabulary size is replaced by the trained vocabulary's. After the
    export, logs the export's translation of the source's example sentence
    (`Source.example`). Returns the export's path (None without run.export_dir, or on
    another worker than the chief). Raises DataError, VocabularyError or ValueError (the data
    or model directory cannot serve this run, or another trainer holds its lock) before
    training, TrainingError during it.
    """
    strategy = distribute.make_strategy(run.num_cpu_replicas)
    keras.utils.set_random_seed(run.seed)
    if run.deterministic:
        tf.config.experimental.enable_op_determinism()
    # The data's own checks (its files, their line counts, UTF-8) before the model
    # directory is made or locked: a run its data cannot serve stops with that one line and
    # leaves nothing there, whatever the path holds.
    source = sources.select(data_config)
    # One trainer per model directory (the chief's lock), from before its first write.
    with (lock.held(run.model_dir, run.force_unlock) if distribute.is_chief()
          else contextlib.nullcontext()):
        return _train_and_export(model_config, data_config, source, run, strategy, log)


def _train_and_export(model_config: TransformerConfig, data_config: DataConfig,
                      source: sources.Source, run: RunConfig, strategy,
                      log: Callable[[str], None]) -> Optional[str]:
    """`train_and_export`'s run on `source`, under the model directory's lock."""
    if run.init_from and layout.checkpoint_state(run.model_dir) is None:
        vocabulary.copy_vocabulary(run.init_from, run.model_dir)
    data = input_pipeline.build(source, run.model_dir, data_config)
    log(f"data: {data.report}")
    model_config = sized_to_vocabulary(model_config, data.tokenizers)
    layout.save_config(run.model_dir, model_config, run.decode)
    builtin = isinstance(source, sources.BuiltinSource)
    run = _with_dropout_schedule(model_config, run, log)
    run = _with_precision(model_config, data, run, strategy, log)
    validator_args = (dict(decode=run.decode, bleu_sentences=run.bleu_sentences,
                           bleu_tokenize="char" if builtin else run.bleu_tokenize)
                      if run.eval_every else None)
    trainer = build_trainer(model_config, data, run, strategy, validator_args, log)
    if run.init_from and not trainer.checkpointer.latest:
        initialize(trainer, run.init_from, log)
    norm = ", pre-norm" if model_config.pre_norm else ""
    log(f"model: {model_config.depth} layers{norm}, d_model {model_config.d_model}, "
        f"{model_config.num_heads} heads, d_ff {model_config.d_ff}, vocabulary "
        f"{model_config.vocab_size} ({trainer.model.count_params() / 1e6:.2f}M parameters); "
        f"{strategy.num_replicas_in_sync} replica(s), {run.precision}; "
        f"model_dir {run.model_dir}")
    if builtin and validator_args is not None:
        log("validation BLEU counts character n-grams: the builtin targets are 1-3 German words")
    results = trainer.train()
    if results:
        log("final: " + ", ".join(f"{k} {v:.4g}" for k, v in sorted(results.items())))
    if run.export_dir is None or not distribute.is_chief():
        return None
    weights = WeightsChoice(run.export_weights, run.average_last)
    path = saved_model.export(run.model_dir, run.export_dir,
                              saved_model.Options(weights=weights, decode=run.decode))
    log(f"exported SavedModel to {path}")
    # What `python -m trainer.translate` would print for one sentence: the export itself,
    # loaded as a server loads it, translates (the builtin corpus: the README's example).
    example = source.example()
    translation, = client.translate_lines(saved_model.load(path), [example])
    log(f"example through the export: {example} -> {translation}")
    return path

