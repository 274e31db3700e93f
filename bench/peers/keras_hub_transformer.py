"""The paper's Transformer from keras-hub's layers: the model (`KerasHubTransformer`), its
training runner (`KerasHubTrainer`), our trained weights copied into it (`copy_weights`)
and keras-hub's beam search on it (`beam_sampler_search`)."""

import dataclasses
import math

import keras
import keras_hub
import numpy as np
import tensorflow as tf
from keras import ops

import keras_transformer
from keras_transformer import BOS_ID, EOS_ID, DecodeConfig
from keras_transformer.losses import label_smoothed_cross_entropy

from peers import Batch


class KerasHubTransformer(keras.Model):
    """The paper's encoder-decoder from keras-hub layers (post-norm, tied embeddings).

    Call: (source_ids, target_input_ids) int [batch, length] -> float32 logits
    [batch, tgt_len, vocab]. `encode`, `embed` and the layer lists serve decoding.
    attention_dropout: the rate on attention weights (None: keras-hub's, the `dropout`).
    """

    def __init__(self, config: keras_transformer.TransformerConfig, attention_dropout=None,
                 **kwargs):
        super().__init__(**kwargs)
        self.config = config
        policy = dict(dtype=self.dtype_policy)
        layer = dict(intermediate_dim=config.d_ff, num_heads=config.num_heads,
                     dropout=config.dropout, layer_norm_epsilon=1e-6, **policy)
        self.embedding = keras_hub.layers.ReversibleEmbedding(
            config.vocab_size, config.d_model, tie_weights=True,
            embeddings_initializer=keras.initializers.RandomNormal(stddev=config.d_model ** -0.5),
            name="embedding", **policy)
        self.positions = keras_hub.layers.SinePositionEncoding(**policy)
        self.source_dropout = keras.layers.Dropout(config.dropout, **policy)
        self.target_dropout = keras.layers.Dropout(config.dropout, **policy)
        self.encoder_layers = [keras_hub.layers.TransformerEncoder(name=f"encoder_{i}", **layer)
                               for i in range(config.num_layers)]
        self.decoder_layers = [keras_hub.layers.TransformerDecoder(name=f"decoder_{i}", **layer)
                               for i in range(config.num_layers)]
        dummy = keras.ops.ones((1, 2), "int32")  # one key: keras warns of a 1-wide softmax
        self((dummy, dummy))
        if attention_dropout is not None:
            # keras-hub's `dropout` also drops attention weights, which the paper does not;
            # Keras MHA reads the rate at call time.
            for block in self.encoder_layers + self.decoder_layers:
                for name in ("_self_attention_layer", "_cross_attention_layer"):
                    if getattr(block, name, None) is not None:
                        getattr(block, name)._dropout = attention_dropout

    def embed(self, ids, dropout, start_index=0, training=None):
        x = self.embedding(ids) * keras.ops.cast(math.sqrt(self.config.d_model), self.compute_dtype)
        return dropout(x + self.positions(x, start_index=start_index), training=training)

    def encode(self, source_ids, training=None):
        x = self.embed(source_ids, self.source_dropout, training=training)
        for block in self.encoder_layers:
            x = block(x, padding_mask=source_ids != 0, training=training)
        return x

    def logits(self, x):
        return keras.ops.cast(self.embedding(x, reverse=True), "float32")

    def call(self, inputs, training=None):
        source_ids, target_input_ids = inputs
        memory = self.encode(source_ids, training=training)
        y = self.embed(target_input_ids, self.target_dropout, training=training)
        for block in self.decoder_layers:
            y = block(y, memory, encoder_padding_mask=source_ids != 0, training=training)
        return self.logits(y)


# ---------------------------------------------------------------- training


