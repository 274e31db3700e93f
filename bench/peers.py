"""The peers of bench/peers_training.py and bench/peers_decoding.py: the paper's Transformer
as keras-hub layers (`KerasHubTransformer`) and as torch.nn.Transformer (`TorchTransformer`),
each with the same architecture as ours (see peers_training.py's docstring for what is
matched), and the three training runners the benchmark takes turns with: `Ours`
(trainer.training.trainer.Trainer), `KerasHub` and `Torch`, each doing one update per call
on the pool's batches (`Batch`).

Needs torch and keras-hub, installed for the benchmarks only (peers_training.py's
docstring says how).
"""

import dataclasses
import math

import keras
import keras_hub
import numpy as np
import tensorflow as tf
import torch
import torch.nn.functional as F
from torch import nn

import keras_transformer
from keras_transformer.losses import label_smoothed_cross_entropy
from trainer.config import RunConfig
from trainer.training import distribute
from trainer.training.run import build_trainer

from machine import update_flops

# ---------------------------------------------------------------- data

@dataclasses.dataclass(frozen=True)
class Batch:
    source_ids: np.ndarray         # int32 [batch, length]
    target_input_ids: np.ndarray   # int32 [batch, length]
    target_output_ids: np.ndarray  # int32 [batch, length]

    @property
    def shape(self):
        return self.source_ids.shape

    @property
    def real_tokens(self) -> int:
        return int(np.count_nonzero(self.source_ids) + np.count_nonzero(self.target_output_ids))

    @property
    def padded_tokens(self) -> int:
        return self.source_ids.size + self.target_output_ids.size

    def flops(self, config) -> int:
        return update_flops(config, self.shape[0], self.shape[1], self.target_output_ids.shape[1],
                            np.count_nonzero(self.source_ids),
                            np.count_nonzero(self.target_output_ids))



# ---------------------------------------------------------------- ours


class Ours:
    """trainer.training.trainer.Trainer on the pool: one update = accumulate + apply, as in training."""

    name = "ours"

    def __init__(self, config, precision, data, schedule_warmup, model_dir):
        keras.utils.set_random_seed(0)
        run = RunConfig(model_dir=model_dir, train_steps=10 ** 6, precision=precision,
                        warmup_steps=schedule_warmup)
        self.trainer = build_trainer(config, data, run, distribute.make_strategy(0))
        self.trainer.restore()
        self.params = self.trainer.model.count_params()

    def update(self) -> float:
        self.trainer.accumulate(self.trainer.stream.next())
        return float(self.trainer.apply().loss)

    def pieces(self, batch: Batch):
        t = self.trainer
        source, target_in, target_out = (tf.constant(x) for x in dataclasses.astuple(batch))
        cached = iter(t.strategy.distribute_datasets_from_function(
            lambda _: tf.data.Dataset.from_tensors(((source, target_in), target_out)).repeat()))
        forward = tf.function(lambda s, t_in: t.model.packed_logits((s, t_in), training=True)[0])
        return {
            "forward": lambda: forward(source, target_in).numpy(),
            "forward + backward": lambda: [g.numpy() for g in t.gradients(
                source, target_in, target_out)[0][:1]],
            "optimizer": lambda: t.apply().loss.numpy(),
            "update": lambda: (t.accumulate(next(cached)), t.apply().loss.numpy()),
        }


# ---------------------------------------------------------------- keras-hub


class KerasHubTransformer(keras.Model):
    """The paper's encoder-decoder from keras-hub layers (post-norm, tied embeddings).

    Call: (source_ids, target_input_ids) int [batch, length] -> float32 logits
    [batch, tgt_len, vocab]. `encode`, `embed` and the layer lists serve decoding.
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


class KerasHub:
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


# ---------------------------------------------------------------- torch


def sinusoids(length: int, d_model: int) -> torch.Tensor:
    """The paper's PE [length, d_model]: sin in even columns, cos in odd ones."""
    positions = torch.arange(length, dtype=torch.float32)[:, None]
    angles = positions / torch.pow(10000.0, torch.arange(0, d_model, 2) / d_model)[None, :]
    return torch.stack([torch.sin(angles), torch.cos(angles)], dim=-1).reshape(length, d_model)


