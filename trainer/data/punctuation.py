"""Moses' punctuation normalization (mosesdecoder's scripts/tokenizer/
normalize-punctuation.perl, as sacremoses' MosesPunctNormalizer(lang) runs it by default)
in TensorFlow ops: a chain of `tf.strings.regex_replace` (RE2), so that a SavedModel
normalizes its inputs inside its graph with core ops only.

The rules, in the order they run: spaces around parentheses and before colons and
semicolons; Penn-style `` and '' quotes; curly and low quotes, dashes, acute accents and the
ellipsis to ASCII; French guillemets to '"'; non-breaking spaces before punctuation and
units; then by language, a comma or period after a closing quote ("en": moved inside it;
"de", "es", "fr": moved outside) and a non-breaking space between digits (a thousands
separator: "," for "de", "es", "cs", "cz", "fr", else "."); and the text stripped of
leading and trailing whitespace. Python's `re`, which sacremoses runs, reads \\d as any
Unicode digit and strips any Unicode space; the RE2 rules here say so explicitly
(\\p{Nd}, and Python's whitespace characters).

tests/test_punctuation.py compares this with sacremoses' outputs, committed beside it
(tests/fixtures/punctuation).
"""

from typing import List, Tuple

import tensorflow as tf

NBSP = "\u00a0"
# Python's str.isspace() characters, which str.strip() removes.
_SPACE = (r"\t\n\x{0b}\x{0c}\r\x{1c}-\x{1f} \x{85}\x{a0}\x{1680}\x{2000}-\x{200a}\x{2028}"
          r"\x{2029}\x{202f}\x{205f}\x{3000}")

# Whatever the language (the Perl script's lines 21-67).
_COMMON = [
    # Spaces around parentheses, colons and semicolons.
    (r"\r", ""), (r"\(", " ("), (r"\)", ") "), (r" +", " "), (r"\) ([.!:?;,])", r")\1"),
    (r"\( ", "("), (r" \)", ")"), (r"(\p{Nd}) %", r"\1%"), (r" :", ":"), (r" ;", ";"),
    # Penn Treebank quotes.
    (r"`", "'"), (r"''", ' " '),
    # Unicode quotes, dashes and the ellipsis.
    ("\u201e", '"'), ("\u201c", '"'), ("\u201d", '"'), ("\u2013", "-"), ("\u2014", " - "),
    (r" +", " "), ("\u00b4", "'"), ("([a-zA-Z])\u2018([a-zA-Z])", r"\1'\2"),
    ("([a-zA-Z])\u2019([a-zA-Z])", r"\1'\2"), ("\u2018", "'"), ("\u201a", "'"),
    ("\u2019", "'"), (r"''", '"'), ("\u00b4\u00b4", '"'), ("\u2026", "..."),
    # French guillemets.
    (f"{NBSP}\u00ab{NBSP}", '"'), (f"\u00ab{NBSP}", '"'), ("\u00ab", '"'),
    (f"{NBSP}\u00bb{NBSP}", '"'), (f"{NBSP}\u00bb", '"'), ("\u00bb", '"'),
    # Non-breaking spaces before punctuation and units.
    (f"{NBSP}%", "%"), (f"n\u00ba{NBSP}", "n\u00ba "), (f"{NBSP}:", ":"),
    (f"{NBSP}\u00baC", " \u00baC"), (f"{NBSP}cm", " cm"), (f"{NBSP}\\?", "?"),
    (f"{NBSP}\\!", "!"), (f"{NBSP};", ";"), (f",{NBSP}", ", "), (r" +", " "),
]
_QUOTE_COMMA = {
    "en": [(r'"([,.]+)', r'\1"')],
    **{lang: [(r',"', '",'), (r'(\.+)"(\s*[^<])', r'"\1\2')] for lang in ("de", "es", "fr")},
}
_DECIMAL_COMMA = ("de", "es", "cz", "cs", "fr")


def rules(language: str) -> List[Tuple[str, str]]:
    """The (RE2 pattern, rewrite) pairs that normalize text of `language` (a two-letter
    code; an unknown one takes the rules every language has), in order."""
    separator = "," if language in _DECIMAL_COMMA else "."
    return (_COMMON + _QUOTE_COMMA.get(language, [])
            + [(f"(\\p{{Nd}}){NBSP}(\\p{{Nd}})", f"\\1{separator}\\2")])


def normalize(strings, language: str) -> tf.Tensor:
    """tf.string [...] -> tf.string [...]: each text with Moses' punctuation rules for
    `language`, stripped.

    Example:

    >>> import tensorflow as tf
    >>> text = tf.constant(["\u201eGut\u201c , sagte er \u2013 (und ging) ."])
    >>> normalize(text, "de").numpy()[0].decode()
    '"Gut", sagte er - (und ging).'
    """
    for pattern, rewrite in rules(language):
        strings = tf.strings.regex_replace(strings, pattern, rewrite)
    return tf.strings.regex_replace(strings, f"^[{_SPACE}]+|[{_SPACE}]+$", "")
