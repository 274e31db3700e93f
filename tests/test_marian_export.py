"""`trainer.export --format=marian`: a model directory as a Hugging Face Marian checkpoint.

A converted OPUS-MT-shaped model goes back to the tensors and files it came from; models
trained here (post-norm, relu, the paper's interleaved sinusoids, shared and separate
vocabularies) load in Transformers with their logits and, where the search settings
agree, their beam outputs, and convert back to model directories that translate as
generate() does. The Transformers checks skip where transformers is not installed (it is
never the project's requirement; CI installs it beside torch)."""

import dataclasses
import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import tensorflow as tf

from conftest import built_once
from programs import program, succeeded
from keras_transformer import (BOS_ID, EOS_ID, PAD_ID, DecodeConfig, TransformerStep,
                               beam_search)
from trainer.conversion import marian
from trainer.formats import safetensors
from trainer.data import vocabulary
from trainer.data.builtin_corpus import english, german
from trainer.model_dir import layout
from trainer.serving import marian as marian_export

pytestmark = pytest.mark.slow

FIXTURES = Path(__file__).parent / "fixtures" / "marian"
FILES = ["README.md", "config.json", "generation_config.json", "model.safetensors",
         "source.spm", "target.spm", "tokenizer_config.json", "vocab.json"]
# Inputs of the builtin corpus's kind, as the trained models saw them.
NUMBERS = [7, 21, 305, 4096, 70013, 918273, 12, 600, 55555, 100]


@pytest.mark.parametrize("name", ["shared_swish", "separate_gelu", "deeper_encoder"])
def test_a_converted_model_exports_to_the_tensors_it_was_converted_from(
        name, tmp_path, capsys):
    checkpoint = FIXTURES / name
    marian.convert(str(checkpoint), str(tmp_path / "converted"))
    capsys.readouterr()
    out = Path(marian_export.export(str(tmp_path / "converted"), str(tmp_path / "marian")))
    # Its PAD's output bias gives PAD nothing of the softmax: no line on PAD's share.
    assert "PAD" not in capsys.readouterr().err
    original = safetensors.load(str(checkpoint / "model.safetensors"))
    exported = safetensors.load(str(out / "model.safetensors"))
    assert sorted(exported) == sorted(original)
    for tensor in original:
        np.testing.assert_array_equal(exported[tensor], original[tensor], err_msg=tensor)
    for vocab in ("vocab.json", "target_vocab.json"):
        assert (out / vocab).exists() == (checkpoint / vocab).exists()
        if (checkpoint / vocab).exists():
            assert json.loads((out / vocab).read_text("utf-8")) == \
                json.loads((checkpoint / vocab).read_text("utf-8"))
    for spm in ("source.spm", "target.spm"):
        assert (out / spm).read_bytes() == (checkpoint / spm).read_bytes()
    # The architecture and generate()'s settings, as the checkpoint has them.
    ours, theirs = (json.loads((d / "config.json").read_text()) for d in (out, checkpoint))
    for key in ("vocab_size", "decoder_vocab_size", "d_model", "encoder_layers",
                "decoder_layers", "encoder_attention_heads", "encoder_ffn_dim",
                "activation_function", "max_position_embeddings", "pad_token_id",
                "eos_token_id", "decoder_start_token_id", "share_encoder_decoder_embeddings"):
        assert ours.get(key) == theirs.get(key, ours.get(key)), key
    ours, theirs = (json.loads((d / "generation_config.json").read_text())
                    for d in (out, checkpoint))
    for key in ("num_beams", "max_length", "bad_words_ids", "forced_eos_token_id"):
        assert ours[key] == theirs[key], key


# A model with separate vocabularies, trained for 100 steps (24 s), whose translations end
# by themselves at different lengths.
SEPARATE = ["--train_steps=100", "--warmup_steps=50", "--eval_every=0", "--checkpoint_every=100",
            "--log_every=100", "--separate_vocabularies", "--vocab_size=300", "--export_dir=none",
            "--precision=float32"]


def train_separate(root: Path):
    succeeded(program("task", *SEPARATE, f"--model_dir={root / 'model'}", cwd=root))


