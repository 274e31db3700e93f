"""The CTranslate2 export computes the model we trained: CTranslate2's search over the
converted weights gives the SavedModel's translations."""

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from conftest import REPO, _env, built_once, decode, sources
from programs import program, succeeded

import ctranslate2  # in the test extra
# One worker runs this file and test_quick_start (pytest-xdist --dist loadgroup): the main
# job's model is trained once for both.
pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("main_job")]

# Keeps CTranslate2 off PAD and BOS, which our search never emits.
SUPPRESS = [["<pad>"], ["<s>"]]


def export_ct2(model_dir: Path, root: Path):
    """trainer.export --format=ctranslate2 (float32) of model_dir into root/ct2, its
    stdout and stderr in root/stdout.txt and root/stderr.txt."""
    result = succeeded(program("export", f"--model_dir={model_dir}", "--format=ctranslate2",
                               "--quantization=float32", f"--export_dir={root / 'ct2'}"))
    (root / "stdout.txt").write_text(result.stdout)
    (root / "stderr.txt").write_text(result.stderr)


@pytest.fixture(scope="module")
def trained(main_job, tmp_path_factory):
    """The README's main job's model (conftest.main_job: it translates the builtin corpus),
    exported as a float32 CTranslate2 model by the real program's main, once per test run:
    (model directory, its SavedModel version, the CTranslate2 directory, the program's
    stderr)."""
    model_dir = main_job.directory / "runs" / "tiny_builtin"
    root = built_once(tmp_path_factory, "ct2_float32", lambda root: export_ct2(model_dir, root),
                      model_dir)
    assert str(root / "ct2") in (root / "stdout.txt").read_text()
    return (model_dir, main_job.directory / "saved_models" / "tiny_builtin" / "1", root / "ct2",
            (root / "stderr.txt").read_text())


def test_the_export_says_how_to_search_as_the_model_directory_does(trained):
    """The main job stored trainer.task's search: beam 4, patience 1, the paper's gnmt
    penalty at alpha 0.6, which CTranslate2 cannot rank by, and Hugging Face's stopping
    rule, which it cannot stop by: one line gives the request options and says both. An
    average penalty and CTranslate2's own stopping rule pass through as request options."""
    import json
    from keras_transformer import DecodeConfig
    from trainer.serving.ctranslate2 import search_note
    stored = json.loads((trained[0] / "config.json").read_text())["decode"]
    assert (stored["beam_size"], stored["alpha"], stored["length_penalty"],
            stored["stopping"], stored["patience"], stored["min_length"]) == (
        4, 0.6, "gnmt", "transformers", 1.0, 0)
    lines = [line for line in trained[3].splitlines() if "CTranslate2" in line]
    assert lines == [
        "CTranslate2 cannot search as the model directory does: translate_batch(..., "
        "beam_size=4, length_penalty=0.6, patience=1) ranks by length^0.6, not by the model "
        "directory's gnmt length penalty ((5 + length) / 6)^0.6; it ends a sentence once "
        "beam_size x patience hypotheses have finished (stopping=first), not by the model "
        "directory's transformers rule"], trained[3][-2000:]
    assert search_note(DecodeConfig(beam_size=5, alpha=1.0, length_penalty="average",
                                    stopping="first", patience=2.0)) == (
        "CTranslate2 takes the search per request: translate_batch(..., beam_size=5, "
        "length_penalty=1, patience=2)")
    assert "not by the model directory's exact rule" in search_note(
        DecodeConfig(length_penalty="average", stopping="exact"))


def _ct2_translate(model_dir, texts, beam_size, alpha, max_decoding_length):
    """CTranslate2's best hypothesis of each text, as pieces, tokenized by the exported
    spm.model as the README's serving example does."""
    import sentencepiece as spm
    sp = spm.SentencePieceProcessor(model_file=str(model_dir / "spm.model"))
    translator = ctranslate2.Translator(str(model_dir), device="cpu", intra_threads=2)
    results = translator.translate_batch(
        [sp.encode(t, out_type=str) for t in texts], beam_size=beam_size,
        length_penalty=alpha, max_decoding_length=max_decoding_length,
        min_decoding_length=0, suppress_sequences=SUPPRESS)
    return sp, [r.hypotheses[0] for r in results]


