"""The model as a Hugging Face Marian checkpoint (`trainer.export --format=marian`), the
way back from trainer/conversion/marian.py: a directory that Transformers'
`MarianMTModel.from_pretrained` and `MarianTokenizer.from_pretrained` load, laid out as an
OPUS-MT checkpoint, so that a model trained or fine-tuned here can be published as those
are.

Files: config.json (MarianConfig), generation_config.json (the model directory's search as
far as `generate()` can run it), model.safetensors (float32), source.spm and target.spm
(the SentencePiece models), vocab.json (and target_vocab.json for separate
vocabularies), tokenizer_config.json, and README.md, the model card the Hugging Face Hub
shows: its front matter names the languages (`--source_lang`, `--target_lang`) and
`pipeline_tag: translation`, its text the architecture, the search and how to load it.

What maps to what is the conversion's map read backwards (trainer/formats/marian.py's
`layer_tensors`), plus:
  - ids: Marian's </s> 0 and <unk> 1 are our EOS and UNK; our BOS becomes <pad>, which
    starts Marian's decoder (the last id of a shared vocabulary, as OPUS-MT has it; id 2
    of separate ones, which must share it); our other pieces follow in their order; our
    PAD, which the model never outputs, has no Marian id;
  - the paper's interleaved sinusoids (section 3.5) are Marian's concatenated ones (all
    sines, then all cosines) with the width's coordinates reordered: the export reorders
    every tensor's d_model axis the same way, which changes no output;
  - no output bias: Marian's final_logits_bias of zeros.
So a converted model exports to the tensors it was converted from.

What Marian cannot express stops the export with one line naming the field: pre-norm
blocks, learned positions, heads narrower or wider than d_model / heads. What it
expresses differently gets one line each: the layer norms' epsilon (Marian's is 1e-5), the
PAD id its softmax lacks (the share a model trained here gives PAD, label smoothing's,
goes to the other ids), and the search settings generate() cannot take (the gnmt length
penalty, the exact stopping rule, a limit set by the input's length).
"""

import dataclasses
import json
import os
import shutil
import sys
from typing import List, Optional

import numpy as np

from keras_transformer import DecodeConfig, TransformerConfig
from keras_transformer.special_ids import BOS_ID, EOS_ID, PAD_ID, UNK_ID
from trainer.formats import marian as marian_format, safetensors
from trainer.data import vocabulary
from trainer.model_dir import files, layout
from trainer.model_dir.weights import WeightsChoice, final_model

DESCRIPTION = "Hugging Face Marian checkpoint"
MODEL_CARD = "README.md"  # what the Hugging Face Hub shows of a model, front matter first
MARIAN_EPSILON = 1e-5  # nn.LayerNorm's default, which MarianMTModel's layers keep
# How far Transformers' log-prob of a token moves when Marian's epsilon replaces
# TransformerConfig's 1e-6: 1.1e-6 on average on the main job's model (docs/pretrained.md,
# "Back to Hugging Face"; tests/test_marian_export.py keeps it under 1e-5).
EPSILON_LOG_PROB_CHANGE = 1e-6
# Beyond this the output bias of PAD leaves it nothing of the softmax: a model converted
# from Marian (trainer/conversion/marian.py's ABSENT_BIAS, -1e4), fine-tuned or not.
_PAD_ABSENT_BIAS = -100.0


@dataclasses.dataclass(frozen=True)
class Options:
    """How a model directory becomes a Marian checkpoint.

    Attributes:
      weights: which weights the checkpoint holds.
      decode: the search generation_config.json describes; None: the model directory's.
      source_lang, target_lang: language codes (en, de, ...) that the model card's front
        matter lists for the Hub; None: it lists none, and a line says so.
    """

    weights: WeightsChoice = dataclasses.field(default_factory=WeightsChoice)
    decode: Optional[DecodeConfig] = None
    source_lang: Optional[str] = None
    target_lang: Optional[str] = None


def default_dir(name: str, options: Options) -> str:
    """Where `python -m trainer.export --format=marian` writes model directory `name`."""
    del options
    return os.path.join("saved_models", f"{name}-marian")


