"""The Transformer encoder-decoder as a keras.Model (paper section 3, Figure 1)."""

import keras
from keras import ops
import tensorflow as tf

from keras_transformer.attention import key_value_weights
from keras_transformer.config import TransformerConfig
from keras_transformer.decoder import Decoder
from keras_transformer.dropout import Dropout
from keras_transformer.embedding import SharedEmbedding
from keras_transformer.encoder import Encoder
from keras_transformer.masking import causal_mask, padding_mask
from keras_transformer.packing import Packing
from keras_transformer.positional import PositionalEncoding
from keras_transformer.residual import Residual
from keras_transformer.special_ids import BOS_ID, PAD_ID


def shift_right(target_ids):
    """The decoder's input for a target: "the output embeddings are offset by one
    position" (section 3.1), BOS first.

    Args:
      target_ids: int [batch, length], each row the target's pieces, then EOS, then
        PAD_ID padding.
    Returns:
      int [batch, length]: BOS, then target_ids without its last position; PAD_ID where
      target_ids is padded, so the EOS is never an input.

    Example:

    >>> from keras_transformer import shift_right
    >>> target_ids = keras.ops.convert_to_tensor([[7, 8, 3, 0], [9, 3, 0, 0]])
    >>> keras.ops.convert_to_numpy(shift_right(target_ids)).tolist()
    [[2, 7, 8, 0], [2, 9, 0, 0]]
    """
    bos = ops.full_like(target_ids[:, :1], BOS_ID)
    shifted = ops.concatenate([bos, target_ids[:, :-1]], axis=1)
    return ops.where(target_ids == PAD_ID, ops.zeros_like(shifted), shifted)


@tf.autograph.experimental.do_not_convert
def sequence_log_probs(model, source_ids, target_ids):
    """log P(target | source) under teacher forcing: the sum of the log-softmax of each
    target token given BOS and the tokens before it.

    Args:
      model: a Transformer.
      source_ids: int [batch, src_len], 0-padded.
      target_ids: int [batch, tgt_len], the target without BOS, ending with EOS,
        then 0 padding (padding contributes nothing).
    Returns:
      float32 [batch], natural-log probabilities (divide by `length_penalty` of the
      non-pad length for a search's score).
    """
    source_ids = tf.cast(source_ids, tf.int32)
    target_ids = tf.cast(target_ids, tf.int32)
    encoder_output = model.encode(source_ids, training=False)
    logits = model.decode(shift_right(target_ids), encoder_output, source_ids, training=False)
    log_probs = tf.nn.log_softmax(logits, axis=-1)  # [batch, tgt_len, vocab]
    token_log_probs = tf.gather(log_probs, target_ids, batch_dims=2)  # [batch, tgt_len]
    return tf.reduce_sum(tf.where(target_ids != PAD_ID, token_log_probs, 0.0), axis=1)


