"""The input pipeline: sentence pairs -> subword ids -> length-bucketed batches, in tf.data.

Each pair becomes three int32 sequences (pad id 0, section 3 of the paper feeds
the decoder its own output shifted right):

    source_ids        = pieces(source) + [EOS]
    target_output_ids = pieces(target) + [EOS]
    target_input_ids  = shift_right(target_output_ids) = [BOS] + pieces(target)

and batches have the structure the model and trainer use:

    ((source_ids [batch, length], target_input_ids [batch, length]),
     target_output_ids [batch, length])

Pairs with an empty side are skipped and pairs with a side longer than
`max_len` positions are dropped; both are counted (`count_split`), never lost
silently. Batching follows section 5.1 ("sentence pairs were batched together by
approximate sequence length"): a pair goes to the smallest bucket length L that
holds both sides, both sides are padded to L, and a bucket's batch size is
batch_tokens // L, so no batch holds more than `batch_tokens` source or target
positions, padding included. The bucket lengths are a small fixed set, so a
compiled (XLA) step sees few shapes.

`batch_tokens` is per replica: the paper's ~25,000 source + 25,000 target tokens
per step over 8 GPUs is about batch_tokens=4096 padded positions per GPU.
"""

import dataclasses
import hashlib
import json
import os
from typing import Dict, List, Optional, Sequence, Tuple, Union

import tensorflow as tf

from keras_transformer import shift_right
from keras_transformer.special_ids import EOS_ID, PAD_ID
from trainer.model_dir import files
from trainer.config import DataConfig
from trainer.data import shuffling, sources as sources_lib
from trainer.data import tokenizer as tokenizer_lib, vocabulary
from trainer.data.sources import DataError

# Bucket lengths grow by this factor (rounded up to a multiple of 8): at most
# ~30% padding per bucket, 11 shapes for max_len=256.
_BUCKET_GROWTH = 1.3
_TOKENIZE_BATCH = 1024