def test_ctranslate2_beam_search_agrees_with_the_saved_model(trained):
    import tensorflow as tf
    import tensorflow_text  # noqa: F401
    _, saved_model, ct2_dir, _ = trained
    texts = sources(200)
    loaded = tf.saved_model.load(str(saved_model))
    ours = [t.decode() for t in loaded.signatures["serving_default"](
        inputs=tf.constant(texts))["translations"].numpy()]
    sp, theirs = _ct2_translate(ct2_dir, texts, 4, 0.6, 127)
    theirs = [sp.decode(pieces) for pieces in theirs]
    # The stopping rules differ (ours Hugging Face's, CTranslate2's once 4 hypotheses have
    # finished), so do the length penalties (ours ((5 + len) / 6)^alpha, CTranslate2's
    # len^alpha) and the maximum lengths (ours per sentence): a few sentences may end
    # differently.
    agree = np.mean([a == b for a, b in zip(ours, theirs)])
    assert agree >= 0.95, [(a, b) for a, b in zip(ours, theirs) if a != b][:5]


def export_average_first(model_dir: Path, root: Path):
    """trainer.export of model_dir's SavedModel, searching as the CTranslate2 export's note
    says CTranslate2 does: the average length penalty and the first stopping rule (the
    model directory's beam 4 and alpha 0.6 kept), into root/saved_model."""
    succeeded(program("export", f"--model_dir={model_dir}", "--length_penalty=average",
                      "--stopping=first", f"--export_dir={root / 'saved_model'}"))


def test_at_equal_rules_beam_search_gives_the_saved_models_tokens_and_scores(
        trained, tmp_path_factory):
    """At the rules CTranslate2 searches by (the average penalty, the first rule, the same
    beam 4, alpha 0.6 and patience, the same maximum length), its beam search over the
    float32 conversion gives the SavedModel's outputs, token for token, and its scores.

    The main job's SavedModel ranks by gnmt, which no request can change (the length
    penalty is an export setting), so this test exports one at average and first (16 s),
    once per test run."""
    import sentencepiece as spm
    import tensorflow as tf
    import tensorflow_text  # noqa: F401
    model_dir, _, ct2_dir, _ = trained
    root = built_once(tmp_path_factory, "saved_model_average_first",
                      lambda root: export_average_first(model_dir, root), model_dir)
    loaded = tf.saved_model.load(str(root / "saved_model" / "1"))
    sp = spm.SentencePieceProcessor(model_file=str(ct2_dir / "spm.model"))
    texts = sources(200)
    source = [sp.encode(text) + [3] for text in texts]  # EOS ends every source
    width = max(map(len, source))
    ours = loaded.signatures["translate_ids"](
        source_ids=tf.constant([row + [0] * (width - len(row)) for row in source]))
    ids, lengths, scores = (ours[key].numpy() for key in ("ids", "lengths", "scores"))
    translator = ctranslate2.Translator(str(ct2_dir), device="cpu", intra_threads=2)

    def translate(**suppress):
        """CTranslate2's best hypothesis of each text (its ids) and its score. Ours ends an
        output at the source's ids + 50, EOS included: CTranslate2's maximum is one per
        request, so each request holds the sources of one length."""
        found, found_scores = [None] * len(texts), np.zeros(len(texts))
        for length in sorted(set(map(len, source))):
            rows = [i for i, row in enumerate(source) if len(row) == length]
            results = translator.translate_batch(
                [sp.encode(texts[i], out_type=str) for i in rows], beam_size=4,
                length_penalty=0.6, patience=1, max_decoding_length=length + 50,
                min_decoding_length=0, return_scores=True, **suppress)
            for i, result in zip(rows, results):
                found[i] = [sp.piece_to_id(p) for p in result.hypotheses[0]]
                found_scores[i] = result.scores[0]
        return found, found_scores

    # Both softmaxes over the whole vocabulary (ours never emits PAD or BOS, it ranks them
    # out after the softmax): CTranslate2 emits neither here either.
    found, found_scores = translate()
    for row, (theirs, length) in enumerate(zip(found, lengths)):
        assert ids[row, :length].tolist() == theirs + [3], texts[row]
    # Measured: within 7.3e-7 (2.5e-7 on average) of scores near -0.2 to -0.4, float32's
    # rounding of a sum over at most 10 tokens; 1e-5 leaves room for other kernels, and is
    # a tenth of what one token's share of 2e-4 (PAD's, below) moves a score.
    np.testing.assert_allclose(found_scores, scores, atol=1e-5, rtol=0)
    # suppress_sequences (SUPPRESS, as docs/serving.md's client asks) takes PAD and BOS
    # out of CTranslate2's softmax: the same tokens, each scored higher by the share the
    # model gives those two ids (label smoothing's 0.1 / 500 each once trained): measured
    # 5.1e-4 to 1.2e-3 higher.
    suppressed, suppressed_scores = translate(suppress_sequences=SUPPRESS)
    assert suppressed == found
    assert np.all(suppressed_scores - scores > 1e-4) and np.all(suppressed_scores - scores < 3e-3)


