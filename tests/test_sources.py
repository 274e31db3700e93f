"""Sources give the corpus's pairs in order, and reject bad files before training starts."""

import gzip
from pathlib import Path

import pytest
import tensorflow as tf
import tensorflow_datasets as tfds

from trainer.config import DataConfig
from trainer.data import builtin_corpus, sources
from trainer.data.sources import DataError

from conftest import MULTI30K, needs_multi30k


def write(path: Path, data: bytes) -> str:
    if path.suffix == ".gz":
        data = gzip.compress(data)
    path.write_bytes(data)
    return str(path)


def read_pairs(dataset: tf.data.Dataset):
    return [(s.decode(), t.decode()) for s, t in dataset.as_numpy_iterator()]


def test_mismatched_line_counts_name_both_files_and_counts(tmp_path):
    source = write(tmp_path / "train.en", b"one\ntwo\nthree\n")
    target = write(tmp_path / "train.de.gz", b"eins\nzwei\n")
    with pytest.raises(DataError) as error:
        sources.check_parallel_files(source, target)
    message = str(error.value)
    assert "\n" not in message
    assert source in message and target in message
    assert "3 lines" in message and "has 2" in message
    # The trainer's entry point checks every split when it opens the source.
    good = write(tmp_path / "val.en", b"one\n")
    with pytest.raises(DataError, match="line counts differ"):
        sources.select(DataConfig(train_src=source, train_tgt=target, eval_src=good,
                                  eval_tgt=good))


def test_invalid_utf8_names_file_and_line(tmp_path):
    path = write(tmp_path / "train.de.gz", "eins\nzwei\nFü\xdfe\n".encode() + b"dr\xffei\nvier\n")
    with pytest.raises(DataError, match=r"train\.de\.gz line 4: invalid UTF-8 \(byte 0xff at byte "
                                        r"column 3\)"):
        sources.count_lines(path)


def test_invalid_utf8_line_number_is_right_past_the_first_block(tmp_path):
    # The file spans two read blocks; only line 100001 is bad.
    line = "Männer überqueren die Straße\n".encode()
    lines = [line] * 200_000
    lines[100_000] = b"ok \xc3\x28 not\n"
    path = write(tmp_path / "big.de", b"".join(lines))
    assert len(line) * 200_000 > sources._BLOCK_BYTES
    with pytest.raises(DataError,
                       match=r"line 100001: invalid UTF-8 \(byte 0xc3 at byte column 4\)"):
        sources.count_lines(path)
    lines[100_000] = line
    assert sources.count_lines(write(tmp_path / "good.de", b"".join(lines))) == 200_000


def test_line_count_agrees_with_text_line_dataset(tmp_path):
    cases = {"a": b"", "b": b"x", "c": b"x\n", "d": b"x\n\ny", "e": b"\n\n", "f": b"x\r\ny\r\n"}
    for name, data in cases.items():
        for suffix in ("", ".gz"):
            path = write(tmp_path / (name + suffix), data)
            expected = sum(1 for _ in sources._lines(path))
            assert sources.count_lines(path) == expected, (name, suffix)


def test_missing_and_corrupt_files_are_data_errors(tmp_path):
    with pytest.raises(DataError, match="file not found: .*nothere.en"):
        sources.count_lines(str(tmp_path / "nothere.en"))
    corrupt = tmp_path / "bad.en.gz"
    corrupt.write_bytes(b"this is not gzip data\n")
    with pytest.raises(DataError, match="cannot read .*bad.en.gz"):
        sources.count_lines(str(corrupt))


def test_gzip_and_plain_files_give_the_same_pairs_in_order(tmp_path):
    en = "A man.\n\nTwo dogs run.\nÜber alles\nFive.\n".encode()
    de = "Ein Mann.\nLeer?\nZwei Hunde rennen.\nüber alles\n \t \n".encode()
    plain = sources.ParallelFiles({"train": (write(tmp_path / "t.en", en),
                                             write(tmp_path / "t.de", de))})
    zipped = sources.ParallelFiles({"train": (write(tmp_path / "t.en.gz", en),
                                              write(tmp_path / "t.de.gz", de))})
    expected = [("A man.", "Ein Mann."), ("", "Leer?"), ("Two dogs run.", "Zwei Hunde rennen."),
                ("Über alles", "über alles"), ("Five.", " \t ")]
    assert read_pairs(plain.pairs("train")) == expected
    assert read_pairs(zipped.pairs("train")) == expected
    assert zipped.size("train") == 5
    # texts() keeps only pairs with text on both sides.
    assert zipped.texts("train") == (["A man.", "Two dogs run.", "Über alles"],
                                     ["Ein Mann.", "Zwei Hunde rennen.", "über alles"])


