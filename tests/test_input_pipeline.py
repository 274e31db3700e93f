"""The input pipeline: batches within the token budget, every pair once per epoch, nothing lost
silently."""

import collections
import dataclasses
import gzip
import itertools
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import tensorflow as tf
import tensorflow_datasets as tfds

from keras_transformer.special_ids import BOS_ID, EOS_ID, PAD_ID
from trainer.config import DataConfig
from trainer.data import input_pipeline, sources, vocabulary
from trainer.data.sources import DataError

from conftest import REPO, require_multi30k

PAIRS = 4000  # Multi30k training pairs used here, to stay fast.


def head(path: Path, n: int) -> bytes:
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rb") as f:
        return b"".join(itertools.islice(f, n))


@pytest.fixture(scope="module")
def multi30k(tmp_path_factory):
    """Source over the first PAIRS training pairs of Multi30k (gzip, as the shared copy)."""
    multi30k = require_multi30k("train.en.gz", "train.de.gz", "val.en", "val.de")
    directory = tmp_path_factory.mktemp("multi30k_head")
    files = {}
    for language in ("en", "de"):
        path = directory / f"train.{language}.gz"
        path.write_bytes(gzip.compress(head(multi30k / f"train.{language}.gz", PAIRS)))
        files[language] = str(path)
    return sources.ParallelFiles({
        "train": (files["en"], files["de"]),
        "validation": (str(multi30k / "val.en"), str(multi30k / "val.de"))})


@pytest.fixture(scope="module")
def tokenizers(tmp_path_factory, multi30k):
    model_dir = str(tmp_path_factory.mktemp("vocab"))
    return vocabulary.load_or_train(model_dir, lambda: multi30k.texts("train"), vocab_size=2000)


def text_pairs(source: sources.Source, split: str):
    return [(s.decode(), t.decode()) for s, t in source.pairs(split).as_numpy_iterator()]


def decoded_pairs(dataset, tokenizers):
    """(source text, target text) of every example of every batch."""
    pairs = []
    for (source_ids, _), target_output_ids in dataset:
        sources_text = tokenizers.source.detokenize(source_ids).numpy()
        targets_text = tokenizers.target.detokenize(target_output_ids).numpy()
        pairs.extend((s.decode(), t.decode()) for s, t in zip(sources_text, targets_text))
    return pairs


@pytest.mark.slow
def test_no_batch_exceeds_the_token_budget(multi30k, tokenizers):
    config = DataConfig(max_len=64, batch_tokens=1000, seed=1)
    lengths = input_pipeline.bucket_lengths(config.max_len)
    shapes = set()
    for (source_ids, target_input_ids), target_output_ids in input_pipeline.train_dataset(
            multi30k.pairs("train"), tokenizers, config).take(300):
        batch, length = source_ids.shape
        assert target_input_ids.shape == target_output_ids.shape == (batch, length)
        assert length in lengths
        assert batch * length <= config.batch_tokens
        # Batches are full and padded to the bucket, not to the longest pair.
        assert batch == config.batch_tokens // length
        shapes.add((batch, length))
    assert 3 <= len(shapes) <= len(lengths)


@pytest.mark.slow
def test_every_pair_appears_exactly_once_per_epoch(multi30k, tokenizers):
    config = DataConfig(max_len=128, batch_tokens=2048, seed=7)
    expected = collections.Counter(text_pairs(multi30k, "train"))
    assert len(expected) > 0.99 * PAIRS
    one_epoch = input_pipeline.train_dataset(multi30k.pairs("train"), tokenizers, config,
                                             num_epochs=1)
    assert collections.Counter(decoded_pairs(one_epoch, tokenizers)) == expected
    two_epochs = input_pipeline.train_dataset(multi30k.pairs("train"), tokenizers, config,
                                              num_epochs=2)
    first, second = [], []
    seen = collections.Counter()
    for pair in decoded_pairs(two_epochs, tokenizers):
        seen[pair] += 1
        (first if seen[pair] == 1 else second).append(pair)
    assert seen == collections.Counter({pair: 2 * n for pair, n in expected.items()})
    assert first[:100] != second[:100]  # reshuffled each epoch


