"""The export formats by name (`trainer.export --format`). Each is a module with

  Options                      a dataclass of its settings (flags of the same names fill it)
  default_dir(name, options)   where an export of model directory `name` goes by default
  export(model_dir, export_dir, options) -> path
  DESCRIPTION                  what it writes, for the program's last line

A new format is a module with these four names and a line below.
"""

import importlib

FORMATS = {
    "saved_model": "trainer.serving.saved_model",  # TF Serving, any TF program
    "ctranslate2": "trainer.serving.ctranslate2",  # CTranslate2's CPU kernels
    "marian": "trainer.serving.marian",  # Hugging Face Transformers, back to the Hub
}


class MissingExtra(ImportError):
    """A format's optional package is not installed; the message says how to install it."""


def exporter(name: str):
    """The module of format `name`, imported now (TensorFlow with it)."""
    if name not in FORMATS:
        raise ValueError(f"unknown format {name!r}; choose one of {', '.join(FORMATS)}")
    return importlib.import_module(FORMATS[name])
