"""The model as a CTranslate2 model directory, for CPU serving with CTranslate2's int8 or
float32 kernels (`pip install -e ".[ctranslate2]"`; OpenNMT is not needed).

The model is described with CTranslate2's own spec API (`ctranslate2.specs.TransformerSpec`)
and written by its `Converter`:

  - post-norm residual blocks (pre_norm=False), or pre-norm with the stacks' final
    LayerNorm when the model was trained so; the config's LayerNorm epsilon and
    feed-forward activation;
  - the position table passed explicitly, in the model's layout (CTranslate2's built-in
    sinusoids put the sines in the first half of the columns, the paper's interleave
    them); learned positions are a table too;
  - the shared matrix as source embedding, target embedding and pre-softmax projection
    (separate source embedding and vocabulary when the model has them), embeddings scaled
    by sqrt(d_model), and the output bias when the model has one;
  - self-attention Q, K, V fused into one linear, encoder-decoder K and V into another,
    Keras kernels [in, out] transposed to CTranslate2's [out, in];
  - our EOS appended to every source, our BOS as the decoder's start token, and the
    vocabulary's pieces in id order (pad, unk, bos, eos are ids 0-3 in both).

The exported directory also holds the SentencePiece model(s), so a client tokenizes with
them, and reads the output pieces with the target's `decode`, which reads byte pieces
("<0xC3>") as the SavedModel does: see docs/serving.md, "CTranslate2".
"""

import dataclasses
import os
import sys
import tempfile

import numpy as np

from keras_transformer import DecodeConfig, Transformer
from keras_transformer.special_ids import BOS_ID, EOS_ID, UNK_ID
from trainer.data import tokenizer as tokenizer_lib, vocabulary
from trainer.model_dir import files as model_files, layout
from trainer.model_dir.weights import WeightsChoice, final_model
from trainer.serving.exporters import MissingExtra
from trainer.serving.shortlist import ShortlistChoice, write_vmap

DESCRIPTION = "CTranslate2 model"
QUANTIZATIONS = ("int8", "int8_float32", "int16", "float32", "bfloat16", "int8_bfloat16")
EXTRA = 'pip install -e ".[ctranslate2]"'


@dataclasses.dataclass(frozen=True)
class Options:
    """How a model directory becomes a CTranslate2 model directory.

    Attributes:
      weights: which weights the export ships.
      quantization: the weights' type on disk, one of QUANTIZATIONS; CTranslate2 can
        convert again at load (`compute_type`). Beam size and length penalty are
        CTranslate2's per-request options.
      shortlist: a vocabulary shortlist, written as the directory's vmap.txt
        (trainer/serving/shortlist.py), which CTranslate2 uses with use_vmap=True.
    """

    weights: WeightsChoice = dataclasses.field(default_factory=WeightsChoice)
    quantization: str = "int8"
    shortlist: ShortlistChoice = dataclasses.field(default_factory=ShortlistChoice)

    def __post_init__(self):
        if self.quantization not in QUANTIZATIONS:
            raise ValueError(f"unknown quantization {self.quantization!r}; choose one of "
                             f"{', '.join(QUANTIZATIONS)}")


def default_dir(name: str, options: Options) -> str:
    """Where `python -m trainer.export` writes model directory `name`'s conversion."""
    return os.path.join("saved_models", f"{name}-ctranslate2-{options.quantization}")


def export(model_dir: str, export_dir: str, options: Options = Options()) -> str:
    """Writes model_dir's model (the weights `options` choose) as a CTranslate2 model
    directory at export_dir, replacing one there; returns export_dir.

    Raises:
      MissingExtra: ctranslate2 is not installed (checked before the model is read).
      ValueError: a model CTranslate2 cannot express.
    """
    _ctranslate2()
    model, _ = final_model(model_dir, options.weights)
    tokenizers = vocabulary.load_or_train(model_dir, None)
    shortlist = options.shortlist.build(tokenizers, model.config.input_vocab_size,
                                        model.config.vocab_size)
    path = write(model, tokenizers, export_dir, options.quantization, shortlist)
    print(search_note(layout.load_decode(model_dir)), file=sys.stderr, flush=True)
    if tokenizers.normalize_punctuation:
        print(f"CTranslate2's clients tokenize: normalize inputs with Moses' punctuation "
              f"rules first, as this model directory does "
              f"(sacremoses.MosesPunctNormalizer({tokenizers.normalize_punctuation!r}))",
              file=sys.stderr, flush=True)
    return path