@pytest.fixture(scope="module")
def trained(exported, tmp_path_factory):
    """{"shared": the session's trained model directory (conftest's `exported`, 30 steps),
    "separate": SEPARATE's (trained once per test run, whichever workers read it)}."""
    separate = built_once(tmp_path_factory, "separate_vocabularies", train_separate, SEPARATE)
    return {"shared": exported.model_dir, "separate": separate / "model"}


def export_marian(model_dir: Path, root: Path):
    """trainer.export --format=marian of model_dir into root/marian, its stdout and stderr
    in root/stdout.txt and root/stderr.txt."""
    result = succeeded(program("export", "--format=marian", f"--model_dir={model_dir}",
                               f"--export_dir={root / 'marian'}"))
    (root / "stdout.txt").write_text(result.stdout)
    (root / "stderr.txt").write_text(result.stderr)


@pytest.fixture(scope="module")
def marian_exports(trained, tmp_path_factory):
    """{kind: (the Marian checkpoint, stdout, stderr lines)} of `trainer.export
    --format=marian` run on each trained model, once per kind and test run."""
    def export(kind):
        root = built_once(tmp_path_factory, f"marian_{kind}",
                          lambda root: export_marian(trained[kind], root), trained[kind])
        return (root / "marian", (root / "stdout.txt").read_text(),
                (root / "stderr.txt").read_text().strip().splitlines())
    return export


def _teacher_forced(model, source_ids, target_ids):
    """Our logits [batch, len + 1, vocab] of BOS + target_ids; ids 0-padded lists."""
    def padded(rows):
        width = max(map(len, rows))
        return tf.constant([row + [PAD_ID] * (width - len(row)) for row in rows])
    return model((padded(source_ids), padded([[BOS_ID] + t for t in target_ids]))).numpy()


def _ids(tokenizer, texts, eos):
    rows = tokenizer.tokenize(tf.constant(texts)).to_list()
    return [row + [EOS_ID] if eos else row for row in rows]


@pytest.mark.parametrize("kind", ["shared", "separate"])
def test_a_trained_model_exported_and_converted_back_computes_its_logits(
        trained, marian_exports, kind, tmp_path):
    """Without Transformers: the export's map, read back by the converter, is the model's
    own, through the reordered width of its sinusoids and its special ids (the layer
    norms' epsilon, Marian's 1e-5 against 1e-6, moves the logits by ~1e-5)."""
    out, stdout, notes = marian_exports(kind)
    assert stdout.strip() == f"exported Hugging Face Marian checkpoint to {out}"
    assert sorted(p.name for p in out.iterdir()) == sorted(
        FILES + ([] if kind == "shared" else ["target_vocab.json"]))
    # The settings generate() takes otherwise than the model directory, a line each: the
    # penalty and the output limit, not the stopping rule (trainer.task's is generate()'s).
    assert [line.split(" ")[0] for line in notes[-3:]] == \
        ["Marian's", "generate()", "generate()"]
    assert "gnmt penalty ((5 + length) / 6)^0.6" in notes[-2]
    assert sum(line.startswith(PAD_NOTE) for line in notes) == 1
    assert not any("stops a sentence" in line for line in notes)
    marian.convert(str(out), str(tmp_path / "back"))
    model, back = (layout.restore_model(str(d)) for d in (trained[kind], tmp_path / "back"))
    assert back.config.sinusoid_layout == "concatenated" != model.config.sinusoid_layout
    tokenizers = vocabulary.load_or_train(str(trained[kind]), None)
    sources = _ids(tokenizers.source, [english(n) for n in NUMBERS], eos=True)
    targets = _ids(tokenizers.target, [german(n) for n in NUMBERS], eos=True)
    ours = _teacher_forced(model, sources, targets)
    again = _teacher_forced(back, sources, targets)
    # The converted model's ids are ours: its vocabulary lists our pieces in our order.
    assert vocabulary.load_or_train(str(tmp_path / "back"), None).target.pieces()[4:] == \
        tokenizers.target.pieces()[4:]
    for row, target in enumerate(targets):
        np.testing.assert_allclose(again[row, :len(target) + 1, 1:],
                                   ours[row, :len(target) + 1, 1:], atol=1e-4, rtol=0)


