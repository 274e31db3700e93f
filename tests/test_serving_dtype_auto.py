"""`trainer.export --serving_dtype=auto --calibration=FILE` (trainer/serving/dtype_choice.py):
every serving dtype built and timed on this machine, the fastest that agrees with float32 kept
as the one new version, the rule and each candidate's figures in its export.json."""

import json
import subprocess
import sys

import pytest
import tensorflow as tf

from conftest import sources
from programs import program, succeeded
from trainer.serving import dtype_choice, saved_model

CALIBRATION_SENTENCES = 40


def test_the_rule_keeps_a_candidate_that_mostly_agrees_and_drops_one_that_does_not():
    words = "zwei junge männer stehen am rand einer straße und schauen auf die stadt".split()
    reference = [" ".join(words[i % 5:] + [str(i)]) for i in range(100)]

    def one_word_off(i):  # the last word a synonym's: a typical int8 difference
        return reference[i].replace("stadt", "großstadt")

    # 82 of 100 identical, the rest one word off: int8_bfloat16's case on Multi30k.
    close = reference[:82] + [one_word_off(i) for i in range(82, 100)]
    identical, bleu = dtype_choice.agreement(close, reference)
    assert identical == pytest.approx(0.82) and bleu >= dtype_choice.MIN_BLEU
    assert dtype_choice.verdict("int8_bfloat16", identical, bleu) == ""
    # 79 of 100: too few identical, though BLEU stays high.
    fewer = reference[:79] + [one_word_off(i) for i in range(79, 100)]
    identical, bleu = dtype_choice.agreement(fewer, reference)
    assert bleu >= dtype_choice.MIN_BLEU
    assert "identical" in dtype_choice.verdict("bfloat16", identical, bleu)
    # Identical often enough, but the rest garbage: BLEU below the bar.
    assert "sacreBLEU" in dtype_choice.verdict("int8", 0.85, 60.0)
    assert dtype_choice.agreement(reference, reference) == (1.0, 100.0)
    assert dtype_choice.verdict("float32", 0.0, 0.0) == ""  # the reference always passes


def test_a_dropped_candidate_is_never_chosen_however_fast():
    figures = [dtype_choice.Candidate("float32", 10.0, [10.0], 1.0, 100.0),
               dtype_choice.Candidate("bfloat16", 12.0, [12.0], 0.9, 95.0),
               dtype_choice.Candidate("int8", 50.0, [50.0], 0.5, 40.0, kept=False,
                                      reason="50.0% identical to float32 (< 80%)")]
    assert dtype_choice.choose(figures).serving_dtype == "bfloat16"
    assert dtype_choice.choose(figures[:1] + figures[2:]).serving_dtype == "float32"


def test_auto_needs_calibration_sentences_and_with_xla_builds_no_int8_candidate():
    with pytest.raises(ValueError, match="--serving_dtype=auto needs --calibration=FILE"):
        saved_model.Options(serving_dtype="auto")
    assert saved_model.Options(serving_dtype="auto", calibration="val.en").candidates == \
        saved_model.SERVING_DTYPES
    assert saved_model.Options(serving_dtype="auto", calibration="val.en",
                               xla=True).candidates == ("float32", "bfloat16")


def _calibration(directory):
    path = directory / "calibration.en"
    path.write_text("\n".join(sources(CALIBRATION_SENTENCES)) + "\n")
    return path


def _auto_export(exported, tmp_path, *flags):
    export_dir = tmp_path / "auto"
    result = succeeded(program("export", f"--model_dir={exported.model_dir}",
                               f"--export_dir={export_dir}", "--serving_dtype=auto",
                               f"--calibration={_calibration(tmp_path)}", *flags,
                               cwd=tmp_path))
    return export_dir, result


