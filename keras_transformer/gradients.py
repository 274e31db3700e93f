"""Closed-form gradients, as tf.custom_gradient gives them to a GradientTape, without the
gradient registration that keeps every traced graph alive.

Inside a tf.function, tf.custom_gradient registers each call's gradient function in
TensorFlow's process-wide gradient registry (ops.RegisterGradient, under a fresh name, for
tf.gradients), and nothing ever removes it: its closure holds the traced graph, so every
trace of a model stays in memory for the life of the process (about 24 MB a beam search
of the tiny model, gigabytes for a program that traces many). `custom_gradient` records
the gradient on the active tapes only, which drop it with themselves. Keras 3 and the
trainer differentiate with GradientTape; tf.gradients, which no tape sees, differentiates
the forward pass's own ops, a correct gradient but not the closed form.
"""

import functools

import tensorflow as tf
from tensorflow.python.eager import record


def custom_gradient(f):
    """f(*tensors) -> (result, gradient), with gradient(*upstream) -> one gradient per
    tensor (a tuple, or the gradient itself for one tensor), upstream holding one tensor
    per tensor of result (tf.nest order): tf.custom_gradient's contract, without
    variables read inside f (pass them as tensors).

    Example:

    >>> import tensorflow as tf
    >>> from keras_transformer.gradients import custom_gradient
    >>> @custom_gradient
    ... def square(x):
    ...     return x * x, lambda dy: 10.0 * dy  # a deliberately wrong gradient
    >>> x = tf.constant(3.0)
    >>> with tf.GradientTape() as tape:
    ...     tape.watch(x)
    ...     y = square(x)
    >>> float(tape.gradient(y, x))
    10.0
    """

    @functools.wraps(f)
    def call(*tensors):
        tensors = [tf.convert_to_tensor(t) for t in tensors]
        with record.stop_recording():  # the tapes need the gradient, not f's ops
            result, gradient = f(*tensors)
        # Fresh tensors, which the tapes know only as this call's outputs.
        outputs = [tf.identity(t) for t in tf.nest.flatten(result)]

        def backward(*upstream):
            grads = gradient(*upstream)
            return list(grads) if isinstance(grads, (list, tuple)) else [grads]

        record.record_operation(f.__name__, outputs, tensors, backward)
        return tf.nest.pack_sequence_as(result, outputs)

    return call
