"""Hugging Face Marian checkpoints (the OPUS-MT models) as model directories of this
project.

The input is a checkpoint as downloaded: config.json, model.safetensors (or
pytorch_model.bin, read only through torch's weights_only loader, and only when torch is
installed), source.spm, target.spm and vocab.json (plus target_vocab.json when the
vocabularies are separate). The output is an ordinary model directory: config.json,
the two SentencePiece models with `vocabulary.json` (trainer/data/vocabulary.py), and
checkpoint ckpt-0 of the weights, which trainer.export, translate, evaluate, visualize
and `trainer.task --init_from` read as they read a trained one.

What maps to what (MarianMTModel in Hugging Face Transformers):
  - post-norm blocks, swish/gelu/relu feed-forward, LayerNorm epsilon 1e-5, sinusoids with
    all sines before all cosines, embeddings scaled by sqrt(d_model) and tied to the
    pre-softmax projection, and `final_logits_bias`: TransformerConfig's activation,
    layer_norm_epsilon, sinusoid_layout and output_bias;
  - q/k/v/out_proj, fc1, fc2 ([out, in] in torch) -> the Dense layers' kernels [in, out];
    self_attn_layer_norm, encoder_attn_layer_norm, final_layer_norm -> the residuals'
    layer norms.

Special ids. Marian's EOS is 0, its unk 1 (by vocab.json), its pad the last id, and the
pad id starts the decoder; ours are PAD 0, UNK 1, BOS 2, EOS 3. So the vocabulary is
reordered: our ids 0-3 take Marian's pad, unk, pad again (the decoder's start, as BOS)
and EOS, and Marian's other pieces follow in their order. The embedding rows and the
output bias follow the same order, so the model computes Marian's logits for every
Marian id; our PAD row, a second copy of pad, gets ABSENT_BIAS, so that the softmax over
our ids is Marian's over its ids. The searches never output PAD or BOS, as Hugging Face's
generation of OPUS-MT never outputs pad (`bad_words_ids`).

Not supported, each with one line naming config.json: pre-norm variants
(`normalize_before`), a layer norm on the embeddings, unscaled embeddings, encoder and
decoder of different widths (feed-forward or heads; their depths may differ), an untied
output projection, other activations.
"""

import json
import os
from typing import Dict, List, Optional, Tuple

import numpy as np

from keras_transformer import DecodeConfig, Transformer, TransformerConfig
from trainer.conversion import ConversionError
from trainer.formats import safetensors
from trainer.formats.marian import PICKLED_WEIGHTS, WEIGHTS, layer_tensors
from trainer.data import tokenizer as tokenizer_lib, vocabulary
from trainer.model_dir import files, layout

DESCRIPTION = "a Hugging Face Marian checkpoint (OPUS-MT)"
# Marian's activation names -> TransformerConfig.activation.
ACTIVATIONS = {"relu": "relu", "swish": "swish", "silu": "swish", "gelu": "gelu"}
# The output bias of our PAD id, which Marian's vocabulary does not have: the softmax
# gives it nothing (exp(-1e4) is 0 in float32), in float32 and bfloat16 alike.
ABSENT_BIAS = -1e4
# The tensors MarianMTModel holds outside its "model." (MarianModel) part.
_TOP_LEVEL = ("lm_head.weight", "final_logits_bias")


def convert(input_dir: str, model_dir: str,
            normalize_punctuation: Optional[str] = None) -> TransformerConfig:
    """Writes the Marian checkpoint in input_dir as model directory model_dir (whole, or
    not at all); returns the model's config. normalize_punctuation: None, or a language
    code whose Moses punctuation rules the model directory applies to every input
    (trainer/data/vocabulary.py's NORMALIZATION; MarianTokenizer does not).

    Raises:
      ConversionError: a missing or damaged file, an architecture this project cannot
        express, a tensor missing or of the wrong shape, a vocabulary that does not match
        the embeddings; model_dir exists already.
    """
    if os.path.exists(model_dir) and os.listdir(model_dir):
        raise ConversionError(f"{model_dir} exists and is not empty: convert into a new "
                              "directory")
    hf_config = _read_json(os.path.join(input_dir, "config.json"))
    config = transformer_config(hf_config, os.path.join(input_dir, "config.json"))
    decode = generation_settings(input_dir, hf_config)
    vocabularies = _vocabularies(input_dir, hf_config, config)
    for name in ("source.spm", "target.spm"):
        _require(os.path.join(input_dir, name))
    tensors = _read_weights(input_dir)
    model = Transformer(config)
    model.build()
    _assign(model, _Weights(tensors, _weights_path(input_dir), _prefix(tensors)), config,
            vocabularies)
    with files.staged_directory(os.path.dirname(os.path.abspath(model_dir))) as staging:
        _write(staging.path, model, config, decode, input_dir, vocabularies)
        vocabulary.save_punctuation_language(staging.path, normalize_punctuation)
        try:
            staging.publish(model_dir.rstrip("/"))  # into an empty model_dir, checked above
        except FileExistsError:
            raise ConversionError(f"{model_dir} was filled by another program during the "
                                  "conversion: convert into a new directory") from None
    return config


