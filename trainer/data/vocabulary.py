"""A model directory's vocabulary: its files, loaded, or trained when there are none.

Files in the model directory: `spm.model` for a shared vocabulary, or
`spm_source.model` and `spm_target.model` for separate ones. An existing file is
loaded, never retrained, so a resumed run tokenizes exactly as before.

A converted model (trainer.convert, e.g. from OPUS-MT) keeps its own SentencePiece
models, which segment but do not number: `vocabulary.json` beside them lists the model's
pieces in id order, for the source and the target (trainer/data/tokenizer.py applies
them, and reads their byte pieces, "<0xC3>", as the bytes they stand for, as Hugging
Face's MarianTokenizer does).

`normalization.json`, when present, names the language whose Moses punctuation rules
(trainer/data/punctuation.py) normalize every source text before SentencePiece, in
training and in every program after (`--normalize_punctuation` of trainer.task and
trainer.convert).
"""

import dataclasses
import json
import os
from typing import Callable, Optional, Sequence, Tuple

import tensorflow as tf

from trainer.data import punctuation
from trainer.data.tokenizer import Tokenizer, Tokenizers, VocabularyError, train_sentencepiece
from trainer.model_dir import files, layout

# The files, named once for every model directory (trainer/model_dir/layout.py).
SHARED_MODEL, SOURCE_MODEL, TARGET_MODEL = (layout.SHARED_MODEL, layout.SOURCE_MODEL,
                                            layout.TARGET_MODEL)
VOCABULARY, NORMALIZATION = layout.VOCABULARY, layout.NORMALIZATION


def load_or_train(model_dir: str,
                  sentences: Optional[Callable[[], Tuple[Sequence[str], Sequence[str]]]],
                  vocab_size: Optional[int] = None,
                  separate: bool = False,
                  model_type: str = "bpe",
                  default_size: Optional[int] = None,
                  normalize_punctuation: Optional[str] = None) -> Tokenizers:
    """Loads the vocabulary from `model_dir`, or trains and saves it there, with the
    directory's punctuation normalization (NORMALIZATION).

    Args: as `_load_or_train`'s, and
      normalize_punctuation: None (whatever the directory says), or a language code: its
        Moses punctuation rules normalize every source text (trainer/data/punctuation.py),
        for a new vocabulary (trained on normalized source text) and in every program
        after, since the directory then says so. A directory whose vocabulary exists
        without it, or with another language, refuses it.
    """
    stored = punctuation_language(model_dir)
    if normalize_punctuation and normalize_punctuation != stored and (
            stored or has_vocabulary(model_dir)):
        raise VocabularyError(
            f"{model_dir}'s vocabulary normalizes punctuation "
            f"{'as ' + repr(stored) if stored else 'not at all'}, not as "
            f"{normalize_punctuation!r}; use a new model directory")
    language = stored or normalize_punctuation
    if language and sentences is not None:
        raw = sentences
        sentences = lambda: _normalized(raw(), language)  # noqa: E731
    tokenizers = _load_or_train(model_dir, sentences, vocab_size, separate, model_type,
                                default_size)
    if language and not stored:
        save_punctuation_language(model_dir, language)
    return dataclasses.replace(tokenizers, normalize_punctuation=language)


def punctuation_language(model_dir: str) -> Optional[str]:
    """The language whose punctuation rules normalize the directory's source texts, or
    None (NORMALIZATION absent: none)."""
    path = os.path.join(model_dir, NORMALIZATION)
    if not tf.io.gfile.exists(path):
        return None
    try:
        with tf.io.gfile.GFile(path) as f:
            return json.load(f)["punctuation"]
    except (ValueError, KeyError, TypeError) as e:
        raise VocabularyError(f"{path} is damaged ({type(e).__name__}): restore it from a "
                              "copy") from None