def test_the_checkpoint_carries_a_model_card_for_the_hub(exported, marian_exports, tmp_path):
    """README.md, as the Hub reads it: front matter with the languages given and
    `pipeline_tag: translation`, then the model and how to load it; without the languages,
    none listed and one line saying how to give them."""
    out = tmp_path / "numbers-en-de"
    result = succeeded(program("export", "--format=marian", f"--model_dir={exported.model_dir}",
                               f"--export_dir={out}", "--source_lang=en", "--target_lang=de"))
    card = (out / "README.md").read_text(encoding="utf-8")
    assert card.startswith("---\n")
    front, body = card[len("---\n"):].split("\n---\n", 1)
    assert front.splitlines()[:3] == ["language:", "- en", "- de"]
    assert "pipeline_tag: translation" in front.splitlines()
    assert "- translation" in front.splitlines() and "library_name: transformers" in front
    assert body.lstrip().startswith("# numbers-en-de\n") and "from en to de" in body
    assert 'MarianMTModel.from_pretrained("numbers-en-de")' in body
    settings = json.loads((out / "generation_config.json").read_text())
    assert f"beam {settings['num_beams']}," in body
    assert f"at most {settings['max_length']} positions" in body
    assert "names no languages" not in result.stderr
    unnamed, _, notes = marian_exports("shared")
    card = (unnamed / "README.md").read_text(encoding="utf-8")
    assert "language:" not in card and "\npipeline_tag: translation\n" in card
    assert any(line.startswith("the model card (README.md) names no languages: give "
                               "--source_lang and --target_lang") for line in notes)


@pytest.mark.parametrize("kind", ["shared", "separate"])
def test_transformers_loads_a_trained_model_with_its_logits_and_its_beam_outputs(
        trained, marian_exports, kind, tmp_path):
    torch = pytest.importorskip("torch", reason="Transformers needs torch: pip install torch")
    transformers = pytest.importorskip("transformers", reason="pip install transformers")
    out = marian_exports(kind)[0]
    hf = transformers.MarianMTModel.from_pretrained(str(out)).eval()
    tokenizer = transformers.MarianTokenizer.from_pretrained(str(out))
    model = layout.restore_model(str(trained[kind]))
    tokenizers = vocabulary.load_or_train(str(trained[kind]), None)
    config = model.config
    target_order = marian_export.marian_order(config.vocab_size, config.share_embeddings)
    ours_of = {m: o for m, o in enumerate(target_order)}

    # Tokenized alike: Marian's ids are ours, renumbered.
    inputs = [english(n) for n in NUMBERS]
    batch = tokenizer(inputs, text_target=[german(n) for n in NUMBERS], return_tensors="pt",
                      padding=True)
    source_order = marian_export.marian_order(config.input_vocab_size, config.share_embeddings)
    sources = _ids(tokenizers.source, inputs, eos=True)
    assert [[source_order[i] for i in row if i != hf.config.pad_token_id]
            for row in batch["input_ids"].tolist()] == sources
    pad = hf.config.pad_token_id
    targets = [[ours_of[i] for i in row if i != pad] for row in batch["labels"].tolist()]
    assert targets == _ids(tokenizers.target, [german(n) for n in NUMBERS], eos=True)

    # Teacher-forced logits within 1e-4, on every Marian id.
    labels = batch.pop("labels")
    start = torch.full((len(inputs), 1), hf.config.decoder_start_token_id)
    decoder_inputs = torch.cat([start, labels[:, :-1]], 1)
    with torch.no_grad():
        theirs = hf(**batch, decoder_input_ids=decoder_inputs).logits.numpy()
    ours = _teacher_forced(model, sources, [t[:-1] for t in targets])
    for row, target in enumerate(targets):
        np.testing.assert_allclose(ours[row, :len(target)][:, target_order],
                                   theirs[row, :len(target)], atol=1e-4, rtol=0)

    # generate() with the exported generation_config.json, and our search where the
    # settings agree: beam 4, length^0.6, its stopping rule and its max_length. Our
    # log-probs are not quite Transformers' (this model's softmax also spreads over its
    # PAD id, which Marian lacks, and its layer norms add 1e-6, not 1e-5), and
    # generate()'s rule is not continuous (a hypothesis ranked 4th of 8 finishes, 5th
    # does not), so a near tie may go the other way: most outputs are the same.
    with torch.no_grad():
        generated = hf.generate(**tokenizer(inputs, return_tensors="pt", padding=True))
    expected = tokenizer.batch_decode(generated, skip_special_tokens=True)
    settings = json.loads((out / "generation_config.json").read_text())
    source_ids = tf.ragged.constant(sources).to_tensor()
    generates = DecodeConfig(beam_size=settings["num_beams"], alpha=settings["length_penalty"],
                             length_penalty="average", stopping="transformers",
                             max_length=settings["max_length"],
                             max_extra_length=settings["max_length"])
    result = beam_search(TransformerStep(model, source_ids),
                         dataclasses.replace(generates, num_hypotheses=1))
    found = [t.decode() for t in tokenizers.target.detokenize(result.ids[:, 0]).numpy()]
    assert sum(a == b for a, b in zip(found, expected)) >= 0.8 * len(inputs)

    # Converted back, the model directory (Marian's numerics, its search settings)
    # translates exactly as generate() does, by default.
    marian.convert(str(out), str(tmp_path / "back"))
    decode = layout.load_decode(str(tmp_path / "back"))
    back = layout.restore_model(str(tmp_path / "back"))
    back_tokenizers = vocabulary.load_or_train(str(tmp_path / "back"), None)
    back_sources = tf.ragged.constant(_ids(back_tokenizers.source, inputs, eos=True))
    result = beam_search(TransformerStep(back, back_sources.to_tensor()),
                         dataclasses.replace(decode, num_hypotheses=1))
    found = [t.decode() for t in back_tokenizers.target.detokenize(result.ids[:, 0]).numpy()]
    assert found == expected


