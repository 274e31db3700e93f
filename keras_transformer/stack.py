"""A stack of N identical layers (paper section 3.1: the encoder and decoder are each
"a stack of N = 6 identical layers")."""

import keras
from keras_transformer.normalization import LayerNormalization, layer_norm


class LayerStack(keras.layers.Layer):
    """N layers of `layer_class` and, when pre_norm, a final LayerNorm (pre-norm blocks
    leave their sum unnormalised). Encoder and Decoder set `layer_class` and `call`.

    Args:
      num_layers: N. The others are passed to every layer (see EncoderLayer).

    Example:

    >>> from keras_transformer import Encoder
    >>> encoder = Encoder(num_layers=2, d_model=16, num_heads=2, d_ff=32, pre_norm=True)
    >>> [layer.name for layer in encoder.layers], encoder.final_norm is not None
    (['layer_0', 'layer_1'], True)
    """

    layer_class = None

    def __init__(self, num_layers, d_model, num_heads, d_ff, key_dim=None, value_dim=None,
                 dropout=0.1, attention_dropout=0.0, pre_norm=False, activation="relu",
                 epsilon=1e-6, **kwargs):
        super().__init__(**kwargs)
        self.layer_args = dict(d_model=d_model, num_heads=num_heads, d_ff=d_ff, key_dim=key_dim,
                               value_dim=value_dim, dropout=dropout,
                               attention_dropout=attention_dropout, pre_norm=pre_norm,
                               activation=activation, epsilon=epsilon)
        self.num_layers = num_layers
        # Named attributes, not a list: tf.train.Checkpoint does not track Keras 3 lists.
        for i in range(num_layers):
            setattr(self, f"layer_{i}", self.layer_class(**self.layer_args, name=f"layer_{i}",
                                                         dtype=self.dtype_policy))
        self.final_norm = (LayerNormalization(epsilon=epsilon, name="final_norm",
                                                           dtype=self.dtype_policy)
                           if pre_norm else None)

    @property
    def layers(self):
        """The N layers, bottom first."""
        return [getattr(self, f"layer_{i}") for i in range(self.num_layers)]

    def build_stack(self, x_shape, *layer_input_shapes):
        for layer in self.layers:
            layer.build(x_shape, *layer_input_shapes)
        if self.final_norm is not None:
            self.final_norm.build(x_shape)
        self.built = True

    def finish(self, x):
        """The stack's output from the last layer's [batch, length, d_model]."""
        return self.final_norm(x) if self.final_norm is not None else x

    def final_norm_weights(self):
        """The final LayerNorm's (gamma, beta) for `finish_step`, or None (post-norm)."""
        return None if self.final_norm is None else self.final_norm.step_weights()

    def finish_step(self, x, weights):
        """`finish` in incremental decoding: x [rows, d_model], weights from
        `final_norm_weights`."""
        if self.final_norm is None:
            return x
        return layer_norm(x, weights, self.final_norm.epsilon)

    def compute_output_shape(self, x_shape, *args, **kwargs):
        return x_shape

    def get_config(self):
        return {**super().get_config(), "num_layers": self.num_layers, **self.layer_args}