def bucket_lengths(max_len: int) -> List[int]:
    """The padded lengths batches can have: 8, 16, 24, 32, 48, 64, ... up to max_len."""
    lengths = [min(8, max_len)]
    while lengths[-1] < max_len:
        grown = max(lengths[-1] + 8, -(-int(lengths[-1] * _BUCKET_GROWTH) // 8) * 8)
        lengths.append(min(grown, max_len))
    return lengths


def bucket_batch_sizes(max_len: int, batch_tokens: int) -> List[int]:
    """Pairs per batch for each of `bucket_lengths(max_len)`: batch_tokens // length."""
    return [batch_tokens // length for length in bucket_lengths(max_len)]


def _fits(max_len: int, source_length, target_length):
    """Whether sequences of these lengths (EOS included; BOS + pieces is as long as
    pieces + EOS) fit `max_len` positions."""
    return (source_length <= max_len) & (target_length <= max_len)


def _encode(tokenizers: tokenizer_lib.Tokenizers, source: tf.Tensor, target: tf.Tensor,
            sampling: float = 0.0):
    """Pieces + EOS of a batch of pairs (segmentations sampled with `sampling` > 0, see
    `Tokenizer.tokenize`).

    source, target: tf.string [batch] -> (source_ids, target_output_ids), int32
    RaggedTensors [batch, (length)].
    """
    batch = tf.shape(source)[:1]
    eos = tf.RaggedTensor.from_tensor(tf.fill(tf.concat([batch, [1]], 0), EOS_ID))
    return (tf.concat([tokenizers.source_ids(source, sampling), eos], axis=1),
            tf.concat([tokenizers.target.tokenize(target, sampling), eos], axis=1))


def examples(pairs: tf.data.Dataset, tokenizers: tokenizer_lib.Tokenizers,
             max_len: int, sampling: float = 0.0) -> tf.data.Dataset:
    """Tokenized examples: (source_ids, target_output_ids), int32 [(length)] each.

    Empty pairs are skipped and too long ones dropped, as `count_split` counts them
    (with `sampling`, the subword regularization of training, a pair's length varies
    from one reading to the next, and so may whether it fits).
    All of it runs vectorized on batches of pairs, in parallel, which are then
    unbatched: a tf.data function call per pair costs more than tokenizing the pair.
    The order is kept (the batches are equal work, so in-order costs little), so a
    seeded training stream is reproducible.
    The elements are rows of ragged batches (RaggedTensorSpec of rank 1).
    """

    @tf.autograph.experimental.do_not_convert
    def encode_batch(source, target):  # tf.string [batch] each
        nonempty = sources_lib.is_nonempty(source, target)
        sequences = _encode(tokenizers, tf.boolean_mask(source, nonempty),
                            tf.boolean_mask(target, nonempty), sampling)
        fits = _fits(max_len, *(ids.row_lengths() for ids in sequences))
        return tuple(tf.ragged.boolean_mask(ids, fits) for ids in sequences)

    return (pairs.batch(_TOKENIZE_BATCH)
            .map(encode_batch, num_parallel_calls=tf.data.AUTOTUNE, deterministic=True)
            .unbatch())


def batches(examples_dataset: tf.data.Dataset, config: DataConfig,
            drop_remainder: bool) -> tf.data.Dataset:
    """Length-bucketed, padded batches ((source_ids, target_input_ids), target_output_ids).

    Each of the three is int32 [batch, L] with L in `bucket_lengths(config.max_len)`
    and batch <= config.batch_tokens // L. drop_remainder drops each bucket's last
    partial batch (only for endless input, where nothing is lost).
    """
    lengths = tf.constant(bucket_lengths(config.max_len), tf.int64)
    batch_sizes = tf.constant(bucket_batch_sizes(config.max_len, config.batch_tokens), tf.int64)

    # The one function tf.data calls per pair; everything else runs per batch.
    @tf.autograph.experimental.do_not_convert
    def bucket(source, target_output):
        length = tf.maximum(tf.size(source, tf.int64), tf.size(target_output, tf.int64))
        # The index of the smallest bucket length >= length.
        return tf.searchsorted(lengths, length[None], out_type=tf.int64)[0]

    def pad(length, sequences):  # [batch, (length)] -> [batch, length]
        return sequences.to_tensor(PAD_ID, shape=tf.stack([sequences.nrows(), length]))

    def model_inputs(length, source, target_output):
        target_output_ids = pad(length, target_output)
        return (pad(length, source), shift_right(target_output_ids)), target_output_ids

    @tf.autograph.experimental.do_not_convert
    def batch_bucket(key, window):
        return window.batch(batch_sizes[key], drop_remainder).map(
            tf.autograph.experimental.do_not_convert(
                lambda source, target_output: model_inputs(lengths[key], source, target_output)))

    @tf.autograph.experimental.do_not_convert
    def batch_size(key):
        return batch_sizes[key]

    return examples_dataset.group_by_window(bucket, batch_bucket, window_size_func=batch_size)


def train_dataset(pairs: Union[tf.data.Dataset, Sequence[tf.data.Dataset]],
                  tokenizers: tokenizer_lib.Tokenizers, config: DataConfig,
                  input_context: Optional[tf.distribute.InputContext] = None,
                  num_epochs: Optional[int] = None,
                  weights: Optional[Sequence[float]] = None) -> tf.data.Dataset:
    """Shuffled, repeated, prefetched training batches for one replica.

    `pairs` is one corpus, or several that are mixed: each is read into memory and
    shuffled on its own, every epoch in a permutation of its own
    (`trainer.data.shuffling`), and every pair is drawn from corpus i with probability
    weights[i] / sum (tf.data's sample_from_datasets, seeded).
    With an input_context, this input pipeline reads only its shard of the pairs.
    num_epochs=None repeats forever (every batch full); a finite number of epochs
    keeps the last partial batches, so each kept pair appears once per epoch (of one
    corpus). With config.seed set, every run yields the same batches in the same order,
    unless config.subword_sampling draws the pairs' segmentations (SentencePiece's own
    generator): then the same pairs in the same order.
    """
    corpora = [pairs] if isinstance(pairs, tf.data.Dataset) else list(pairs)

    def shuffled(index, corpus):
        if input_context is not None and input_context.num_input_pipelines > 1:
            corpus = corpus.shard(input_context.num_input_pipelines,
                                  input_context.input_pipeline_id)
        seed = None if config.seed is None else config.seed + index
        return shuffling.shuffled(corpus, seed, num_epochs)

    streams = [shuffled(index, corpus) for index, corpus in enumerate(corpora)]
    if len(streams) == 1:
        mixed = streams[0]
    else:
        weights = [1.0] * len(streams) if weights is None else list(weights)
        mixed = tf.data.Dataset.sample_from_datasets(
            streams, [w / sum(weights) for w in weights], seed=config.seed)
    dataset = batches(examples(mixed, tokenizers, config.max_len, config.subword_sampling),
                      config, drop_remainder=num_epochs is None)
    return dataset.prefetch(tf.data.AUTOTUNE)


def eval_dataset(pairs: tf.data.Dataset, tokenizers: tokenizer_lib.Tokenizers,
                 config: DataConfig,
                 input_context: Optional[tf.distribute.InputContext] = None) -> tf.data.Dataset:
    """One deterministic pass of batches over the pairs (partial batches kept)."""
    if input_context is not None and input_context.num_input_pipelines > 1:
        pairs = pairs.shard(input_context.num_input_pipelines, input_context.input_pipeline_id)
    dataset = batches(examples(pairs, tokenizers, config.max_len),
                      config, drop_remainder=False)
    return dataset.prefetch(tf.data.AUTOTUNE)


@dataclasses.dataclass(frozen=True)
class SplitCounts:
    """What became of a split's pairs: read = empty + too_long + kept."""

    read: int
    empty: int
    too_long: int

    @property
    def kept(self) -> int:
        return self.read - self.empty - self.too_long

    def __add__(self, other: "SplitCounts") -> "SplitCounts":
        return SplitCounts(self.read + other.read, self.empty + other.empty,
                           self.too_long + other.too_long)

    def __str__(self):
        return (f"{self.read} pairs read, {self.empty} empty skipped, "
                f"{self.too_long} too long dropped")


def count_split(pairs: tf.data.Dataset, tokenizers: tokenizer_lib.Tokenizers,
                max_len: int) -> SplitCounts:
    """Counts read, empty and too long pairs with the pipeline's own predicates (one pass)."""

    @tf.autograph.experimental.do_not_convert
    def count_batch(source, target):
        nonempty = sources_lib.is_nonempty(source, target)  # [batch]
        fits = _fits(max_len, *(ids.row_lengths() for ids in _encode(tokenizers, source, target)))
        return tf.stack([tf.size(source, tf.int64),
                         tf.reduce_sum(tf.cast(~nonempty, tf.int64)),
                         tf.reduce_sum(tf.cast(nonempty & ~fits, tf.int64))])

    totals = (pairs.batch(_TOKENIZE_BATCH)
              .map(count_batch, num_parallel_calls=tf.data.AUTOTUNE, deterministic=False)
              .reduce(tf.zeros([3], tf.int64), tf.autograph.experimental.do_not_convert(
                  lambda total, counts: total + counts)))
    read, empty, too_long = (int(n) for n in totals.numpy())
    return SplitCounts(read, empty, too_long)


COUNTS_FILE = "data_counts.json"


def cached_counts(corpus: sources_lib.Corpus, tokenizers: tokenizer_lib.Tokenizers,
                  max_len: int, model_dir: str) -> SplitCounts:
    """`count_split` of a corpus, remembered in <model_dir>/data_counts.json under a key
    of the corpus' key (its files' sizes and modification times), the vocabulary's bytes
    and max_len: a resumed run does not tokenize the corpus again to count it."""
    vocabularies = {tokenizers.source.model_proto, tokenizers.target.model_proto}
    key = hashlib.sha256(json.dumps(
        [corpus.key, max_len, sorted(hashlib.sha256(v).hexdigest() for v in vocabularies)]
    ).encode()).hexdigest()
    path = os.path.join(model_dir, COUNTS_FILE)
    cache = {}
    if tf.io.gfile.exists(path):
        try:
            with tf.io.gfile.GFile(path) as f:
                cache = json.load(f)
        except ValueError:  # a damaged cache is only lost time: count again, rewrite it
            cache = {}
    if key in cache:
        return SplitCounts(**cache[key]["counts"])
    counts = count_split(corpus.pairs, tokenizers, max_len)
    cache[key] = {"corpus": corpus.name, "counts": dataclasses.asdict(counts)}
    files.write_atomically(path, json.dumps(cache, indent=1))  # other workers may read it
    return counts


@dataclasses.dataclass(frozen=True)
class Data:
    """Everything the trainer needs from the data, built by `build`."""

    source: sources_lib.Source
    tokenizers: tokenizer_lib.Tokenizers
    config: DataConfig
    eval_split: str
    counts: Dict[str, SplitCounts]
    train_corpora: Dict[str, SplitCounts]  # corpus name -> counts, when there are several

    @property
    def train_weights(self) -> List[float]:
        """Each training corpus' share of the training pairs (summing to 1):
        config.train_weights, else in proportion to the pairs kept."""
        weights = (self.config.train_weights
                   or [counts.kept for counts in self.train_corpora.values()] or [1.0])
        return [weight / sum(weights) for weight in weights]

    @property
    def report(self) -> str:
        """One line, e.g. "train: 29000 pairs read, 0 empty skipped, 3 too long dropped; ..."."""
        parts = [f"{split}: {counts}" for split, counts in self.counts.items()]
        parts[1:1] = [f"train corpus {name} (weight {weight:.3g}): {counts}"
                      for (name, counts), weight in zip(self.train_corpora.items(),
                                                        self.train_weights)]
        return "; ".join(parts)

    def train_dataset(self, input_context: Optional[tf.distribute.InputContext] = None,
                      num_epochs: Optional[int] = None) -> tf.data.Dataset:
        """Training batches for one replica; see `train_dataset`."""
        corpora = [corpus.pairs for corpus in self.source.corpora("train")]
        return train_dataset(corpora, self.tokenizers, self.config, input_context, num_epochs,
                             self.train_weights)

    def eval_dataset(self, input_context: Optional[tf.distribute.InputContext] = None
                     ) -> tf.data.Dataset:
        """One pass of evaluation batches; see `eval_dataset`."""
        return eval_dataset(self.source.pairs(self.eval_split), self.tokenizers, self.config,
                            input_context)

    def eval_texts(self) -> Tuple[List[str], List[str]]:
        """The non-empty evaluation pairs as text (sources, references), e.g. for BLEU."""
        return self.source.texts(self.eval_split)


def build(source: sources_lib.Source, model_dir: str, config: DataConfig = DataConfig(),
          eval_split: str = "validation") -> Data:
    """Loads or trains the vocabulary and counts the data, ready for training.

    Args:
      source: where the pairs come from (see `trainer.data.sources.select`).
      model_dir: where the SentencePiece model(s) live (loaded if present), and the
        training split's counts (`cached_counts`).
      config: the vocabulary (vocab_size, separate_vocabularies, subword_model,
        vocab_sample_pairs), the batching (max_len, batch_tokens, shuffling) and the
        training corpora's weights.
      eval_split: the split evaluated during training.

    Raises:
      DataError: the source lacks a split, train_weights do not match its training
        corpora, or no training pair is left (in the split, or in one of its corpora).
    """
    for split in ("train", eval_split):
        if split not in source.splits:
            raise DataError(f"{source.description} has no split {split!r}; it has {source.splits}")
    corpora = source.corpora("train")
    if config.train_weights is not None and len(config.train_weights) != len(corpora):
        raise DataError(f"{len(config.train_weights)} train_weights for {len(corpora)} "
                        "training corpora")
    if config.spm_model:
        vocabulary.adopt(config.spm_model, model_dir)
    tokenizers = vocabulary.load_or_train(
        model_dir, lambda: source.texts("train", config.vocab_sample_pairs),
        vocab_size=config.vocab_size,
        separate=config.separate_vocabularies or len(config.spm_model or ()) == 2,
        model_type=config.subword_model, default_size=source.vocab_size,
        normalize_punctuation=config.normalize_punctuation)
    train = [cached_counts(corpus, tokenizers, config.max_len, model_dir) for corpus in corpora]
    counts = {"train": sum(train[1:], train[0]),
              eval_split: count_split(source.pairs(eval_split), tokenizers, config.max_len)}
    if counts["train"].kept == 0:
        raise DataError(f"no training pair left: train: {counts['train']} "
                        f"(max_len={config.max_len})")
    train_corpora = ({corpus.name: c for corpus, c in zip(corpora, train)}
                     if len(corpora) > 1 else {})
    for name, corpus_counts in train_corpora.items():
        if corpus_counts.kept == 0:
            raise DataError(f"no training pair left in {name}: {corpus_counts} "
                            f"(max_len={config.max_len})")
    return Data(source, tokenizers, config, eval_split, counts, train_corpora)