def test_with_beam_1_and_alpha_0_the_outputs_are_identical_token_for_token(trained):
    """CTranslate2's beam 1 is greedy: the most probable token at every step. Our beam
    search of size 1 is not quite (an output that ended with EOS competes with the live
    beam's continuation on total log-prob, so "zwölf" can beat the likelier next token
    "tausend"), so the comparison is with our greedy search."""
    import tensorflow as tf
    from keras_transformer import DecodeConfig, greedy_search
    from trainer.serving import saved_model
    model_dir, _, ct2_dir, _ = trained
    translator, _ = saved_model.build_translator(str(model_dir))
    texts = sources(200)
    source_ids = translator.source_ids(tf.constant(texts))
    result = greedy_search(translator.step(source_ids, shortlist=False), DecodeConfig(alpha=0.0))
    sp, theirs = _ct2_translate(ct2_dir, texts, 1, 0.0, translator.model.config.max_length - 2)
    max_lengths = np.sum(source_ids.numpy() != 0, axis=1) + 50
    for row, length, cap, pieces in zip(result.ids[:, 0].numpy(),
                                        result.lengths[:, 0].numpy(), max_lengths, theirs):
        ours = [sp.id_to_piece(int(i)) for i in row[:length - 1]]  # without EOS
        # Ours forces EOS at the sentence's cap (source length + 50); CTranslate2's cap
        # is the batch's.
        assert ours == (pieces[:len(ours)] if length == cap else pieces)


def _model_bin_dtypes(path: Path):
    """{variable name: its type on disk} of a CTranslate2 model.bin, read as
    ctranslate2.specs.ModelSpec writes it (a version, the spec's name and revision, then
    each variable: name, rank, dims, type id, byte count, bytes)."""
    import struct
    names = ("float32", "int8", "int16", "int32", "float16", "bfloat16")  # types.h's order
    data = path.read_bytes()
    offset = 0

    def read(fmt):
        nonlocal offset
        values = struct.unpack_from("<" + fmt, data, offset)  # as written: no padding
        offset += struct.calcsize("<" + fmt)
        return values

    def string():
        nonlocal offset
        (length,) = read("H")
        offset += length
        return data[offset - length:offset - 1].decode()

    read("I")
    string()
    _, count = read("II")
    dtypes = {}
    for _ in range(count):
        name = string()
        (rank,) = read("B")
        read(f"{rank}I")
        type_id, size = read("BI")
        offset += size
        dtypes[name] = names[type_id]
    return dtypes