class KerasHubTrainer:
    """KerasHubTransformer, one tf.function update: tape, summed smoothed loss / tokens, Adam;
    jit_compile: the update compiled by XLA (what Keras' own `fit` does by default)."""

    def __init__(self, config, precision, pool, schedule_warmup, attention_dropout,
                 jit_compile=False):
        self.name = "keras-hub, XLA" if jit_compile else "keras-hub"
        keras.utils.set_random_seed(0)
        self.config, self.pool, self.position = config, pool, 0
        self.model = KerasHubTransformer(config, attention_dropout, dtype=precision)
        self.params = self.model.count_params()
        self.optimizer = keras.optimizers.Adam(
            keras_transformer.WarmupSchedule(config.d_model, schedule_warmup),
            beta_1=0.9, beta_2=0.98, epsilon=1e-9)
        self.optimizer.build(self.model.trainable_variables)
        spec = tf.TensorSpec([None, None], tf.int32)
        jit = dict(jit_compile=jit_compile)
        self.step = tf.function(self._step, input_signature=[spec] * 3, **jit)
        self.gradients = tf.function(self._gradients, input_signature=[spec] * 3, **jit)
        self.apply = tf.function(self._apply, **jit)
        self.forward = tf.function(lambda s, t: self.model((s, t), training=True),
                                   input_signature=[spec] * 2, **jit)

    def _gradients(self, source_ids, target_input_ids, target_output_ids):
        with tf.GradientTape() as tape:
            logits = self.model((source_ids, target_input_ids), training=True)
            loss_sum, tokens = label_smoothed_cross_entropy(target_output_ids, logits,
                                                            self.config.label_smoothing)
            loss = loss_sum / tf.maximum(tokens, 1.0)
        return tape.gradient(loss, self.model.trainable_variables), loss

    def _apply(self, grads):
        self.optimizer.apply_gradients(zip(grads, self.model.trainable_variables))

    def _step(self, source_ids, target_input_ids, target_output_ids):
        grads, loss = self._gradients(source_ids, target_input_ids, target_output_ids)
        self._apply(grads)
        return loss

    def update(self) -> float:
        batch = self.pool[self.position % len(self.pool)]
        self.position += 1
        return float(self.step(*dataclasses.astuple(batch)))

    def pieces(self, batch: Batch):
        args = [tf.constant(x) for x in dataclasses.astuple(batch)]
        grads = self.gradients(*args)[0]
        return {
            "forward": lambda: self.forward(*args[:2]).numpy(),
            "forward + backward": lambda: [g.numpy() for g in self.gradients(*args)[0][:1]],
            "optimizer": lambda: (self.apply(grads), self.optimizer.iterations.numpy()),
            "update": lambda: self.step(*args).numpy(),
        }


# ---------------------------------------------------------------- decoding


def copy_weights(ours, peer: KerasHubTransformer):
    """Our Transformer's weights into the keras-hub model (same function, other layout)."""
    config = ours.config
    heads, d_k = config.num_heads, config.d_k

    def attention(source, target):
        for mine, theirs in ((source.query_dense, target._query_dense),
                             (source.key_dense, target._key_dense),
                             (source.value_dense, target._value_dense)):
            theirs.kernel.assign(np.reshape(mine.kernel.numpy(), (-1, heads, d_k)))
            theirs.bias.assign(np.reshape(mine.bias.numpy(), (heads, d_k)))
        target._output_dense.kernel.assign(
            np.reshape(source.output_dense.kernel.numpy(), (heads, d_k, -1)))
        target._output_dense.bias.assign(source.output_dense.bias.numpy())

    def norm(source, target):
        target.gamma.assign(source.layer_norm.gamma.numpy())
        target.beta.assign(source.layer_norm.beta.numpy())

    def feed_forward(layer, block):
        for mine, theirs in ((layer.feed_forward.inner, block._feedforward_intermediate_dense),
                             (layer.feed_forward.outer, block._feedforward_output_dense)):
            theirs.kernel.assign(mine.kernel.numpy())
            theirs.bias.assign(mine.bias.numpy())
        norm(layer.feed_forward_residual, block._feedforward_layer_norm)

    peer.embedding.embeddings.assign(ours.embedding.embeddings.numpy())
    for layer, block in zip(ours.encoder.layers, peer.encoder_layers):
        attention(layer.self_attention, block._self_attention_layer)
        norm(layer.self_attention_residual, block._self_attention_layer_norm)
        feed_forward(layer, block)
    for layer, block in zip(ours.decoder.layers, peer.decoder_layers):
        attention(layer.self_attention, block._self_attention_layer)
        norm(layer.self_attention_residual, block._self_attention_layer_norm)
        attention(layer.cross_attention, block._cross_attention_layer)
        norm(layer.cross_attention_residual, block._cross_attention_layer_norm)
        feed_forward(layer, block)


