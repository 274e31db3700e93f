"""Pretrained models of other toolkits as model directories of this project
(`python -m trainer.convert --from=NAME`). Each format is a module with

  convert(input_dir, model_dir, normalize_punctuation=None) -> TransformerConfig
                                                     writes model_dir whole, or nothing
  DESCRIPTION                                          what it reads, for --help

A new format is a module with these two names and a line below.
"""

import importlib

FORMATS = {
    "marian": "trainer.conversion.marian",  # Hugging Face Marian checkpoints: OPUS-MT
}


class ConversionError(ValueError):
    """An input a converter cannot take; the message is one line naming the file and
    what is wrong with it."""


def converter(name: str):
    """The module of format `name`, imported now (TensorFlow with it)."""
    if name not in FORMATS:
        raise ValueError(f"unknown format {name!r}; choose one of {', '.join(FORMATS)}")
    return importlib.import_module(FORMATS[name])
