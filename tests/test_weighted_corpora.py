"""Several training corpora, mixed by weight (--train_src=a,b --train_weights=0.7,0.3)."""

import pytest
import tensorflow as tf

from trainer.config import DataConfig
from trainer.data import input_pipeline, sources
from trainer.data.sources import DataError

SMALL, LARGE = 300, 3000
EXAMPLES = 4000


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    """A small corpus whose sentences start with "alpha" and a large one with "bravo",
    and a validation corpus."""
    directory = tmp_path_factory.mktemp("corpora")

    def write(name, word, pairs):
        for language in ("en", "de"):
            lines = [f"{word} {language} {i} {i * 7 % 13}" for i in range(pairs)]
            (directory / f"{name}.{language}").write_text("\n".join(lines) + "\n")
        return str(directory / f"{name}.en"), str(directory / f"{name}.de")

    return {"small": write("small", "alpha", SMALL), "large": write("large", "bravo", LARGE),
            "validation": write("val", "charlie", 50)}


def build(files, model_dir, **config):
    source = sources.ParallelFiles({"train": [files["small"], files["large"]],
                                    "validation": files["validation"]})
    return input_pipeline.build(source, str(model_dir), DataConfig(
        max_len=16, batch_tokens=256, vocab_size=300, **config))


def small_share(data, examples=EXAMPLES):
    """The share of the first `examples` training examples that come from the small corpus."""
    from_small = seen = 0
    for (source_ids, _), _ in data.train_dataset():
        words = data.tokenizers.source.detokenize(source_ids).numpy()
        from_small += sum(w.startswith(b"alpha") for w in words)
        seen += len(words)
        if seen >= examples:
            return from_small / seen


def first_batches(data, count=10):
    return [batch[1].numpy().tolist() for batch in data.train_dataset().take(count)]


@pytest.mark.slow
def test_each_corpus_is_sampled_in_its_weights_proportion(files, tmp_path):
    weighted = build(files, tmp_path / "weighted", train_weights=(0.7, 0.3))
    # 4000 draws: the standard deviation of the share is under 0.008.
    assert small_share(weighted) == pytest.approx(0.7, abs=0.035)
    # Without weights, the corpora count by their sizes, as if concatenated.
    by_size = build(files, tmp_path / "weighted")
    assert small_share(by_size) == pytest.approx(SMALL / (SMALL + LARGE), abs=0.035)
    # The start report counts each corpus, with its weight.
    assert (f"train: {SMALL + LARGE} pairs read" in weighted.report
            and f"train corpus {files['small'][0]} | {files['small'][1]} (weight 0.7): "
                f"{SMALL} pairs read" in weighted.report
            and f"(weight 0.3): {LARGE} pairs read" in weighted.report), weighted.report


@pytest.mark.slow
def test_the_mixed_stream_is_fixed_by_the_seed(files, tmp_path):
    first = build(files, tmp_path / "a", train_weights=(1, 1), seed=5)
    again = build(files, tmp_path / "a", train_weights=(1, 1), seed=5)
    other = build(files, tmp_path / "a", train_weights=(1, 1), seed=6)
    assert first_batches(first) == first_batches(again)
    assert first_batches(first) != first_batches(other)


def test_bad_weights_are_a_one_line_error_before_any_work(files, tmp_path):
    small, large = files["small"], files["large"]
    for weights, message in [((0.7, -0.3), "train_weights must all be positive, got 0.7,-0.3"),
                             ((0.0, 1.0), "must all be positive"),
                             ((1.0,), "train_weights has 1 weights for 2 training corpora")]:
        with pytest.raises(ValueError, match=message):
            DataConfig(train_src=f"{small[0]},{large[0]}", train_tgt=f"{small[1]},{large[1]}",
                       train_weights=weights)
    with pytest.raises(ValueError, match="train_src has 2 files but train_tgt has 1"):
        DataConfig(train_src=f"{small[0]},{large[0]}", train_tgt=small[1])
    # Given a source directly, the count is checked against its corpora, before the
    # vocabulary is trained.
    with pytest.raises(DataError, match="3 train_weights for 2 training corpora"):
        build(files, tmp_path / "bad", train_weights=(1, 2, 3))
    assert not (tmp_path / "bad" / "spm.model").exists()


def test_select_reads_comma_separated_files_as_corpora(files):
    small, large = files["small"], files["large"]
    config = DataConfig(train_src=f"{small[0]},{large[0]}", train_tgt=f"{small[1]},{large[1]}",
                        eval_src=files["validation"][0], eval_tgt=files["validation"][1])
    source = sources.select(config)
    assert [corpus.name for corpus in source.corpora("train")] == [
        f"{small[0]} | {small[1]}", f"{large[0]} | {large[1]}"]
    assert source.size("train") == SMALL + LARGE
    # pairs() is the corpora one after the other (the vocabulary's sample spans both).
    pairs = list(source.pairs("train").as_numpy_iterator())
    assert pairs[0][0].startswith(b"alpha") and pairs[-1][0].startswith(b"bravo")
    assert len(pairs) == SMALL + LARGE
