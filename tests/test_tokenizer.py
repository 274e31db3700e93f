"""The SentencePiece vocabulary: lossless on clean text, graph-only, trained once per model_dir."""

import gzip
import itertools
from pathlib import Path
import unicodedata

import pytest
import tensorflow as tf

from trainer.data import tokenizer as tokenizer_lib, vocabulary
from keras_transformer.special_ids import BOS_ID, EOS_ID, PAD_ID, UNK_ID
from trainer.data.tokenizer import Tokenizer

from conftest import require_multi30k


def read_lines(path: Path, limit=None):
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt", encoding="utf-8") as f:
        return [line.rstrip("\n") for line in itertools.islice(f, limit)]


@pytest.fixture(scope="module")
def training_text():
    multi30k = require_multi30k("train.en.gz", "train.de.gz")
    return (read_lines(multi30k / "train.en.gz", 3000), read_lines(multi30k / "train.de.gz", 3000))


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory, training_text):
    model_dir = str(tmp_path_factory.mktemp("shared_vocab"))
    return vocabulary.load_or_train(model_dir, lambda: training_text, vocab_size=2000).source


def round_trip(tokenizer, sentences):
    return [s.decode() for s in tokenizer.detokenize(tokenizer.tokenize(sentences)).numpy()]


def test_multi30k_round_trips_exactly(tokenizer):
    # Multi30k is NFKC and whitespace-clean, so nmt_nfkc normalisation leaves it unchanged
    # and detokenize(tokenize(s)) must give s back byte for byte, unseen words included.
    names = ("val.en", "val.de", "test2016.en", "test2016.de")
    multi30k = require_multi30k(*names)
    sentences = [line for name in names for line in read_lines(multi30k / name)]
    assert all(unicodedata.normalize("NFKC", s) == s == " ".join(s.split()) for s in sentences)
    assert round_trip(tokenizer, sentences) == sentences


def test_round_trip_applies_only_nfkc_and_whitespace_normalisation(tokenizer):
    sentences = ["  Two   dogs\tplay ", "ﬁsh and chips…", "Ｆｕｌｌ width",
                 "Zoe\u0301 café"]
    expected = [" ".join(unicodedata.normalize("NFKC", s).split()) for s in sentences]
    assert expected == ["Two dogs play", "fish and chips...", "Full width", "Zoé café"]
    assert round_trip(tokenizer, sentences) == expected


def test_characters_outside_the_vocabulary_fall_back_to_bytes_not_unk(tokenizer):
    sentences = ["Der Schneemann ☃ steht in 東京.", "Ωμέγα 😀"]
    ids = tokenizer.tokenize(sentences)
    assert not tf.reduce_any(ids.flat_values == UNK_ID)
    assert round_trip(tokenizer, sentences) == sentences


def test_special_ids_are_fixed_and_never_produced_by_tokenize(tokenizer, training_text):
    assert tokenizer.vocab_size == 2000
    ids = tokenizer.tokenize(training_text[0][:500] + training_text[1][:500]).flat_values
    assert tf.reduce_all(ids > EOS_ID)
    assert tf.reduce_all(ids < tokenizer.vocab_size)
    assert ids.dtype == tf.int32


def test_detokenize_reads_to_the_first_eos_and_ignores_pad_and_bos(tokenizer):
    text = ["A dog runs.", "Ein Hund"]
    pieces = tokenizer.tokenize(text)  # [2, (pieces)]
    bos = tf.fill([2, 1], BOS_ID)
    eos = tf.fill([2, 1], EOS_ID)
    garbage = tokenizer.tokenize(["after the end", "nach dem Ende"]).to_tensor()
    padded = tf.concat([bos, pieces.to_tensor(default_value=PAD_ID), eos, garbage,
                        tf.fill([2, 3], PAD_ID)], axis=1)
    assert [s.decode() for s in tokenizer.detokenize(padded).numpy()] == text
    ragged = tf.concat([tf.RaggedTensor.from_tensor(bos), pieces], axis=1)
    assert [s.decode() for s in tokenizer.detokenize(tf.cast(ragged, tf.int64)).numpy()] == text