class TorchTransformer(nn.Module):
    """torch.nn.Transformer with a tied, sqrt(d)-scaled embedding and sinusoidal positions."""

    def __init__(self, config: keras_transformer.TransformerConfig, paper_dropout: bool):
        super().__init__()
        d = config.d_model
        self.d_model = d
        self.embedding = nn.Embedding(config.vocab_size, d)
        nn.init.normal_(self.embedding.weight, std=d ** -0.5)
        self.register_buffer("positions", sinusoids(config.max_length, d), persistent=False)
        self.dropout = nn.Dropout(config.dropout)
        self.transformer = nn.Transformer(
            d_model=d, nhead=config.num_heads, num_encoder_layers=config.num_layers,
            num_decoder_layers=config.num_layers, dim_feedforward=config.d_ff,
            dropout=config.dropout, batch_first=True, layer_norm_eps=1e-6)
        # The paper's post-norm stacks end with their last sublayer's LayerNorm.
        self.transformer.encoder.norm = None
        self.transformer.decoder.norm = None
        if paper_dropout:
            for block in [*self.transformer.encoder.layers, *self.transformer.decoder.layers]:
                block.dropout = nn.Identity()  # inside the FFN, after the ReLU
                for attention in (block.self_attn, getattr(block, "multihead_attn", None)):
                    if attention is not None:
                        attention.dropout = 0.0  # on the attention weights

    def embed(self, ids):
        x = self.embedding(ids) * math.sqrt(self.d_model)
        return self.dropout(x + self.positions[:ids.shape[1]])

    def forward(self, source_ids, target_input_ids):
        pad = source_ids == 0
        length = target_input_ids.shape[1]
        causal = nn.Transformer.generate_square_subsequent_mask(length)
        y = self.transformer(self.embed(source_ids), self.embed(target_input_ids),
                             tgt_mask=causal, tgt_is_causal=True,
                             src_key_padding_mask=pad, memory_key_padding_mask=pad)
        return F.linear(y, self.embedding.weight)  # [batch, tgt_len, vocab]


def warmup_lr(d_model: int, warmup: int, step: int) -> float:
    """keras_transformer.WarmupSchedule in Python (LambdaLR passes the update count)."""
    step = max(step, 1)
    return d_model ** -0.5 * min(step ** -0.5, step * warmup ** -1.5)


class Torch:
    """TorchTransformer, eager: forward (autocast for bfloat16), backward, Adam step;
    compile: the model's forward and backward compiled by torch.compile (Inductor's C++
    kernels on a CPU), the optimizer eager."""

    def __init__(self, config, precision, pool, schedule_warmup, paper_dropout,
                 compile=False):
        self.name = "torch.compile" if compile else "torch"
        torch.manual_seed(0)
        self.config, self.position = config, 0
        self.autocast = precision == "mixed_bfloat16"
        self.pool = [tuple(torch.from_numpy(x).long() for x in dataclasses.astuple(b))
                     for b in pool]
        self.model = TorchTransformer(config, paper_dropout).train()
        self.params = sum(p.numel() for p in self.model.parameters())
        if compile:
            self.model = torch.compile(self.model)
        self.optimizer = torch.optim.Adam(self.model.parameters(), lr=1.0, betas=(0.9, 0.98),
                                          eps=1e-9)
        self.schedule = torch.optim.lr_scheduler.LambdaLR(
            self.optimizer, lambda step: warmup_lr(config.d_model, schedule_warmup, step))

    def _loss(self, source_ids, target_input_ids, target_output_ids):
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=self.autocast):
            logits = self.model(source_ids, target_input_ids)
        loss_sum = F.cross_entropy(logits.float().flatten(0, 1), target_output_ids.flatten(),
                                   ignore_index=0, label_smoothing=self.config.label_smoothing,
                                   reduction="sum")
        return loss_sum / (target_output_ids != 0).sum().clamp(min=1)

    def _apply(self):
        self.optimizer.step()
        self.schedule.step()
        self.optimizer.zero_grad(set_to_none=True)

    def _update(self, batch) -> float:
        loss = self._loss(*batch)
        loss.backward()
        self._apply()
        return loss.item()

    def update(self) -> float:
        batch = self.pool[self.position % len(self.pool)]
        self.position += 1
        return self._update(batch)

    def pieces(self, batch: Batch):
        args = tuple(torch.from_numpy(x).long() for x in dataclasses.astuple(batch))

        def forward():
            with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16,
                                                 enabled=self.autocast):
                return float(self.model(*args[:2])[0, 0, 0])

        def forward_backward():
            loss = self._loss(*args)
            loss.backward()
            return loss.item()

        def optimizer():  # gradients of the last forward + backward, kept
            self.optimizer.step()
            self.schedule.step()

        return {"forward": forward, "forward + backward": forward_backward,
                "optimizer": optimizer, "update": lambda: self._update(args)}
