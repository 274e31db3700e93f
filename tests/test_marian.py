"""OPUS-MT (Marian) checkpoints converted by `trainer.convert` compute what the reference
implementations compute: tests/fixtures/marian holds small random Marian models as
Hugging Face saves them (shared and separate vocabularies; 1, 2 and 3 layers, and encoder
and decoder depths apart, 2 and 3, 3 and 1; widths 32, 40 and 64; swish, gelu and relu;
three of them trained half-way, so that their outputs end by themselves), with the outputs
of Hugging Face Transformers' MarianMTModel (and of CTranslate2's own
TransformersConverter) on them, made by make_fixtures.py there (torch is not needed
here)."""

import dataclasses
import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import tensorflow as tf

from conftest import checkpoint_weights
from programs import program
from keras_transformer import (BOS_ID, EOS_ID, PAD_ID, UNK_ID, DecodeConfig, TransformerStep,
                               beam_search, greedy_search)
from trainer.conversion import marian
from trainer.data import vocabulary
from trainer.model_dir import layout
from trainer.model_dir.weights import WeightsChoice
from trainer.serving import saved_model
from trainer.serving.options import request_inputs

FIXTURES = Path(__file__).parent / "fixtures" / "marian"
NAMES = sorted(path.name for path in FIXTURES.iterdir() if (path / "config.json").exists())
PICKLED = "shared_swish"  # the fixture that also holds pytorch_model.bin
_CONVERTED = {}


class Converted:
    """A fixture converted into a model directory, with its reference outputs."""

    def __init__(self, name, root):
        self.input = FIXTURES / name
        self.model_dir = root / name
        marian.convert(str(self.input), str(self.model_dir))
        self.reference = json.loads((self.input / "reference.json").read_text("utf-8"))
        self.model = layout.restore_model(str(self.model_dir))
        self.tokenizers = vocabulary.load_or_train(str(self.model_dir), None)
        self.source_index = {p: i for i, p in enumerate(self.tokenizers.source.pieces())}
        self.target_pieces = self.tokenizers.target.pieces()
        target_vocab = self.input / ("vocab.json" if self.model.config.share_embeddings
                                     else "target_vocab.json")
        # The Marian id of each of our target ids (our PAD has none: -1).
        vocab = json.loads(target_vocab.read_text("utf-8"))
        self.marian_ids = np.array([-1, vocab["<unk>"], vocab["<pad>"], vocab["</s>"]] +
                                   [vocab[p] for p in self.target_pieces[4:]])

    def our_source_ids(self, pieces):
        """Our source ids of the reference's source pieces (which end with </s>)."""
        return [self.source_index.get(p, UNK_ID) for p in pieces]


@pytest.fixture(params=NAMES)
def converted(request, tmp_path_factory):
    if request.param not in _CONVERTED:
        _CONVERTED[request.param] = Converted(request.param, tmp_path_factory.mktemp("marian"))
    return _CONVERTED[request.param]


def padded(rows):
    width = max(map(len, rows))
    return tf.constant([row + [PAD_ID] * (width - len(row)) for row in rows], tf.int32)


def test_the_converted_model_has_the_references_teacher_forced_logits(converted):
    arrays = np.load(converted.input / "reference_logits.npz")
    source_vocab = json.loads((converted.input / "vocab.json").read_text("utf-8"))
    source_pieces = {i: p for p, i in source_vocab.items()}
    sources = [[converted.source_index[source_pieces[i]] for i, keep in zip(row, mask) if keep]
               for row, mask in zip(arrays["input_ids"], arrays["attention_mask"])]
    labels = arrays["labels"]
    pad = int(converted.marian_ids[BOS_ID])
    index = {int(m): i for i, m in enumerate(converted.marian_ids) if i != PAD_ID}
    targets = [[BOS_ID] + [index[int(i)] for i in row[:-1] if i != pad] for row in labels]
    logits = converted.model((padded(sources), padded(targets))).numpy()
    for row, target in enumerate(targets):
        ours = logits[row, :len(target), 1:]  # every id but our PAD, which Marian lacks
        reference = arrays["logits"][row, :len(target)][:, converted.marian_ids[1:]]
        np.testing.assert_allclose(ours, reference, atol=1e-4, rtol=0)
    # Our PAD row is out of the softmax: the log-softmax over our ids is Marian's.
    assert logits[..., PAD_ID].max() < -1000


