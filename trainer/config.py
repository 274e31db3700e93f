"""What to train on and how: `DataConfig` and `RunConfig`, next to the model's own
`keras_transformer.TransformerConfig` and the search's `DecodeConfig`.

These dataclasses are everything `python -m trainer.task` passes down; its flags take
their defaults from the fields here, so a default is written once. Pure Python (no
TensorFlow), so flags are checked before TensorFlow starts.
"""

import dataclasses
import os
from typing import Dict, List, Optional, Tuple

from keras_transformer.config import DecodeConfig
from trainer.training.dropout_schedule import DropoutSchedule

PRECISIONS = ("float32", "mixed_float16", "mixed_bfloat16")
# RunConfig.precision's default: measured on the machine (trainer/training/precision.py).
AUTO_PRECISION = "auto"
SUBWORD_MODELS = ("bpe", "unigram")

# How a model trained here searches unless its run says otherwise: the paper's beam and length
# penalty, and Hugging Face's stopping rule, a sentence done once its best live beam, scored at
# its current length, does not beat the worst of its beam_size finished. It matched the exact rule
# on both corpora measured (the Multi30k recipe's val, 40.41 against 40.40 at alpha 0.6; the
# builtin corpus' held-out numbers, 999 of 1,000 each) on fewer row-steps; CTranslate2's
# `first`, the recipe's, lost 4 of those 1,000 (docs/multi30k.md, "The search").
# DecodeConfig() itself stays the exact search, the reference every search is tested against.
TRAINED_DECODE = DecodeConfig(stopping="transformers")


@dataclasses.dataclass(frozen=True)
class DataConfig:
    """Where the sentence pairs come from, the vocabulary, and how pairs become batches.

    Attributes:
      dataset: None or "builtin" for the builtin number-words corpus, or
        "tfds:<builder>/<config>" (e.g. "tfds:wmt14_translate/de-en"). Ignored when text
        files are given.
      train_src, train_tgt, eval_src, eval_tgt: parallel UTF-8 text files, one sentence a
        line (".gz" read as gzip); all four or none. Several training corpora are
        comma-separated lists, train_src's i-th file translated by train_tgt's i-th.
      train_weights: with several training corpora, the share of training pairs drawn
        from each (normalised; None: in proportion to their sizes, as concatenated).
      source_lang, target_lang: the direction, for the builtin corpus and TFDS.
      tfds_data_dir: TFDS data directory (None: TFDS's default).
      vocab_size: SentencePiece pieces; None sizes the vocabulary to the corpus
        (`trainer.data.tokenizer.default_vocab_size`, 37000 for WMT-sized data).
      separate_vocabularies: a source and a target vocabulary instead of the shared one
        of section 5.1.
      subword_model: "bpe" (the paper's byte-pair encoding) or "unigram".
      normalize_punctuation: None, or a language code: Moses' punctuation rules for it
        normalize every source text before SentencePiece, in training and in every
        program after (stored in the model directory: trainer/data/vocabulary.py).
      spm_model: an existing SentencePiece model to use instead of training one (its
        pad/unk/bos/eos ids 0-3, as this project trains them), or two: the source's and
        the target's; copied into the model directory when it has no vocabulary yet.
      subword_sampling: subword regularization of the training batches: 0 segments every
        sentence one way; above 0, every time a sentence is read it gets a segmentation
        drawn by SentencePiece with this alpha (over all segmentations): for BPE, the
        BPE-dropout rate (Provilkov et al. 2020: 0.1); for unigram, the smoothing of Kudo
        (2018: 0.1-0.5). Validation, counting and serving never sample.
      vocab_sample_pairs: at most this many training pairs, spread evenly over the
        split, train the vocabulary.
      max_len: positions per sequence, BOS/EOS included; longer pairs are dropped and
        counted.
      batch_tokens: padded positions per batch and replica, for source and for target
        each; at least `max_len`. The paper's ~25k tokens per side over 8 GPUs is 4096.
      seed: the order of the training stream and the builtin corpus (None: random).
    """

    dataset: Optional[str] = None
    train_src: Optional[str] = None
    train_tgt: Optional[str] = None
    eval_src: Optional[str] = None
    eval_tgt: Optional[str] = None
    train_weights: Optional[Tuple[float, ...]] = None
    source_lang: str = "en"
    target_lang: str = "de"
    tfds_data_dir: Optional[str] = None
    vocab_size: Optional[int] = None
    separate_vocabularies: bool = False
    subword_model: str = "bpe"
    normalize_punctuation: Optional[str] = None
    spm_model: Optional[Tuple[str, ...]] = None
    subword_sampling: float = 0.0
    vocab_sample_pairs: int = 1_000_000
    max_len: int = 64
    batch_tokens: int = 2048
    seed: Optional[int] = 0

    def __post_init__(self):
        if self.spm_model is not None and len(self.spm_model) not in (1, 2):
            raise ValueError(f"spm_model takes one SentencePiece model, or a source's and a "
                             f"target's, not {len(self.spm_model)}")
        if self.subword_model not in SUBWORD_MODELS:
            raise ValueError(f"subword_model must be one of {SUBWORD_MODELS}, "
                             f"got {self.subword_model!r}")
        if self.subword_sampling < 0 or (self.subword_model == "bpe"
                                          and self.subword_sampling >= 1):
            raise ValueError(f"subword_sampling must be in [0, 1) for bpe (a dropout rate) "
                             f"and at least 0 for unigram, got {self.subword_sampling}")
        if self.max_len < 2:
            raise ValueError(f"max_len must be at least 2 (one piece + BOS/EOS), "
                             f"got {self.max_len}")
        if self.batch_tokens < self.max_len:
            raise ValueError(f"batch_tokens={self.batch_tokens} is less than "
                             f"max_len={self.max_len}: a longest pair would not fit in a batch")
        for split, (source, target) in (("train", ("train_src", "train_tgt")),
                                        ("eval", ("eval_src", "eval_tgt"))):
            sources, targets = file_list(getattr(self, source)), file_list(getattr(self, target))
            if sources and targets and len(sources) != len(targets):
                raise ValueError(f"{source} has {len(sources)} files but {target} has "
                                 f"{len(targets)}: give a target file for every source file")
        if self.train_weights is not None:
            corpora = len(file_list(self.train_src))
            if corpora and len(self.train_weights) != corpora:
                raise ValueError(f"train_weights has {len(self.train_weights)} weights for "
                                 f"{corpora} training corpora (train_src's files)")
            if any(not weight > 0 for weight in self.train_weights):
                raise ValueError(f"train_weights must all be positive, got "
                                 f"{','.join(f'{w:g}' for w in self.train_weights)}")

    @property
    def text_files(self) -> Dict[str, List[Tuple[str, str]]]:
        """{"train": [(source, target), ...], "validation": [(source, target)]}: the text
        files as given, a pair per corpus."""
        return {"train": list(zip(file_list(self.train_src), file_list(self.train_tgt))),
                "validation": list(zip(file_list(self.eval_src), file_list(self.eval_tgt)))}