def test_saved_model_tokenizes_like_training(tokenizer, tmp_path):
    module = tf.Module()
    module.tokenizer = tokenizer
    module.tokenize = tf.function(
        lambda s: tokenizer.tokenize(s).to_tensor(default_value=PAD_ID),
        input_signature=[tf.TensorSpec([None], tf.string)])
    module.detokenize = tf.function(tokenizer.detokenize,
                                    input_signature=[tf.TensorSpec([None, None], tf.int32)])
    tf.saved_model.save(module, str(tmp_path / "saved"))
    loaded = tf.saved_model.load(str(tmp_path / "saved"))
    text = tf.constant(["Eine Frau fährt Fahrrad.", "A man in a red ☃ shirt."])
    ids = loaded.tokenize(text)
    assert tf.reduce_all(ids == tokenizer.tokenize(text).to_tensor(default_value=PAD_ID))
    assert tf.reduce_all(loaded.detokenize(ids) == text)


def test_tokenizers_outlive_reseeding_and_keep_their_own_vocabularies(tokenizer, tmp_path,
                                                                      training_text):
    # Seeding drops TF's kernel cache, which held tensorflow_text's own SentencePiece
    # resource: afterwards every use failed with NotFound.
    import keras
    smaller = vocabulary.load_or_train(str(tmp_path), lambda: training_text,
                                          vocab_size=1000).source
    text = tf.constant(training_text[0][:50])
    before = [t.tokenize(text) for t in (tokenizer, smaller)]
    pipeline = tf.data.Dataset.from_tensor_slices(text).batch(50).map(tokenizer.tokenize)
    keras.utils.set_random_seed(7)
    after = [t.tokenize(text) for t in (tokenizer, smaller)]
    for b, a in zip(before, after):
        assert b.to_list() == a.to_list()
    assert before[0].to_list() != before[1].to_list()  # one model each, not a shared one
    assert next(iter(pipeline)).to_list() == before[0].to_list()
    assert round_trip(smaller, training_text[1][:20]) == training_text[1][:20]


def test_existing_vocabulary_is_loaded_not_retrained(tmp_path, training_text):
    model_dir = str(tmp_path)
    first = vocabulary.load_or_train(model_dir, lambda: training_text, vocab_size=1000)
    assert (tmp_path / "spm.model").exists() and first.shared

    def must_not_train():
        raise AssertionError("the vocabulary was retrained")

    again = vocabulary.load_or_train(model_dir, must_not_train)
    assert again.source.model_proto == first.source.model_proto and again.shared
    with pytest.raises(tokenizer_lib.VocabularyError, match="1000 pieces but vocab_size=1200"):
        vocabulary.load_or_train(model_dir, must_not_train, vocab_size=1200)
    with pytest.raises(tokenizer_lib.VocabularyError, match="shared vocabulary"):
        vocabulary.load_or_train(model_dir, must_not_train, separate=True)
    # A source's default size only sizes a new vocabulary: an existing one of another
    # size (a model directory of an older version) is loaded as it is.
    kept = vocabulary.load_or_train(model_dir, must_not_train, default_size=600)
    assert kept.source.vocab_size == 1000


def test_a_default_size_sizes_a_new_vocabulary_and_a_given_size_overrides_it(tmp_path,
                                                                            training_text):
    sized = vocabulary.load_or_train(str(tmp_path / "a"), lambda: training_text,
                                        default_size=700)
    assert sized.source.vocab_size == 700
    given = vocabulary.load_or_train(str(tmp_path / "b"), lambda: training_text,
                                        vocab_size=900, default_size=700)
    assert given.source.vocab_size == 900


def test_separate_vocabularies_are_trained_per_language(tmp_path, training_text):
    english, german = training_text
    tokenizers = vocabulary.load_or_train(str(tmp_path), lambda: training_text,
                                             vocab_size=800, separate=True)
    assert not tokenizers.shared
    assert sorted(p.name for p in tmp_path.iterdir()) == ["spm_source.model", "spm_target.model"]
    source_pieces = tokenizers.source.tokenize(english[:200]).flat_values.shape[0]
    target_pieces = tokenizers.target.tokenize(english[:200]).flat_values.shape[0]
    # The English vocabulary segments English into fewer pieces than the German one does.
    assert source_pieces < 0.8 * target_pieces
    assert round_trip(tokenizers.target, german[:200]) == german[:200]
    with pytest.raises(tokenizer_lib.VocabularyError, match="separate vocabularies"):
        vocabulary.load_or_train(str(tmp_path), lambda: training_text)