@needs_multi30k("train.en.gz", "train.de.gz", "val.en", "val.de")
def test_multi30k_files_are_read_in_order():
    source = sources.select(DataConfig(
        train_src=str(MULTI30K / "train.en.gz"), train_tgt=str(MULTI30K / "train.de.gz"),
        eval_src=str(MULTI30K / "val.en"), eval_tgt=str(MULTI30K / "val.de")))
    assert source.splits == ("train", "validation")
    assert source.size("train") == 29000 and source.size("validation") == 1014
    first = read_pairs(source.pairs("validation").take(1))[0]
    with open(MULTI30K / "val.en", encoding="utf-8") as en, \
            open(MULTI30K / "val.de", encoding="utf-8") as de:
        assert first == (en.readline().rstrip("\n"), de.readline().rstrip("\n"))


def test_vocabulary_sample_spreads_over_the_whole_split():
    source = sources.BuiltinSource(seed=3, train_size=1000, eval_size=10)
    english, german = source.texts("train", max_pairs=100)
    all_english, all_german = builtin_corpus.splits(seed=3, train_size=1000, eval_size=10)["train"]
    assert len(english) == 100
    assert english == all_english[::10] and german == all_german[::10]


def test_builtin_source_direction():
    forward = sources.select(DataConfig(), builtin_train_size=50, builtin_eval_size=5)
    backward = sources.select(DataConfig(source_lang="de", target_lang="en"),
                              builtin_train_size=50, builtin_eval_size=5)
    assert forward.splits == ("train", "validation", "test")
    pairs = read_pairs(forward.pairs("validation"))
    assert read_pairs(backward.pairs("validation")) == [(t, s) for s, t in pairs]
    english, german = builtin_corpus.splits(seed=0, train_size=50, eval_size=5)["validation"]
    assert pairs == list(zip(english, german))
    with pytest.raises(DataError, match="between en and de"):
        sources.select(DataConfig(source_lang="en", target_lang="fr"))


def test_select_rejects_incomplete_or_conflicting_options(tmp_path):
    en = write(tmp_path / "a.en", b"x\n")
    with pytest.raises(DataError, match="all four"):
        sources.select(DataConfig(train_src=en, train_tgt=en))
    with pytest.raises(DataError, match="either"):
        sources.select(DataConfig(dataset="tfds:wmt14_translate/de-en", train_src=en,
                                  train_tgt=en, eval_src=en, eval_tgt=en))
    with pytest.raises(DataError, match="unknown dataset"):
        sources.select(DataConfig(dataset="multi30k"))


@pytest.mark.parametrize("name", ["wmt14_translate/de-en", "wmt_t2t_translate/de-en"])
def test_tfds_source_reads_the_asked_direction(name):
    with tfds.testing.mock_data(num_examples=6):
        examples = list(tfds.builder(name).as_dataset(split="train", shuffle_files=False)
                        .as_numpy_iterator())
        en_de = sources.select(DataConfig(dataset=f"tfds:{name}"))
        de_en = sources.select(DataConfig(dataset=f"tfds:{name}", source_lang="de",
                                          target_lang="en"))
        assert read_pairs(en_de.pairs("train")) == [
            (e["en"].decode(), e["de"].decode()) for e in examples]
        assert read_pairs(de_en.pairs("train")) == [
            (e["de"].decode(), e["en"].decode()) for e in examples]
        assert en_de.size("train") == 6
        with pytest.raises(DataError, match="translates between"):
            sources.select(DataConfig(dataset=f"tfds:{name}", source_lang="en",
                                      target_lang="fr"))


def test_the_example_a_run_ends_with_is_in_the_source_language(tmp_path):
    """The builtin corpus shows the README's example, in either direction; text files
    their first non-empty validation sentence."""
    forward = sources.select(DataConfig(), builtin_train_size=50, builtin_eval_size=5)
    backward = sources.select(DataConfig(source_lang="de", target_lang="en"),
                              builtin_train_size=50, builtin_eval_size=5)
    assert forward.example() == builtin_corpus.english(builtin_corpus.EXAMPLE_NUMBER)
    assert backward.example() == builtin_corpus.german(builtin_corpus.EXAMPLE_NUMBER)
    train_src = write(tmp_path / "train.en", b"one\ntwo\n")
    train_tgt = write(tmp_path / "train.de", b"eins\nzwei\n")
    eval_src = write(tmp_path / "val.en", b"\nthree\nfour\n")
    eval_tgt = write(tmp_path / "val.de", b"null\ndrei\nvier\n")
    files = sources.select(DataConfig(train_src=train_src, train_tgt=train_tgt,
                                      eval_src=eval_src, eval_tgt=eval_tgt))
    assert files.example() == "three"
    assert forward.vocab_size == builtin_corpus.VOCAB_SIZE and files.vocab_size is None