def export(model_dir: str, export_dir: str, options: Options = Options()) -> str:
    """Writes model_dir's model (the weights `options` choose) as a Marian checkpoint
    directory at export_dir, replacing one there; returns export_dir. Prints one line on
    stderr for each setting Marian or generate() takes differently.

    Raises:
      ValueError: a model Marian cannot express, naming the field.
    """
    config = layout.load_config(model_dir)
    refusal = unexpressible(config)
    if refusal:
        raise ValueError(f"{model_dir}: {refusal}; Marian (MarianMTModel) cannot express it")
    model, _ = final_model(model_dir, options.weights)
    tokenizers = vocabulary.load_or_train(model_dir, None)
    decode = options.decode or layout.load_decode(model_dir)
    languages = (options.source_lang, options.target_lang)
    with files.staged_directory(os.path.dirname(os.path.abspath(export_dir))) as staging:
        write(model, tokenizers, decode, staging.path)
        with open(os.path.join(staging.path, MODEL_CARD), "w", encoding="utf-8") as f:
            f.write(model_card(os.path.basename(os.path.abspath(export_dir).rstrip("/")),
                               config, decode, languages, tokenizers.normalize_punctuation))
        staging.publish(os.path.abspath(export_dir).rstrip("/"), replace=True)
    if not all(languages):
        print(f"the model card ({MODEL_CARD}) names no languages: give --source_lang and "
              "--target_lang for the Hub's language tags", file=sys.stderr, flush=True)
    pad_in_softmax = not (config.output_bias and
                          float(model.embedding.bias[PAD_ID]) < _PAD_ABSENT_BIAS)
    for note in notes(config, decode, tokenizers.normalize_punctuation, pad_in_softmax):
        print(note, file=sys.stderr, flush=True)
    return export_dir