# conftest.sources' inputs: 300 English number words, the issue's check.
NUMBER_WORDS = [7 + 389 * i for i in range(300)]


@pytest.fixture(scope="module")
def main_job_marian(main_job, tmp_path_factory):
    """(the main job's model directory, its Marian export, that export converted back by
    trainer.convert). The main job's model (conftest.main_job, trained once for this
    xdist_group) translates the builtin corpus; its 500 pieces lack "ö", which it spells
    with the byte pieces <0xC3> <0xB6>."""
    root = tmp_path_factory.mktemp("main_job_marian")
    model_dir = main_job.directory / "runs" / "tiny_builtin"
    marian_export.export(str(model_dir), str(root / "marian"))
    marian.convert(str(root / "marian"), str(root / "back"))
    return model_dir, root / "marian", root / "back"


def _generate(torch, transformers, checkpoint, texts):
    """generate()'s texts of a Marian checkpoint, with its own generation_config.json."""
    hf = transformers.MarianMTModel.from_pretrained(str(checkpoint)).eval()
    tokenizer = transformers.MarianTokenizer.from_pretrained(str(checkpoint))
    with torch.no_grad():
        ids = hf.generate(**tokenizer(texts, return_tensors="pt", padding=True))
    return tokenizer.batch_decode(ids, skip_special_tokens=True)


def _byte_piece_inputs():
    """The inputs of NUMBER_WORDS whose German has an "ö", which the main job's vocabulary
    spells with byte pieces."""
    return [english(n) for n in NUMBER_WORDS if "ö" in german(n)]


