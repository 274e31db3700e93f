"""Tests for the builtin English -> German number-words corpus."""

import collections
import random

import pytest

from trainer.data import builtin_corpus
from trainer.data.builtin_corpus import english, german, split_numbers, splits

# Hand-checked translations: (number, British English, German).
EXAMPLES = [
    (0, "zero", "null"),
    (1, "one", "eins"),
    (7, "seven", "sieben"),
    (11, "eleven", "elf"),
    (12, "twelve", "zwölf"),
    (16, "sixteen", "sechzehn"),
    (17, "seventeen", "siebzehn"),
    (20, "twenty", "zwanzig"),
    (21, "twenty-one", "einundzwanzig"),
    (30, "thirty", "dreißig"),
    (60, "sixty", "sechzig"),
    (66, "sixty-six", "sechsundsechzig"),
    (70, "seventy", "siebzig"),
    (77, "seventy-seven", "siebenundsiebzig"),
    (99, "ninety-nine", "neunundneunzig"),
    (100, "one hundred", "einhundert"),
    (101, "one hundred and one", "einhunderteins"),
    (111, "one hundred and eleven", "einhundertelf"),
    (121, "one hundred and twenty-one", "einhunderteinundzwanzig"),
    (200, "two hundred", "zweihundert"),
    (1000, "one thousand", "eintausend"),
    (1001, "one thousand and one", "eintausendeins"),
    (1100, "one thousand one hundred", "eintausendeinhundert"),
    (1101, "one thousand one hundred and one", "eintausendeinhunderteins"),
    (2020, "two thousand and twenty", "zweitausendzwanzig"),
    (21000, "twenty-one thousand", "einundzwanzigtausend"),
    (101000, "one hundred and one thousand", "einhunderteintausend"),
    (305000, "three hundred and five thousand", "dreihundertfünftausend"),
    (341212, "three hundred and forty-one thousand two hundred and twelve",
     "dreihunderteinundvierzigtausendzweihundertzwölf"),
    (1000000, "one million", "eine Million"),
    (1000001, "one million and one", "eine Million eins"),
    (1005000, "one million five thousand", "eine Million fünftausend"),
    (2000005, "two million and five", "zwei Millionen fünf"),
    (2305001, "two million three hundred and five thousand and one",
     "zwei Millionen dreihundertfünftausendeins"),
    (21000000, "twenty-one million", "einundzwanzig Millionen"),
    (101000000, "one hundred and one million", "einhunderteine Millionen"),
    (999999999,
     "nine hundred and ninety-nine million nine hundred and ninety-nine "
     "thousand nine hundred and ninety-nine",
     "neunhundertneunundneunzig Millionen "
     "neunhundertneunundneunzigtausendneunhundertneunundneunzig"),
]


@pytest.mark.parametrize("n, expected_english, expected_german", EXAMPLES)
def test_hand_checked_examples(n, expected_english, expected_german):
    assert english(n) == expected_english
    assert german(n) == expected_german


def test_german_puts_units_before_tens():
    units = ["ein", "zwei", "drei", "vier", "fünf", "sechs", "sieben", "acht",
             "neun"]
    tens = {2: "zwanzig", 3: "dreißig", 4: "vierzig", 5: "fünfzig",
            6: "sechzig", 7: "siebzig", 8: "achtzig", 9: "neunzig"}
    for t, tens_word in tens.items():
        for u in range(1, 10):
            n = 10 * t + u
            assert german(n) == f"{units[u - 1]}und{tens_word}"
            # English keeps the digit order: tens first.
            assert english(n).startswith(english(10 * t) + "-")


def test_german_is_one_word_below_a_million():
    rng = random.Random(1)
    for n in [rng.randrange(1_000_000) for _ in range(2000)]:
        assert " " not in german(n), n
    for n in [rng.randrange(1_000_000, 1_000_000_000) for _ in range(2000)]:
        million_word = "Million" if n // 1_000_000 == 1 else "Millionen"
        words = german(n).split(" ")
        assert words[1] == million_word, n
        assert len(words) == (2 if n % 1_000_000 == 0 else 3), n


def test_german_one_is_eins_only_at_the_end():
    rng = random.Random(2)
    for n in [rng.randrange(1_000_000_000) for _ in range(5000)]:
        word = german(n)
        assert word.endswith("eins") == (n % 100 == 1), n
        # "eins" never sits inside a compound: "einstausend" is wrong.
        assert "eins" not in word[:-4], n