@pytest.mark.slow
def test_the_streams_saved_state_is_its_position_not_its_pairs(multi30k, tokenizers, tmp_path):
    """A checkpoint of the training stream costs the same for a corpus ten times larger,
    under 1 MB: each epoch's order is drawn from the seed and the epoch
    (trainer/data/shuffling.py), so the state holds the position and the batches in
    flight, not pairs waiting in a buffer (MBs here)."""
    config = DataConfig(max_len=64, batch_tokens=1024, seed=1)

    def state_bytes(pairs, name):
        iterator = iter(input_pipeline.train_dataset(pairs, tokenizers, config))
        for _ in range(5):
            next(iterator)
        tf.train.Checkpoint(iterator=iterator).write(str(tmp_path / name / "ckpt"))
        return sum(path.stat().st_size for path in (tmp_path / name).iterdir())

    small = state_bytes(multi30k.pairs("train"), "small")
    large = state_bytes(multi30k.pairs("train").repeat(10), "large")
    assert small < 1e6 and large < 1e6 and large < 2 * small, (small, large)


@pytest.mark.slow
def test_a_seed_fixes_the_training_stream(multi30k, tokenizers):
    def first_batches(seed):
        config = DataConfig(max_len=64, batch_tokens=1024, seed=seed)
        dataset = input_pipeline.train_dataset(multi30k.pairs("train"), tokenizers, config)
        return [batch[1].numpy() for batch in dataset.take(20)]

    same, again, other = first_batches(5), first_batches(5), first_batches(6)
    assert all(a.shape == b.shape and (a == b).all() for a, b in zip(same, again))
    assert any(a.shape != b.shape or (a != b).any() for a, b in zip(same, other))


@pytest.mark.slow
def test_subword_sampling_resegments_training_pairs_and_leaves_validation_alone(multi30k,
                                                                                 tokenizers):
    sampled = DataConfig(max_len=128, batch_tokens=2048, seed=7, subword_sampling=0.1)
    plain = dataclasses.replace(sampled, subword_sampling=0.0)

    def epoch(config):
        return input_pipeline.train_dataset(multi30k.pairs("train"), tokenizers, config,
                                            num_epochs=1)

    def target_tokens(dataset):
        return sum(int(tf.math.count_nonzero(target_output_ids))
                   for _, target_output_ids in dataset)

    # The same pairs, each once, in more (BPE-dropout: shorter) pieces than without.
    assert (collections.Counter(decoded_pairs(epoch(sampled), tokenizers))
            == collections.Counter(decoded_pairs(epoch(plain), tokenizers)))
    assert target_tokens(epoch(sampled)) > 1.05 * target_tokens(epoch(plain))
    validation = [input_pipeline.eval_dataset(multi30k.pairs("validation"), tokenizers, config)
                  for config in (sampled, plain)]
    assert all((a[1].numpy() == b[1].numpy()).all() for a, b in zip(*validation))
    with pytest.raises(ValueError, match="subword_sampling must be in"):
        DataConfig(subword_sampling=1.0)  # a BPE-dropout rate of 1 leaves only characters
    with pytest.raises(ValueError, match="subword_sampling must be in"):
        DataConfig(subword_sampling=-0.1, subword_model="unigram")


def test_decoder_input_is_the_target_shifted_right(multi30k, tokenizers):
    config = DataConfig(max_len=64, batch_tokens=1024)
    batch = next(iter(input_pipeline.eval_dataset(multi30k.pairs("validation"), tokenizers,
                                                  config)))
    (source_ids, target_input_ids), target_output_ids = batch
    assert source_ids.dtype == target_input_ids.dtype == target_output_ids.dtype == tf.int32
    for source, target_input, target_output in zip(source_ids.numpy(), target_input_ids.numpy(),
                                                   target_output_ids.numpy()):
        source = source[source != PAD_ID]
        target_input = target_input[target_input != PAD_ID]
        target_output = target_output[target_output != PAD_ID]
        assert source[-1] == EOS_ID and EOS_ID not in source[:-1] and BOS_ID not in source
        assert target_input[0] == BOS_ID and EOS_ID not in target_input
        assert target_output[-1] == EOS_ID and BOS_ID not in target_output
        assert list(target_input[1:]) == list(target_output[:-1])
    # Padding only at the end: the non-pad tokens are a prefix.
    lengths = tf.reduce_sum(tf.cast(source_ids != PAD_ID, tf.int32), axis=1)
    prefix = tf.sequence_mask(lengths, tf.shape(source_ids)[1])
    assert tf.reduce_all(prefix == (source_ids != PAD_ID))


@pytest.mark.slow
def test_eval_is_one_deterministic_pass_over_every_pair(multi30k, tokenizers):
    config = DataConfig(max_len=256, batch_tokens=2048)
    first = decoded_pairs(input_pipeline.eval_dataset(multi30k.pairs("validation"), tokenizers,
                                                      config), tokenizers)
    second = decoded_pairs(input_pipeline.eval_dataset(multi30k.pairs("validation"), tokenizers,
                                                       config), tokenizers)
    assert first == second
    assert collections.Counter(first) == collections.Counter(text_pairs(multi30k, "validation"))


