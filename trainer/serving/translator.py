"""Text in, text out: tokenizer -> model -> beam search -> detokenizer, in TF graph ops only.

The same `Translator` computes validation BLEU during training and is what the export
saves, so training-time BLEU and the served model translate identically. Its tf.functions
are the SavedModel's signatures (trainer/serving/saved_model.py):

  translate      tf.string [batch] -> translations tf.string [batch], scores float32 [batch]
  translate_ids  int32 [batch, src_len] -> ids int32 [batch, width], lengths, scores
  nbest          tf.string [batch] -> translations tf.string [batch, beam], scores, log_probs
  translate_with_options
                 inputs, target_prefix tf.string [batch]; the beam search's request
                 options (trainer/serving/options.py), each a scalar or [batch] ->
                 translations tf.string [batch, num_hypotheses], scores, log_probs, error
  sample         inputs, target_prefix tf.string [batch]; sampling's request options ->
                 as translate_with_options
  score          (tf.string [batch], tf.string [batch]) -> log_probs, scores, lengths
  attention      tf.string [batch] -> pieces and attention weights (paper section 3.2, 4)

(translate_with_options and sample are in trainer/serving/options.py.)

Every one of them gives one result per input whatever the input (only `score` rejects a
call whose inputs and targets differ in number; the options signatures answer a row whose
options are out of range with its `error`): empty or whitespace-only text translates to "", text longer than the model's
positions is truncated, invalid UTF-8 is replaced by U+FFFD, and outputs have at most
config.max_length - 1 tokens.
"""

import dataclasses

import tensorflow as tf

from keras_transformer import (DecodeConfig, Transformer, TransformerStep, beam_search,
                               length_penalty, sequence_log_probs, shift_right)
from keras_transformer.special_ids import EOS_ID, PAD_ID, UNK_ID
from trainer.data import punctuation
from trainer.data.tokenizer import Tokenizers
from trainer.serving.limits import ServingLimits
from trainer.serving.options import OptionSignatures

_NEG_INF = float("-inf")