def test_translations_are_injective():
    numbers = list(range(0, 20000)) + list(range(20000, 1_000_000_000, 99991))
    assert len({english(n) for n in numbers}) == len(numbers)
    assert len({german(n) for n in numbers}) == len(numbers)


@pytest.mark.parametrize("function", [english, german])
@pytest.mark.parametrize("n", [-1, 1_000_000_000, 10**12])
def test_out_of_range_raises(function, n):
    with pytest.raises(ValueError):
        function(n)


@pytest.mark.parametrize("function", [english, german])
def test_range_bounds_are_accepted(function):
    assert function(0)
    assert function(builtin_corpus.MAX_NUMBER)


def test_split_sizes():
    corpus = splits(seed=0, train_size=500, eval_size=70)
    assert set(corpus) == {"train", "validation", "test"}
    expected = {"train": 500, "validation": 70, "test": 70}
    for name, (sources, targets) in corpus.items():
        assert len(sources) == len(targets) == expected[name]
        assert all(isinstance(s, str) and s for s in sources + targets)


def test_default_split_sizes():
    corpus = splits()
    assert [len(corpus[name][0]) for name in ("train", "validation", "test")] \
        == [20000, 1000, 1000]


def test_sources_are_english_and_targets_german():
    numbers = split_numbers(seed=3, train_size=200, eval_size=20)
    corpus = splits(seed=3, train_size=200, eval_size=20)
    for name, (sources, targets) in corpus.items():
        assert sources == [english(n) for n in numbers[name]]
        assert targets == [german(n) for n in numbers[name]]


def test_splits_are_disjoint_and_without_duplicates():
    numbers = split_numbers(seed=0)
    all_numbers = numbers["train"] + numbers["validation"] + numbers["test"]
    assert len(set(all_numbers)) == len(all_numbers) == 22000
    corpus = splits(seed=0)
    train, validation, test = (set(corpus[name][0])
                               for name in ("train", "validation", "test"))
    assert not train & validation
    assert not train & test
    assert not validation & test


def test_same_seed_gives_identical_splits():
    assert splits(seed=7, train_size=300, eval_size=30) == \
        splits(seed=7, train_size=300, eval_size=30)


def test_different_seeds_give_different_splits():
    a = splits(seed=7, train_size=300, eval_size=30)
    b = splits(seed=8, train_size=300, eval_size=30)
    for name in ("train", "validation", "test"):
        assert a[name] != b[name]


def test_training_data_covers_all_magnitudes():
    train = split_numbers(seed=0)["train"]
    per_digits = collections.Counter(len(str(n)) for n in train)
    # The 1000 numbers with 1..3 digits are all drawn and spread over the splits.
    for digits in (1, 2, 3):
        assert per_digits[digits] > 0.8 * builtin_corpus._count_with_digits(
            digits), digits
    # Longer ones share the rest about evenly (about 16% each).
    for digits in range(4, 10):
        assert 0.12 < per_digits[digits] / len(train) < 0.20, digits
    lengths = [len(english(n).split()) for n in train]
    assert min(lengths) == 1
    # 999,999,999 is the longest sentence at 14 English words.
    assert max(lengths) >= 12


def test_negative_sizes_raise():
    with pytest.raises(ValueError):
        splits(train_size=-1)
    with pytest.raises(ValueError):
        splits(eval_size=-1)


def test_round_numbers_are_common():
    """Each three-digit group below the leading one is zero about a quarter of the time
    (in millions, where distinct round numbers do not run out), so numbers like "three
    hundred and five thousand" are in the training split by the hundred; drawn uniformly,
    one in a thousand would be."""
    train = split_numbers(seed=0)["train"]
    millions = [n for n in train if n >= 1_000_000]
    assert 0.2 < sum(n % 1000 == 0 for n in millions) / len(millions) < 0.3
    assert 0.2 < sum(n // 1000 % 1000 == 0 for n in millions) / len(millions) < 0.3
    thousands = [n for n in train if 1000 <= n < 1_000_000 and n % 1000 == 0]
    assert len(thousands) > 500
    assert all(german(n).endswith("tausend") for n in thousands)


def test_the_readmes_example_is_a_builtin_sentence_pair():
    assert english(builtin_corpus.EXAMPLE_NUMBER) == "three hundred and five thousand"
    assert german(builtin_corpus.EXAMPLE_NUMBER) == "dreihundertfünftausend"