@pytest.mark.xdist_group("main_job")
def test_a_model_back_from_hugging_face_writes_byte_pieces_as_their_characters(
        main_job_marian, tmp_path):
    """Exported to Marian and converted back, a model trained here keeps its byte pieces'
    characters: its default export (the Translator the SavedModel saves; the detokenizer's
    saved form is tests/test_tokenizer.py's) and its Marian export again write "zwölf" as
    generate() does on the first export, not "zw<0xC3><0xB6>lf"."""
    torch = pytest.importorskip("torch", reason="Transformers needs torch: pip install torch")
    transformers = pytest.importorskip("transformers", reason="pip install transformers")
    from trainer.serving import saved_model
    model_dir, out, back = main_job_marian
    target = vocabulary.load_or_train(str(back), None).target
    pieces = target.id_to_piece(target.tokenize(tf.constant(["zwölf"]))[0]).numpy().tolist()
    assert b"<0xC3>" in pieces and b"<0xB6>" in pieces  # and id_to_piece keeps their names

    inputs = _byte_piece_inputs()
    expected = _generate(torch, transformers, out, inputs)
    assert len(inputs) >= 5 and sum("ö" in text for text in expected) >= len(inputs) / 2, \
        expected

    translator, _ = saved_model.build_translator(str(back))  # the default export's
    found = translator.translate(tf.constant(inputs))["translations"].numpy()
    assert [text.decode("utf-8") for text in found] == expected

    again = marian_export.export(str(back), str(tmp_path / "again"))
    assert _generate(torch, transformers, again, inputs) == expected


@pytest.mark.xdist_group("main_job")
def test_a_model_back_from_hugging_face_translates_in_ctranslate2_as_our_search_does(
        main_job_marian, tmp_path):
    """Converted back from its Marian export, the main job's model exported to CTranslate2
    and read by its target SentencePiece model as docs/serving.md's client reads it writes
    what our search writes at CTranslate2's rules (the converted directory's average
    penalty, alpha and max_length, the first stopping rule), byte pieces as their
    characters. Needs ctranslate2 only."""
    ctranslate2 = pytest.importorskip("ctranslate2")
    import sentencepiece as spm
    from trainer.serving import ctranslate2 as ct2_export, saved_model
    _, _, back = main_job_marian
    inputs = _byte_piece_inputs()
    assert len(inputs) >= 5
    translator, _ = saved_model.build_translator(str(back))
    ct2_dir = ct2_export.export(str(back), str(tmp_path / "ct2"),
                                ct2_export.Options(quantization="float32"))
    source, target_spm = (spm.SentencePieceProcessor(model_file=f"{ct2_dir}/{name}")
                          for name in (vocabulary.SOURCE_MODEL, vocabulary.TARGET_MODEL))
    decode = layout.load_decode(str(back))
    assert decode.length_penalty == "average"  # the converted checkpoint's, generate()'s
    results = ctranslate2.Translator(ct2_dir, device="cpu", intra_threads=2).translate_batch(
        [source.encode(text, out_type=str) for text in inputs], beam_size=decode.beam_size,
        length_penalty=decode.alpha, max_decoding_length=decode.max_length - 1,
        suppress_sequences=[["<pad>"], ["<s>"]])
    # CTranslate2 stops by its own rule (the first beam_size finished), which may end a
    # sentence on another hypothesis than generate()'s rule: the same search on our side.
    source_ids = translator.source_ids(tf.constant(inputs))
    ours = translator.best(source_ids, translator.search(
        source_ids, decode=dataclasses.replace(decode, stopping="first")))["translations"].numpy()
    theirs = [target_spm.decode(r.hypotheses[0]) for r in results]
    assert theirs == [text.decode("utf-8") for text in ours]
    assert not any("<0x" in text for text in theirs)
    assert sum("ö" in text for text in theirs) >= len(inputs) / 2, theirs


