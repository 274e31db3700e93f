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


def test_beam_search_and_sampling_flags_exclude_each_other_naming_the_declared_groups(tmp_path):
    """The groups are the declarations' `searches`: the options only beam search reads,
    and those only sampling reads (but --seed, which seeds a sampling asked for)."""
    from keras_transformer.config import OPTIONS
    from keras_transformer.options import BEAM, SAMPLE
    names = {"top_k": "sample_topk", "top_p": "sample_topp"}
    beam = [names.get(o.name, o.name) for o in OPTIONS if o.request and o.searches == (BEAM,)]
    sampling = [names.get(o.name, o.name) for o in OPTIONS
                if o.request and o.searches == (SAMPLE,) and o.name != "seed"]
    assert beam == ["beam_size", "alpha", "stopping", "patience"]
    assert sampling == ["temperature", "sample_topk", "sample_topp"]
    result = program("translate", f"--saved_model={tmp_path / 'no_export'}", "--patience=2",
                     "--sample_topk=5", cwd=tmp_path)
    assert error_line(result) == (
        f"trainer.translate: error: {'/'.join('--' + n for n in beam)} (beam search) and "
        f"{'/'.join('--' + n for n in sampling)} (sampling) exclude each other")


@pytest.mark.parametrize("flags", [["--min_length=2"], ["--num_hypotheses=2"],
                                   ["--max_extra_length=3"], ["--prefix_file=p.txt"]],
                         ids=["min_length", "num_hypotheses", "max_extra_length", "prefix"])
def test_a_shared_option_with_signature_is_refused_naming_it(flags, tmp_path):
    result = program("translate", f"--saved_model={tmp_path / 'no_export'}",
                     "--signature=serving_default", *flags, cwd=tmp_path)
    name = flags[0].split("=")[0]
    assert error_line(result) == f"trainer.translate: error: --signature cannot be combined " \
                                 f"with {name}"


@pytest.mark.parametrize("flag, message", [
    ("--alpha=-1", "alpha must be in [0.0, inf), got -1"),
    ("--patience=0", "patience must be in (0.0, inf), got 0"),
    ("--min_length=-1", "min_length must be in [0, inf), got -1"),
    ("--num_hypotheses=0", "num_hypotheses must be in [1, beam_size], got 0"),
    ("--sample_topp=1.5", "top_p must be in (0.0, 1], got 1.5"),
    ("--temperature=-0.5", "temperature must be in [0.0, inf), got -0.5")])
def test_an_option_out_of_its_declared_range_is_refused_before_the_export_is_read(
        flag, message, tmp_path):
    result = program("translate", f"--saved_model={tmp_path / 'no_export'}", flag,
                     cwd=tmp_path)
    assert error_line(result) == f"trainer.translate: error: {message}"