def test_the_default_export_is_int8_and_translates_as_float32_does(trained, tmp_path):
    """`trainer.export --format=ctranslate2` without --quantization writes int8 weights
    (every linear's and the embedding's weight int8 on disk, beside its float32 scale) into
    saved_models/<name>-ctranslate2-int8, which CTranslate2 loads as int8 and whose beam
    outputs are the float32 conversion's (200 of 200 measured; 97% asked)."""
    model_dir, _, float32_dir, _ = trained
    result = succeeded(program("export", f"--model_dir={model_dir}", "--format=ctranslate2",
                               cwd=tmp_path))
    out = tmp_path / "saved_models" / f"{model_dir.name}-ctranslate2-int8"
    assert result.stdout.strip() == (
        f"exported CTranslate2 model to saved_models/{model_dir.name}-ctranslate2-int8")
    dtypes = _model_bin_dtypes(out / "model.bin")
    weights = [name for name in dtypes if name.endswith("/weight")]
    assert len(weights) > 20
    assert all(dtypes[name] == "int8" and dtypes[f"{name}_scale"] == "float32"
               for name in weights), {name: dtypes[name] for name in weights}
    float32_dtypes = _model_bin_dtypes(float32_dir / "model.bin")  # the same variables
    assert {float32_dtypes[name] for name in weights} == {"float32"}
    assert not any(name.endswith("_scale") for name in float32_dtypes)
    # As stored; CTranslate2's int8 computes with float32 activations on a CPU.
    translator = ctranslate2.Translator(str(out), device="cpu", intra_threads=2)
    assert translator.compute_type.startswith("int8")
    assert ctranslate2.Translator(str(float32_dir), device="cpu").compute_type == "float32"
    texts = sources(200)
    _, int8 = _ct2_translate(out, texts, 4, 0.6, 127)
    _, float32 = _ct2_translate(float32_dir, texts, 4, 0.6, 127)
    assert np.mean([a == b for a, b in zip(int8, float32)]) >= 0.97, [
        (a, b) for a, b in zip(int8, float32) if a != b][:5]


def test_the_shortlist_is_a_vmap_that_restricts_ctranslate2_to_its_candidates(
        trained, tmp_path):
    """--shortlist writes vmap.txt: the K most frequent target pieces of the corpus under
    the empty key, and each source piece's M most co-occurring others. With use_vmap=True
    CTranslate2 translates each input among the frequent pieces, its source pieces'
    lists and the special pieces it adds itself (<unk>, <s>, </s>), and only that changes:
    an output that keeps to those pieces without the map is the same with it.

    A real export of its own (5 s): the shortlist is made at export time, from a corpus of
    2,000 pairs of the builtin corpus; K 50 and M 5 are small enough that some outputs of
    the whole vocabulary (20 of 200 measured) leave their candidates."""
    import collections
    import sentencepiece as spm
    from trainer.data.builtin_corpus import english, german
    model_dir, _, float32_dir, _ = trained
    numbers = [3 + 97 * i for i in range(2000)]
    corpus = {"src.txt": english, "tgt.txt": german}
    for name, language in corpus.items():
        (tmp_path / name).write_text("\n".join(language(n) for n in numbers) + "\n", "utf-8")
    out = tmp_path / "ct2"
    succeeded(program("export", f"--model_dir={model_dir}", "--format=ctranslate2",
                      "--quantization=float32", f"--export_dir={out}",
                      f"--shortlist={tmp_path / 'src.txt'},{tmp_path / 'tgt.txt'}",
                      "--shortlist_frequent=50", "--shortlist_per_source=5"))
    vmap = {}
    for line in (out / "vmap.txt").read_text("utf-8").splitlines():
        key, tab, pieces = line.partition("\t")
        assert tab and key not in vmap, line
        vmap[key] = set(pieces.split())
    sp = spm.SentencePieceProcessor(model_file=str(out / "spm.model"))
    pairs = [(sp.encode(english(n), out_type=str), sp.encode(german(n), out_type=str))
             for n in numbers]
    counts = collections.Counter(piece for _, target in pairs for piece in target)
    frequent = vmap.pop("")
    assert len(frequent) == 50 and min(counts[p] for p in frequent) >= max(
        count for piece, count in counts.items() if piece not in frequent)
    seen_with = collections.defaultdict(set)  # source piece -> target pieces of its pairs
    for source, target in pairs:
        for piece in source:
            seen_with[piece].update(target)
    assert vmap and all(0 < len(listed) <= 5 and not listed & frequent
                        and listed <= seen_with[key] for key, listed in vmap.items())

    texts = sources(200)
    inputs = [sp.encode(text, out_type=str) for text in texts]
    # At most the model's 127 positions after BOS: a restricted search may loop.
    search = dict(beam_size=4, length_penalty=0.6, max_decoding_length=126,
                  min_decoding_length=0, suppress_sequences=SUPPRESS)
    whole = [r.hypotheses[0] for r in ctranslate2.Translator(
        str(float32_dir), device="cpu", intra_threads=2).translate_batch(inputs, **search)]
    translator = ctranslate2.Translator(str(out), device="cpu", intra_threads=2)
    kept = 0
    for pieces, free in zip(inputs, whole):  # one input a request: its own candidates
        candidates = frequent.union(*(vmap.get(p, ()) for p in pieces), {"<unk>", "<s>", "</s>"})
        found = translator.translate_batch([pieces], use_vmap=True, **search)[0].hypotheses[0]
        assert set(found) <= candidates, (pieces, found)
        if set(free) <= candidates:
            assert found == free, (pieces, found, free)
            kept += 1
    assert 0.5 * len(texts) <= kept < len(texts)