class Translator(OptionSignatures, tf.Module):
    """A trained model with its tokenizers and decoding settings.

    Args:
      model: the Transformer.
      tokenizers: its source and target tokenizers.
      decode: the search: the fixed signatures' settings, and the defaults of
        translate_with_options' and sample's rows out of range.
      limits: what a request may ask of translate_with_options and sample
        (trainer.serving.limits.ServingLimits).
      use_cache: incremental decoding with the key/value cache (False recomputes the
        whole prefix every step; for benchmarks).
      step_weights: what every search's steps read, made once (int8:
        keras_transformer.quantization.quantize_step_weights, as tf.Variables the export
        saves); None reads the model's at each search.
      shortlist: None, or a keras_transformer.shortlist.Shortlist every beam search ranks
        its batch's candidates of (sampling and `score` use the whole vocabulary).
    """

    def __init__(self, model: Transformer, tokenizers: Tokenizers,
                 decode: DecodeConfig = DecodeConfig(), use_cache: bool = True,
                 step_weights=None, shortlist=None, limits: ServingLimits = ServingLimits()):
        super().__init__(name="translator")
        self.model = model
        self.step_weights = step_weights
        self.shortlist = shortlist
        self.source_tokenizer = tokenizers.source
        self.target_tokenizer = tokenizers.target
        self.normalize_punctuation = tokenizers.normalize_punctuation
        self.decode = decode
        self.limits = limits
        self.use_cache = use_cache

    def source_ids(self, inputs):
        """tf.string [batch] -> int32 [batch, src_len]: pieces + EOS, 0-padded, truncated so
        that the model's positions suffice; an empty input becomes an all-padding row.
        The model directory's punctuation normalization, if any, runs first."""
        inputs = _valid_utf8(inputs)
        if self.normalize_punctuation:
            inputs = punctuation.normalize(inputs, self.normalize_punctuation)
        pieces = self.source_tokenizer.tokenize(inputs)
        pieces = pieces[:, :self.model.config.max_length - 1]
        # An input with no pieces (empty, whitespace) gets no EOS either: nothing to translate.
        return _padded(pieces, eos=True) * tf.cast(pieces.row_lengths() > 0, tf.int32)[:, None]

    def target_ids(self, targets):
        """tf.string [batch] -> int32 [batch, tgt_len]: pieces + EOS, 0-padded, truncated to
        the longest output the model can produce (config.max_length - 1: BOS takes a
        position); the empty string is the output [EOS]."""
        return _padded(self._target_pieces(targets), eos=True)

    def prefix_ids(self, target_prefix):
        """tf.string [batch] -> int32 [batch, prefix_len]: the pieces an output must start
        with, 0-padded (no EOS: the output goes on); "" is no prefix."""
        return _padded(self._target_pieces(target_prefix), eos=False)

    def _target_pieces(self, texts):
        """Target-side pieces of tf.string [batch], ragged, at most config.max_length - 2
        (room for BOS and EOS)."""
        pieces = self.target_tokenizer.tokenize(_valid_utf8(texts))
        return pieces[:, :self.model.config.max_length - 2]

    def step(self, source_ids, target_prefix=None, shortlist=True):
        """The model as a search's step over source_ids int32 [batch, src_len] (a
        TransformerStep with the export's weights and, unless shortlist=False, its
        shortlist), outputs starting with target_prefix int32 [batch, prefix_len]."""
        return TransformerStep(self.model, source_ids, target_prefix, self.use_cache,
                               weights=self.step_weights,
                               shortlist=self.shortlist if shortlist else None)

    def search(self, source_ids, decode=None, target_prefix=None):
        """Beam search with `decode`'s settings (default: the export's, with
        num_hypotheses 1: the signatures that return only the best translation stop as
        soon as it is certain)."""
        if decode is None:
            decode = dataclasses.replace(self.decode, num_hypotheses=1)
        return beam_search(self.step(source_ids, target_prefix), decode)

    @tf.function(input_signature=[tf.TensorSpec([None], tf.string)], autograph=False)
    def translate(self, inputs):
        """tf.string [batch] -> {"translations": tf.string [batch], "scores": float32 [batch]};
        scores are the best hypothesis' log-probability / length penalty, 0 for an empty
        input (translated to the empty string)."""
        source_ids = self.source_ids(inputs)
        return self.best(source_ids, self.search(source_ids))

    def best(self, source_ids, result):
        """translate's outputs from a search's DecodeResult: {"translations": tf.string
        [batch], "scores": float32 [batch]}, "" and 0 for empty inputs."""
        return for_inputs(source_ids, {
            "translations": self.target_tokenizer.detokenize(result.ids[:, 0]),
            "scores": result.scores[:, 0]})

    @tf.function(input_signature=[tf.TensorSpec([None, None], tf.int32)], autograph=False)
    def translate_ids(self, source_ids):
        """Beam search on token ids, for clients that tokenize themselves.

        source_ids: int32 [batch, src_len], the model's input form: source pieces then
          EOS (3), 0-padded. Ids outside the vocabulary become UNK (1); columns past
          config.max_length are dropped.
        Returns {"ids": int32 [batch, width] the best hypothesis, ending with EOS then 0
          padding, width <= config.max_length - 1; "lengths": int32 [batch] tokens with
          EOS; "scores": float32 [batch] as `translate`}. An all-padding row gives an
          all-padding output, length 0 and score 0.
        """
        config = self.model.config
        vocab = config.input_vocab_size
        source_ids = source_ids[:, :config.max_length]
        source_ids = tf.where((source_ids < 0) | (source_ids >= vocab), UNK_ID, source_ids)
        # Attention needs at least one key, even when every row is empty.
        source_ids = tf.pad(source_ids, [[0, 0], [0, tf.maximum(1 - tf.shape(source_ids)[1], 0)]])
        result = self.search(source_ids)
        return for_inputs(source_ids, {"ids": result.ids[:, 0], "lengths": result.lengths[:, 0],
                                       "scores": result.scores[:, 0]})

    @tf.function(input_signature=[tf.TensorSpec([None], tf.string)], autograph=False)
    def nbest(self, inputs):
        """The beam's hypotheses, best first: k = beam_size candidates per input.

        tf.string [batch] -> {"translations": tf.string [batch, beam], "scores": float32
        [batch, beam] (log-prob / length penalty, decreasing), "log_probs": float32
        [batch, beam] (natural log P(translation | input), what reranking combines)}.
        An empty input gives k empty translations scoring 0.
        """
        source_ids = self.source_ids(inputs)
        result = self.search(source_ids, dataclasses.replace(
            self.decode, num_hypotheses=self.decode.beam_size))
        return self._hypotheses(source_ids, result, self.decode.beam_size)

    def _hypotheses(self, source_ids, result, k):
        """The first k hypotheses of a DecodeResult as texts: {"translations": tf.string
        [batch, k], "scores", "log_probs": float32 [batch, k]}, "" and 0 for empty inputs."""
        ids = result.ids[:, :k]
        batch, width = tf.shape(ids)[0], tf.shape(ids)[2]
        flat_ids = tf.reshape(ids, tf.stack([batch * k, width]))
        translations = tf.reshape(self.target_tokenizer.detokenize(flat_ids),
                                  tf.stack([batch, k]))
        return for_inputs(source_ids, {"translations": translations,
                                       "scores": result.scores[:, :k],
                                       "log_probs": result.log_probs[:, :k]})

    @tf.function(input_signature=[tf.TensorSpec([None], tf.string),
                                  tf.TensorSpec([None], tf.string)], autograph=False)
    def score(self, inputs, targets):
        """How probable the model finds each given translation (reranking, quality
        estimation), under teacher forcing.

        inputs, targets: tf.string [batch], aligned.
        Returns {"log_probs": float32 [batch], natural log P(target | input) with EOS;
          "scores": float32 [batch], log_probs / length penalty, on the scale of
          `translate`'s scores; "lengths": int32 [batch], target tokens with EOS}.
        An empty input has only the empty translation: 0 for target "", -inf otherwise,
        as `translate` maps it to "" with score 0.
        """
        tf.debugging.assert_equal(tf.shape(inputs), tf.shape(targets),
                                  message="score: inputs and targets must have one target "
                                          "per input")
        source_ids = self.source_ids(inputs)
        target_ids = self.target_ids(targets)
        lengths = tf.reduce_sum(tf.cast(target_ids != PAD_ID, tf.int32), axis=1)
        log_probs = sequence_log_probs(self.model, source_ids, target_ids)
        has_input = tf.reduce_any(source_ids != PAD_ID, axis=1)
        log_probs = tf.where(has_input, log_probs, tf.where(lengths == 1, 0.0, _NEG_INF))
        return {"log_probs": log_probs,
                "scores": log_probs / length_penalty(lengths, self.decode.alpha,
                                                     self.decode.length_penalty),
                "lengths": lengths}

    @tf.function(input_signature=[tf.TensorSpec([None], tf.string)], autograph=False)
    def attention(self, inputs):
        """The attention weights behind each translation (section 4: "individual attention
        heads clearly learn to perform different tasks").

        tf.string [batch] -> {
          "translations": tf.string [batch], as `translate`;
          "source_pieces": tf.string [batch, src_len], the source's subwords and "</s>";
          "source_lengths": int32 [batch], valid entries of source_pieces (0: empty input);
          "output_pieces": tf.string [batch, tgt_len], the translation's subwords, "</s>";
          "output_lengths": int32 [batch];
          "encoder_self_attention": float32 [batch, layers, heads, src_len, src_len],
            row i: how source position i attends to every source position;
          "encoder_decoder_attention": float32 [batch, layers, heads, tgt_len, src_len],
            row t: the source attention while predicting output token t}.
        Entries past a row's lengths are padding.
        """
        source_ids = self.source_ids(inputs)
        best = self.translate_ids(source_ids)  # its rows of empty inputs: all PAD
        output_lengths = best["lengths"]
        output_ids = best["ids"][:, :tf.reduce_max(tf.concat([output_lengths, [0]], 0))]
        encoder_output, encoder_weights = self.model.encode(
            source_ids, training=False, return_attention_scores=True)
        # Teacher forcing on the output reproduces the attention of every decoding step.
        _, cross_weights = self.model.decode(shift_right(output_ids), encoder_output,
                                             source_ids, training=False,
                                             return_attention_scores=True)
        return {"translations": self.target_tokenizer.detokenize(output_ids),
                "source_pieces": self.source_tokenizer.id_to_piece(source_ids),
                "source_lengths": tf.reduce_sum(tf.cast(source_ids != PAD_ID, tf.int32), 1),
                "output_pieces": self.target_tokenizer.id_to_piece(output_ids),
                "output_lengths": output_lengths,
                "encoder_self_attention": tf.stack(encoder_weights, axis=1),
                "encoder_decoder_attention": tf.stack(cross_weights, axis=1)}


def _padded(pieces, eos):
    """int32 [batch, length] of ragged pieces int32 [batch, (pieces)], EOS after each row's
    when `eos`, then 0 padding."""
    if eos:
        eos_column = tf.fill(tf.stack([pieces.nrows(), 1]), EOS_ID)
        pieces = tf.concat([pieces, tf.RaggedTensor.from_tensor(eos_column)], axis=1)
    return tf.cast(pieces.to_tensor(default_value=PAD_ID), tf.int32)


def for_inputs(source_ids, outputs):
    """outputs (a dict of [batch, ...] tensors) with every row of an empty input (all
    padding: nothing to translate) at its empty value: "" for texts, 0 for numbers."""
    has_input = tf.reduce_any(source_ids != PAD_ID, axis=1)  # [batch]

    def emptied(t):
        has = tf.reshape(has_input, tf.concat([[-1], tf.ones([tf.rank(t) - 1], tf.int32)], 0))
        return tf.where(has, t, tf.zeros_like(t))

    return {name: emptied(t) for name, t in outputs.items()}


def _valid_utf8(strings):
    """tf.string [batch] with invalid UTF-8 sequences replaced by U+FFFD."""
    return tf.strings.unicode_transcode(strings, "UTF-8", "UTF-8", errors="replace")
