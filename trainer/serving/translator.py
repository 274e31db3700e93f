"""Text in, text out: tokenizer -> model -> beam search -> detokenizer, in TF graph ops only.

The same `Translator` computes validation BLEU during training and is what the export
saves, so training-time BLEU and the served model translate identically. Its tf.functions
are the SavedModel's signatures (trainer/serving/saved_model.py):

  translate      tf.string [batch] -> translations tf.string [batch], scores float32 [batch]
  translate_ids  int32 [batch, src_len] -> ids int32 [batch, width], lengths, scores
  nbest          tf.string [batch] -> translations tf.string [batch, beam], scores, log_probs
  translate_with_options
                 inputs, target_prefix tf.string [batch]; beam_size, alpha, max_extra_length,
                 num_hypotheses scalars -> translations tf.string [batch, num_hypotheses],
                 scores, log_probs
  sample         inputs, target_prefix tf.string [batch]; num_hypotheses, max_extra_length,
                 temperature, top_k, top_p, seed scalars -> as translate_with_options
  score          (tf.string [batch], tf.string [batch]) -> log_probs, scores, lengths
  attention      tf.string [batch] -> pieces and attention weights (paper section 3.2, 4)

(translate_with_options and sample are in trainer/serving/options.py.)

Every one of them gives one result per input whatever the input (only `score` rejects a
call whose inputs and targets differ in number, and the options signatures options out of
their range): empty or whitespace-only text translates to "", text longer than the model's
positions is truncated, invalid UTF-8 is replaced by U+FFFD, and outputs have at most
config.max_length - 1 tokens.
"""

import tensorflow as tf

from keras_transformer import (DecodeConfig, Transformer, beam_search, length_penalty,
                               sequence_log_probs, shift_right)
from keras_transformer.special_ids import EOS_ID, PAD_ID, UNK_ID
from trainer.data import punctuation
from trainer.data.tokenizer import Tokenizers
from trainer.serving.options import OptionSignatures

_NEG_INF = float("-inf")