def test_default_vocab_size_follows_the_documented_rule(training_text):
    english, german = training_text
    words = {w for s in english + german for w in s.split()}
    chars = {c for s in english + german for c in s} - {" "}
    assert tokenizer_lib.default_vocab_size(english + german) == 260 + len(chars) + len(words) // 4
    many_words = [f"w{i}" for i in range(1_000_000)]
    assert tokenizer_lib.default_vocab_size(many_words) == 37000
    # The default is a target SentencePiece may lower on a tiny corpus ...
    tiny = ["one two three", "two three four", "four five six seven"] * 10
    assert Tokenizer(tokenizer_lib.train_sentencepiece(tiny)).vocab_size > 260
    # ... but an explicit size it cannot reach is an error.
    with pytest.raises(tokenizer_lib.VocabularyError, match="too high"):
        tokenizer_lib.train_sentencepiece(tiny, vocab_size=5000)


def test_bpe_and_unigram_models(training_text):
    english, _ = training_text
    for model_type in ("bpe", "unigram"):
        tokenizer = Tokenizer(tokenizer_lib.train_sentencepiece(english, 600, model_type))
        assert round_trip(tokenizer, english[:100]) == english[:100]
    with pytest.raises(tokenizer_lib.VocabularyError, match="model_type"):
        tokenizer_lib.train_sentencepiece(english, 600, "wordpiece")


def test_sampled_segmentations_vary_and_each_spells_the_sentence(training_text):
    # Subword regularization (--subword_sampling): every call draws a segmentation, by
    # BPE-dropout for a BPE model and over all segmentations for a unigram one; each draw
    # detokenizes to the sentence, and sampling 0 is the one segmentation.
    english, _ = training_text
    sentences = english[:50]
    for model_type in ("bpe", "unigram"):
        tokenizer = Tokenizer(tokenizer_lib.train_sentencepiece(english, 600, model_type))
        one = tokenizer.tokenize(sentences).to_list()
        assert tokenizer.tokenize(sentences, 0.0).to_list() == one
        draws = [tokenizer.tokenize(sentences, 0.1) for _ in range(3)]
        for ids in draws:
            assert [s.decode() for s in tokenizer.detokenize(ids).numpy()] == sentences
            assert not tf.reduce_any(ids.flat_values < 4)  # no PAD, UNK, BOS or EOS
        lists = [ids.to_list() for ids in draws]
        assert lists[0] != lists[1] != lists[2] and one not in lists
        if model_type == "bpe":  # dropped merges leave more, shorter pieces
            assert all(ids.flat_values.shape[0] > sum(map(len, one)) for ids in draws)


def test_an_existing_sentencepiece_model_is_adopted_not_retrained(tmp_path, training_text):
    """--spm_model: the model directory's vocabulary is that file, byte for byte; one
    without the project's special ids is one error naming it."""
    model = tmp_path / "given.model"
    model.write_bytes(tokenizer_lib.train_sentencepiece(training_text[0], 500))
    vocabulary.adopt([str(model)], str(tmp_path / "run"))
    tokenizers = vocabulary.load_or_train(str(tmp_path / "run"), None)
    assert (tmp_path / "run" / vocabulary.SHARED_MODEL).read_bytes() == model.read_bytes()
    assert tokenizers.shared and tokenizers.source.vocab_size == 500
    marian = Path(__file__).parent / "fixtures" / "marian" / "shared_swish" / "source.spm"
    with pytest.raises(tokenizer_lib.VocabularyError, match=f"{marian} has pad/unk/bos/eos"):
        vocabulary.adopt([str(marian)], str(tmp_path / "other"))
    assert not (tmp_path / "other").exists()


@pytest.fixture(scope="module")
def numbers_spm():
    """(serialized model, sentencepiece processor) of a 300-piece vocabulary of German
    number words, which lacks "ö": "zwölf" falls back to the bytes of "ö"."""
    import sentencepiece as spm
    from trainer.data.builtin_corpus import german
    proto = tokenizer_lib.train_sentencepiece([german(7 + 389 * i) for i in range(3000)], 300)
    return proto, spm.SentencePieceProcessor(model_proto=proto)


