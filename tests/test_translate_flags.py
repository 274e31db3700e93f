"""trainer.translate's option flags choose a signature, or are refused in one line before
the export is read (no export needed: these stop first)."""

import pytest

from programs import program


def error_line(result) -> str:
    assert result.returncode == 2 and result.stdout == "", result
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    return lines[0]


@pytest.mark.parametrize("flags", [["--seed=1"], ["--seed=0"], ["--seed=1", "--beam_size=2"],
                                   ["--seed=1", "--num_hypotheses=2"]],
                         ids=["alone", "its_default_value", "with_beam", "with_shared"])
def test_a_seed_without_a_sampling_flag_is_refused_naming_them(flags, tmp_path):
    """--seed=1 alone would translate with serving_default, unseeded: it fails instead."""
    result = program("translate", f"--saved_model={tmp_path / 'no_export'}", *flags,
                     cwd=tmp_path)
    assert error_line(result) == ("trainer.translate: error: --seed seeds sampling: give it "
                                  "with --temperature, --sample_topk or --sample_topp")


@pytest.mark.parametrize("sampling", ["--temperature=0.5", "--sample_topk=5",
                                      "--sample_topp=0.9"])
def test_a_seed_with_a_sampling_flag_goes_on_to_the_export(sampling, tmp_path):
    result = program("translate", f"--saved_model={tmp_path / 'no_export'}", "--seed=7",
                     sampling, cwd=tmp_path)
    assert result.returncode == 2, result
    line = result.stderr.strip().splitlines()[-1]
    assert "--seed" not in line and "no_export" in line, line