def test_auto_publishes_one_version_the_fastest_kept_candidate(exported, tmp_path):
    export_dir, result = _auto_export(exported, tmp_path)
    assert sorted(p.name for p in export_dir.iterdir()) == ["1"]  # no candidate left over
    info = json.loads((export_dir / "1" / "assets.extra" / "export.json").read_text())
    choice = info["serving_dtype_choice"]
    assert choice["rule"] == dtype_choice.RULE
    assert choice["measured_on"]["sentences"] == CALIBRATION_SENTENCES
    candidates = {c["serving_dtype"]: c for c in choice["candidates"]}
    assert list(candidates) == list(saved_model.SERVING_DTYPES)
    for c in candidates.values():
        assert c["sentences_per_second"] > 0 and len(c["rounds"]) == dtype_choice.ROUNDS
        assert 0.0 <= c["identical_to_float32"] <= 1.0 and c["bleu_vs_float32"] >= 0.0
        assert c["kept"] == (dtype_choice.verdict(c["serving_dtype"], c["identical_to_float32"],
                                                  c["bleu_vs_float32"]) == "")
    assert candidates["float32"]["kept"] and candidates["float32"]["identical_to_float32"] == 1
    kept = [c for c in candidates.values() if c["kept"]]
    fastest = max(kept, key=lambda c: c["sentences_per_second"])
    assert info["serving_dtype"] == choice["chosen"] == fastest["serving_dtype"]
    # The published version is that candidate: its weights of its dtype, its calibration.
    assert info["calibration"] == (str(tmp_path / "calibration.en")
                                   if fastest["serving_dtype"] == "int8_bfloat16" else None)
    for dtype in candidates:
        assert any(line.startswith(dtype + " ") for line in result.stdout.splitlines())
    assert f"serving dtype: {info['serving_dtype']}" in result.stdout
    assert f"exported SavedModel to {export_dir / '1'}" in result.stdout
    translations = saved_model.load(str(export_dir)).signatures["serving_default"](
        inputs=tf.constant(sources(2)))["translations"]
    assert translations.shape == (2,)


def test_auto_without_calibration_fails_in_one_line_naming_it(exported, tmp_path):
    result = subprocess.run([sys.executable, "-m", "trainer.export",
                             f"--model_dir={exported.model_dir}", "--serving_dtype=auto",
                             f"--export_dir={tmp_path / 'auto'}"],
                            capture_output=True, text=True, cwd=tmp_path, timeout=300)
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "--calibration" in lines[0], result.stderr
    assert lines[0].startswith("trainer.export: error: --serving_dtype=auto needs")
    assert not (tmp_path / "auto").exists()


def test_compare_exports_times_each_export_against_the_first_and_names_the_fastest_kept(
        exported, tmp_path):
    """The serving host's check: python -m trainer.compare_exports on the float32 export
    and a bfloat16 one of the same model, timed as auto times its candidates."""
    succeeded(program("export", f"--model_dir={exported.model_dir}",
                      f"--export_dir={tmp_path / 'bfloat16'}", "--serving_dtype=bfloat16",
                      cwd=tmp_path))
    result = succeeded(program("compare_exports",
                               f"--saved_model={exported.version_dir},{tmp_path / 'bfloat16'}",
                               f"--sentences={_calibration(tmp_path)}", "--count=24",
                               "--rounds=2", cwd=tmp_path))
    rows = {}
    for line in result.stdout.splitlines():
        for dtype in ("float32", "bfloat16"):
            if line.startswith(f"{dtype} ("):
                rate, identical = line.split(")", 1)[1].split()[:2]
                rows[dtype] = (float(rate), line)
                if dtype == "float32":  # the reference: itself, and always kept
                    assert identical == "100.0%" and line.endswith("kept"), line
    assert set(rows) == {"float32", "bfloat16"}, result.stdout
    kept = {dtype: rate for dtype, (rate, line) in rows.items() if line.endswith("kept")}
    assert f"fastest kept: {max(kept, key=kept.get)} (" in result.stdout
    assert "on 24 sentences" in result.stdout and "2 rounds" in result.stdout


def test_compare_exports_refuses_a_missing_file_in_one_line(exported, tmp_path):
    result = program("compare_exports", f"--saved_model={exported.version_dir}",
                     f"--sentences={tmp_path / 'none.en'}")
    assert result.returncode == 2
    assert result.stderr.strip().splitlines()[-1].startswith(
        f"trainer.compare_exports: error: --sentences={tmp_path / 'none.en'} cannot be read")