def test_a_vocabularys_byte_pieces_read_as_sentencepiece_reads_them(numbers_spm, tmp_path):
    """A tokenizer with a `vocabulary` (a converted model's, here in another order than
    the SentencePiece model's) reads runs of byte pieces as SentencePiece does, and the
    text as Hugging Face's MarianTokenizer does (decode_pieces without UNK, "▁" a space,
    stripped): well-formed characters are themselves, and every byte of none is one
    U+FFFD, where TF's and Python's replacement give one for a whole cut sequence."""
    import random
    proto, sp = numbers_spm
    own = [sp.id_to_piece(i) for i in range(sp.get_piece_size())]
    assert "<0xC3>" in sp.encode("zwölf", out_type=str)
    rest = own[4:]
    random.Random(1).shuffle(rest)
    pieces = own[:4] + rest
    tokenizer = Tokenizer(proto, vocabulary=pieces)
    index = {piece: i for i, piece in enumerate(pieces)}

    def byte_pieces(data: bytes):
        return [f"<0x{b:02X}>" for b in data]

    zwoelf = ["▁", "z", "w", "<0xC3>", "<0xB6>", "l", "f"]
    runs = [byte_pieces("zwölf €😀 東京".encode()), zwoelf, zwoelf[:4] + zwoelf[5:],
            ["<0xB6>"], byte_pieces(b"\xe2\x82"),  # a lone continuation byte, a cut "€"
            byte_pieces(b"\xf0\x9f\x98"), byte_pieces(b"\xc0\xaf"),  # a cut "😀", overlong "/"
            byte_pieces(b"\xed\xa0\x80"), byte_pieces(b"\xf4\x90\x80\x80"),  # surrogate, > U+10FFFF
            byte_pieces(b"\xe0\x9f\xbf\xf0\x8f\xbf\xbf\xff\xf5"),
            ["<0xE2>", "<unk>", "<0x82>", "<0xAC>", "▁", "<0xC3>", "▁", "<0xB6>"],  # across UNK
            byte_pieces("\u2003a\u00a0".encode()), ["<0x20>", "▁", "z", "<0x0A>"],  # stripped
            byte_pieces("\u200bb\u200b".encode())]  # kept: not whitespace
    values = [0x00, 0x20, 0x41, 0x7F, 0x80, 0x8F, 0x90, 0x9F, 0xA0, 0xB6, 0xBF, 0xC0, 0xC2, 0xC3,
              0xDF, 0xE0, 0xE2, 0xED, 0xEF, 0xF0, 0xF4, 0xF5, 0xFF]
    words = [p for p in own[4:] if not sp.is_byte(sp.piece_to_id(p))]
    rng = random.Random(0)
    runs += [[f"<0x{rng.choice(values):02X}>" if rng.random() < 0.7 else rng.choice(words)
              for _ in range(rng.randint(1, 10))] for _ in range(500)]
    ids = tf.ragged.constant([[index[p] for p in run] for run in runs], tf.int32)
    ours = [t.decode("utf-8") for t in tokenizer.detokenize(ids).numpy()]
    theirs = [sp.decode_pieces([p for p in run if p != "<unk>"]).replace("\u2581", " ").strip()
              for run in runs]
    assert ours == theirs
    assert ours[:5] == ["zwölf €😀 東京", "zwölf", "zw\ufffdlf", "\ufffd", "\ufffd\ufffd"]
    assert ours[10] == "€ \ufffd \ufffd"
    # The pieces keep their names.
    assert tokenizer.id_to_piece(tf.constant([index["<0xC3>"]])).numpy().tolist() == [b"<0xC3>"]
    # In graph ops only: a SavedModel reads them so.
    module = tf.Module()
    module.tokenizer = tokenizer
    module.detokenize = tf.function(tokenizer.detokenize,
                                    input_signature=[tf.TensorSpec([None, None], tf.int32)])
    tf.saved_model.save(module, str(tmp_path / "saved"))
    loaded = tf.saved_model.load(str(tmp_path / "saved"))
    assert [t.decode("utf-8") for t in loaded.detokenize(ids.to_tensor()).numpy()] == ours