@pytest.mark.slow
def test_greedy_and_beam_search_give_the_references_outputs(converted):
    """Beam 4 with alpha 0 (Hugging Face's length_penalty=0): both rank by log-prob, and
    finish hypotheses by generate()'s rule (the exact search's differ on the trained
    fixtures: a hypothesis that ends outside a step's beam_size best candidates)."""
    reference = converted.reference
    sources = padded([converted.our_source_ids(p) for p in reference["source_pieces"]])
    extra = reference["max_extra_length"]
    config = DecodeConfig(beam_size=4, alpha=0.0, max_extra_length=extra,
                          stopping="transformers")
    for name, search in (("greedy", greedy_search), ("beam", beam_search)):
        ids = search(TransformerStep(converted.model, sources), config).ids[:, 0].numpy()
        pieces = [[converted.target_pieces[i] for i in row if i not in (PAD_ID, EOS_ID)]
                  for row in ids]
        assert pieces == reference[name]["pieces"], name


@pytest.mark.slow
def test_the_model_directorys_search_gives_generates_outputs(converted):
    """The settings conversion stores (the checkpoint's generation_config.json: beam 4,
    Transformers' default length_penalty 1.0, max_length 48, generate()'s stopping rule)
    give what generate() gives as users call it. On the trained fixtures the outputs end
    by themselves at different lengths, and the length penalty decides some of them."""
    reference = converted.reference
    decode = layout.load_decode(str(converted.model_dir))
    assert (decode.beam_size, decode.alpha, decode.max_length) == (
        reference["generate"]["num_beams"], reference["generate"]["length_penalty"],
        reference["generate"]["max_length"])
    sources = padded([converted.our_source_ids(p) for p in reference["source_pieces"]])
    result = beam_search(TransformerStep(converted.model, sources),
                         dataclasses.replace(decode, num_hypotheses=1))
    pieces = [[converted.target_pieces[i] for i in row if i not in (PAD_ID, EOS_ID)]
              for row in result.ids[:, 0].numpy()]
    assert pieces == reference["generate"]["pieces"]


# The SavedModel's own part (tokenizing in the graph, a language code, shared and separate
# vocabularies, the signatures) on three fixtures that hold every such case, one with depths
# apart; the other models' searches are checked above, an export each costing 15-45 s.
@pytest.mark.parametrize("converted", ["shared_swish", "separate_gelu", "deeper_decoder"],
                         indirect=True)
@pytest.mark.slow
def test_the_text_to_text_saved_model_gives_the_references_translations(converted, tmp_path):
    """The default export translates as generate() does by default; asked for them, its
    beam 4 and greedy searches at length penalty 0 give the references' too."""
    extra = converted.reference["max_extra_length"]
    options = saved_model.Options(weights=WeightsChoice())  # the model directory's search
    path = saved_model.export(str(converted.model_dir), str(tmp_path / "export"), options)
    loaded = saved_model.load(path)
    inputs = tf.constant(converted.reference["inputs"])
    translations = loaded.signatures["serving_default"](inputs=inputs)["translations"]
    assert [t.decode("utf-8") for t in translations.numpy()] == \
        converted.reference["generate"]["texts"]
    for name, beam_size in (("beam", 4), ("greedy", 1)):
        found = loaded.signatures["translate_with_options"](
            inputs=inputs, target_prefix=tf.fill(tf.shape(inputs), ""),
            **request_inputs("translate_with_options", DecodeConfig(), beam_size=beam_size,
                             alpha=0.0, max_extra_length=extra,
                             stopping="transformers"))["translations"]
        assert [t[0].decode("utf-8") for t in found.numpy()] == \
            converted.reference[name]["texts"], name


@pytest.mark.slow
def test_the_ctranslate2_export_gives_the_references_translations(converted, tmp_path):
    ctranslate2 = pytest.importorskip("ctranslate2")
    from trainer.serving import ctranslate2 as ct2_export
    directory = ct2_export.write(converted.model, converted.tokenizers, str(tmp_path / "ct2"),
                                 "float32")
    translator = ctranslate2.Translator(directory)
    # The pieces a client of the export gives it: the source's, without the EOS the
    # export's config appends. CTranslate2 stops at the limit where the others force EOS
    # as the limit's last token: one token less.
    sources = [pieces[:-1] for pieces in converted.reference["source_pieces"]]
    extra = converted.reference["max_extra_length"]
    for name, beam_size in (("greedy", 1), ("beam", 4)):
        results = [translator.translate_batch([s], beam_size=beam_size, length_penalty=0.0,
                                              max_decoding_length=len(s) + extra)[0]
                   for s in sources]
        texts = ["".join(p for p in r.hypotheses[0] if p != "<unk>").replace("\u2581", " ")
                 .strip() for r in results]
        # Transformers' outputs. (CTranslate2 4.8's own converter, whose outputs
        # reference.json keeps, starts Marian's decoder with </s> where Transformers starts
        # it with <pad>: on the trained fixtures its outputs differ.)
        assert texts == converted.reference[name]["texts"], name