@pytest.mark.xdist_group("main_job")
def test_marians_epsilon_moves_transformers_log_probs_by_what_the_export_says(
        main_job_marian):
    """The export's note: Marian's layer norms add 1e-5 where a model trained here adds
    1e-6, which moves Transformers' teacher-forced log-probs of the main job's model by
    about 1e-6 a token (the 300 inputs' reference translations; docs/pretrained.md has the
    figures). The rest of the difference from the model's own log-probs is its PAD id,
    which Marian's vocabulary lacks: its softmax gives PAD a share that Transformers'
    gives the other ids. Without PAD in the softmax, the model's log-probs are
    Transformers' at its own epsilon."""
    torch = pytest.importorskip("torch", reason="Transformers needs torch: pip install torch")
    transformers = pytest.importorskip("transformers", reason="pip install transformers")
    model_dir, out, _ = main_job_marian
    hf = transformers.MarianMTModel.from_pretrained(str(out)).eval()
    tokenizer = transformers.MarianTokenizer.from_pretrained(str(out))
    batch = tokenizer([english(n) for n in NUMBER_WORDS],
                      text_target=[german(n) for n in NUMBER_WORDS], return_tensors="pt",
                      padding=True)
    labels = batch.pop("labels")
    pad = hf.config.pad_token_id
    start = torch.full((len(NUMBER_WORDS), 1), hf.config.decoder_start_token_id)
    decoder_inputs = torch.cat([start, labels[:, :-1]], 1)
    tokens = (labels != pad).numpy()

    def transformers_log_probs():  # of every reference token: [tokens]
        with torch.no_grad():
            logits = hf(**batch, decoder_input_ids=decoder_inputs).logits
        return torch.log_softmax(logits, -1).gather(-1, labels[..., None])[..., 0][tokens]

    norms = [m for m in hf.modules() if isinstance(m, torch.nn.LayerNorm)]
    assert norms and {m.eps for m in norms} == {marian_export.MARIAN_EPSILON}
    with_marians = transformers_log_probs().numpy()
    for norm in norms:
        norm.eps = 1e-6
    with_ours = transformers_log_probs().numpy()
    change = np.mean(np.abs(with_marians - with_ours))
    assert 0 < change < 10 * marian_export.EPSILON_LOG_PROB_CHANGE
    model = layout.restore_model(str(model_dir))
    config = model.config
    assert config.layer_norm_epsilon == 1e-6
    assert f"about {marian_export.EPSILON_LOG_PROB_CHANGE:g} a token" in \
        marian_export.notes(config, layout.load_decode(str(model_dir)))[0]

    target_order, source_order = (marian_export.marian_order(size, config.share_embeddings)
                                  for size in (config.vocab_size, config.input_vocab_size))
    targets = [[target_order[i] for i in row if i != pad] for row in labels.tolist()]
    sources = [[source_order[i] for i in row if i != pad]
               for row in batch["input_ids"].tolist()]
    logits = _teacher_forced(model, sources, [t[:-1] for t in targets])

    def at_targets(logits):  # [batch, length, vocab] -> the targets' log-probs [tokens]
        log_probs = tf.nn.log_softmax(logits).numpy()
        return np.concatenate([log_probs[row, np.arange(len(t)), t]
                               for row, t in enumerate(targets)])

    ours = at_targets(logits)
    logits[..., PAD_ID] = -np.inf
    np.testing.assert_allclose(at_targets(logits), with_ours, atol=1e-5, rtol=0)
    assert np.mean(np.abs(ours - with_marians)) > 10 * change  # PAD's share, mostly


PAD_NOTE = "Marian's vocabulary has no id for this model's PAD"