def generation_settings(input_dir: str, hf: dict) -> DecodeConfig:
    """How Transformers' `generate()` translates with the checkpoint by default: the
    settings of its generation_config.json, else of its config.json (older checkpoints),
    else Transformers' defaults (num_beams 1, length_penalty 1.0, max_length 20), as the
    DecodeConfig of the "average" length penalty (log-prob / length^length_penalty), whose
    outputs are limited by max_length alone, as Transformers limits them (max_extra_length
    never binds first) and at least min_new_tokens long, searched with generate()'s
    stopping rule ("transformers", its
    default early_stopping=False; a checkpoint's other early_stopping values are not
    followed)."""
    path = os.path.join(input_dir, "generation_config.json")
    settings = {**hf, **(_read_json(path) if os.path.exists(path) else {})}
    try:
        max_length = int(settings.get("max_length") or 20)
        return DecodeConfig(beam_size=int(settings.get("num_beams") or 1),
                            alpha=float(settings.get("length_penalty", 1.0)),
                            length_penalty="average", stopping="transformers",
                            max_length=max_length, max_extra_length=max(max_length - 1, 0),
                            min_length=int(settings.get("min_new_tokens") or 0))
    except (TypeError, ValueError) as e:
        raise ConversionError(f"{path if os.path.exists(path) else 'config.json'}: "
                              f"generation settings this project cannot use ({e})") from None


def transformer_config(hf: dict, path: str) -> TransformerConfig:
    """The TransformerConfig of Marian config.json `hf` (read from `path`, for errors)."""
    def unsupported(what):
        return ConversionError(f"{path}: {what}; this project converts post-norm Marian "
                               "Transformers (MarianMTModel), the OPUS-MT architecture")

    if hf.get("model_type") != "marian":
        raise unsupported(f"model_type is {hf.get('model_type')!r}, not 'marian'")
    for flag, what in (("normalize_before", "pre-norm blocks (normalize_before)"),
                       ("normalize_embedding", "a layer norm on the embeddings"),
                       ("add_final_layer_norm", "a final layer norm")):
        if hf.get(flag):
            raise unsupported(f"{what} are not supported" if flag == "normalize_before"
                              else f"{what} is not supported")
    if not hf.get("scale_embedding", False):
        raise unsupported("unscaled embeddings (scale_embedding false) are not supported")
    for encoder, decoder in (("encoder_ffn_dim", "decoder_ffn_dim"),
                             ("encoder_attention_heads", "decoder_attention_heads")):
        if hf.get(encoder) != hf.get(decoder):
            raise unsupported(f"{encoder}={hf.get(encoder)} differs from "
                              f"{decoder}={hf.get(decoder)}")
    activation = hf.get("activation_function", "gelu")
    if activation not in ACTIVATIONS:
        raise unsupported(f"activation_function {activation!r} is not one of "
                          f"{', '.join(ACTIVATIONS)}")
    if not hf.get("tie_word_embeddings", True):
        raise unsupported("an output projection untied from the embeddings is not supported")
    share = hf.get("share_encoder_decoder_embeddings", True)
    try:
        encoder_layers = int(hf["encoder_layers"])
        decoder_layers = int(hf.get("decoder_layers", encoder_layers))
        vocab_size = int(hf["vocab_size"])
        target_size = vocab_size if share else int(hf.get("decoder_vocab_size") or vocab_size)
        return TransformerConfig(
            vocab_size=target_size + 1, source_vocab_size=None if share else vocab_size + 1,
            share_embeddings=share, num_layers=encoder_layers,
            num_decoder_layers=None if decoder_layers == encoder_layers else decoder_layers,
            d_model=int(hf["d_model"]), d_ff=int(hf["encoder_ffn_dim"]),
            num_heads=int(hf["encoder_attention_heads"]), dropout=float(hf.get("dropout", 0.1)),
            attention_dropout=float(hf.get("attention_dropout", 0.0)),
            max_length=int(hf.get("max_position_embeddings", 512)),
            activation=ACTIVATIONS[activation], layer_norm_epsilon=1e-5, output_bias=True,
            sinusoid_layout="concatenated")
    except (KeyError, TypeError, ValueError) as e:
        raise ConversionError(f"{path}: {type(e).__name__} {e} (a Marian config.json has "
                              "vocab_size, d_model, encoder_layers, encoder_ffn_dim, "
                              "encoder_attention_heads)") from None