def search_note(decode: DecodeConfig) -> str:
    """One line on how to search as the model directory does: CTranslate2 takes the
    search per request; it ranks by log-prob / length^length_penalty only (the "average"
    length penalty), and ends a sentence once beam_size x patience hypotheses have
    finished (the "first" stopping rule)."""
    request = (f"beam_size={decode.beam_size}, length_penalty={decode.alpha:g}, "
               f"patience={decode.patience:g}")
    if decode.min_length:  # the same count: tokens before the end token
        request += f", min_decoding_length={decode.min_length}"
    differs = []
    if decode.length_penalty != "average":
        differs.append(f"ranks by length^{decode.alpha:g}, not by the model directory's gnmt "
                       f"length penalty ((5 + length) / 6)^{decode.alpha:g}")
    if decode.stopping != "first":
        differs.append(f"ends a sentence once beam_size x patience hypotheses have finished "
                       f"(stopping=first), not by the model directory's {decode.stopping} rule")
    if not differs:
        return f"CTranslate2 takes the search per request: translate_batch(..., {request})"
    return (f"CTranslate2 cannot search as the model directory does: translate_batch(..., "
            f"{request}) " + "; it ".join(differs))


def _ctranslate2():
    try:
        import ctranslate2
        from ctranslate2.converters import Converter
        from ctranslate2.specs import transformer_spec
    except ImportError as e:
        raise MissingExtra(f"--format=ctranslate2 needs the ctranslate2 extra: {EXTRA}") from e
    return ctranslate2, Converter, transformer_spec


def _activation(name: str):
    from ctranslate2.specs import common_spec
    return {"relu": common_spec.Activation.RELU, "swish": common_spec.Activation.SWISH,
            "gelu": common_spec.Activation.GELU}[name]


def _linear(spec, dense_layers):
    """Sets a CTranslate2 linear to the Keras Dense layers' kernels concatenated along
    their outputs: weight [sum of outputs, in], bias [sum of outputs]."""
    spec.weight = np.concatenate([d.kernel.numpy().T for d in dense_layers])
    spec.bias = np.concatenate([d.bias.numpy() for d in dense_layers])


def _layer_norm(spec, layer_norm):
    spec.gamma = layer_norm.gamma.numpy()
    spec.beta = layer_norm.beta.numpy()


def _attention(spec, attention, residual, self_attention: bool):
    projections = [attention.query_dense, attention.key_dense, attention.value_dense]
    if self_attention:  # one fused QKV linear
        _linear(spec.linear[0], projections)
    else:  # queries from the decoder; keys and values, fused, from the encoder
        _linear(spec.linear[0], projections[:1])
        _linear(spec.linear[1], projections[1:])
    _linear(spec.linear[-1], [attention.output_dense])
    _layer_norm(spec.layer_norm, residual.layer_norm)


def _feed_forward(spec, layer):
    _linear(spec.linear_0, [layer.feed_forward.inner])
    _linear(spec.linear_1, [layer.feed_forward.outer])
    _layer_norm(spec.layer_norm, layer.feed_forward_residual.layer_norm)


def _positions(layer) -> np.ndarray:
    """[max_length, d_model]: the table row p is added at position p."""
    if layer.kind == "learned":
        return layer.position_embeddings.numpy()
    return np.asarray(layer.table(layer.max_length), np.float32)


