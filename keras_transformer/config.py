"""TransformerConfig: every hyperparameter of the model in one dataclass; DecodeConfig:
every setting of the search that translates with it.

Presets are named after the paper's rows ("Attention Is All You Need", Table 3):
`base` and `big`; every other row is `dataclasses.replace(TransformerConfig.base(...), ...)`.
`tiny` and `small` are this project's presets that train on a 2-core CPU.
"""

import dataclasses
from typing import Optional

from keras_transformer.options import BEAM, SAMPLE, check_fields, option, options_of

POSITIONAL_KINDS = ("sinusoidal", "learned")
# The feed-forward network's activation: the paper's ReLU, or what other Transformers use
# (Marian's OPUS-MT models: swish, x * sigmoid(x); gelu, the exact erf form).
ACTIVATIONS = ("relu", "swish", "gelu")
# Where the sinusoids' sines and cosines of one frequency go: the paper's formula
# interleaves them; Marian (and so OPUS-MT) puts all the sines, then all the cosines.
SINUSOID_LAYOUTS = ("interleaved", "concatenated")
# What a search divides a hypothesis' log-probability by (keras_transformer.search.
# length_penalty): the paper's, of Wu et al. (2016), ((5 + length) / 6)^alpha, or
# length^alpha, Hugging Face's, Marian's, CTranslate2's and fairseq's.
LENGTH_PENALTIES = ("gnmt", "average")
# When a beam search's sentence is done (keras_transformer.stopping, where each is a class):
# "exact", once no live beam can still enter its n-best (the paper's search, never a
# worse n-best than searching on); "transformers", as Hugging Face's generate() stops by
# default (early_stopping=False), which converted checkpoints use to translate as
# generate(); "first", once patience x beam_size hypotheses have finished, as CTranslate2
# and fairseq stop. The names are here, apart from the classes, so that a program checks
# its flags before TensorFlow starts.
STOPPING_RULES = ("exact", "transformers", "first")


