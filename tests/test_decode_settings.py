"""How a model translates lives in its model directory: config.json's "decode", written by
python -m trainer.task from its search flags (and by the converter from a checkpoint's
generation settings, tests/test_marian.py), the default of every export, which a flag on
the command line overrides. The real programs (their main, in this process:
programs.program), real files."""

import dataclasses
import json
import shutil

import pytest
import tensorflow as tf

from conftest import QUICK
from programs import program, succeeded
from keras_transformer import DecodeConfig

pytestmark = pytest.mark.slow

SEARCH_FLAGS = ["--beam_size=3", "--alpha=1.3", "--length_penalty=average"]


def export_info(export_dir):
    return json.loads((export_dir / "1" / "assets.extra" / "export.json").read_text())


def test_a_run_stores_its_search_flags_which_the_export_uses_unless_a_flag_overrides(tmp_path):
    model_dir = tmp_path / "run"
    succeeded(program("task", *QUICK, "--train_steps=1", "--checkpoint_every=1",
                      *SEARCH_FLAGS, f"--model_dir={model_dir}"))
    stored = json.loads((model_dir / "config.json").read_text())["decode"]
    # The flags given, and trainer.task's stopping rule (Hugging Face's), not the library's
    # exact one.
    assert DecodeConfig.from_dict(stored) == DecodeConfig(beam_size=3, alpha=1.3,
                                                          length_penalty="average",
                                                          stopping="transformers")
    succeeded(program("export", f"--model_dir={model_dir}", "--beam_size=2",
                      f"--export_dir={tmp_path / 'export'}"))
    info = export_info(tmp_path / "export")
    # The flag given wins; the others come from the model directory, not the paper.
    assert (info["beam_size"], info["alpha"], info["length_penalty"], info["stopping"]) == (
        2, 1.3, "average", "transformers")


# The paper's search, written out here rather than read from the library's defaults (section
# 6.1): "beam search with a beam size of 4 and length penalty alpha = 0.6" (Wu et al.'s
# ((5 + |Y|) / 6)^alpha), the plain search that stops once no live beam can still win, and
# "maximum output length during inference to input length + 50" (no cap of its own but the
# model's positions), and no minimum length.
PAPER = {"beam_size": 4, "alpha": 0.6, "length_penalty": "gnmt", "stopping": "exact",
         "max_extra_length": 50, "max_length": None, "min_length": 0}


def _search(decode: DecodeConfig) -> dict:
    """The fields of `decode` that PAPER fixes."""
    return {name: getattr(decode, name) for name in PAPER}


def test_a_model_directory_without_settings_translates_with_the_papers(exported, tmp_path):
    """A directory written before config.json held the settings."""
    from trainer.serving import saved_model
    model_dir = tmp_path / "old"
    shutil.copytree(exported.model_dir, model_dir)
    config = json.loads((model_dir / "config.json").read_text())
    config.pop("decode", None)
    (model_dir / "config.json").write_text(json.dumps({"model": config["model"]}))
    translator, _ = saved_model.build_translator(str(model_dir))
    assert _search(translator.decode) == PAPER and translator.decode == DecodeConfig()
    given = {"beam_size": 2, "length_penalty": "average", "max_length": 2}
    config["decode"] = given
    (model_dir / "config.json").write_text(json.dumps(config))
    translator, _ = saved_model.build_translator(str(model_dir))
    # The settings given, and the paper's for the rest.
    assert _search(translator.decode) == {**PAPER, **given}
    assert translator.decode == DecodeConfig(**given)
    # Its search keeps to them: 2 beams, outputs of max_length - 1 tokens: EOS alone.
    result = translator.search(translator.source_ids(
        tf.constant(["three hundred and twenty-five thousand four hundred and one"])),
        dataclasses.replace(translator.decode, num_hypotheses=2))
    assert result.ids.shape[1] == 2 and result.lengths.numpy().max() == 1


# "decode" as config.json held it when the largest beam a client may ask for was a field
# of DecodeConfig.
OLD_DECODE = {"beam_size": 3, "alpha": 1.0, "length_penalty": "average", "stopping": "first",
              "patience": 1.5, "max_extra_length": 40, "max_length": None, "max_beam_size": 6}


def test_a_model_directory_and_export_of_the_older_settings_still_load(exported, tmp_path):
    from trainer.serving import saved_model
    from trainer.serving.limits import ServingLimits
    model_dir = tmp_path / "older"
    shutil.copytree(exported.model_dir, model_dir)
    config = json.loads((model_dir / "config.json").read_text())
    (model_dir / "config.json").write_text(json.dumps({**config, "decode": OLD_DECODE}))
    translator, _ = saved_model.build_translator(str(model_dir))
    assert translator.decode == DecodeConfig(**{k: v for k, v in OLD_DECODE.items()
                                                if k != "max_beam_size"})
    path = saved_model.export(str(model_dir), str(tmp_path / "export"))
    info = saved_model.read_info(path)
    assert info["max_beam_size"] == ServingLimits().max_beam_size
    # An export.json of then (max_beam_size beside the search) reads as before.
    old_info = {**{k: v for k, v in info.items() if k not in DecodeConfig().to_dict()},
                **OLD_DECODE}
    assert DecodeConfig.from_dict(old_info) == translator.decode
    assert ServingLimits.from_dict(old_info) == ServingLimits(max_beam_size=6)


def test_damaged_settings_are_one_line_naming_config_json(exported, tmp_path):
    model_dir = tmp_path / "damaged"
    shutil.copytree(exported.model_dir, model_dir)
    config = json.loads((model_dir / "config.json").read_text())
    config["decode"] = {"length_penalty": "shortest"}
    (model_dir / "config.json").write_text(json.dumps(config))
    result = program("export", f"--model_dir={model_dir}",
                     f"--export_dir={tmp_path / 'export'}")
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert result.returncode == 2 and "Traceback" not in result.stderr, result.stderr[-3000:]
    assert "config.json is damaged" in lines[-1] and "shortest" in lines[-1], lines[-1]
