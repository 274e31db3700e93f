"""python -m trainer.translate and python -m trainer.evaluate on the exported model; the
tokenized BLEU against the official Multi30k files. In a subprocess where the console is
the claim (TensorFlow's start-up lines hidden, or shown with --verbosity); the program's
main in this process (programs.program) where it is what the program prints."""

import re
import sys

import pytest
import sacrebleu
import tensorflow as tf

from conftest import MULTI30K, needs_multi30k, run, sources
from programs import program, succeeded
from trainer.config import TRAINED_DECODE

# Each test runs the programs, or uses the model they trained.
pytestmark = pytest.mark.slow


def test_translate_cli_gives_one_line_per_input_line_as_the_signature_does(exported, loaded,
                                                                           tmp_path):
    texts = sources(5)
    lines = [t.encode() for t in texts[:3]] + [b"", b"   ", b"\xff\xfe not utf-8",
                                               texts[3].encode() + b"\r", texts[4].encode()]
    result = run([sys.executable, "-m", "trainer.translate",
                  f"--saved_model={exported.version_dir}", "--batch_size=3"],
                 cwd=tmp_path, input=b"\n".join(lines))  # the last line without a newline
    out = result.stdout.decode("utf-8").split("\n")
    assert out[-1] == "" and len(out) - 1 == len(lines)
    expected = loaded.signatures["serving_default"](
        inputs=tf.constant([line.rstrip(b"\r") for line in lines]))["translations"].numpy()
    assert out[:-1] == [t.decode() for t in expected]
    assert out[3] == out[4] == ""
    # Progress is all the console shows: TensorFlow's start-up lines are hidden.
    stderr = result.stderr.decode()
    assert all(line.startswith("translated ") for line in stderr.splitlines()), stderr
    assert f"translated {len(lines)}/{len(lines)}" in result.stderr.decode()


def test_verbosity_shows_what_the_quiet_console_hides(exported, tmp_path):
    command = [sys.executable, "-m", "trainer.translate", f"--saved_model={exported.version_dir}"]
    quiet = run(command, cwd=tmp_path, input=b"one\n").stderr.decode().splitlines()
    verbose = run(command + ["--verbosity=0"], cwd=tmp_path,
                  input=b"one\n").stderr.decode().splitlines()
    assert [line for line in quiet if not line.startswith("translated ")] == []
    assert len([line for line in verbose if not line.startswith("translated ")]) > 0


def test_evaluate_cli_prints_sacrebleu_and_chrf_with_signatures_of_its_translations(
        exported, tmp_path):
    from trainer.data import builtin_corpus
    numbers = [7 + 389 * i for i in range(6)]
    (tmp_path / "src.txt").write_text("".join(builtin_corpus.english(n) + "\n"
                                              for n in numbers))
    references = [builtin_corpus.german(n) for n in numbers]
    (tmp_path / "ref.txt").write_text("".join(r + "\n" for r in references))
    (tmp_path / "tok.txt").write_text("".join(r.lower() + "\n" for r in references))
    result = succeeded(program("evaluate", f"--saved_model={exported.version_dir}",
                               "--src=src.txt", "--ref=ref.txt", "--tok_ref=tok.txt",
                               "--output=hyp.txt", cwd=tmp_path))
    printed = result.stdout
    hypotheses = (tmp_path / "hyp.txt").read_text().splitlines()
    assert len(hypotheses) == len(references)
    bleu = sacrebleu.corpus_bleu(hypotheses, [references])
    chrf = sacrebleu.corpus_chrf(hypotheses, [references])
    assert re.search(r"sacreBLEU \(detokenized, cased\) BLEU = ([\d.]+)",
                     printed).group(1) == f"{bleu.score:.2f}"
    assert re.search(r"chrF2 = ([\d.]+)", printed).group(1) == f"{chrf.score:.2f}"
    assert "nrefs:1|case:mixed|eff:no|tok:13a|smooth:exp|version:" in printed
    assert "nrefs:1|case:mixed|eff:yes|nc:6|nw:0|space:no|version:" in printed
    assert re.search(r"tokenized lowercased BLEU \(Moses de, multi-bleu.perl\) BLEU = [\d.]+",
                     printed)