def save_punctuation_language(model_dir: str, language: Optional[str]):
    """Writes NORMALIZATION: the directory's source texts are normalized as `language`'s
    (None: the file is not written)."""
    if language:
        tf.io.gfile.makedirs(model_dir)
        files.write_atomically(os.path.join(model_dir, NORMALIZATION),
                               json.dumps({"punctuation": language}))


def _normalized(pairs: Tuple[Sequence[str], Sequence[str]], language: str):
    """(source sentences normalized as `language`'s, target sentences)."""
    source, target = pairs
    normalized = []
    for start in range(0, len(source), 10000):
        batch = punctuation.normalize(tf.constant(list(source[start:start + 10000])), language)
        normalized.extend(text.decode("utf-8") for text in batch.numpy())
    return normalized, target


def _load_or_train(model_dir: str,
                   sentences: Optional[Callable[[], Tuple[Sequence[str], Sequence[str]]]],
                   vocab_size: Optional[int] = None,
                   separate: bool = False,
                   model_type: str = "bpe",
                   default_size: Optional[int] = None) -> Tokenizers:
    """Loads the vocabulary from `model_dir`, or trains and saves it there.

    Args:
      model_dir: directory (any tf.io.gfile path) that holds or will hold the
        SentencePiece model(s).
      sentences: called only when training is needed; returns (source sentences,
        target sentences), the sample to learn from. None: the vocabulary must exist
        (serving a trained model), shared or separate, whatever `separate` says.
      vocab_size: pieces per vocabulary; None = `default_size`. When a vocabulary
        already exists, a given size must match it.
      separate: separate source and target vocabularies instead of a shared one.
      model_type: "bpe" or "unigram".
      default_size: the size a new vocabulary gets when vocab_size is None (the
        source's own, `Source.vocab_size`); None: `default_vocab_size` of the text each
        vocabulary is trained on. An existing vocabulary is loaded whatever its size.
    """
    shared_path = os.path.join(model_dir, SHARED_MODEL)
    source_path = os.path.join(model_dir, SOURCE_MODEL)
    target_path = os.path.join(model_dir, TARGET_MODEL)
    if tf.io.gfile.exists(os.path.join(model_dir, VOCABULARY)):
        return _checked_size(load_converted(model_dir), vocab_size)
    has_shared = tf.io.gfile.exists(shared_path)
    separate_found = [tf.io.gfile.exists(p) for p in (source_path, target_path)]
    has_separate = all(separate_found)
    if any(separate_found) and not has_separate:
        raise VocabularyError(f"{model_dir} has only one of {SOURCE_MODEL} and {TARGET_MODEL}")
    if sentences is None:  # serving a trained model: whichever kind it has
        separate = has_separate
    if separate and has_shared:
        raise VocabularyError(f"{shared_path} is a shared vocabulary but separate ones were asked "
                              "for; use another model_dir or drop the separate option")
    if not separate and has_separate:
        raise VocabularyError(f"{model_dir} has separate vocabularies but a shared one was asked "
                              "for; use another model_dir or ask for separate ones")

    if separate and has_separate:
        tokenizers = Tokenizers(Tokenizer.from_file(source_path), Tokenizer.from_file(target_path))
    elif has_shared:
        shared = Tokenizer.from_file(shared_path)
        tokenizers = Tokenizers(shared, shared)
    elif sentences is None:
        raise VocabularyError(f"{model_dir} holds no vocabulary ({SHARED_MODEL}, or "
                              f"{SOURCE_MODEL} and {TARGET_MODEL}): is it a model directory "
                              "of python -m trainer.task?")
    else:
        tf.io.gfile.makedirs(model_dir)
        source_text, target_text = sentences()
        size = vocab_size if vocab_size is not None else default_size
        if separate:
            source = Tokenizer(train_sentencepiece(source_text, size, model_type))
            target = Tokenizer(train_sentencepiece(target_text, size, model_type))
            source.save(source_path)
            target.save(target_path)
            return Tokenizers(source, target)
        shared = Tokenizer(train_sentencepiece(list(source_text) + list(target_text),
                                               size, model_type))
        shared.save(shared_path)
        return Tokenizers(shared, shared)

    return _checked_size(tokenizers, vocab_size)