def test_too_long_pairs_are_dropped_and_counted(multi30k, tokenizers):
    config = DataConfig(max_len=16, batch_tokens=512)
    pairs = text_pairs(multi30k, "validation")
    source_lengths = tokenizers.source.tokenize([s for s, _ in pairs]).row_lengths() + 1
    target_lengths = tokenizers.target.tokenize([t for _, t in pairs]).row_lengths() + 1
    fits = (source_lengths <= 16) & (target_lengths <= 16)
    kept = [pair for pair, ok in zip(pairs, fits.numpy()) if ok]
    assert 0 < len(kept) < len(pairs)

    counts = input_pipeline.count_split(multi30k.pairs("validation"), tokenizers, config.max_len)
    assert counts == input_pipeline.SplitCounts(len(pairs), 0, len(pairs) - len(kept))
    batches = list(input_pipeline.eval_dataset(multi30k.pairs("validation"), tokenizers, config))
    assert all(batch[1].shape[1] <= 16 for batch in batches)
    assert collections.Counter(decoded_pairs(batches, tokenizers)) == collections.Counter(kept)


def test_empty_lines_are_skipped_and_counted(tmp_path, tokenizers):
    en = "A dog.\n\n   \nTwo cats.\nA bird.\n\nA fish.\n"
    de = "Ein Hund.\nEine Katze?\n\nZwei Katzen.\n\t\n\nEin Fisch.\n"
    (tmp_path / "t.en").write_text(en, encoding="utf-8")
    (tmp_path / "t.de").write_text(de, encoding="utf-8")
    source = sources.ParallelFiles({"train": (str(tmp_path / "t.en"), str(tmp_path / "t.de"))})
    counts = input_pipeline.count_split(source.pairs("train"), tokenizers, max_len=64)
    assert str(counts) == "7 pairs read, 4 empty skipped, 0 too long dropped"
    config = DataConfig(max_len=64, batch_tokens=256)
    assert sorted(decoded_pairs(input_pipeline.eval_dataset(source.pairs("train"), tokenizers,
                                                            config), tokenizers)) == [
        ("A dog.", "Ein Hund."), ("A fish.", "Ein Fisch."), ("Two cats.", "Zwei Katzen.")]


@pytest.mark.slow
def test_build_reports_and_rejects_bad_input_before_training(tmp_path, multi30k):
    data = input_pipeline.build(multi30k, str(tmp_path / "model"),
                                DataConfig(max_len=24, batch_tokens=512, vocab_size=1500))
    assert (tmp_path / "model" / "spm.model").exists()
    train, validation = data.counts["train"], data.counts["validation"]
    assert data.report == (f"train: {PAIRS} pairs read, 0 empty skipped, {train.too_long} too long "
                           f"dropped; validation: 1014 pairs read, 0 empty skipped, "
                           f"{validation.too_long} too long dropped")
    assert train.too_long > 0
    assert data.eval_texts()[0][:2] == [p[0] for p in text_pairs(multi30k, "validation")[:2]]

    with pytest.raises(ValueError, match="batch_tokens=100 is less than max_len=128"):
        DataConfig(max_len=128, batch_tokens=100)
    with pytest.raises(DataError, match="no training pair left"):
        input_pipeline.build(multi30k, str(tmp_path / "model"),
                             DataConfig(max_len=2, batch_tokens=64))
    with pytest.raises(DataError, match="no split 'test'"):
        input_pipeline.build(multi30k, str(tmp_path / "model"), eval_split="test")


def test_bucket_lengths_are_few_and_cover_max_len():
    for max_len in (8, 50, 256, 1024):
        lengths = input_pipeline.bucket_lengths(max_len)
        assert lengths[-1] == max_len and lengths == sorted(set(lengths))
        assert all(length % 8 == 0 for length in lengths[:-1])
        # Consecutive lengths grow by at most ~30% (bounded padding) beyond the first few.
        assert all(b <= max(a + 8, 1.3 * a + 8) for a, b in zip(lengths, lengths[1:]))
    assert len(input_pipeline.bucket_lengths(256)) == 11
    assert input_pipeline.bucket_batch_sizes(256, 4096)[-1] == 16