class _Vocabulary:
    """One side's vocabulary: `order`, the Marian id of each of our ids, and `pieces`,
    our ids' pieces."""

    def __init__(self, path: str, vocab: dict, rows: int, hf: dict, target: bool):
        ids = sorted(vocab.values()) if isinstance(vocab, dict) else None
        if ids != list(range(rows)):
            count = len(vocab) if isinstance(vocab, dict) else "no"
            raise ConversionError(f"{path} has {count} pieces, but the embedding it indexes "
                                  f"has {rows} rows: the vocabulary does not match the model")
        special = {}
        for piece in ("</s>", "<unk>", "<pad>"):
            if piece not in vocab:
                raise ConversionError(f"{path} has no {piece} piece, which a Marian "
                                      "vocabulary always has")
            special[piece] = vocab[piece]
        if target:
            said = tuple(hf.get(key, special[piece]) for key, piece in (
                ("eos_token_id", "</s>"), ("pad_token_id", "<pad>"),
                ("decoder_start_token_id", "<pad>")))
            if said != (special["</s>"], special["<pad>"], special["<pad>"]):
                raise ConversionError(
                    f"{path}: </s> and <pad> are ids {special['</s>']} and {special['<pad>']}, "
                    f"but config.json's eos, pad and decoder start ids are {said}")
        by_id = {i: piece for piece, i in vocab.items()}
        rest = [i for i in range(rows) if i not in special.values()]
        self.order = [special["<pad>"], special["<unk>"], special["<pad>"], special["</s>"],
                      *rest]
        self.pieces = [*tokenizer_lib.SPECIAL_PIECES, *(by_id[i] for i in rest)]


def _vocabularies(input_dir: str, hf: dict, config: TransformerConfig
                  ) -> Tuple[_Vocabulary, _Vocabulary]:
    """(source, target) vocabularies of the checkpoint."""
    source_path = os.path.join(input_dir, "vocab.json")
    source_vocab = _read_json(source_path)
    source = _Vocabulary(source_path, source_vocab, config.input_vocab_size - 1, hf,
                         target=config.share_embeddings)
    if config.share_embeddings:
        return source, source
    target_path = os.path.join(input_dir, "target_vocab.json")
    target = _Vocabulary(target_path, _read_json(target_path), config.vocab_size - 1, hf,
                         target=True)
    return source, target


class _Weights:
    """The checkpoint's tensors by name, each checked against the shape the config
    implies."""

    def __init__(self, tensors: Dict[str, np.ndarray], path: str, prefix: str):
        self.tensors, self.path, self.prefix = tensors, path, prefix

    def get(self, name: str, shape: Tuple[int, ...], required: bool = True):
        full = name if name in _TOP_LEVEL else self.prefix + name
        if full not in self.tensors:
            if not required:
                return None
            raise ConversionError(f"{self.path} has no tensor {full}")
        tensor = self.tensors[full]
        if tuple(tensor.shape) != tuple(shape):
            raise ConversionError(f"{self.path}: tensor {full} has shape {list(tensor.shape)}, "
                                  f"but config.json implies {list(shape)}")
        return tensor

    def first(self, names: List[str], shape: Tuple[int, ...]) -> np.ndarray:
        """The first of `names` the checkpoint has (tied matrices are stored once)."""
        for name in names:
            tensor = self.get(name, shape, required=False)
            if tensor is not None:
                return tensor
        raise ConversionError(f"{self.path} has none of the tensors {', '.join(names)}")


