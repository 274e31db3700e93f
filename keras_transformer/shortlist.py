"""A vocabulary shortlist for beam search: each batch ranks only the target pieces its
sources make likely, so each step's pre-softmax projection reads a few thousand rows of
the [vocab_size, d_model] matrix instead of all of them (CTranslate2's vocabulary map,
Marian's lexical shortlist; no aligner: co-occurrence in a parallel corpus).

A shortlist holds the K most frequent target pieces and, for each source piece, the M
target pieces that co-occur with it most in the corpus (in the same sentence pair,
counted once per pair), the frequent K left out. A batch's candidates are the union of
the frequent K, its source pieces' lists, its target prefix's pieces and the special ids
PAD, UNK, BOS and EOS (ids 0-3). Sorted, they start with those four, so that in the
search's *candidate space* (the index of a candidate in the batch's list) the special ids
keep their own values and the search runs unchanged: `beam_search(..., shortlist=)`
maps the prefix in and the outputs back, and the step embeds a candidate's piece
(keras_transformer.step.TransformerStep's `vocabulary`).

The softmax normalizes over the candidates, as CTranslate2's and Marian's do, so an
output's score is its log-probability among them.
"""

from typing import NamedTuple

import numpy as np
import tensorflow as tf

from keras_transformer.special_ids import EOS_ID

# The special ids, 0-3 (PAD, UNK, BOS, EOS): always candidates.
SPECIAL_IDS = 4


class Shortlist(NamedTuple):
    """frequent: int32 [K], the most frequent target pieces; by_source: int32
    [source_vocab, M], each source piece's most co-occurring target pieces (rows padded
    with EOS, which is always a candidate); target_vocab: the target vocabulary's size
    (a Python int)."""

    frequent: tf.Tensor
    by_source: tf.Tensor
    target_vocab: int

    @classmethod
    def from_corpus(cls, sources, targets, source_vocab, target_vocab, frequent=100,
                    per_source=20):
        """The shortlist of a tokenized parallel corpus.

        Args:
          sources, targets: sequences of int sequences, the aligned pairs' piece ids.
          source_vocab, target_vocab: the vocabularies' sizes.
          frequent: K; per_source: M.
        Returns: a Shortlist of numpy arrays (tf.constant or tf.Variable them to serve).

        Example:

        >>> shortlist = Shortlist.from_corpus([[4, 5], [4, 6]], [[7, 8], [7, 9]],
        ...                                   source_vocab=8, target_vocab=10,
        ...                                   frequent=1, per_source=2)
        >>> shortlist.frequent.tolist(), shortlist.by_source[4:7].tolist()
        ([7], [[8, 9], [8, 3], [9, 3]])
        """
        counts = np.zeros(target_vocab, np.int64)
        for target in targets:
            np.add.at(counts, np.asarray(target, np.int64), 1)
        counts[:SPECIAL_IDS] = -1
        # Most frequent first, ties by lower id; only pieces the corpus holds.
        order = np.lexsort((np.arange(target_vocab), -counts))
        top = order[:frequent]
        top = np.sort(top[counts[top] > 0]).astype(np.int32)
        always = np.zeros(target_vocab, bool)
        always[:SPECIAL_IDS] = True
        always[top] = True
        codes, pair_counts = _cooccurrences(sources, targets, target_vocab, always)
        source, target = codes // target_vocab, codes % target_vocab
        # Within each source piece: most co-occurring first, ties by lower target id.
        order = np.lexsort((target, -pair_counts, source))
        source, target = source[order], target[order]
        starts = np.searchsorted(source, source, side="left")
        rank = np.arange(len(source)) - starts
        keep = rank < per_source
        by_source = np.full((source_vocab, per_source), EOS_ID, np.int32)
        by_source[source[keep], rank[keep]] = target[keep]
        return cls(top, by_source, target_vocab)

    def candidates(self, source_ids, target_prefix=None):
        """The batch's candidates, sorted: int32 [C], the special ids 0-3 first.

        source_ids: int [batch, src_len], 0-padded; target_prefix: None or int
        [batch, prefix_len], 0-padded (its pieces are candidates too)."""
        source_ids = tf.cast(source_ids, tf.int32)
        listed = tf.gather(self.by_source, tf.reshape(source_ids, [-1]))  # pads' rows: EOS
        ids = [tf.range(SPECIAL_IDS), self.frequent, tf.reshape(listed, [-1])]
        if target_prefix is not None:
            ids.append(tf.reshape(tf.cast(target_prefix, tf.int32), [-1]))
        ids = tf.concat(ids, 0)
        present = tf.scatter_nd(ids[:, None], tf.ones_like(ids), [self.target_vocab]) > 0
        return tf.cast(tf.where(present)[:, 0], tf.int32)


def to_candidates(ids, candidates):
    """ids int [...] of pieces that are all candidates (or PAD) -> their int32 indices
    in the sorted candidates int32 [C]."""
    ids = tf.cast(ids, tf.int32)
    flat = tf.reshape(ids, [1, -1])
    index = tf.searchsorted(candidates[None, :], flat, out_type=tf.int32)
    return tf.reshape(index, tf.shape(ids))


def from_candidates(indices, candidates):
    """Candidate indices int32 [...] -> the pieces they stand for (0 stays PAD)."""
    return tf.gather(candidates, indices)


def _cooccurrences(sources, targets, target_vocab, skip):
    """(codes int64 [pairs], counts int64 [pairs]): each (source piece s, target piece t)
    that occurs in a sentence pair, as s * target_vocab + t, with the number of pairs it
    occurs in; target pieces where `skip` bool [target_vocab] is True left out."""
    merged_codes, merged_counts = np.zeros(0, np.int64), np.zeros(0, np.int64)
    pending, size = [], 0

    def merge(codes, counts):
        codes, inverse = np.unique(codes, return_inverse=True)
        return codes, np.bincount(inverse, weights=counts).astype(np.int64)

    for source, target in zip(sources, targets):
        s = np.unique(np.asarray(source, np.int64))
        s = s[s >= SPECIAL_IDS]
        t = np.unique(np.asarray(target, np.int64))
        t = t[~skip[t]]
        if s.size and t.size:
            pending.append((s[:, None] * target_vocab + t[None, :]).ravel())
            size += pending[-1].size
        if size > 5_000_000:  # merge in chunks: memory stays bounded by the distinct pairs
            merged_codes, merged_counts = merge(
                np.concatenate([merged_codes, *pending]),
                np.concatenate([merged_counts, np.ones(size, np.int64)]))
            pending, size = [], 0
    return merge(np.concatenate([merged_codes, *pending]),
                 np.concatenate([merged_counts, np.ones(size, np.int64)]))
