"""Moses' punctuation normalization in TF ops (trainer/data/punctuation.py): sacremoses'
outputs on 62 inputs in six languages (committed in tests/fixtures/punctuation, made by
make_reference.py there), stored in a model directory, and run by its SavedModel."""

import json
from pathlib import Path

import pytest
import tensorflow as tf

from trainer.conversion import marian
from trainer.data import punctuation, vocabulary
from trainer.data.builtin_corpus import english, german
from trainer.data.tokenizer import VocabularyError
from trainer.model_dir.weights import WeightsChoice
from trainer.serving import saved_model

REFERENCE = json.loads((Path(__file__).parent / "fixtures" / "punctuation" / "reference.json")
                       .read_text("utf-8"))


@pytest.mark.parametrize("language", sorted(REFERENCE["outputs"]))
def test_the_graph_normalizes_as_sacremoses_does(language):
    inputs = REFERENCE["inputs"]
    expected = REFERENCE["outputs"][language]
    found = [t.decode("utf-8") for t in
             punctuation.normalize(tf.constant(inputs), language).numpy()]
    assert found == expected
    # Most inputs change, so the rules are not trivially met.
    assert sum(a != b for a, b in zip(inputs, expected)) > len(inputs) // 2


def test_a_new_vocabulary_stores_its_normalization_and_keeps_it(tmp_path):
    pairs = ([f"{english(n)} : \u201cright\u201d" for n in range(300)],
             [german(n) for n in range(300)])
    tokenizers = vocabulary.load_or_train(str(tmp_path), lambda: pairs, vocab_size=300,
                                          normalize_punctuation="en")
    assert json.loads((tmp_path / vocabulary.NORMALIZATION).read_text()) == \
        {"punctuation": "en"}
    # Serving reads it back: a text tokenizes as its normalized form.
    loaded = vocabulary.load_or_train(str(tmp_path), None)
    assert loaded.normalize_punctuation == "en"
    texts = tf.constant(["seven : \u201cright\u201d", 'seven: "right"'])
    raw, normalized = loaded.source_ids(texts).to_list()
    assert raw == normalized
    assert loaded.source.tokenize(texts).to_list()[0] != normalized
    assert tokenizers.source_ids(texts).to_list()[0] == normalized
    with pytest.raises(VocabularyError, match="normalizes punctuation as 'en', not as 'de'"):
        vocabulary.load_or_train(str(tmp_path), lambda: pairs, normalize_punctuation="de")


def test_a_vocabulary_made_without_it_refuses_it(tmp_path):
    pairs = ([english(n) for n in range(300)], [german(n) for n in range(300)])
    vocabulary.load_or_train(str(tmp_path), lambda: pairs, vocab_size=300)
    with pytest.raises(VocabularyError, match="normalizes punctuation not at all, not as 'en'"):
        vocabulary.load_or_train(str(tmp_path), lambda: pairs, normalize_punctuation="en")


@pytest.mark.slow
def test_a_converted_model_asked_to_normalizes_inside_its_saved_model(tmp_path):
    """Off by default, as MarianTokenizer tokenizes; asked for, the SavedModel (core ops and
    tensorflow-text only) translates a text as it translates the text normalized."""
    fixture = Path(__file__).parent / "fixtures" / "marian" / "shared_swish"
    marian.convert(str(fixture), str(tmp_path / "plain"))
    marian.convert(str(fixture), str(tmp_path / "normalized"), normalize_punctuation="en")
    assert not (tmp_path / "plain" / vocabulary.NORMALIZATION).exists()
    text = "\u201cone hundred\u201d \u2013 two : three"
    texts = [text, punctuation.normalize(tf.constant([text]), "en").numpy()[0].decode()]
    assert texts[1] == '"one hundred" - two: three'
    # Unnormalized, the two texts are other pieces.
    plain = vocabulary.load_or_train(str(tmp_path / "plain"), None)
    first, second = plain.source_ids(tf.constant(texts)).to_list()
    assert first != second
    path = saved_model.export(str(tmp_path / "normalized"), str(tmp_path / "export"),
                              saved_model.Options(weights=WeightsChoice()))
    out = saved_model.load(path).signatures["serving_default"](inputs=tf.constant(texts))
    first, second = [t.decode("utf-8") for t in out["translations"].numpy()]
    assert first == second