@keras.saving.register_keras_serializable(package="keras_transformer")
class Transformer(keras.Model):
    """The Transformer of "Attention Is All You Need" (Vaswani et al., 2017).

    Args:
      config: a TransformerConfig (or its dict form, as stored by get_config).
      **kwargs: keras.Model arguments, e.g. dtype="mixed_bfloat16".

    Call: (source_ids int [batch, src_len], target_input_ids int [batch, tgt_len]),
      pad id 0, target_input_ids = shift_right(target ids) -> float32 logits
      [batch, tgt_len, vocab].

    Example:

    >>> import keras
    >>> from keras_transformer import Transformer, TransformerConfig, shift_right
    >>> model = Transformer(TransformerConfig.tiny(vocab_size=100))
    >>> source_ids = keras.ops.convert_to_tensor([[5, 6, 7, 3]])  # pieces, EOS
    >>> target_ids = keras.ops.convert_to_tensor([[8, 9, 3]])
    >>> tuple(model((source_ids, shift_right(target_ids)), training=True).shape)
    (1, 3, 100)

    `packed_logits` is `call` without computing at padding, for training. `encode`,
    `decode`, `initial_cache`, `step_weights` and `decode_step` are the pieces that
    decoding (keras_transformer.decoding) reuses.
    """

    def __init__(self, config, **kwargs):
        super().__init__(**kwargs)
        if isinstance(config, dict):
            config = TransformerConfig.from_dict(config)
        self.config = config
        policy = dict(dtype=self.dtype_policy)
        stack = dict(d_model=config.d_model,
                     num_heads=config.num_heads, d_ff=config.d_ff, key_dim=config.key_dim,
                     value_dim=config.value_dim, dropout=config.dropout,
                     attention_dropout=config.attention_dropout, pre_norm=config.pre_norm,
                     activation=config.activation, epsilon=config.layer_norm_epsilon)
        # The target embedding is always the pre-softmax matrix; the source shares it
        # unless share_embeddings is False.
        self.embedding = SharedEmbedding(config.vocab_size, config.d_model, config.output_bias,
                                         name="embedding", **policy)
        self.source_embedding = (None if config.share_embeddings else
                                 SharedEmbedding(config.input_vocab_size, config.d_model,
                                                 name="source_embedding", **policy))
        positional = dict(d_model=config.d_model, max_length=config.max_length,
                          kind=config.positional, layout=config.sinusoid_layout, **policy)
        self.source_positions = PositionalEncoding(name="source_positions", **positional)
        self.target_positions = PositionalEncoding(name="target_positions", **positional)
        self.source_dropout_layer = Dropout(config.dropout, **policy)
        self.target_dropout_layer = Dropout(config.dropout, **policy)
        self.encoder = Encoder(config.encoder_layers, name="encoder", **stack, **policy)
        self.decoder = Decoder(config.decoder_layers, name="decoder", **stack, **policy)

    def encode(self, source_ids, training=None, return_attention_scores=False, packing=None,
               weights=None):
        """source_ids int [batch, src_len] -> encoder output [batch, src_len, d_model]
        (plus N encoder self-attention weights with return_attention_scores=True); with
        `packing`, Packing(source_ids), the output is packed: [src_tokens, d_model].

        weights: None (the layers' own), or, in inference with `packing`, the "encoder"
        of `encoder_weights()` or int8 weights made from it: the residual stream is then
        float32 (Encoder.with_weights) and so is the output."""
        embedding = self.embedding if self.source_embedding is None else self.source_embedding
        ids = source_ids if packing is None else packing.pack(source_ids)
        x = self.source_positions(embedding(ids), packing=packing)
        if weights is not None:
            if packing is None:
                raise ValueError("an encoder of given weights runs on packed tokens")
            return self.encoder.with_weights(tf.cast(x, tf.float32), padding_mask(source_ids),
                                             weights, packing)
        x = self.source_dropout_layer(x, training=training)
        return self.encoder(x, padding_mask(source_ids), training=training,
                            return_attention_scores=return_attention_scores, packing=packing)

    def decode(self, target_input_ids, encoder_output, source_ids, training=None,
               return_attention_scores=False, packing=None, source_packing=None,
               project=True):
        """Teacher-forced decoding of a whole target prefix.

        Args:
          target_input_ids: int [batch, tgt_len], BOS followed by the target.
          encoder_output: [batch, src_len, d_model] from `encode` ([src_tokens, d_model]
            with `source_packing`).
          source_ids: int [batch, src_len], for the source padding mask.
          packing, source_packing: Packing(target_input_ids) and Packing(source_ids), or
            None: compute on the non-padding positions only (see `packed_logits`).
          project: False: return the decoder stack's output [..., d_model] (compute
            dtype), before the pre-softmax projection.
        Returns:
          float32 logits [batch, tgt_len, vocab] (with `packing`, [tgt_tokens, vocab])
          (plus N encoder-decoder attention weights with return_attention_scores=True).
        """
        ids = target_input_ids if packing is None else packing.pack(target_input_ids)
        x = self.target_positions(self.embedding(ids), packing=packing)
        x = self.target_dropout_layer(x, training=training)
        target_len = ops.shape(target_input_ids)[1]
        outputs = self.decoder(x, encoder_output, causal_mask(target_len),
                               padding_mask(source_ids), training=training,
                               return_attention_scores=return_attention_scores,
                               packing=packing, source_packing=source_packing)
        project = self.embedding.logits if project else (lambda x: x)
        if return_attention_scores:
            return project(outputs[0]), outputs[1]
        return project(outputs)

    def packed_logits(self, inputs, training=None, project=True):
        """`call` computed on the non-padding positions only: what training uses.

        Every layer but attention is position-wise, so on the tokens alone
        (keras_transformer.packing) nothing is computed at padding: the same logits as
        `call` at the non-padding target positions, in a fraction of the time when
        batches are padded.

        Args:
          inputs: (source_ids int [batch, src_len], target_input_ids int
            [batch, tgt_len]), as for `call`.
          project: False: the decoder's output [tgt_tokens, d_model] instead of the
            logits, for `projected_label_smoothed_cross_entropy` (the trainer's loss).
        Returns:
          (float32 logits [tgt_tokens, vocab], one row per non-padding position of
          target_input_ids in row-major order; the Packing of target_input_ids, whose
          `pack(target_ids)` are the matching labels).
        """
        source_ids, target_input_ids = inputs
        source, target = Packing(source_ids), Packing(target_input_ids)
        encoder_output = self.encode(source_ids, training=training, packing=source)
        return self.decode(target_input_ids, encoder_output, source_ids, training=training,
                           packing=target, source_packing=source, project=project), target

    def initial_cache(self, encoder_output, beam_size=1, width=0, source_packing=None,
                      key_value=None):
        """The decoding cache of `beam_size` rows per sentence, growing (width 0) or of
        `width` positions, from `encode`'s output (packed with its `source_packing`; see
        DecoderLayer.initial_cache); key_value: None, or the "key_value" of
        `encoder_weights()` (or int8 weights made from it)."""
        return self.decoder.initial_cache(encoder_output, beam_size, width, source_packing,
                                          key_value)

    def encoder_weights(self):
        """What `encode` and `initial_cache` read when given their weights, as tensors:
        {"encoder": Encoder.step_weights, "key_value": each decoder layer's fused
        encoder-decoder key and value projections}. A decoding step's weights carry them
        as "encoder" when the encoder runs on weights of the export's own (int8:
        keras_transformer.quantization.static_step_weights)."""
        return {"encoder": self.encoder.step_weights(),
                "key_value": [key_value_weights(layer.cross_attention)
                              for layer in self.decoder.layers]}

    def step_weights(self, length, elementwise=None):
        """What `decode_step` reads, read once per search rather than at every step:
        the embedding matrix, the position table PE[0:length] (length: the positions the
        search may decode, BOS included) and the decoder's fused projections; elementwise:
        how every step's attentions attend, decided once per search (None: at each step
        by its rows; True or False: for a search whose rows stay at most, or above,
        attention.ELEMENTWISE_MAX_ROWS)."""
        return {"embedding": self.embedding.step_weights(),
                "positions": self.target_positions.step_weights(length),
                "decoder": self.decoder.step_weights(elementwise)}

    def decode_step(self, target_ids, index, cache, cross_attention_mask, weights,
                    fixed_width=False):
        """One step of incremental decoding: `decode` in inference for one more position.

        Args:
          target_ids: int [batch * beams], the token at position `index` (BOS at 0) of
            each row, the beams of a sentence adjacent.
          index: scalar int, the position being decoded (the cache holds positions
            0 .. index - 1).
          cache: from `initial_cache(encoder_output, beams)` or the previous step.
          cross_attention_mask: bool [batch, 1, 1, src_len], `padding_mask(source_ids)`.
          weights: `step_weights(length)` with length > index.
          fixed_width: the cache is `initial_cache(..., width)` with width > index (its
            shapes never change: XLA), not a growing one.
        Returns:
          (float32 logits [batch * beams, vocab] for position index + 1, the new cache).
        """
        x = self.target_positions.step(
            self.embedding.step(target_ids, weights["embedding"]), index, weights["positions"])
        x, cache = self.decoder.step(x, cache, cross_attention_mask, weights["decoder"],
                                     index if fixed_width else None)  # [rows, d_model]
        with tf.name_scope("output_projection"):  # a profile's label (DecoderLayer.step)
            return self.embedding.step_logits(x, weights["embedding"]), cache

    def follow_dropout(self, rate: tf.Variable):
        """Makes every P_drop dropout (section 5.4: on each sublayer's output and on the
        embeddings' sums with the positional encodings; not attention_dropout) read its
        rate from `rate`, a float32 [] variable, at every call: a schedule of the rate
        without tracing the update again. Needs config.dropout > 0 (`Dropout.follow`)."""
        for layer in self._flatten_layers():
            if isinstance(layer, Residual):
                layer.dropout_layer.follow(rate)
        self.source_dropout_layer.follow(rate)
        self.target_dropout_layer.follow(rate)

    def call(self, inputs, training=None):
        source_ids, target_input_ids = inputs
        encoder_output = self.encode(source_ids, training=training)
        return self.decode(target_input_ids, encoder_output, source_ids, training=training)

    def build(self, input_shape=None):
        """Creates every weight by running the model once on a dummy pair."""
        if not self.built:
            dummy = ops.ones((1, 1), "int32")
            self.call((dummy, dummy), training=False)
        self.built = True

    def get_build_config(self):
        return {"built": True}

    def build_from_config(self, config):
        self.build()

    def get_config(self):
        return {**super().get_config(), "config": self.config.to_dict()}

    @classmethod
    def from_config(cls, config):
        return cls(**config)