@dataclasses.dataclass(frozen=True)
class TransformerConfig:
    """Hyperparameters of the Transformer (paper section 3, Table 3).

    Attributes:
      vocab_size: target vocabulary size (and source, unless `source_vocab_size` is set).
      num_layers: N, identical layers in each of the encoder and decoder stacks.
      num_encoder_layers, num_decoder_layers: a depth for one stack that differs from
        num_layers (None: num_layers), as Marian, fairseq and CTranslate2 allow; a deep
        encoder with a shallow decoder decodes faster (Kasai et al., 2021). The
        `encoder_layers` and `decoder_layers` properties give the depths.
      d_model: width of every sublayer output and of the embeddings.
      d_ff: inner width of the position-wise feed-forward network.
      num_heads: h, parallel attention heads.
      key_dim: d_k per head; None means d_model / h.
      value_dim: d_v per head; None means d_model / h.
      dropout: P_drop on every sublayer output and on embeddings + positional encodings.
      attention_dropout: dropout on attention weights (not in the paper, so 0 by default).
      label_smoothing: epsilon_ls of the training loss (section 5.4).
      positional: "sinusoidal" (section 3.5) or "learned" (Table 3 row E).
      share_embeddings: one matrix for source embedding, target embedding and pre-softmax
        projection (section 3.4). False gives the source its own embedding matrix; the
        target embedding stays tied to the pre-softmax projection.
      pre_norm: x + Dropout(Sublayer(LayerNorm(x))) instead of the paper's post-norm
        LayerNorm(x + Dropout(Sublayer(x))).
      max_length: longest sequence the model accepts (size of the learned position table
        and of the decoding cache).
      source_vocab_size: source vocabulary size when it differs from the target's
        (requires share_embeddings=False); None means vocab_size.

    What the paper does not fix, with its choice (or the common one) as the default and
    the values pretrained Marian (OPUS-MT) models need (trainer.convert sets them):
      activation: the feed-forward network's, one of ACTIVATIONS; "relu" (section 3.3).
      layer_norm_epsilon: added to the variance in every layer norm; 1e-6 (Marian: 1e-5).
      output_bias: a trained bias on the logits after the pre-softmax projection; False
        (section 3.4 has none; Marian has one).
      sinusoid_layout: one of SINUSOID_LAYOUTS; "interleaved" as in section 3.5's formula
        (Marian: "concatenated").

    Example:

    >>> import dataclasses
    >>> from keras_transformer import TransformerConfig
    >>> base = TransformerConfig.base()
    >>> base.num_layers, base.d_model, base.d_ff, base.num_heads, base.d_k
    (6, 512, 2048, 8, 64)
    >>> dataclasses.replace(base, num_heads=1).d_k  # Table 3 row (A): h = 1, d_k = 512
    512
    >>> TransformerConfig.from_dict(base.to_dict()) == base
    True
    """

    vocab_size: int = 37000
    num_layers: int = 6
    num_encoder_layers: Optional[int] = None
    num_decoder_layers: Optional[int] = None
    d_model: int = 512
    d_ff: int = 2048
    num_heads: int = 8
    key_dim: Optional[int] = None
    value_dim: Optional[int] = None
    dropout: float = 0.1
    attention_dropout: float = 0.0
    label_smoothing: float = 0.1
    positional: str = "sinusoidal"
    share_embeddings: bool = True
    pre_norm: bool = False
    max_length: int = 256
    source_vocab_size: Optional[int] = None
    activation: str = "relu"
    layer_norm_epsilon: float = 1e-6
    output_bias: bool = False
    sinusoid_layout: str = "interleaved"

    def __post_init__(self):
        for name, allowed in (("positional", POSITIONAL_KINDS), ("activation", ACTIVATIONS),
                              ("sinusoid_layout", SINUSOID_LAYOUTS)):
            if getattr(self, name) not in allowed:
                raise ValueError(f"{name} must be one of {allowed}, got {getattr(self, name)!r}")
        if not 0.0 < self.layer_norm_epsilon < 1.0:
            raise ValueError(f"layer_norm_epsilon must be in (0, 1), got {self.layer_norm_epsilon}")
        if (self.key_dim is None or self.value_dim is None) and self.d_model % self.num_heads:
            raise ValueError(
                f"d_model={self.d_model} is not divisible by num_heads={self.num_heads}; "
                "set key_dim and value_dim explicitly")
        if self.share_embeddings and self.source_vocab_size not in (None, self.vocab_size):
            raise ValueError("separate source and target vocabularies need share_embeddings=False")
        for name in ("vocab_size", "num_layers", "d_model", "d_ff", "num_heads", "max_length",
                     "num_encoder_layers", "num_decoder_layers"):
            if getattr(self, name) is not None and getattr(self, name) <= 0:
                raise ValueError(f"{name} must be positive, got {getattr(self, name)}")
        for name in ("dropout", "attention_dropout", "label_smoothing"):
            if not 0.0 <= getattr(self, name) < 1.0:
                raise ValueError(f"{name} must be in [0, 1), got {getattr(self, name)}")

    @property
    def encoder_layers(self) -> int:
        return self.num_encoder_layers or self.num_layers

    @property
    def decoder_layers(self) -> int:
        return self.num_decoder_layers or self.num_layers

    @property
    def depth(self) -> str:
        """The layers, for reports: "6", or "12+1" (encoder + decoder) when they differ."""
        if self.encoder_layers == self.decoder_layers:
            return str(self.encoder_layers)
        return f"{self.encoder_layers}+{self.decoder_layers}"

    @property
    def d_k(self) -> int:
        return self.key_dim or self.d_model // self.num_heads

    @property
    def d_v(self) -> int:
        return self.value_dim or self.d_model // self.num_heads

    @property
    def input_vocab_size(self) -> int:
        return self.source_vocab_size or self.vocab_size

    @classmethod
    def _preset(cls, values: dict, vocab_size: int, overrides: dict) -> "TransformerConfig":
        """A preset's values, with `overrides` taking precedence."""
        return cls(**{**values, "vocab_size": vocab_size, **overrides})

    @classmethod
    def base(cls, vocab_size: int = 37000, **overrides) -> "TransformerConfig":
        """Transformer (base model), Table 3: 65M parameters, 100k steps."""
        return cls._preset(dict(num_layers=6, d_model=512, d_ff=2048, num_heads=8, dropout=0.1),
                           vocab_size, overrides)

    @classmethod
    def big(cls, vocab_size: int = 37000, **overrides) -> "TransformerConfig":
        """Transformer (big), Table 3: 213M parameters, 300k steps (0.1 dropout for en-fr)."""
        return cls._preset(dict(num_layers=6, d_model=1024, d_ff=4096, num_heads=16, dropout=0.3),
                           vocab_size, overrides)

    @classmethod
    def small(cls, vocab_size: int = 8000, **overrides) -> "TransformerConfig":
        """A 3-layer, d_model=256 model for Multi30k-sized corpora on a CPU."""
        return cls._preset(dict(num_layers=3, d_model=256, d_ff=1024, num_heads=4, dropout=0.1,
                                max_length=128), vocab_size, overrides)

    @classmethod
    def tiny(cls, vocab_size: int = 1000, **overrides) -> "TransformerConfig":
        """A 2-layer, d_model=64 model for tests and the builtin corpus, without dropout:
        the builtin corpus is generated, its 1,000-update run reads each pair about five
        times, and dropout only slows what such a run learns (bench/runs.md)."""
        return cls._preset(dict(num_layers=2, d_model=64, d_ff=256, num_heads=4, dropout=0.0,
                                max_length=128), vocab_size, overrides)

    @classmethod
    def preset(cls, name: str, vocab_size: Optional[int] = None,
               **overrides) -> "TransformerConfig":
        """The preset called `name` ("tiny", "small", "base" or "big"); vocab_size None
        keeps the preset's own."""
        if name not in PRESETS:
            raise ValueError(f"unknown preset {name!r}; choose one of {', '.join(PRESETS)}")
        if vocab_size is not None:
            overrides["vocab_size"] = vocab_size
        return getattr(cls, name)(**overrides)

    def to_dict(self) -> dict:
        """The fields as a JSON-ready dict; `from_dict` reads it back."""
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, fields: dict) -> "TransformerConfig":
        return cls(**fields)