def test_pre_norm_learned_positions_and_separate_vocabularies_convert(tmp_path):
    """The variants the paper does not use convert too (and encoder and decoder depths
    apart, 3 and 1): a random model's greedy output, id for id."""
    import tensorflow as tf
    from keras_transformer import Transformer, TransformerConfig, greedy_search
    from trainer.data import builtin_corpus
    from trainer.data.tokenizer import Tokenizer, Tokenizers, train_sentencepiece
    from trainer.serving import ctranslate2 as ctranslate2_format
    english = [builtin_corpus.english(i) for i in range(0, 20000, 7)]
    german = [builtin_corpus.german(i) for i in range(0, 20000, 7)]
    tokenizers = Tokenizers(Tokenizer(train_sentencepiece(english, 400)),
                            Tokenizer(train_sentencepiece(german, 500)))
    config = TransformerConfig.tiny(vocab_size=tokenizers.target.vocab_size,
                                    source_vocab_size=tokenizers.source.vocab_size,
                                    share_embeddings=False, pre_norm=True,
                                    positional="learned", max_length=24,
                                    num_encoder_layers=3, num_decoder_layers=1)
    model = Transformer(config)
    model.build()
    out = ctranslate2_format.write(model, tokenizers, str(tmp_path / "ct2"), "float32")
    texts = english[:50]
    pieces = tokenizers.source.tokenize(tf.constant(texts))[:, :config.max_length - 1]
    eos = tf.fill([len(texts), 1], 3)
    source_ids = tf.concat([pieces, tf.RaggedTensor.from_tensor(eos)], 1).to_tensor()
    result = decode(greedy_search, model, source_ids, alpha=0.0)
    translator = ctranslate2.Translator(out, device="cpu", intra_threads=2)
    import sentencepiece as spm
    target = spm.SentencePieceProcessor(model_proto=tokenizers.target.model_proto)
    source = spm.SentencePieceProcessor(model_proto=tokenizers.source.model_proto)
    lengths = result.lengths[:, 0]
    for i, text in enumerate(texts):
        tokens = [source.id_to_piece(int(t)) for t in pieces[i].numpy()]
        theirs = translator.translate_batch(
            [tokens], beam_size=1, max_decoding_length=int(lengths[i]) - 1,
            min_decoding_length=0, suppress_sequences=SUPPRESS)[0].hypotheses[0]
        ours = [target.id_to_piece(int(t)) for t in result.ids[i, 0, :lengths[i]]]
        assert ours[:len(theirs)] == theirs and len(ours) - len(theirs) <= 1


def test_without_the_extra_the_export_names_it(tmp_path):
    # A real `python -m trainer.export` in a process where ctranslate2 cannot be imported.
    hide = ("import sys, runpy\n"
            "class Hide:\n"
            "    def find_spec(self, name, *args):\n"
            "        if name.split('.')[0] == 'ctranslate2':\n"
            "            raise ModuleNotFoundError(name)\n"
            "sys.meta_path.insert(0, Hide())\n"
            "sys.argv = ['trainer.export'] + sys.argv[1:]\n"
            "runpy.run_module('trainer.export', run_name='__main__')\n")
    result = subprocess.run([sys.executable, "-c", hide, f"--model_dir={tmp_path}",
                             "--format=ctranslate2", f"--export_dir={tmp_path / 'ct2'}"],
                            cwd=REPO, env=_env(), capture_output=True, timeout=60)
    assert result.returncode == 2
    lines = result.stderr.decode().strip().splitlines()
    assert len(lines) == 1 and '".[ctranslate2]"' in lines[0], lines
    assert not (tmp_path / "ct2").exists()
