"""A pre-norm model whose encoder is deeper than its decoder (`--hparams=pre_norm=true,
num_encoder_layers=3,num_decoder_layers=1`, the shape the Multi30k recipe can take) in every
export the paper's post-norm model has: the SavedModel in each serving dtype translates as
the model does, CTranslate2's search over its conversion gives the SavedModel's tokens and
scores at equal rules. The Marian export's one-line refusal of pre-norm is
test_marian_export.py's."""

import json

import numpy as np
import pytest
import tensorflow as tf

from conftest import built_once
from programs import program, succeeded
from trainer.data import builtin_corpus

pytestmark = pytest.mark.slow

HPARAMS = "pre_norm=true,num_encoder_layers=3,num_decoder_layers=1"
# CTranslate2's search rules (the average penalty, a sentence done once 4 hypotheses have
# finished), stored in the model directory, so every export searches by them.
FLAGS = ["--config=tiny", f"--hparams={HPARAMS}", "--train_steps=400", "--warmup_steps=200",
         "--eval_every=0", "--checkpoint_every=400", "--log_every=100",
         "--length_penalty=average", "--stopping=first"]
SERVING = {"bfloat16": ["--serving_dtype=bfloat16"], "int8": ["--serving_dtype=int8"],
           "int8_bfloat16": ["--serving_dtype=int8_bfloat16"]}


def _train_and_export(root):
    """trainer.task with FLAGS into root/model (its float32 export in root/float32), then
    trainer.export of each serving dtype of SERVING into root/<dtype> (int8_bfloat16
    calibrated on the training sources) and a float32 CTranslate2 model into root/ct2."""
    english, _ = builtin_corpus.splits()["train"]
    (root / "train.en").write_text("\n".join(english[:2000]) + "\n")
    model_dir = root / "model"
    succeeded(program("task", *FLAGS, f"--model_dir={model_dir}",
                      f"--export_dir={root / 'float32'}", cwd=root))
    for name, flags in SERVING.items():
        calibration = [f"--calibration={root / 'train.en'}"] if name == "int8_bfloat16" else []
        succeeded(program("export", f"--model_dir={model_dir}", *flags, *calibration,
                          f"--export_dir={root / name}"))
    succeeded(program("export", f"--model_dir={model_dir}", "--format=ctranslate2",
                      "--quantization=float32", f"--export_dir={root / 'ct2'}"))


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    """The directory _train_and_export filled, once per test run (about 80 s)."""
    return built_once(tmp_path_factory, "pre_norm_exports", _train_and_export, FLAGS, SERVING)


def _translate(version, texts):
    loaded = tf.saved_model.load(str(version))
    return [t.decode() for t in loaded.signatures["serving_default"](
        inputs=tf.constant(texts))["translations"].numpy()]


def test_the_model_is_pre_norm_with_its_own_depths_and_every_serving_dtype_translates_it(
        built):
    import tensorflow_text  # noqa: F401
    model = json.loads((built / "model" / "config.json").read_text())["model"]
    assert (model["pre_norm"], model["num_encoder_layers"], model["num_decoder_layers"]) == (
        True, 3, 1)
    english, german = builtin_corpus.splits()["validation"]
    english, german = english[:300], german[:300]
    float32 = _translate(built / "float32" / "1", english)
    # Trained: the float32 export translates most held-out sentences exactly, so the
    # exports below are compared on a model that is sure of its outputs.
    exact = np.mean([t == g for t, g in zip(float32, german)])
    assert exact > 0.8, exact
    for name in SERVING:
        version = built / name / "1"
        info = json.loads((version / "assets.extra" / "export.json").read_text())
        assert info["serving_dtype"] == name
        differ = [(e, t, f) for e, t, f in zip(english, _translate(version, english), float32)
                  if t != f]
        # A step that normalised as post-norm does, or ran 3 decoder layers, would
        # translate nothing alike; rounding moves a near-tie or two.
        assert len(differ) <= 3, (name, differ)


def test_ctranslate2_gives_the_saved_models_tokens_and_scores_at_equal_rules(built):
    import ctranslate2
    import sentencepiece as spm
    import tensorflow_text  # noqa: F401
    ct2_dir = built / "ct2"
    sp = spm.SentencePieceProcessor(model_file=str(ct2_dir / "spm.model"))
    texts = builtin_corpus.splits()["validation"][0][:200]
    source = [sp.encode(text) + [3] for text in texts]  # EOS ends every source
    width = max(map(len, source))
    ours = tf.saved_model.load(str(built / "float32" / "1")).signatures["translate_ids"](
        source_ids=tf.constant([row + [0] * (width - len(row)) for row in source]))
    ids, lengths, scores = (ours[key].numpy() for key in ("ids", "lengths", "scores"))
    translator = ctranslate2.Translator(str(ct2_dir), device="cpu", intra_threads=2)
    # Ours ends an output at the source's ids + 50: one request per source length.
    for length in sorted(set(map(len, source))):
        rows = [i for i, row in enumerate(source) if len(row) == length]
        results = translator.translate_batch(
            [sp.encode(texts[i], out_type=str) for i in rows], beam_size=4,
            length_penalty=0.6, patience=1, max_decoding_length=length + 50,
            min_decoding_length=0, return_scores=True)
        for i, result in zip(rows, results):
            theirs = [sp.piece_to_id(p) for p in result.hypotheses[0]]
            assert ids[i, :lengths[i]].tolist() == theirs + [3], texts[i]
            assert abs(result.scores[0] - scores[i]) < 1e-5, texts[i]