PRESETS = ("tiny", "small", "base", "big")


@dataclasses.dataclass(frozen=True)
class DecodeConfig:
    """How a trained model translates (paper section 6.1: "beam search with a beam size
    of 4 and length penalty alpha = 0.6 ... maximum output length during inference to
    input length + 50"), sampling's settings included. The one place these values are
    written: the library's searches, validation, the export, its signatures and the
    programs' flags all read them, and each field's declaration (keras_transformer.options:
    its type, range, whether a request may set it, its help), from here.

    A field may hold a tensor: a scalar, or [batch], one value per sentence (an export's
    signature inputs, whose range the signature checks per row); only Python values are
    checked here. The attributes are the help texts below.
    """

    beam_size: int = option(
        4, int, "Hypotheses kept per input: 1 is greedy search.", low=1, high="max_beam_size",
        request=True, searches=(BEAM,))
    alpha: float = option(
        0.6, float, "The length penalty's exponent: 0 turns it off.", low=0.0, request=True,
        searches=(BEAM,))
    length_penalty: str = option(
        "gnmt", str, "The length penalty's form: gnmt, the paper's ((5 + length) / 6)^alpha, "
        "or average, length^alpha (Hugging Face, Marian, CTranslate2).",
        choices=LENGTH_PENALTIES)
    stopping: str = option(
        "exact", str, "When a sentence's beam search is done: exact, once no live beam can "
        "still enter its n-best (the paper's search); transformers, as Hugging Face's "
        "generate() stops by default; first, once patience x beam size hypotheses have "
        "finished (CTranslate2's and fairseq's rule).", choices=STOPPING_RULES, request=True,
        searches=(BEAM,))
    patience: float = option(
        1.0, float, "With stopping first, the finished hypotheses a sentence waits for, as "
        "a multiple of the beam size.", low=0.0, low_open=True, request=True,
        searches=(BEAM,))
    max_extra_length: int = option(
        50, int, "Output tokens beyond the input's: an output has at most the input's "
        "tokens + 1 + this many, EOS included (the paper's input + 50).", low=0, request=True)
    max_length: Optional[int] = option(
        None, int, "Positions an output may take, the start token included, as "
        "Transformers' max_length counts them (a converted checkpoint's generation "
        "setting); none: the model's positions.", low=2, optional=True)
    min_length: int = option(
        0, int, "Tokens an output has at least before its EOS (CTranslate2's "
        "min_decoding_length; 0: no minimum); the maximum length still ends an output.",
        low=0, request=True)
    num_hypotheses: Optional[int] = option(
        None, int, "Hypotheses returned per input, best first: beam search finds them "
        "exactly (none: all beam_size); sampling draws this many (none: one).",
        low=1, high="beam_size", optional=True, request=True)
    temperature: float = option(
        1.0, float, "Sampling's temperature: the logits are divided by it; 0 takes the "
        "most probable token (greedy).", low=0.0, request=True, searches=(SAMPLE,))
    top_k: int = option(
        0, int, "Sample among the k most probable tokens (ties with the k-th kept); 0: "
        "all.", low=0, request=True, searches=(SAMPLE,))
    top_p: float = option(
        1.0, float, "Sample within the smallest set of most probable tokens whose "
        "probability reaches top_p (nucleus sampling); 1: all.", low=0.0, high=1,
        low_open=True, request=True, searches=(SAMPLE,))
    seed: int = option(
        0, int, "Sampling's seed: the same seed and input give the same samples.",
        request=True, searches=(SAMPLE,), dtype="int64")

    def __post_init__(self):
        check_fields(self)

    def to_dict(self) -> dict:
        """The fields as a JSON-ready dict; `from_dict` reads it back."""
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, fields: dict) -> "DecodeConfig":
        """The config of `fields`' decoding keys (other keys, such as an older export's
        max_beam_size, are ignored; missing ones take the paper's values): reads a model
        directory's config.json and an export's export.json."""
        names = {field.name for field in dataclasses.fields(cls)}
        return cls(**{k: v for k, v in fields.items() if k in names})


OPTIONS = options_of(DecodeConfig)
