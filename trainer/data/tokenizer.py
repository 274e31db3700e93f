"""The subword vocabulary: SentencePiece trained on the training text, applied in the TF graph.

The paper (section 5.1) encodes WMT 2014 English-German with byte-pair encoding into
"a shared source-target vocabulary of about 37000 tokens". Here the vocabulary is
learned with the `sentencepiece` package (BPE by default, unigram as an option) and
applied with `tensorflow_text.SentencepieceTokenizer`, so tokenization is a graph
op: the tf.data pipeline and an exported SavedModel run the same code on the same
model bytes.

Ids are the project's (`keras_transformer.special_ids`): PAD 0, UNK 1, BOS 2, EOS 3.

Normalisation. SentencePiece's default `nmt_nfkc` rule is applied before
segmentation: Unicode NFKC (e.g. the ligature "ﬁ" -> "fi", full-width letters ->
ASCII, "…" -> "..."), control characters removed, and whitespace runs collapsed to
one space with leading and trailing whitespace removed. So detokenize(tokenize(s))
is the normalised s, which equals s for text that is already NFKC and
whitespace-clean. Byte fallback is on: a character the vocabulary does not cover
becomes its UTF-8 bytes instead of <unk>, so nothing else is lost.

A converted model's SentencePiece models (trainer.convert, e.g. from OPUS-MT) segment but
do not number: its tokenizers number pieces by the model's own list of them in id order
(`Tokenizer`'s `vocabulary`), and a piece the list lacks is UNK. A leading target-language
code of a multilingual model (">>fra<<") is one piece, as in Hugging Face's MarianTokenizer.
Its text is read as MarianTokenizer reads it, byte pieces included (trainer/data/
byte_fallback.py): a model trained here, exported to Hugging Face and converted back,
writes "zwölf", not "zw<0xC3><0xB6>lf".

The files a model directory keeps them in: trainer/data/vocabulary.py.
"""

import dataclasses
import hashlib
import io
import os
import re
from typing import Iterable, List, Optional, Sequence

import numpy as np
import sentencepiece as spm
import tensorflow as tf
import tensorflow_text as tf_text
from tensorflow_text.python.ops import sentencepiece_tokenizer as tf_text_sentencepiece

from keras_transformer.special_ids import BOS_ID, EOS_ID, PAD_ID, UNK_ID
from trainer.config import SUBWORD_MODELS
from trainer.data import byte_fallback, punctuation
from trainer.model_dir import files

# The paper's shared en-de vocabulary (section 5.1).
PAPER_VOCAB_SIZE = 37000
# Specials + the 256 byte pieces of byte fallback.
_FIXED_PIECES = 4 + 256

# The pieces a vocabulary's first ids hold (keras_transformer.special_ids).
SPECIAL_PIECES = ("<pad>", "<unk>", "<s>", "</s>")
# A multilingual Marian model's target-language piece, written first in the input.
LANGUAGE_CODE = re.compile(">>.*<<")
# Leading or trailing whitespace as Python's str.strip() sees it (MarianTokenizer strips
# its text so), in RE2: ASCII's, the separators \x1c-\x1f, NEL and Unicode's Z category.
_WHITESPACE = r"[\t-\r\x{1c}-\x{20}\x{85}\pZ]"


class VocabularyError(ValueError):
    """A vocabulary cannot be trained or loaded as asked; the message is one line."""