@pytest.mark.parametrize("where", ["generation_config.json", "config.json"])
def test_the_checkpoints_generation_settings_become_the_model_directorys(tmp_path, where):
    """What generate() uses by default, from generation_config.json or (older checkpoints)
    config.json, becomes config.json's "decode": beam search at num_beams, ranked by the
    "average" length penalty at length_penalty, up to max_length positions."""
    checkpoint = tmp_path / "checkpoint"
    shutil.copytree(FIXTURES / NAMES[0], checkpoint)
    if where == "config.json":
        (checkpoint / "generation_config.json").unlink()
    settings = json.loads((checkpoint / where).read_text())
    settings.update(num_beams=5, length_penalty=0.8, max_length=40)
    (checkpoint / where).write_text(json.dumps(settings))
    marian.convert(str(checkpoint), str(tmp_path / "converted"))
    assert layout.load_decode(str(tmp_path / "converted")) == DecodeConfig(
        beam_size=5, alpha=0.8, length_penalty="average", stopping="transformers",
        max_length=40, max_extra_length=39)
    # Transformers' own defaults where the checkpoint says nothing.
    (checkpoint / where).write_text(json.dumps(
        {k: v for k, v in settings.items()
         if k not in ("num_beams", "length_penalty", "max_length")}))
    marian.convert(str(checkpoint), str(tmp_path / "defaults"))
    assert layout.load_decode(str(tmp_path / "defaults")) == DecodeConfig(
        beam_size=1, alpha=1.0, length_penalty="average", stopping="transformers",
        max_length=20, max_extra_length=19)


@pytest.mark.slow
def test_the_convert_program_writes_a_model_directory_the_translate_program_reads(tmp_path):
    model_dir = tmp_path / "opus-mt"
    result = program("convert", "--from=marian", f"--input={FIXTURES / NAMES[0]}",
                     f"--model_dir={model_dir}")
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.startswith(f"converted {FIXTURES / NAMES[0]} into {model_dir}: ")
    assert sorted(p.name for p in model_dir.iterdir()) == sorted(
        ["checkpoint", "ckpt-0.data-00000-of-00001", "ckpt-0.index", "config.json",
         "spm_source.model", "spm_target.model", "vocabulary.json"])
    again = program("convert", f"--input={FIXTURES / NAMES[0]}", f"--model_dir={model_dir}")
    assert again.returncode == 2
    assert again.stderr.strip().splitlines()[-1] == (
        f"trainer.convert: error: {model_dir} exists and is not empty: convert into a new "
        "directory")


def test_a_pickled_checkpoint_converts_to_the_same_weights_as_its_safetensors(tmp_path):
    """An older checkpoint's pytorch_model.bin (made by make_fixtures.py from the fixture's
    model.safetensors, as Transformers 4 saved it) is read with torch's weights_only
    loader; where torch is missing, test_conversion_errors checks the one-line refusal."""
    pytest.importorskip("torch", reason="the pickled route reads pytorch_model.bin with "
                        "torch, which is not installed here (pip install torch)")
    pickled = tmp_path / "pickled"
    shutil.copytree(FIXTURES / PICKLED, pickled)
    (pickled / "model.safetensors").unlink()
    marian.convert(str(pickled), str(tmp_path / "from_bin"))
    marian.convert(str(FIXTURES / PICKLED), str(tmp_path / "from_safetensors"))
    from_bin = checkpoint_weights(tmp_path / "from_bin")
    from_safetensors = checkpoint_weights(tmp_path / "from_safetensors")
    assert len(from_bin) == len(from_safetensors) > 30
    for a, b in zip(from_bin, from_safetensors):
        np.testing.assert_array_equal(a, b)
    assert (tmp_path / "from_bin" / "vocabulary.json").read_bytes() == \
        (tmp_path / "from_safetensors" / "vocabulary.json").read_bytes()
