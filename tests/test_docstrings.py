"""The library's docstring examples run as written (doctest)."""

import doctest
import importlib
import pkgutil

import pytest

import keras_transformer

MODULES = sorted(name for _, name, _ in pkgutil.iter_modules(keras_transformer.__path__))
# Modules whose examples train or search for seconds: out of the fast loop.
SLOW_EXAMPLES = {"losses", "sampling"}


@pytest.mark.parametrize("name", [pytest.param(name, marks=pytest.mark.slow)
                                  if name in SLOW_EXAMPLES else name for name in MODULES])
def test_docstring_examples_run_as_written(name):
    module = importlib.import_module(f"keras_transformer.{name}")
    failures, _ = doctest.testmod(module, optionflags=doctest.ELLIPSIS)
    assert failures == 0


def test_every_public_module_shows_an_example():
    """A `>>> ` example, which the test above runs, in the docstring of each public module
    (its name without a leading underscore) or of one of its public members."""
    finder = doctest.DocTestFinder()
    examples = {}
    for name in MODULES:
        if name.startswith("_"):
            continue
        module = importlib.import_module(f"keras_transformer.{name}")
        examples[name] = sum(len(test.examples) for test in finder.find(module)
                             if not any(part.startswith("_")
                                        for part in test.name.split(".")[2:]))
    lacking = sorted(name for name, count in examples.items() if count == 0)
    assert not lacking, f"no >>> example in keras_transformer's {', '.join(lacking)}"


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