@needs_multi30k("test2016.de", "val.de", "tok/test2016.lc.norm.tok.de", "tok/val.lc.norm.tok.de")
def test_tokenized_bleu_tokenizes_output_exactly_as_the_official_multi30k_files():
    from trainer.cli import read_text
    from trainer.metrics import corpus_scores, moses_tokenized
    raw = read_text(MULTI30K / "test2016.de")
    assert moses_tokenized(raw, "de") == read_text(MULTI30K / "tok" / "test2016.lc.norm.tok.de")
    # val: 1 of 1014 lines differs (a period after a closing quote at the very end).
    raw = read_text(MULTI30K / "val.de")
    official = read_text(MULTI30K / "tok" / "val.lc.norm.tok.de")
    assert sum(a != b for a, b in zip(moses_tokenized(raw, "de"), official)) <= 1
    # Cased output scored against the lowercased references: tokenized BLEU lowercases.
    hypotheses = read_text(MULTI30K / "test2016.de")[:200]
    references = read_text(MULTI30K / "tok" / "test2016.lc.norm.tok.de")[:200]
    results = corpus_scores(hypotheses, hypotheses, tokenized_references=references)
    assert results["tok_bleu"][0].score == pytest.approx(100.0)
    assert results["bleu"][0].score == pytest.approx(100.0)
    assert corpus_scores(hypotheses, [r.upper() for r in hypotheses])["bleu"][0].score < 10


def test_translate_cli_options_go_through_the_options_signatures(exported, loaded, tmp_path):
    texts = sources(4) + [""]
    prefixes = ["zwei", "", "", "drei", ""]
    (tmp_path / "prefixes.txt").write_text("\n".join(prefixes) + "\n")
    stdin = "\n".join(texts).encode() + b"\n"

    def translate(*flags):
        return program("translate", f"--saved_model={exported.export_dir}", *flags,
                       cwd=tmp_path, stdin=stdin)

    beam = succeeded(translate("--beam_size=3", "--alpha=1.0", "--num_hypotheses=2",
                               "--min_length=4", f"--prefix_file={tmp_path / 'prefixes.txt'}"))
    sampled = succeeded(translate("--temperature=1.5", "--sample_topk=20", "--sample_topp=0.9",
                                  "--seed=42", "--num_hypotheses=3", "--min_length=2"))
    inputs = {"inputs": tf.constant(texts), "target_prefix": tf.constant(prefixes)}
    # The flags given, the export's values (trainer.task's) for the others.
    expected_beam = loaded.signatures["translate_with_options"](
        **inputs, beam_size=tf.constant(3), alpha=tf.constant(1.0),
        max_extra_length=tf.constant(50), min_length=tf.constant(4),
        num_hypotheses=tf.constant(2), stopping=tf.constant(TRAINED_DECODE.stopping),
        patience=tf.constant(TRAINED_DECODE.patience))
    # The CLI batches by length: each input's samples are the same in any batch.
    expected_samples = loaded.signatures["sample"](
        inputs=inputs["inputs"], target_prefix=tf.constant([""] * len(texts)),
        num_hypotheses=tf.constant(3), max_extra_length=tf.constant(50),
        min_length=tf.constant(2), temperature=tf.constant(1.5), top_k=tf.constant(20),
        top_p=tf.constant(0.9), seed=tf.constant(42, tf.int64))
    # k lines per input line, best first.
    for result, expected in ((beam, expected_beam), (sampled, expected_samples)):
        lines = result.stdout.split("\n")[:-1]
        assert lines == [t.decode() for t in expected["translations"].numpy().ravel()]


def test_min_length_alone_asks_translate_with_options_for_one_translation_each(
        exported, loaded, tmp_path):
    """Every unset option at the export's, num_hypotheses at 1 whatever the export's."""
    texts = sources(3)
    result = succeeded(program("translate", f"--saved_model={exported.version_dir}",
                               "--min_length=6", cwd=tmp_path,
                               stdin="\n".join(texts).encode() + b"\n"))
    expected = loaded.signatures["translate_with_options"](
        inputs=tf.constant(texts), target_prefix=tf.constant([""] * len(texts)),
        beam_size=tf.constant(TRAINED_DECODE.beam_size), alpha=tf.constant(TRAINED_DECODE.alpha),
        stopping=tf.constant(TRAINED_DECODE.stopping),
        patience=tf.constant(TRAINED_DECODE.patience),
        max_extra_length=tf.constant(TRAINED_DECODE.max_extra_length),
        min_length=tf.constant(6), num_hypotheses=tf.constant(1))
    assert result.stdout.split("\n")[:-1] == [
        t.decode() for t in expected["translations"].numpy().ravel()]


@pytest.mark.parametrize("flags, message", [
    (["--beam_size=9"], "beam_size must be in [1, 8], got 9"),
    (["--beam_size=2", "--num_hypotheses=3"], "num_hypotheses must be in [1, beam_size=2], got 3")],
    ids=["beam_size", "num_hypotheses"])