def file_list(paths: Optional[str]) -> List[str]:
    """The files of a comma-separated list."""
    return [path.strip() for path in (paths or "").split(",") if path.strip()]


@dataclasses.dataclass(frozen=True)
class RunConfig:
    """How to train, as opposed to what (TransformerConfig) and on what (DataConfig).

    The defaults are the builtin recipe's (trainer/flagfiles/builtin.cfg): what
    `python -m trainer.task` runs with no flags.

    Attributes:
      model_dir: checkpoints, vocabulary, config.json and TensorBoard summaries; a second
        run on the same directory resumes.
      export_dir: where the SavedModel versions go after training (None: no export).
      train_steps: total optimiser updates; a resumed run stops at the same total.
      precision: one of PRECISIONS, or AUTO_PRECISION: on a CPU the faster of float32
        and mixed_bfloat16, timed on the run's own batches; on GPUs mixed_float16; a
        resumed run keeps the precision its model directory recorded
        (trainer/training/precision.py).
      jit_compile: XLA-compile the forward and backward pass.
      accum_steps: microbatches per update and replica.
      num_cpu_replicas: split the CPU into this many logical devices and mirror over
        them (multi-replica training without GPUs); 0 or 1: one device.
      warmup_steps, learning_rate_scale: the schedule of section 5.3.
      cooldown: decay the schedule's rate linearly to 0 over this last fraction of the
        run, which ends at train_steps or at the end of max_train_minutes, whichever comes
        first (trainer/training/cooldown.py); 0: the schedule as it is (the paper's, as the
        WMT recipes keep it). The default, 0.5, is the builtin recipe's: a short run that
        ends at a small rate gets its last answers right (bench/runs.md).
      dropout_schedule: P_drop over the run, `rate@start,...` (e.g. "0.2@0,0.3@0.4":
        0.2 from the start, 0.3 from 40% of the run on), the progress measured as the
        cooldown's; needs the model's dropout > 0, which it replaces. Recorded in the model
        directory, so a resumed run keeps it (trainer/training/dropout_schedule.py); "":
        the model's fixed dropout.
      eval_every, checkpoint_every, keep_checkpoints, log_every: in updates; validation
        also runs at the end, and eval_every 0 never validates.
      decode: the search of validation BLEU and of the export (section 6.1).
      bleu_sentences: validation sentences translated for BLEU (0: all).
      bleu_tokenize: sacreBLEU's tokenizer for validation BLEU ("13a"; the builtin
        corpus always uses "char").
      max_train_minutes: wall-time budget of this invocation's training loop (0: none);
        when spent, training checkpoints and stops before train_steps, at the next
        multiple of log_every (on every worker: the chief's clock decides).
      average_last: export the mean of the last N checkpoints (section 6.1: 5 for base,
        20 for big; 0: the last checkpoint).
      ema_decay: keep an exponential moving average of the weights in the checkpoint, with
        this decay (e.g. 0.9999; trainer/model_dir/ema.py); 0: none.
      export_weights: what the export ships: "last", "average" (average_last), "ema"
        (ema_decay) or "best" (keep_best); None: "average" when average_last is set, else
        "last".
      seed: initial weights and dropout.
      deterministic: TensorFlow's op determinism (tf.config.experimental
        .enable_op_determinism): with it, a run's weights are bit-identical however often
        it was preempted or killed and resumed (CPU, one replica). Refused with a time
        budget or subword sampling, which make the run depend on the clock or on
        SentencePiece's own generator.
      keep_best: "bleu", "chrf" or "loss": keep the checkpoint with the best validation
        score apart from the rotating ones (trainer/model_dir/best.py), for
        export_weights="best"; None: none.
      early_stopping: stop after this many validations in a row without an improvement of
        at least early_stopping_min_delta in the keep_best metric (BLEU without one), then
        export; 0: never. Resuming keeps the best score and the count.
      early_stopping_min_delta: the smallest change that counts as an improvement.
      force_unlock: take over the model directory's lock even when another host's trainer
        holds it (trainer/model_dir/lock.py; that trainer must be gone).
      init_from: another model directory (a trained or a converted one) whose newest
        checkpoint's weights a new run starts from, with that model's vocabulary and
        architecture and a fresh optimizer and schedule (fine-tuning); None: random
        weights. A run that resumes from its own checkpoint ignores it.
    """

    model_dir: str
    export_dir: Optional[str] = None
    train_steps: int = 1000
    precision: str = AUTO_PRECISION
    jit_compile: bool = False
    accum_steps: int = 1
    num_cpu_replicas: int = 0
    warmup_steps: int = 400
    learning_rate_scale: float = 1.0
    cooldown: float = 0.5
    dropout_schedule: str = ""
    eval_every: int = 1000
    checkpoint_every: int = 250
    keep_checkpoints: int = 5
    log_every: int = 10
    decode: DecodeConfig = TRAINED_DECODE
    bleu_sentences: int = 0
    bleu_tokenize: str = "13a"
    max_train_minutes: float = 0.0
    average_last: int = 0
    init_from: Optional[str] = None
    force_unlock: bool = False
    keep_best: Optional[str] = None
    early_stopping: int = 0
    early_stopping_min_delta: float = 0.0
    ema_decay: float = 0.0
    export_weights: Optional[str] = None
    seed: int = 0
    deterministic: bool = False

    def __post_init__(self):
        if self.deterministic and self.max_train_minutes:
            raise ValueError("deterministic needs a run bounded by its steps: a time budget "
                             "(max_train_minutes) makes the steps trained depend on the clock")
        if self.precision not in (AUTO_PRECISION, *PRECISIONS):
            raise ValueError(f"precision must be {AUTO_PRECISION} or one of {PRECISIONS}, "
                             f"got {self.precision!r}")
        for name in ("train_steps", "accum_steps", "checkpoint_every", "keep_checkpoints",
                     "log_every"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be at least 1, got {getattr(self, name)}")
        for name in ("num_cpu_replicas", "eval_every", "bleu_sentences", "max_train_minutes",
                     "average_last"):
            if getattr(self, name) < 0:
                raise ValueError(f"{name} must not be negative, got {getattr(self, name)}")
        if not 0.0 <= self.cooldown <= 1.0:
            raise ValueError(f"cooldown must be in [0, 1], got {self.cooldown}")
        if self.dropout_schedule:
            DropoutSchedule.parse(self.dropout_schedule)  # ValueError in one line
        if not 0.0 <= self.ema_decay < 1.0:
            raise ValueError(f"ema_decay must be in [0, 1), got {self.ema_decay}")
        if self.export_weights not in (None, "last", "average", "ema", "best"):
            raise ValueError("export_weights must be last, average, ema or best, got "
                             f"{self.export_weights!r}")
        if self.keep_best not in (None, "bleu", "chrf", "loss"):
            raise ValueError(f"keep_best must be bleu, chrf or loss, got {self.keep_best!r}")
        if self.export_weights == "best" and not self.keep_best:
            raise ValueError("export_weights=best needs keep_best (the metric to rank by)")
        if (self.keep_best or self.early_stopping) and not self.eval_every:
            raise ValueError("keep_best and early_stopping need validations: set eval_every")
        if self.early_stopping < 0 or self.early_stopping_min_delta < 0:
            raise ValueError("early_stopping and early_stopping_min_delta must not be negative")
        if self.export_weights == "ema" and not self.ema_decay:
            raise ValueError("export_weights=ema needs a moving average: set ema_decay")
        if self.export_weights == "average" and not self.average_last:
            raise ValueError("export_weights=average needs average_last (checkpoints to average)")


def default_run_name(preset: str, data_config: DataConfig) -> str:
    """<preset>_<data>: the name of a run's default model and export directories, e.g.
    "small_multi30k" for text files in a multi30k directory."""
    if data_config.train_src:
        first = file_list(data_config.train_src)[0]
        data = os.path.basename(os.path.dirname(os.path.abspath(first))) or "files"
    else:
        data = (data_config.dataset or "builtin").replace("tfds:", "").replace("/", "-")
    return f"{preset}_{data}"
