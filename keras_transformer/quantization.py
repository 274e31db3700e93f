"""int8 weights for a decoding step: each projection's kernel stored as int8 with a scale
per output column, its input quantized per row at run time, multiplied by oneDNN's int8
matmul (`_QuantizedMatMul`, which the stock x86 TensorFlow wheel registers; the kernel
Intel Neural Compressor's graphs run) with the dequantization fused.

Only the step's matmuls change (keras_transformer.step, `dense`): the encoder, the
attentions' products, the layer norms, the softmax and the search stay in float32. The
largest error a matmul adds is about 1% of its output's largest magnitude
(bench/sweeps/int8_matmul.py; with 7-bit weights, up to 2%: see _WEIGHT_RANGE).
"""

from typing import NamedTuple

import tensorflow as tf
from tensorflow.python.framework import op_def_library

# The int8 range an input row is rounded into: symmetric, so that 0 is exact and -x is -q.
_RANGE = 127.0
# The range a weight is rounded into: 7 bits. On CPUs without VNNI (AVX2, and AVX-512
# before Cascade Lake) oneDNN multiplies int8 by vpmaddubsw: the input shifted to uint8
# (+128), and each pair of products summed in int16, which saturates above 32,767; with
# weights within +-63, 255 x 63 x 2 = 32,130 cannot. With +-127 weights a matmul there was
# off by up to 20% of its output's range (an AVX2-only AMD EPYC), against about 1% here.
_WEIGHT_RANGE = 63.0


class Int8Kernel(NamedTuple):
    """A kernel [in, out] as int8 values (tf.int8: a while loop cannot carry quantized
    types) and float32 scales [out]: kernel ~= values * scales."""

    values: tf.Tensor
    scales: tf.Tensor


def quantize_kernel(kernel) -> Int8Kernel:
    """Int8Kernel of a float kernel [in, out], a scale per output column (its largest
    magnitude / 63, rounded to nearest: see _WEIGHT_RANGE).

    Example:

    >>> import numpy as np
    >>> kernel = np.array([[0.5, -2.0], [-1.0, 1.0]], np.float32)
    >>> q = quantize_kernel(kernel)
    >>> q.values.numpy().tolist(), np.round(q.scales.numpy() * 63, 4).tolist()
    ([[31, -63], [-63, 31]], [1.0, 2.0])
    """
    kernel = tf.cast(kernel, tf.float32)
    scales = tf.maximum(tf.reduce_max(tf.abs(kernel), axis=0), 1e-30) / _WEIGHT_RANGE
    values = tf.cast(tf.clip_by_value(tf.round(kernel / scales), -_WEIGHT_RANGE,
                                      _WEIGHT_RANGE), tf.int8)
    return Int8Kernel(values, scales)


def dense(x, kernel, bias=None, constant=True):
    """x [rows, in] @ kernel + bias -> [rows, out], the step's one way to project.

    kernel: a tensor [in, out] (float32 or bfloat16, the matmul in x's dtype), or an
    Int8Kernel: then x is quantized per row (each row divided by its largest magnitude,
    rounded to int8), multiplied as int8 by oneDNN, and the output rescaled and the bias
    added in float32; the result is in x's dtype.
    constant: the kernel is the same at every call of the graph (a weight), so oneDNN's
    int8 kernel may keep its reordered copy; False for one made per call (a shortlist's).
    """
    if not isinstance(kernel, Int8Kernel):
        y = tf.matmul(x, kernel)
        return y if bias is None else tf.nn.bias_add(y, bias)
    dtype = x.dtype
    x = tf.cast(x, tf.float32)
    top = tf.maximum(tf.reduce_max(tf.abs(x), axis=1, keepdims=True), 1e-30)  # [rows, 1]
    q = tf.quantization.quantize(x / top, -1.0, 1.0, tf.qint8, mode="SCALED",
                                 narrow_range=True)
    zeros = tf.zeros_like(kernel.scales)
    # The op reads a kernel's range as qint8's full scale (127 x scale), whatever range
    # quantize_kernel rounded it into.
    # The bias goes in after the rows are scaled back, so the kernel's bias is zero.
    _, _, op, _ = op_def_library._apply_op_helper(
        "_QuantizedMatMul", name="int8_matmul", device_inputs=[],
        host_inputs=[q.output, tf.bitcast(kernel.values, tf.qint8), zeros, -1.0, 1.0,
                     -_RANGE * kernel.scales, _RANGE * kernel.scales],
        Thost_outputs=[tf.float32], Tdevice_outputs=[], T1=tf.qint8, T2=tf.qint8,
        Tbias=tf.float32, Tout=tf.float32, U=tf.float32, fused_ops=["BiasAdd", "Dequantize"],
        input_quant_mode="SCALED", output_quant_mode="SCALED", is_weight_const=constant,
        is_bias_const=True, transpose_a=False, transpose_b=False, leakyrelu_alpha=0.2)
    y = op.outputs[0] * top
    return tf.cast(y if bias is None else tf.nn.bias_add(y, tf.cast(bias, tf.float32)), dtype)


def quantize_step_weights(weights):
    """A float32 Transformer's step weights (`Transformer.step_weights`) with every matmul
    of a decoding step int8: each decoder layer's attention projections and feed-forward
    kernels, and the output projection. The embedding rows, position table, biases and
    layer norms stay float32.

    Made once (an export stores them), not at every search: quantizing is a pass over
    every weight.
    """
    embedding = weights["embedding"]
    if "projection" not in embedding:
        raise ValueError("int8 step weights are made from a float32 model's")

    def attention(w):
        return {**w, "input_kernel": quantize_kernel(w["input_kernel"]),
                "output_kernel": quantize_kernel(w["output_kernel"])}

    def layer(w):
        w_1, b_1, w_2, b_2 = w["feed_forward"]
        return {**w, "self_attention": attention(w["self_attention"]),
                "cross_attention": attention(w["cross_attention"]),
                "feed_forward": (quantize_kernel(w_1), b_1, quantize_kernel(w_2), b_2)}

    decoder = weights["decoder"]
    return {**weights,
            "embedding": {**embedding, "projection": quantize_kernel(embedding["projection"])},
            "decoder": {**decoder, "layers": [layer(w) for w in decoder["layers"]]}}