@pytest.mark.xdist_group("main_job")
def test_transformers_scores_the_main_jobs_outputs_above_the_saved_model_by_pads_share(
        main_job, tmp_path):
    """The main job's model exported by `trainer.export --format=marian`, as a user runs
    it: Transformers' log-prob of each of generate()'s 300 outputs is the float32
    SavedModel's `score` plus the share the model's softmax gives its PAD id at each
    token, which Marian's vocabulary lacks, and the export says how much that is a token
    (label smoothing's 0.1 / 500, measured 2.0e-4 a token, 2.0e-3 a sentence at most).
    What is left, within 1e-5 a token, is Marian's epsilon (1e-6 a token, the note's other
    line) and float32's rounding; the final logits bias is zeros, as the model has no
    output bias."""
    torch = pytest.importorskip("torch", reason="Transformers needs torch: pip install torch")
    transformers = pytest.importorskip("transformers", reason="pip install transformers")
    import tensorflow_text  # noqa: F401
    model_dir = main_job.directory / "runs" / "tiny_builtin"
    out = tmp_path / "marian"
    result = succeeded(program("export", "--format=marian", f"--model_dir={model_dir}",
                               f"--export_dir={out}"))
    config = layout.load_config(str(model_dir))
    assert (config.label_smoothing, config.vocab_size, config.output_bias) == (0.1, 500, False)
    share = config.label_smoothing / config.vocab_size
    lines = [line for line in result.stderr.splitlines() if line.startswith(PAD_NOTE)]
    assert lines == [f"{PAD_NOTE}, to which its softmax gives a share: Transformers' log-probs "
                     "are higher than the model's by that share (about label smoothing's "
                     "0.1 / 500 = 0.0002 a token once trained)"], result.stderr

    inputs = [english(n) for n in NUMBER_WORDS]
    hf = transformers.MarianMTModel.from_pretrained(str(out)).eval()
    tokenizer = transformers.MarianTokenizer.from_pretrained(str(out))
    assert not hf.final_logits_bias.any()
    with torch.no_grad():
        outputs = tokenizer.batch_decode(
            hf.generate(**tokenizer(inputs, return_tensors="pt", padding=True)),
            skip_special_tokens=True)
    batch = tokenizer(inputs, text_target=outputs, return_tensors="pt", padding=True)
    labels = batch.pop("labels")
    start = torch.full((len(inputs), 1), hf.config.decoder_start_token_id)
    with torch.no_grad():
        logits = hf(**batch, decoder_input_ids=torch.cat([start, labels[:, :-1]], 1)).logits
    tokens = labels != hf.config.pad_token_id
    theirs = (torch.log_softmax(logits, -1).gather(-1, labels[..., None])[..., 0]
              * tokens).sum(1).numpy()

    loaded = tf.saved_model.load(str(main_job.directory / "saved_models" / "tiny_builtin" / "1"))
    scored = loaded.signatures["score"](inputs=tf.constant(inputs), targets=tf.constant(outputs))
    ours, lengths = scored["log_probs"].numpy(), scored["lengths"].numpy()
    assert lengths.tolist() == tokens.sum(1).tolist()  # the same tokens, EOS included
    difference = theirs - ours
    assert np.all(difference > 0)
    np.testing.assert_allclose(difference.sum() / lengths.sum(), share, rtol=0.25)

    # PAD's share at each token, from the model's own teacher-forced softmax.
    model = layout.restore_model(str(model_dir))
    tokenizers = vocabulary.load_or_train(str(model_dir), None)
    targets = _ids(tokenizers.target, outputs, eos=True)
    log_probs = tf.nn.log_softmax(_teacher_forced(
        model, _ids(tokenizers.source, inputs, eos=True), [t[:-1] for t in targets])).numpy()
    pad_share = np.array([-np.log1p(-np.exp(log_probs[row, :len(t), PAD_ID])).sum()
                          for row, t in enumerate(targets)])
    np.testing.assert_array_less(np.abs(difference - pad_share),
                                 10 * marian_export.EPSILON_LOG_PROB_CHANGE * lengths)


@pytest.mark.parametrize("field,value,says", [
    ("pre_norm", True, "pre_norm=True: Marian's blocks are post-norm"),
    ("positional", "learned", "positional='learned': Marian's positions are sinusoidal"),
    ("key_dim", 8, "key_dim=8, value_dim=16: Marian's heads are d_model / num_heads = 16 "
                   "wide")])
def test_a_model_marian_cannot_express_stops_the_export_naming_the_field(
        exported, field, value, says, tmp_path):
    model_dir = tmp_path / "model"
    shutil.copytree(exported.model_dir, model_dir)
    config = json.loads((model_dir / "config.json").read_text())
    config["model"][field] = value
    (model_dir / "config.json").write_text(json.dumps(config))
    result = program("export", "--format=marian", f"--model_dir={model_dir}",
                     f"--export_dir={tmp_path / 'out'}")
    assert result.returncode == 2
    assert result.stderr.strip().splitlines()[-1] == (
        f"trainer.export: error: {model_dir}: {says}; Marian (MarianMTModel) cannot "
        "express it")
    assert not (tmp_path / "out").exists()
