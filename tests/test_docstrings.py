"""The library's docstring examples run as written (doctest)."""

import doctest
import importlib
import pkgutil

import pytest

import keras_transformer

MODULES = sorted(name for _, name, _ in pkgutil.iter_modules(keras_transformer.__path__))


@pytest.mark.parametrize("name", MODULES)
def test_docstring_examples_run_as_written(name):
    module = importlib.import_module(f"keras_transformer.{name}")
    failures, _ = doctest.testmod(module, optionflags=doctest.ELLIPSIS)
    assert failures == 0


def test_every_layer_and_the_model_show_an_example():
    for name in ("MultiHeadAttention", "PositionwiseFeedForward", "PositionalEncoding",
                 "SharedEmbedding", "Residual", "EncoderLayer", "DecoderLayer", "Encoder",
                 "Decoder", "Transformer", "WarmupSchedule", "LabelSmoothedCrossEntropy"):
        assert ">>> " in getattr(keras_transformer, name).__doc__, name


def test_all_names_the_public_api_and_each_name_resolves():
    for name in keras_transformer.__all__:
        assert getattr(keras_transformer, name) is not None, name
    assert "Transformer" in keras_transformer.__all__
    assert "LabelSmoothedCrossEntropy" in keras_transformer.__all__