def _decoder_with_cache(model: KerasHubTransformer):
    """keras-hub's cached decoder call, as BartSeq2SeqLM.call_decoder_with_cache: caches
    [batch, layers, 2, length, heads, d_k], the cross-attention ones filled by a seeding
    call (cross_index 0) and reused after it (cross_index None)."""

    def call(memory, source_mask, token_ids, index, self_cache, cross_cache, cross_index):
        x = model.embed(token_ids, model.target_dropout, start_index=index, training=False)
        self_caches, cross_caches = [], []
        for i, block in enumerate(model.decoder_layers):
            x, next_self, next_cross = block(
                x, memory, encoder_padding_mask=source_mask,
                self_attention_cache=self_cache[:, i], self_attention_cache_update_index=index,
                cross_attention_cache=cross_cache[:, i],
                cross_attention_cache_update_index=cross_index, training=False)
            self_caches.append(next_self)
            cross_caches.append(next_cross)
        if cross_index is not None:
            cross_cache = ops.stack(cross_caches, axis=1)
        return model.logits(x), x, ops.stack(self_caches, axis=1), cross_cache

    return call


def beam_sampler_search(model: KerasHubTransformer, decode: DecodeConfig, jit_compile: bool):
    """keras_hub.samplers.BeamSampler driving keras-hub's cached decoder, the way
    BartSeq2SeqLM.generate_step does (seeded with BOS only), at decode.beam_size, outputs of
    at most (padded source width + decode.max_extra_length) tokens, capped at
    config.max_length - 1 (as our search). A tf.function source_ids int32 [batch, src_len]
    -> (ids int32 [batch, beam, width + 1] with BOS first, sorted by log-prob; log-probs
    [batch, beam]); jit_compile: XLA, keras-hub's default for generate() on TensorFlow."""
    config = model.config
    layers, heads, head_dim = config.num_layers, config.num_heads, config.d_k
    sampler = keras_hub.samplers.BeamSampler(num_beams=decode.beam_size, return_all_beams=True)
    call_decoder = _decoder_with_cache(model)

    @tf.function(input_signature=[tf.TensorSpec([None, None], tf.int32)],
                 jit_compile=jit_compile)
    def search(source_ids):
        batch, src_len = tf.shape(source_ids)[0], tf.shape(source_ids)[1]
        width = tf.minimum(src_len + decode.max_extra_length, config.max_length - 1)
        source_mask = source_ids != 0
        memory = model.encode(source_ids, training=False)
        prompt = tf.concat([tf.fill([batch, 1], BOS_ID), tf.zeros([batch, width], tf.int32)], 1)
        prompt_mask = tf.range(width + 1)[None, :] < tf.ones([batch, 1], tf.int32)
        self_cache = tf.zeros([batch, layers, 2, width + 1, heads, head_dim], memory.dtype)
        cross_cache = tf.zeros([batch, layers, 2, src_len, heads, head_dim], memory.dtype)
        _, hidden, self_cache, cross_cache = call_decoder(
            memory, source_mask, prompt[:, :1], 0, self_cache, cross_cache, 0)

        def next(prompt, cache, index):
            self_cache, memory, source_mask, cross_cache = cache
            cache_index = index - 1  # the previous token, as in BartSeq2SeqLM
            token = ops.slice(prompt, [0, cache_index], [ops.shape(prompt)[0], 1])
            logits, hidden, self_cache, _ = call_decoder(
                memory, source_mask, token, cache_index, self_cache, cross_cache, None)
            return logits[:, 0], hidden[:, 0], (self_cache, memory, source_mask, cross_cache)

        return sampler(next=next, prompt=prompt,
                       cache=(self_cache, memory, source_mask, cross_cache), index=1,
                       mask=prompt_mask, stop_token_ids=[EOS_ID], hidden_states=hidden[:, 0])

    return search