def unexpressible(config: TransformerConfig) -> str:
    """What of `config` Marian cannot express ("" when nothing)."""
    if config.pre_norm:
        return "pre_norm=True: Marian's blocks are post-norm"
    if config.positional != "sinusoidal":
        return f"positional={config.positional!r}: Marian's positions are sinusoidal"
    if (config.d_k, config.d_v) != (config.d_model // config.num_heads,) * 2:
        return (f"key_dim={config.d_k}, value_dim={config.d_v}: Marian's heads are d_model / "
                f"num_heads = {config.d_model // config.num_heads} wide")
    return ""


def notes(config: TransformerConfig, decode: DecodeConfig,
          normalize_punctuation: Optional[str] = None,
          pad_in_softmax: bool = True) -> List[str]:
    """One line for each setting the checkpoint takes otherwise than the model directory.

    pad_in_softmax: the model's softmax gives its PAD id a share (a model trained here;
    not one converted from Marian, whose PAD has an output bias of -1e4)."""
    lines = []
    if normalize_punctuation:
        lines.append(f"MarianTokenizer does not normalize punctuation, as this model directory "
                     f"does ({normalize_punctuation!r}): normalize inputs first "
                     f"(sacremoses.MosesPunctNormalizer({normalize_punctuation!r}))")
    if config.layer_norm_epsilon != MARIAN_EPSILON:
        effect = (f"Transformers' log-probs move by about {EPSILON_LOG_PROB_CHANGE:g} a token"
                  if config.layer_norm_epsilon == TransformerConfig.layer_norm_epsilon
                  else "its logits differ slightly")
        lines.append(f"Marian's layer norms add {MARIAN_EPSILON:g} to the variance where this "
                     f"model's add {config.layer_norm_epsilon:g}: {effect}")
    if pad_in_softmax:
        # Label smoothing's target gives every id, PAD too, label_smoothing / vocab_size;
        # a trained model's softmax comes to give PAD about that.
        share = (f"about label smoothing's {config.label_smoothing:g} / {config.vocab_size} = "
                 f"{config.label_smoothing / config.vocab_size:.2g} a token once trained"
                 if config.label_smoothing else "what it learned")
        lines.append(f"Marian's vocabulary has no id for this model's PAD, to which its softmax "
                     f"gives a share: Transformers' log-probs are higher than the model's by "
                     f"that share ({share})")
    if decode.length_penalty != "average":
        lines.append(f"generate() ranks beams by log-prob / length^{decode.alpha:g}, not by "
                     f"the model directory's gnmt penalty ((5 + length) / 6)^{decode.alpha:g}")
    if decode.stopping != "transformers":
        lines.append("generate() stops a sentence's beam search by its own guess "
                     f"(early_stopping=False), not by the model directory's {decode.stopping} "
                     "rule")
    if decode.max_length is None:
        lines.append(f"generate() limits outputs to max_length={config.max_length} positions, "
                     f"not to the input's length + {decode.max_extra_length}")
    return lines


def write(model, tokenizers, decode: DecodeConfig, directory: str):
    """The checkpoint's files in the empty `directory`."""
    config = model.config
    shared = config.share_embeddings
    source_order, target_order = (marian_order(n, pad_last=shared) for n in (
        config.input_vocab_size, config.vocab_size))
    width = (np.concatenate([np.arange(0, config.d_model, 2), np.arange(1, config.d_model, 2)])
             if config.sinusoid_layout == "interleaved" else np.arange(config.d_model))

    def marian(array, width_axis):
        return array if width_axis is None else np.take(array, width, axis=width_axis)

    tensors = {f"model.{name}": marian(variable.numpy().T if layout_.transposed
                                       else variable.numpy(), layout_.width_axis)
               for name, variable, layout_ in marian_format.layer_tensors(model)}
    target = marian(model.embedding.embeddings.numpy()[target_order], 1)
    if shared:
        tensors["model.shared.weight"] = target
    else:
        tensors["model.encoder.embed_tokens.weight"] = marian(
            model.source_embedding.embeddings.numpy()[source_order], 1)
        tensors["model.decoder.embed_tokens.weight"] = target
    bias = (model.embedding.bias.numpy()[target_order] if config.output_bias
            else np.zeros(len(target_order), np.float32))
    tensors["final_logits_bias"] = bias[None, :]
    safetensors.save(os.path.join(directory, marian_format.WEIGHTS), tensors)

    pad = target_order.index(BOS_ID)
    _write_json(directory, "config.json", _marian_config(config, pad))
    _write_json(directory, "generation_config.json", {
        "bad_words_ids": [[pad]], "decoder_start_token_id": pad, "eos_token_id": 0,
        "forced_eos_token_id": 0, "pad_token_id": pad, "num_beams": decode.beam_size,
        "length_penalty": decode.alpha,
        "max_length": decode.max_length or config.max_length,
        # min_new_tokens counts what min_length does: the tokens before EOS.
        **({"min_new_tokens": decode.min_length} if decode.min_length else {})})
    for side, tokenizer, order, name in (("source", tokenizers.source, source_order,
                                          "vocab.json"),
                                         ("target", tokenizers.target, target_order,
                                          "target_vocab.json")):
        shutil.copyfile(tokenizer.path, os.path.join(directory, f"{side}.spm"))
        if side == "source" or not shared:
            _write_json(directory, name, _marian_vocab(tokenizer.pieces(), order))
    _write_json(directory, "tokenizer_config.json", {
        "tokenizer_class": "MarianTokenizer", "separate_vocabs": not shared,
        "eos_token": "</s>", "unk_token": "<unk>", "pad_token": "<pad>",
        "model_max_length": config.max_length, "sp_model_kwargs": {}})


def model_card(name: str, config: TransformerConfig, decode: DecodeConfig,
               languages=(None, None), normalize_punctuation: Optional[str] = None) -> str:
    """README.md of the checkpoint `name`: the Hub's front matter (the languages given,
    `pipeline_tag: translation`) and what the model is and how to load it."""
    source, target = languages
    front = ["---"]
    if source and target:
        front += ["language:", *(f"- {code}" for code in dict.fromkeys((source, target)))]
    front += ["library_name: transformers", "pipeline_tag: translation", "tags:",
              "- translation", "- marian", "---"]
    direction = f"from {source} to {target}" if source and target else "between two languages"
    layers = (f"{config.encoder_layers} layers" if config.encoder_layers == config.decoder_layers
              else f"{config.encoder_layers} encoder and {config.decoder_layers} decoder layers")
    vocabulary_ = ("a shared SentencePiece vocabulary" if config.share_embeddings
                   else "a source and a target SentencePiece vocabulary")
    lines = front + [
        "", f"# {name}", "",
        f"A Transformer that translates {direction}, trained with keras-transformer and "
        "written by `python -m trainer.export --format=marian` as a Marian checkpoint, which "
        "Transformers' `MarianMTModel` and `MarianTokenizer` load.", "",
        f"- {layers}, d_model {config.d_model}, {config.num_heads} heads, feed-forward "
        f"{config.d_ff} ({config.activation}); {vocabulary_} of {config.vocab_size - 1} pieces",
        f"- generation_config.json: beam {decode.beam_size}, length penalty "
        f"{decode.alpha:g}, at most {decode.max_length or config.max_length} positions"]
    if normalize_punctuation:
        lines.append(f"- trained on text normalized by Moses' punctuation rules for "
                     f"{normalize_punctuation!r}, which MarianTokenizer does not apply: "
                     f"normalize inputs first (sacremoses.MosesPunctNormalizer)")
    lines += ["", "```python", "from transformers import MarianMTModel, MarianTokenizer", "",
              f'tokenizer = MarianTokenizer.from_pretrained("{name}")  # or its Hub name',
              f'model = MarianMTModel.from_pretrained("{name}")',
              'batch = tokenizer(["..."], return_tensors="pt", padding=True)',
              "print(tokenizer.batch_decode(model.generate(**batch), "
              "skip_special_tokens=True))", "```", ""]
    return "\n".join(lines)


def marian_order(rows: int, pad_last: bool) -> List[int]:
    """Our id of each Marian id of a vocabulary of `rows` ids (ours: PAD, UNK, BOS, EOS,
    then the pieces): </s>, <unk>, the pieces, then <pad> (our BOS) last, or <pad> third
    when not `pad_last`; our PAD has no Marian id."""
    pieces = list(range(4, rows))
    return ([EOS_ID, UNK_ID, *pieces, BOS_ID] if pad_last
            else [EOS_ID, UNK_ID, BOS_ID, *pieces])


def _marian_vocab(pieces: List[str], order: List[int]) -> dict:
    special = {EOS_ID: "</s>", UNK_ID: "<unk>", BOS_ID: "<pad>"}
    return {special.get(ours, pieces[ours]): marian_id for marian_id, ours in enumerate(order)}


def _marian_config(config: TransformerConfig, pad: int) -> dict:
    return {
        "model_type": "marian", "architectures": ["MarianMTModel"],
        "vocab_size": config.input_vocab_size - 1, "decoder_vocab_size": config.vocab_size - 1,
        "share_encoder_decoder_embeddings": config.share_embeddings,
        "tie_word_embeddings": True, "d_model": config.d_model,
        "encoder_layers": config.encoder_layers, "decoder_layers": config.decoder_layers,
        "encoder_attention_heads": config.num_heads, "decoder_attention_heads": config.num_heads,
        "encoder_ffn_dim": config.d_ff, "decoder_ffn_dim": config.d_ff,
        "activation_function": config.activation, "dropout": config.dropout,
        "attention_dropout": config.attention_dropout, "activation_dropout": 0.0,
        "max_position_embeddings": config.max_length, "scale_embedding": True,
        "pad_token_id": pad, "eos_token_id": 0, "decoder_start_token_id": pad,
        "forced_eos_token_id": 0, "is_encoder_decoder": True, "dtype": "float32"}


def _write_json(directory: str, name: str, contents: dict):
    with open(os.path.join(directory, name), "w", encoding="utf-8") as f:
        json.dump(contents, f, ensure_ascii=False, indent=1)