class Translator(OptionSignatures, tf.Module):
    """A trained model with its tokenizers and decoding settings.

    Args:
      model: the Transformer.
      tokenizers: its source and target tokenizers.
      decode: the search: the fixed signatures' beam size, alpha and extra length, and
        the largest beam (and number of samples) a client may ask of
        translate_with_options and sample.
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
                 step_weights=None, shortlist=None):
        super().__init__(name="translator")
        self.model = model
        self.step_weights = step_weights
        self.shortlist = shortlist
        self.source_tokenizer = tokenizers.source
        self.target_tokenizer = tokenizers.target
        self.normalize_punctuation = tokenizers.normalize_punctuation
        self.decode = decode
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
        eos = tf.fill(tf.stack([pieces.nrows(), 1]), EOS_ID)
        ids = tf.concat([pieces, tf.RaggedTensor.from_tensor(eos)], axis=1)
        ids = tf.cast(ids.to_tensor(default_value=PAD_ID), tf.int32)
        # An input with no pieces (empty, whitespace) gets no EOS either: nothing to translate.
        return ids * tf.cast(pieces.row_lengths() > 0, tf.int32)[:, None]

    def target_ids(self, targets):
        """tf.string [batch] -> int32 [batch, tgt_len]: pieces + EOS, 0-padded, truncated to
        the longest output the model can produce (config.max_length - 1: BOS takes a
        position); the empty string is the output [EOS]."""
        pieces = self._target_pieces(targets)
        eos = tf.fill(tf.stack([pieces.nrows(), 1]), EOS_ID)
        ids = tf.concat([pieces, tf.RaggedTensor.from_tensor(eos)], axis=1)
        return tf.cast(ids.to_tensor(default_value=PAD_ID), tf.int32)

    def prefix_ids(self, target_prefix):
        """tf.string [batch] -> int32 [batch, prefix_len]: the pieces an output must start
        with, 0-padded (no EOS: the output goes on); "" is no prefix."""
        return tf.cast(self._target_pieces(target_prefix).to_tensor(default_value=PAD_ID),
                       tf.int32)

    def _target_pieces(self, texts):
        """Target-side pieces of tf.string [batch], ragged, at most config.max_length - 2
        (room for BOS and EOS)."""
        pieces = self.target_tokenizer.tokenize(_valid_utf8(texts))
        return pieces[:, :self.model.config.max_length - 2]

    def search(self, source_ids, num_hypotheses=1):
        """Beam search with `decode`'s settings, whose first num_hypotheses outputs are
        exact (1: the signatures that return only the best translation stop as soon as
        it is certain)."""
        return beam_search(self.model, source_ids, beam_size=self.decode.beam_size,
                           alpha=self.decode.alpha, extra_length=self.decode.max_extra_length,
                           use_cache=self.use_cache, num_hypotheses=num_hypotheses,
                           step_weights=self.step_weights, shortlist=self.shortlist,
                           length_penalty=self.decode.length_penalty,
                           max_length=self.decode.max_length, stopping=self.decode.stopping)

    @tf.function(input_signature=[tf.TensorSpec([None], tf.string)])
    def translate(self, inputs):
        """tf.string [batch] -> {"translations": tf.string [batch], "scores": float32 [batch]};
        scores are the best hypothesis' log-probability / length penalty, 0 for an empty
        input (translated to the empty string)."""
        source_ids = self.source_ids(inputs)
        return self.best(source_ids, self.search(source_ids))

    def best(self, source_ids, result):
        """translate's outputs from a search's DecodeResult: {"translations": tf.string
        [batch], "scores": float32 [batch]}, "" and 0 for empty inputs."""
        has_input = tf.reduce_any(source_ids != PAD_ID, axis=1)
        translations = self.target_tokenizer.detokenize(result.ids[:, 0])
        return {"translations": tf.where(has_input, translations, ""),
                "scores": tf.where(has_input, result.scores[:, 0], 0.0)}

    @tf.function(input_signature=[tf.TensorSpec([None, None], tf.int32)])
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
        has_input = tf.reduce_any(source_ids != PAD_ID, axis=1)
        return {"ids": tf.where(has_input[:, None], result.ids[:, 0], PAD_ID),
                "lengths": tf.where(has_input, result.lengths[:, 0], 0),
                "scores": tf.where(has_input, result.scores[:, 0], 0.0)}

    @tf.function(input_signature=[tf.TensorSpec([None], tf.string)])
    def nbest(self, inputs):
        """The beam's hypotheses, best first: k = beam_size candidates per input.

        tf.string [batch] -> {"translations": tf.string [batch, beam], "scores": float32
        [batch, beam] (log-prob / length penalty, decreasing), "log_probs": float32
        [batch, beam] (natural log P(translation | input), what reranking combines)}.
        An empty input gives k empty translations scoring 0.
        """
        source_ids = self.source_ids(inputs)
        result = self.search(source_ids, num_hypotheses=self.decode.beam_size)
        return self._hypotheses(source_ids, result, self.decode.beam_size)

    def _hypotheses(self, source_ids, result, k):
        """The first k hypotheses of a DecodeResult as texts: {"translations": tf.string
        [batch, k], "scores", "log_probs": float32 [batch, k]}, "" and 0 for empty inputs."""
        ids = result.ids[:, :k]
        batch, width = tf.shape(ids)[0], tf.shape(ids)[2]
        flat_ids = tf.reshape(ids, tf.stack([batch * k, width]))
        translations = tf.reshape(self.target_tokenizer.detokenize(flat_ids),
                                  tf.stack([batch, k]))
        has_input = tf.reduce_any(source_ids != PAD_ID, axis=1)[:, None]  # [batch, 1]
        return {"translations": tf.where(has_input, translations, ""),
                "scores": tf.where(has_input, result.scores[:, :k], 0.0),
                "log_probs": tf.where(has_input, result.log_probs[:, :k], 0.0)}

    @tf.function(input_signature=[tf.TensorSpec([None], tf.string),
                                  tf.TensorSpec([None], tf.string)])
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
        empty_target = lengths == 1
        log_probs = tf.where(has_input, log_probs, tf.where(empty_target, 0.0, _NEG_INF))
        return {"log_probs": log_probs,
                "scores": log_probs / length_penalty(lengths, self.decode.alpha,
                                                     self.decode.length_penalty),
                "lengths": lengths}

    @tf.function(input_signature=[tf.TensorSpec([None], tf.string)])
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
        result = self.search(source_ids)
        has_input = tf.reduce_any(source_ids != PAD_ID, axis=1)
        output_lengths = tf.where(has_input, result.lengths[:, 0], 0)
        output_ids = result.ids[:, 0, :tf.reduce_max(tf.concat([output_lengths, [0]], 0))]
        output_ids = tf.where(has_input[:, None], output_ids, PAD_ID)  # [batch, tgt_len]
        encoder_output, encoder_weights = self.model.encode(
            source_ids, training=False, return_attention_scores=True)
        # Teacher forcing on the output reproduces the attention of every decoding step.
        _, cross_weights = self.model.decode(shift_right(output_ids), encoder_output,
                                             source_ids, training=False,
                                             return_attention_scores=True)
        translations = self.target_tokenizer.detokenize(output_ids)
        return {"translations": tf.where(has_input, translations, ""),
                "source_pieces": self.source_tokenizer.id_to_piece(source_ids),
                "source_lengths": tf.reduce_sum(tf.cast(source_ids != PAD_ID, tf.int32), 1),
                "output_pieces": self.target_tokenizer.id_to_piece(output_ids),
                "output_lengths": output_lengths,
                "encoder_self_attention": tf.stack(encoder_weights, axis=1),
                "encoder_decoder_attention": tf.stack(cross_weights, axis=1)}


def _valid_utf8(strings):
    """tf.string [batch] with invalid UTF-8 sequences replaced by U+FFFD."""
    return tf.strings.unicode_transcode(strings, "UTF-8", "UTF-8", errors="replace")