def default_vocab_size(sentences: Iterable[str]) -> int:
    """The vocabulary size used when none is given, sized to the corpus.

    Rule: min(37000, required + distinct_words // 4), where `distinct_words`
    counts whitespace-separated words in `sentences` and `required` is what
    byte-fallback SentencePiece needs before its first merge (4 special ids +
    256 byte pieces + distinct characters). A WMT-sized corpus has millions of
    distinct words and gets the paper's 37000; Multi30k en+de (39.5k distinct
    words) gets ~10.2k; the builtin number corpus' training split (16.5k distinct
    words) 4,413, of which SentencePiece's BPE, trained with this size as a target
    (`train_sentencepiece`), makes 1,729 pieces: 16.1k of its words are compounds
    longer than SentencePiece's longest piece (16 characters), so the merges run out
    first (docs/data.md). Otherwise a quarter of the distinct words is learnable: BPE
    needs at least one merge per distinct multi-character word to spell it as one piece.
    """
    words = set()
    chars = set()
    for sentence in sentences:
        words.update(sentence.split())
        chars.update(sentence)
    chars.discard(" ")
    return min(PAPER_VOCAB_SIZE, _FIXED_PIECES + len(chars) + len(words) // 4)


def train_sentencepiece(sentences: Sequence[str], vocab_size: Optional[int] = None,
                        model_type: str = "bpe") -> bytes:
    """Trains a SentencePiece model on `sentences` and returns its serialized bytes.

    Args:
      sentences: the training text, one sentence per item (already sampled; all
        of it is used).
      vocab_size: number of pieces including the 4 specials and 256 bytes. None
        uses `default_vocab_size(sentences)`, which SentencePiece may lower if
        the text cannot support it; an explicit size it cannot reach is an error.
      model_type: "bpe" (the paper) or "unigram".
    """
    if model_type not in SUBWORD_MODELS:
        raise VocabularyError(f"model_type must be one of {SUBWORD_MODELS}, got {model_type!r}")
    sentences = [s for s in sentences if s.strip()]
    if not sentences:
        raise VocabularyError("no non-empty sentences to train the vocabulary on")
    explicit = vocab_size is not None
    if not explicit:
        vocab_size = default_vocab_size(sentences)
    model = io.BytesIO()
    try:
        spm.SentencePieceTrainer.train(
            sentence_iterator=iter(sentences),
            model_writer=model,
            vocab_size=vocab_size,
            model_type=model_type,
            pad_id=PAD_ID, unk_id=UNK_ID, bos_id=BOS_ID, eos_id=EOS_ID,
            byte_fallback=True,
            # The default size is a target; an explicit one must be met exactly.
            hard_vocab_limit=explicit,
            num_threads=os.cpu_count() or 1,
            minloglevel=2,
        )
    except RuntimeError as e:
        message = " ".join(str(e).split())
        raise VocabularyError(f"SentencePiece training failed for vocab_size={vocab_size}: "
                              f"{message}") from None
    return model.getvalue()


class _SharedSentencepieceModel(tf_text_sentencepiece._SentencepieceModelResource):
    """tensorflow_text's SentencePiece model resource, named after the model's bytes.

    tensorflow_text's own resource belongs to the op kernel that created it, so when TF
    drops its kernel cache (tf.random.set_seed and keras.utils.set_random_seed do) the
    resource goes with it and every later use fails with NotFound. A shared name makes it
    the resource manager's: it outlives the kernel, and tokenizers of the same model
    share one copy of it (it is read-only)."""

    def __init__(self, model_proto: bytes):
        self._shared_name = "sentencepiece_" + hashlib.sha256(model_proto).hexdigest()[:32]
        super().__init__(model_proto, None)

    def _create_resource(self):
        return tf_text_sentencepiece.gen_sentencepiece_tokenizer.sentencepiece_op(
            model=self._model, shared_name=self._shared_name)


class Tokenizer(tf.Module):
    """Text <-> subword ids with one SentencePiece model, in TF graph ops only.

    Usable inside tf.data and inside exported tf.functions: it holds the
    `tensorflow_text.SentencepieceTokenizer` resource, which a SavedModel that
    tracks this module carries along.

    Args:
      model_proto: serialized SentencePiece model with the project's special ids.
      path: where the model was read from or written to (for reports), if anywhere.
      vocabulary: the model's pieces in id order, SPECIAL_PIECES first, when they are not
        the SentencePiece model's own (a converted model): the SentencePiece model then
        only segments, a piece outside the vocabulary is UNK, and text is the pieces
        joined without UNK, runs of byte pieces read as UTF-8, "▁" read as a space and
        whitespace stripped, as Hugging Face's MarianTokenizer decodes (byte runs as
        SentencePiece's decoder reads them: trainer/data/byte_fallback.py).
    """

    def __init__(self, model_proto: bytes, path: Optional[str] = None,
                 vocabulary: Optional[Sequence[str]] = None):
        super().__init__(name="tokenizer")
        try:
            processor = spm.SentencePieceProcessor(model_proto=model_proto)
        except RuntimeError as e:  # a truncated or foreign file
            reason = " ".join(str(e).split())[:120]
            raise VocabularyError(f"{path or '<bytes>'} is not a readable SentencePiece model "
                                  f"({reason}); restore it from a copy, or use another "
                                  "model directory") from None
        ids = (processor.pad_id(), processor.unk_id(), processor.bos_id(), processor.eos_id())
        if vocabulary is None and ids != (PAD_ID, UNK_ID, BOS_ID, EOS_ID):
            raise VocabularyError(
                f"SentencePiece model {path or '<bytes>'} has pad/unk/bos/eos ids {ids}, "
                f"expected {(PAD_ID, UNK_ID, BOS_ID, EOS_ID)}")
        own = [processor.id_to_piece(i) for i in range(processor.get_piece_size())]
        if vocabulary is not None and tuple(vocabulary[:len(SPECIAL_PIECES)]) != SPECIAL_PIECES:
            raise VocabularyError(f"the vocabulary of {path or '<bytes>'} starts with "
                                  f"{list(vocabulary[:4])}, not {list(SPECIAL_PIECES)}")
        self.model_proto = model_proto
        self.path = path
        # Arrays, not lists: a tf.Module would track a list's every string.
        self._vocabulary = None if vocabulary is None else np.array(vocabulary, object)
        self.vocab_size = len(own if vocabulary is None else vocabulary)
        self._sentencepiece = tf_text.SentencepieceTokenizer(model=model_proto, out_type=tf.int32)
        self._sentencepiece._model_resource = _SharedSentencepieceModel(model_proto)
        self._own_pieces = np.array(own, object)
        if vocabulary is not None:
            index = {piece: i for i, piece in enumerate(vocabulary)}
            # [SentencePiece ids] -> the model's ids; [model ids] -> pieces.
            self._model_ids = tf.constant([index.get(piece, UNK_ID) for piece in own], tf.int32)
            self._pieces = tf.constant(list(vocabulary))
            self._byte_values = tf.constant(byte_fallback.byte_values(vocabulary, processor),
                                            tf.int32)
            codes = [piece for piece in vocabulary if LANGUAGE_CODE.fullmatch(piece)]
            self._codes = tf.constant(codes or [""], tf.string)
            self._code_ids = tf.constant([index[c] for c in codes] or [UNK_ID], tf.int32)

    @classmethod
    def from_file(cls, path: str, vocabulary: Optional[Sequence[str]] = None) -> "Tokenizer":
        with tf.io.gfile.GFile(path, "rb") as f:
            return cls(f.read(), path, vocabulary)

    def save(self, path: str):
        """Writes the model bytes to `path` atomically (a crash leaves no half file)."""
        files.write_atomically(path, self.model_proto)
        self.path = path

    def tokenize(self, strings, sampling: float = 0.0) -> tf.RaggedTensor:
        """Subword ids of each string, without BOS/EOS.

        strings: tf.string [batch] -> int32 RaggedTensor [batch, (pieces)].
        sampling: 0, the one segmentation of each string; above 0, a segmentation drawn at
          every call by SentencePiece (nbest_size -1, alpha = sampling), for subword
          regularization in training: BPE-dropout at this rate for a BPE model (Provilkov
          et al. 2020), sampling over all segmentations for a unigram one (Kudo 2018).
          SentencePiece draws from its own generator, so sampled ids are not seeded.
        """
        if self._vocabulary is not None:
            # A leading language code (">>fra<<") is one piece, not SentencePiece's to cut.
            strings, codes = self._split_language_code(strings)
        if not sampling:
            ids = self._sentencepiece.tokenize(strings)
        else:
            # The op the tf_text tokenizer runs, with its sampling inputs: no second
            # resource (nor a second copy of the model in an export of this module).
            values, row_splits = tf_text_sentencepiece.gen_sentencepiece_tokenizer.\
                sentencepiece_tokenize_op(self._sentencepiece._model_resource.resource_handle,
                                          strings, nbest_size=-1, alpha=sampling,
                                          add_bos=False, add_eos=False, reverse=False,
                                          out_type=tf.int32)
            ids = tf.RaggedTensor.from_row_splits(values, row_splits, validate=False)
        if self._vocabulary is None:
            return ids
        ids = tf.ragged.map_flat_values(tf.gather, self._model_ids, ids)
        return tf.concat([self._language_code_ids(codes), ids], axis=1)

    def _split_language_code(self, strings):
        """(the text after a leading ">>...<<" code, the code or "") of each string, as
        Hugging Face's MarianTokenizer splits them: tf.string [batch] x 2."""
        rest = tf.strings.regex_replace(strings, "^>>.*?<<", "", replace_global=False)
        code_lengths = tf.strings.length(strings) - tf.strings.length(rest)
        codes = tf.strings.substr(strings, tf.zeros_like(code_lengths), code_lengths)
        return rest, codes

    def _language_code_ids(self, codes):
        """tf.string [batch] codes ("" for none) -> int32 RaggedTensor [batch, (0 or 1)]:
        the code's id, or UNK for a code the vocabulary lacks."""
        matches = tf.equal(codes[:, None], self._codes[None, :])  # [batch, codes]
        found = tf.reduce_any(matches, axis=1)
        ids = tf.gather(self._code_ids, tf.argmax(tf.cast(matches, tf.int32), axis=1))
        ids = tf.where(found, ids, UNK_ID)
        has_code = codes != ""
        return tf.RaggedTensor.from_row_lengths(tf.boolean_mask(ids, has_code),
                                                tf.cast(has_code, tf.int64))

    def pieces(self) -> List[str]:
        """The model's pieces in id order (vocab_size strings)."""
        return (self._own_pieces if self._vocabulary is None else self._vocabulary).tolist()

    def id_to_piece(self, ids) -> tf.Tensor:
        """The subword string of each id: int [...] -> tf.string [...]."""
        if self._vocabulary is None:
            return self._sentencepiece.id_to_string(ids)
        return tf.gather(self._pieces, ids)

    def detokenize(self, ids) -> tf.Tensor:
        """Text of each id sequence, read up to its first EOS; PAD and BOS are ignored.

        ids: int [batch, length] Tensor or [batch, (length)] RaggedTensor, e.g. a
        padded model input or a decoder output -> tf.string [batch].
        """
        if isinstance(ids, tf.RaggedTensor):
            ids = ids.to_tensor(default_value=PAD_ID)
        ids = tf.cast(ids, tf.int32)  # [batch, length]
        before_eos = tf.math.cumsum(tf.cast(ids == EOS_ID, tf.int32), axis=1) == 0
        keep = before_eos & (ids != PAD_ID) & (ids != BOS_ID)
        if self._vocabulary is None:
            return self._sentencepiece.detokenize(tf.ragged.boolean_mask(ids, keep))
        # Without UNK, as MarianTokenizer drops it before SentencePiece reads the rest: the
        # byte pieces on either side of one are one run. Dense again, to read runs across
        # positions; the padding's "<pad>" is no byte and no text.
        kept = tf.ragged.boolean_mask(ids, keep & (ids != UNK_ID))
        kept_ids = kept.to_tensor(default_value=PAD_ID)  # [batch, pieces]
        real = tf.sequence_mask(kept.row_lengths(), tf.shape(kept_ids)[1])
        pieces = tf.where(real, tf.gather(self._pieces, kept_ids), "")
        texts = byte_fallback.texts(pieces, tf.gather(self._byte_values, kept_ids))
        text = tf.strings.regex_replace(tf.strings.reduce_join(texts, axis=1), "\u2581", " ")
        return tf.strings.regex_replace(text, f"^{_WHITESPACE}+|{_WHITESPACE}+$", "")


@dataclasses.dataclass(frozen=True)
class Tokenizers:
    """The source and target tokenizers; the same object when the vocabulary is shared.

    normalize_punctuation: None, or the language code whose Moses punctuation rules
    (trainer/data/punctuation.py) normalize every source text before SentencePiece."""

    source: Tokenizer
    target: Tokenizer
    normalize_punctuation: Optional[str] = None

    def source_ids(self, strings, sampling: float = 0.0) -> tf.RaggedTensor:
        """The source's ids of strings tf.string [batch] (see `Tokenizer.tokenize`),
        normalized first when normalize_punctuation says so."""
        if self.normalize_punctuation:
            strings = punctuation.normalize(strings, self.normalize_punctuation)
        return self.source.tokenize(strings, sampling)

    @property
    def shared(self) -> bool:
        return self.source is self.target

    @property
    def shared_ids(self) -> bool:
        """One id space on both sides: one tokenizer, or a converted model's two
        SentencePiece models numbering into one vocabulary."""
        return self.shared or self.source.pieces() == self.target.pieces()