def _checked_size(tokenizers: Tokenizers, vocab_size: Optional[int]) -> Tokenizers:
    """`tokenizers`, loaded from a model directory, if each has vocab_size pieces (or
    vocab_size is None)."""
    loaded = [tokenizers.source] if tokenizers.shared else [tokenizers.source, tokenizers.target]
    for tokenizer in loaded:
        if vocab_size is not None and tokenizer.vocab_size != vocab_size:
            raise VocabularyError(
                f"{tokenizer.path} has {tokenizer.vocab_size} pieces but vocab_size={vocab_size} "
                "was asked for; an existing vocabulary is never retrained")
    return tokenizers


def has_vocabulary(model_dir: str) -> bool:
    """Whether model_dir holds a vocabulary file (whole or not)."""
    return any(tf.io.gfile.exists(os.path.join(model_dir, name))
               for name in layout.VOCABULARY_FILES)


def adopt(spm_models: Sequence[str], model_dir: str):
    """Copies existing SentencePiece model(s) into model_dir as its vocabulary (one:
    shared; two: the source's and the target's), unless it has one already; a model
    without the project's special ids is a VocabularyError naming it."""
    if has_vocabulary(model_dir):
        return
    targets = [SHARED_MODEL] if len(spm_models) == 1 else [SOURCE_MODEL, TARGET_MODEL]
    for path, name in zip(spm_models, targets):
        if not tf.io.gfile.exists(path):
            raise VocabularyError(f"--spm_model={path}: no such file")
        tokenizer = Tokenizer.from_file(path)  # checks it
        tf.io.gfile.makedirs(model_dir)
        tokenizer.save(os.path.join(model_dir, name))


def copy_vocabulary(from_dir: str, to_dir: str):
    """Copies from_dir's vocabulary files into to_dir, unless to_dir has a vocabulary
    already (a run that starts from another model keeps that model's vocabulary)."""
    if has_vocabulary(to_dir):
        return
    if not layout.copy_model_files(from_dir, to_dir, layout.VOCABULARY_FILES):
        raise VocabularyError(f"{from_dir} holds no vocabulary ({SHARED_MODEL}, or "
                              f"{SOURCE_MODEL} and {TARGET_MODEL}): is it a model directory?")


def save_converted(model_dir: str, source_model: bytes, target_model: bytes,
                   source_vocabulary: Sequence[str], target_vocabulary: Sequence[str]):
    """Writes a converted model's SentencePiece models and VOCABULARY to model_dir."""
    files.write_atomically(os.path.join(model_dir, SOURCE_MODEL), source_model)
    files.write_atomically(os.path.join(model_dir, TARGET_MODEL), target_model)
    vocabulary = {"source": list(source_vocabulary), "target": list(target_vocabulary)}
    files.write_atomically(os.path.join(model_dir, VOCABULARY),
                           json.dumps(vocabulary, ensure_ascii=False).encode("utf-8"))


def load_converted(model_dir: str) -> Tokenizers:
    """The tokenizers of a converted model's directory (see the module's docstring)."""
    path = os.path.join(model_dir, VOCABULARY)
    try:
        with tf.io.gfile.GFile(path, "rb") as f:
            vocabulary = json.loads(f.read().decode("utf-8"))
        source, target = vocabulary["source"], vocabulary["target"]
    except (ValueError, KeyError, TypeError) as e:
        raise VocabularyError(f"{path} is damaged ({type(e).__name__}): restore it from a "
                              "copy, or convert the model again") from None
    models = [os.path.join(model_dir, name) for name in (SOURCE_MODEL, TARGET_MODEL)]
    for model in models:
        if not tf.io.gfile.exists(model):
            raise VocabularyError(f"{model} is missing: {path} needs a SentencePiece model "
                                  "for each side")
    return Tokenizers(Tokenizer.from_file(models[0], source),
                      Tokenizer.from_file(models[1], target))