def transformer_spec(model: Transformer, tokenizers: tokenizer_lib.Tokenizers):
    """The CTranslate2 TransformerSpec of `model` with its tokenizers' vocabularies.

    Raises:
      ValueError: the model has per-head key and value widths that differ.
    """
    _, _, specs = _ctranslate2()
    config = model.config
    if (config.key_dim or 0) != (config.value_dim or 0):
        raise ValueError(f"CTranslate2 needs key_dim == value_dim; this model has "
                         f"{config.key_dim} and {config.value_dim}")
    shape = dict(num_heads=config.num_heads, pre_norm=config.pre_norm, head_dim=config.key_dim,
                 activation=_activation(config.activation))
    encoder = specs.TransformerEncoderSpec(config.encoder_layers, **shape)
    decoder = specs.TransformerDecoderSpec(config.decoder_layers, **shape)
    spec = specs.TransformerSpec(encoder, decoder)

    pieces = tokenizers.target.pieces()
    source_pieces = tokenizers.source.pieces()
    spec.config.unk_token = pieces[UNK_ID]
    spec.config.bos_token = pieces[BOS_ID]
    spec.config.eos_token = pieces[EOS_ID]
    spec.config.decoder_start_token = pieces[BOS_ID]
    spec.config.add_source_eos = True
    spec.config.layer_norm_epsilon = config.layer_norm_epsilon
    spec.register_source_vocabulary(source_pieces)
    spec.register_target_vocabulary(pieces)

    shared = model.embedding.embeddings.numpy()  # [vocab, d_model]
    source = shared if model.source_embedding is None else model.source_embedding.embeddings
    encoder.embeddings[0].weight = np.asarray(source)
    encoder.position_encodings.encodings = _positions(model.source_positions)
    for layer_spec, layer in zip(encoder.layer, model.encoder.layers):
        _attention(layer_spec.self_attention, layer.self_attention,
                   layer.self_attention_residual, self_attention=True)
        _feed_forward(layer_spec.ffn, layer)

    decoder.embeddings.weight = shared
    decoder.projection.weight = shared  # the pre-softmax projection
    if config.output_bias:
        decoder.projection.bias = model.embedding.bias.numpy()
    decoder.position_encodings.encodings = _positions(model.target_positions)
    for layer_spec, layer in zip(decoder.layer, model.decoder.layers):
        _attention(layer_spec.self_attention, layer.self_attention,
                   layer.self_attention_residual, self_attention=True)
        _attention(layer_spec.attention, layer.cross_attention,
                   layer.cross_attention_residual, self_attention=False)
        _feed_forward(layer_spec.ffn, layer)
    if config.pre_norm:
        _layer_norm(encoder.layer_norm, model.encoder.final_norm)
        _layer_norm(decoder.layer_norm, model.decoder.final_norm)
    return spec


def write(model: Transformer, tokenizers: tokenizer_lib.Tokenizers, output_dir: str,
          quantization: str = "int8", shortlist=None) -> str:
    """Writes `model` as a CTranslate2 model directory (replacing one there) with the
    SentencePiece model(s) beside it; returns output_dir.

    Args:
      quantization: the weights' type on disk, one of QUANTIZATIONS; CTranslate2 can
        convert again at load (`compute_type`).
      shortlist: None, or a keras_transformer.shortlist.Shortlist, written as vmap.txt.
    Raises:
      MissingExtra: ctranslate2 is not installed.
      ValueError: an unknown quantization, or a model CTranslate2 cannot express.
    """
    if quantization not in QUANTIZATIONS:
        raise ValueError(f"unknown quantization {quantization!r}; choose one of "
                         f"{', '.join(QUANTIZATIONS)}")
    _, converter_base, _ = _ctranslate2()
    spec = transformer_spec(model, tokenizers)

    class KerasTransformerConverter(converter_base):
        def _load(self):
            return spec

    files = ({vocabulary.SHARED_MODEL: tokenizers.source} if tokenizers.shared else
             {vocabulary.SOURCE_MODEL: tokenizers.source,
              vocabulary.TARGET_MODEL: tokenizers.target})
    with model_files.staged_directory(os.path.dirname(os.path.abspath(output_dir))) as staging:
        with tempfile.TemporaryDirectory() as scratch:
            vmap = None
            if shortlist is not None:  # the converter copies it in as vmap.txt
                vmap = os.path.join(scratch, "vmap.txt")
                write_vmap(shortlist, tokenizers, vmap)
            KerasTransformerConverter().convert(staging.path, vmap=vmap,
                                                quantization=quantization, force=True)
        for name, tokenizer in files.items():
            with open(os.path.join(staging.path, name), "wb") as f:
                f.write(tokenizer.model_proto)
        staging.publish(output_dir, replace=True)
    return output_dir
