"""SentencePiece's byte-fallback pieces read back as text, in TF graph ops.

A SentencePiece model trained with byte fallback (every vocabulary trained here is,
trainer/data/tokenizer.py) spells a character it lacks as the pieces of its UTF-8 bytes:
"zwölf" may be "▁zw" "<0xC3>" "<0xB6>" "lf". SentencePiece's decoder, and so Hugging Face's
MarianTokenizer, which decodes with it, reads every run of consecutive byte pieces as UTF-8:
each well-formed character of the run is itself, and each byte that is part of none is one
U+FFFD. That is one U+FFFD per byte: "<0xE2>" "<0x82>" (a "€" cut short) is two, where
Python's errors="replace" and TF's unicode_transcode give one for the whole cut sequence.
Well-formed is Unicode's: no overlong forms, no surrogates, nothing above U+10FFFF (the
second byte's range after E0, ED, F0 and F4, as in SentencePiece's DecodeUTF8).

`Tokenizer` reads a vocabulary that is not the SentencePiece model's own (a converted
model's, `vocabulary.json`) with it; tensorflow_text's decoder, which is SentencePiece's
own, reads a model's own ids.
"""

from typing import List, Sequence

import tensorflow as tf

# The value of a piece that stands for no byte; it ends a run of byte pieces.
NOT_A_BYTE = -1
REPLACEMENT = "\ufffd"
# Each byte as a one-byte string, by its value.
_BYTES = [bytes([value]) for value in range(256)]


def byte_values(pieces: Sequence[str], processor) -> List[int]:
    """The byte each piece stands for, or NOT_A_BYTE: a piece is a byte piece when the
    SentencePiece model (`processor`, a sentencepiece.SentencePieceProcessor) has it as one,
    as SentencePiece's decoder decides (a piece it lacks, whatever its name, is not)."""
    return [int(piece[3:5], 16) if processor.is_byte(processor.piece_to_id(piece))
            else NOT_A_BYTE for piece in pieces]


def texts(pieces, values) -> tf.Tensor:
    """The text of each piece, with its byte pieces read as SentencePiece reads them.

    pieces: tf.string [batch, length], the pieces' names; values: int32 [batch, length],
    each piece's byte or NOT_A_BYTE (padding too) -> tf.string [batch, length]: a piece
    that is no byte as it is, a byte piece's byte when it is part of a well-formed
    character of its run, else U+FFFD. Joined, a row is its pieces' text.
    """
    byte = tf.gather(tf.constant(_BYTES), tf.maximum(values, 0))
    return tf.where(values == NOT_A_BYTE, pieces,
                    tf.where(well_formed(values), byte, REPLACEMENT))


def well_formed(values) -> tf.Tensor:
    """Whether each byte is part of a well-formed UTF-8 character of its run.

    values: int32 [batch, length], bytes and NOT_A_BYTE -> bool [batch, length] (False for
    NOT_A_BYTE). A run is read from its start, a character at a time, as SentencePiece's
    DecodeUTF8 reads it; a byte that starts no character is skipped alone. Every byte that
    can start a character (ASCII or a lead byte, never a continuation byte) is reached that
    way, so a byte is part of a character exactly when one of the 4 bytes up to it starts a
    character long enough to hold it.
    """
    def ahead(k):  # values[:, j + k]; past the end, NOT_A_BYTE
        return tf.pad(values, [[0, 0], [0, k]], constant_values=NOT_A_BYTE)[:, k:]

    def behind(flags, k):  # flags[:, j - k]; before the start, False
        return tf.pad(flags, [[0, 0], [k, 0]])[:, :tf.shape(flags)[1]]

    def between(x, low, high):
        return (x >= low) & (x <= high)

    # The character's length by its first byte (0: it starts none).
    length = tf.where(between(values, 0, 0x7F), 1,
                      tf.where(between(values, 0xC2, 0xDF), 2,
                               tf.where(between(values, 0xE0, 0xEF), 3,
                                        tf.where(between(values, 0xF0, 0xF4), 4, 0))))
    # The second byte's range: narrower after E0 and F0 (overlong forms), ED (surrogates)
    # and F4 (above U+10FFFF).
    low = tf.where(values == 0xE0, 0xA0, tf.where(values == 0xF0, 0x90, 0x80))
    high = tf.where(values == 0xED, 0x9F, tf.where(values == 0xF4, 0x8F, 0xBF))
    starts = (length == 1) | (
        (length >= 2) & between(ahead(1), low, high)
        & ((length < 3) | between(ahead(2), 0x80, 0xBF))
        & ((length < 4) | between(ahead(3), 0x80, 0xBF)))
    inside = starts
    for k in range(1, 4):
        inside |= behind(starts & (length > k), k)
    return inside
