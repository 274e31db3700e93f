"""`trainer.export --shortlist=SRC,TGT`: a vocabulary shortlist made from a parallel
corpus at export time (keras_transformer.shortlist), stored in the SavedModel for its beam
searches, or written as CTranslate2's vocabulary map (vmap.txt, `use_vmap=True`).

The corpus is two line-aligned text files (gzipped when their names end in .gz), tokenized
with the model directory's own SentencePiece models. --shortlist_frequent (K) and
--shortlist_per_source (M) default to the values chosen on Multi30k's val
(bench/performance-notes.md, "A vocabulary shortlist").
"""

import dataclasses
import gzip
import sys
from typing import Optional, Tuple

# TensorFlow is imported by the functions that use it: trainer.export reads
# ShortlistChoice's defaults for its flags before it starts TensorFlow.

# Pairs tokenized per call; progress is written every this many pairs times 10.
_CHUNK = 5000


@dataclasses.dataclass(frozen=True)
class ShortlistChoice:
    """Whether and how an export shortlists the target vocabulary.

    Attributes:
      shortlist: "SRC,TGT", the parallel corpus's two text files (line-aligned), or ""
        for none (every search ranks the whole vocabulary).
      shortlist_frequent: K, the most frequent target pieces, always candidates.
      shortlist_per_source: M, the target pieces listed for each source piece.
    """

    shortlist: str = ""
    shortlist_frequent: int = 300
    shortlist_per_source: int = 50

    def __post_init__(self):
        if self.shortlist and len(self.shortlist.split(",")) != 2:
            raise ValueError(f"--shortlist takes two files, SRC,TGT; got {self.shortlist!r}")
        if self.shortlist_frequent < 0 or self.shortlist_per_source < 1:
            raise ValueError("--shortlist_frequent must be >= 0 and --shortlist_per_source "
                             f">= 1, got {self.shortlist_frequent} and "
                             f"{self.shortlist_per_source}")

    @property
    def paths(self) -> Optional[Tuple[str, str]]:
        """(SRC, TGT), or None without a shortlist."""
        return tuple(self.shortlist.split(",")) if self.shortlist else None

    def build(self, tokenizers, source_vocab: int, target_vocab: int):
        """The keras_transformer.shortlist.Shortlist of the corpus (numpy arrays), tokenized
        by `tokenizers` (trainer.data.tokenizer.Tokenizers), or None without one.

        Raises FileNotFoundError for a missing file, ValueError for files whose line
        counts differ."""
        if not self.paths:
            return None
        from keras_transformer.shortlist import Shortlist
        sources, targets = read_pairs(*self.paths, tokenizers)
        return Shortlist.from_corpus(sources, targets, source_vocab, target_vocab,
                                     self.shortlist_frequent, self.shortlist_per_source)

    def describe(self) -> dict:
        """What export.json records of it."""
        return {"corpus": list(self.paths), "frequent": self.shortlist_frequent,
                "per_source": self.shortlist_per_source}


def read_pairs(source_path: str, target_path: str, tokenizers):
    """(source piece ids, target piece ids): lists of id lists of the files' lines,
    tokenized by the model's tokenizers, with progress on stderr."""
    import tensorflow as tf
    texts = []
    for path in (source_path, target_path):
        if not tf.io.gfile.exists(path):
            raise FileNotFoundError(f"--shortlist: no file {path}")
        with tf.io.gfile.GFile(path, "rb") as f:
            data = f.read()
        if path.endswith(".gz"):
            data = gzip.decompress(data)
        texts.append(data.decode("utf-8", errors="replace").splitlines())
    if len(texts[0]) != len(texts[1]):
        raise ValueError(f"--shortlist: {source_path} has {len(texts[0])} lines and "
                         f"{target_path} {len(texts[1])}; the files must be aligned")
    ids = ([], [])
    for start in range(0, len(texts[0]), _CHUNK):
        for out, lines, tokenizer in zip(ids, texts, (tokenizers.source, tokenizers.target)):
            out.extend(tokenizer.tokenize(tf.constant(lines[start:start + _CHUNK])).to_list())
        done = min(start + _CHUNK, len(texts[0]))
        if done % (10 * _CHUNK) == 0 or done == len(texts[0]):
            print(f"shortlist: tokenized {done}/{len(texts[0])} pairs", file=sys.stderr)
    return ids


def write_vmap(shortlist, tokenizers, path: str):
    """A keras_transformer.shortlist.Shortlist as CTranslate2's vocabulary map: a line
    "<source piece>\\t<target pieces>" per source piece with a list, and the frequent
    pieces under the empty key (always candidates). CTranslate2 adds UNK, BOS and EOS
    itself."""
    import tensorflow as tf
    from keras_transformer.shortlist import SPECIAL_IDS
    source_pieces = tokenizers.source.id_to_piece(
        tf.range(shortlist.by_source.shape[0])).numpy()
    target_pieces = tokenizers.target.id_to_piece(tf.range(shortlist.target_vocab)).numpy()

    def pieces(ids):
        return " ".join(target_pieces[i].decode() for i in ids)

    lines = ["\t" + pieces(shortlist.frequent)]
    for source, listed in enumerate(shortlist.by_source):
        listed = [t for t in listed.tolist() if t >= SPECIAL_IDS]  # EOS pads the rows
        if listed and source >= SPECIAL_IDS:
            lines.append(f"{source_pieces[source].decode()}\t{pieces(listed)}")
    with tf.io.gfile.GFile(path, "w") as f:
        f.write("\n".join(lines) + "\n")