@pytest.mark.slow
def test_input_pipelines_read_disjoint_shards(multi30k, tokenizers):
    config = DataConfig(max_len=128, batch_tokens=2048, seed=3)
    shards = []
    for pipeline_id in range(2):
        context = tf.distribute.InputContext(num_input_pipelines=2, input_pipeline_id=pipeline_id,
                                             num_replicas_in_sync=2)
        shards.append(collections.Counter(decoded_pairs(
            input_pipeline.train_dataset(multi30k.pairs("train"), tokenizers, config, context,
                                         num_epochs=1), tokenizers)))
    assert abs(sum(shards[0].values()) - sum(shards[1].values())) <= 1
    assert shards[0] + shards[1] == collections.Counter(text_pairs(multi30k, "train"))


@pytest.mark.slow
def test_tfds_translation_builder_with_mock_data(tmp_path):
    with tfds.testing.mock_data(num_examples=40):
        source = sources.select(DataConfig(dataset="tfds:wmt14_translate/de-en"))
        data = input_pipeline.build(source, str(tmp_path), DataConfig(max_len=64,
                                                                          batch_tokens=512))
        assert data.report.startswith("train: 40 pairs read, 0 empty skipped")
        expected = collections.Counter(
            # Mock sentences have runs of spaces, which SentencePiece collapses.
            (" ".join(s.split()), " ".join(t.split()))
            for s, t in text_pairs(source, "train"))
        assert collections.Counter(decoded_pairs(data.train_dataset(num_epochs=1),
                                                 data.tokenizers)) == expected


_MIRRORED = """
import sys
import tensorflow as tf
cpu = tf.config.list_physical_devices("CPU")[0]
tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * 2)
from trainer.config import DataConfig
from trainer.data import input_pipeline, sources
config = DataConfig(max_len=48, batch_tokens=480, seed=0)
source = sources.select(config, builtin_train_size=2000, builtin_eval_size=10)
data = input_pipeline.build(source, sys.argv[1], config)
from trainer.training.stream import TrainingStream
strategy = tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"])
stream = TrainingStream(strategy, data, sys.argv[1], keep=1, batches_per_step=1,
                        log=lambda line: None)
for _ in range(5):
    (source_ids, _), _ = stream.next()
    for replica in strategy.experimental_local_results(source_ids):
        batch, length = replica.shape
        assert batch * length <= 480 and batch == 480 // length, replica.shape
        print(replica.device, batch, length)
"""


@pytest.mark.slow
def test_mirrored_strategy_gets_one_budgeted_batch_per_replica(tmp_path):
    result = subprocess.run([sys.executable, "-c", _MIRRORED, str(tmp_path)], cwd=REPO,
                            capture_output=True, text=True, timeout=300,
                            env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2"})
    assert result.returncode == 0, result.stderr[-3000:]
    devices = [line.split()[0] for line in result.stdout.splitlines()]
    assert len(devices) == 10 and {d.rsplit(":", 1)[-1] for d in devices} == {"0", "1"}


def test_training_counts_are_cached_in_the_model_dir_until_the_files_change(tmp_path):
    """A resumed run reads the training split's counts from data_counts.json instead of
    tokenizing the corpus again; new file contents (size, mtime) are counted again."""
    en, de = tmp_path / "t.en", tmp_path / "t.de"
    en.write_text("A dog.\nTwo cats.\n\nA bird.\n")
    de.write_text("Ein Hund.\nZwei Katzen.\nLeer.\nEin Vogel.\n")
    source = sources.ParallelFiles({"train": (str(en), str(de)),
                                    "validation": (str(en), str(de))})
    model_dir = tmp_path / "model"
    config = DataConfig(max_len=64, batch_tokens=256)
    assert str(input_pipeline.build(source, str(model_dir), config).counts["train"]) == (
        "4 pairs read, 1 empty skipped, 0 too long dropped")
    cache_file = model_dir / input_pipeline.COUNTS_FILE
    cache = json.loads(cache_file.read_text())
    (entry,) = cache.values()
    # What is cached is what is reported: a doctored entry shows that it is read.
    entry["counts"]["read"] = 5
    cache_file.write_text(json.dumps(cache))
    assert input_pipeline.build(source, str(model_dir), config).counts["train"].read == 5
    # Another max_len is another key: counted anew.
    assert input_pipeline.build(source, str(model_dir), dataclasses.replace(
        config, max_len=32)).counts["train"].read == 4
    en.write_text("A dog.\nTwo cats.\nA fish.\nA bird.\nA cow.\n")
    de.write_text("Ein Hund.\nZwei Katzen.\nEin Fisch.\nEin Vogel.\nEine Kuh.\n")
    changed = sources.ParallelFiles({"train": (str(en), str(de)),
                                     "validation": (str(en), str(de))})
    assert str(input_pipeline.build(changed, str(model_dir), config).counts["train"]) == (
        "5 pairs read, 0 empty skipped, 0 too long dropped")