def test_an_option_beyond_the_exports_limits_is_the_signatures_error_in_one_line(
        exported, flags, message, tmp_path):
    """DecodeConfig cannot know the export's max_beam_size (8) or a beam's size: the
    signature's `error` output names the option, and the program fails with it."""
    bad = program("translate", f"--saved_model={exported.export_dir}", *flags, cwd=tmp_path,
                  stdin=b"one\ntwo\n")
    assert bad.returncode == 2 and bad.stdout == "", bad
    assert bad.stderr.strip().splitlines()[-1] == f"trainer.translate: error: {message}"


def test_signature_chooses_the_signature_whose_hypotheses_are_printed(exported, loaded,
                                                                      tmp_path):
    """--signature=nbest prints the nbest signature's k hypotheses per input line, best
    first; a signature the export lacks is refused naming those it has."""
    texts = sources(3)
    result = succeeded(program("translate", f"--saved_model={exported.version_dir}",
                               "--signature=nbest", cwd=tmp_path,
                               stdin="\n".join(texts).encode() + b"\n"))
    expected = loaded.signatures["nbest"](inputs=tf.constant(texts))["translations"].numpy()
    assert expected.shape[1] > 1  # several lines per input: not serving_default's one
    assert result.stdout.split("\n")[:-1] == [t.decode() for t in expected.ravel()]
    bad = program("translate", f"--saved_model={exported.version_dir}", "--signature=nbset",
                  cwd=tmp_path, stdin=b"one\n")
    assert bad.returncode == 2 and bad.stdout == ""
    assert bad.stderr.strip().splitlines()[-1] == (
        f"trainer.translate: error: --signature=nbset is not one of "
        f"{sorted(loaded.signatures)}")


def test_export_max_beam_size_bounds_what_a_request_may_ask(exported, tmp_path):
    """trainer.export --max_beam_size=2: its export.json holds 2, a request for beam 3 is
    that row's error and trainer.translate's one line, and beam 2 still translates. (This
    test exports on its own: the limit is what it checks.)"""
    import json
    succeeded(program("export", f"--model_dir={exported.model_dir}",
                      f"--export_dir={tmp_path / 'export'}", "--max_beam_size=2",
                      cwd=tmp_path))
    version = tmp_path / "export" / "1"
    assert json.loads((version / "assets.extra" / "export.json").read_text())["max_beam_size"] == 2
    translate = ("translate", f"--saved_model={version}")
    bad = program(*translate, "--beam_size=3", cwd=tmp_path, stdin=b"one\n")
    assert bad.returncode == 2 and bad.stdout == ""
    assert bad.stderr.strip().splitlines()[-1] == \
        "trainer.translate: error: beam_size must be in [1, 2], got 3"
    good = succeeded(program(*translate, "--beam_size=2", "--num_hypotheses=2", cwd=tmp_path,
                             stdin=b"one\ntwo\n"))
    assert len(good.stdout.split("\n")[:-1]) == 4


@pytest.mark.parametrize("flags, option, value", [
    (["--stopping=exact"], "stopping", "exact"),
    (["--stopping=first", "--patience=0.5"], "patience", 0.5),
    (["--max_extra_length=1"], "max_extra_length", 1)], ids=lambda v: str(v))
def test_each_search_flag_reaches_the_signature_and_changes_the_hypotheses(
        exported, loaded, flags, option, value, tmp_path):
    """translate --num_hypotheses=4 with search flags prints translate_with_options'
    4-best lists at the flags' values, the export's (trainer.task's search) for the
    others, and they are not the lists with `option` at the export's value: the flag
    reached the signature."""
    texts = sources(4)
    result = succeeded(program("translate", f"--saved_model={exported.version_dir}",
                               "--num_hypotheses=4", *flags, cwd=tmp_path,
                               stdin="\n".join(texts).encode() + b"\n"))
    # trainer.task's search, stated: beam 4, alpha 0.6, stopping as Transformers stops,
    # patience 1, input length + 50.
    export = {"beam_size": 4, "alpha": 0.6, "stopping": "transformers", "patience": 1.0,
              "max_extra_length": 50}
    asked = {**export, **{f[2:].split("=")[0]: type(export[f[2:].split("=")[0]])(
        f.split("=")[1]) for f in flags}}

    def four_best(**settings):
        outputs = loaded.signatures["translate_with_options"](
            inputs=tf.constant(texts), target_prefix=tf.constant([""] * len(texts)),
            min_length=tf.constant(0), num_hypotheses=tf.constant(4),
            **{k: tf.constant(v) for k, v in settings.items()})
        return [t.decode() for t in outputs["translations"].numpy().ravel()]

    expected = four_best(**asked)
    assert asked[option] == value
    assert result.stdout.split("\n")[:-1] == expected
    assert expected != four_best(**{**asked, option: export[option]})