def _assign(model: Transformer, weights: _Weights, config: TransformerConfig,
            vocabularies: Tuple[_Vocabulary, _Vocabulary]):
    d, source, target = config.d_model, *vocabularies
    rows = config.vocab_size - 1
    if config.share_embeddings:
        names = ["shared.weight", "decoder.embed_tokens.weight", "encoder.embed_tokens.weight",
                 "lm_head.weight"]
        target_matrix = source_matrix = weights.first(names, (rows, d))
    else:
        source_matrix = weights.get("encoder.embed_tokens.weight",
                                    (config.input_vocab_size - 1, d))
        target_matrix = weights.first(["decoder.embed_tokens.weight", "lm_head.weight"],
                                      (rows, d))
        model.source_embedding.embeddings.assign(source_matrix[source.order])
    model.embedding.embeddings.assign(target_matrix[target.order])
    bias = weights.get("final_logits_bias", (1, rows), required=False)
    bias = np.zeros(rows, np.float32) if bias is None else bias[0]
    model.embedding.bias.assign(np.concatenate([[ABSENT_BIAS], bias[target.order[1:]]]))
    for name, variable, torch_layout in layer_tensors(model):
        shape = tuple(variable.shape)
        tensor = weights.get(name, shape[::-1] if torch_layout.transposed else shape)
        variable.assign(tensor.T if torch_layout.transposed else tensor)


def _write(directory: str, model: Transformer, config: TransformerConfig,
           decode: DecodeConfig, input_dir: str, vocabularies: Tuple[_Vocabulary, _Vocabulary]):
    """The model directory, in the empty `directory`; its vocabulary is checked by
    loading it."""
    import tensorflow as tf

    layout.save_config(directory, config, decode)
    models = []
    for name in ("source.spm", "target.spm"):
        with open(os.path.join(input_dir, name), "rb") as f:
            models.append(f.read())
    vocabulary.save_converted(directory, *models, vocabularies[0].pieces,
                                 vocabularies[1].pieces)
    try:
        vocabulary.load_converted(directory)
    except tokenizer_lib.VocabularyError as e:
        raise ConversionError(str(e).replace(os.path.join(directory, vocabulary.SOURCE_MODEL),
                                             os.path.join(input_dir, "source.spm"))
                              .replace(os.path.join(directory, vocabulary.TARGET_MODEL),
                                       os.path.join(input_dir, "target.spm"))) from None
    manager = tf.train.CheckpointManager(tf.train.Checkpoint(model=model), directory,
                                         max_to_keep=1)
    manager.save(checkpoint_number=0)


def _read_json(path: str):
    _require(path)
    try:
        with open(path, encoding="utf-8") as f:
            return json.load(f)
    except ValueError as e:
        raise ConversionError(f"{path} is not valid JSON ({' '.join(str(e).split())[:80]})"
                              ) from None


def _require(path: str):
    if not os.path.isfile(path):
        raise ConversionError(f"{path} is missing: a Marian checkpoint directory has "
                              "config.json, model.safetensors, source.spm, target.spm and "
                              "vocab.json")


def _weights_path(input_dir: str) -> str:
    path = os.path.join(input_dir, WEIGHTS)
    pickled = os.path.join(input_dir, PICKLED_WEIGHTS)
    return pickled if not os.path.isfile(path) and os.path.isfile(pickled) else path


def _read_weights(input_dir: str) -> Dict[str, np.ndarray]:
    path = _weights_path(input_dir)
    if path.endswith(WEIGHTS):
        _require(path)
        try:
            return safetensors.load(path)
        except safetensors.SafetensorsError as e:
            raise ConversionError(str(e)) from None
    try:
        import torch
    except ImportError:
        raise ConversionError(
            f"{path} is a pickled PyTorch file, which only torch reads safely (its "
            "weights_only loader) and torch is not installed: convert it to model.safetensors "
            "where torch is, or install torch") from None
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as e:  # torch's errors for a damaged or unsafe file vary by version
        raise ConversionError(f"{path} cannot be read by torch's weights_only loader "
                              f"({' '.join(str(e).split())[:100]})") from None
    return {name: tensor.float().numpy() for name, tensor in state.items()}


def _prefix(tensors: Dict[str, np.ndarray]) -> str:
    """"model." for MarianMTModel's names, "" for MarianModel's."""
    return "model." if any(name.startswith("model.") for name in tensors) else ""
