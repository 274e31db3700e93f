"""int8 weights for a decoding step: each projection's kernel stored as int8 with a scale
per output column, multiplied by oneDNN's int8 matmul (`_QuantizedMatMul`, which the stock
x86 TensorFlow wheel registers; the kernel Intel Neural Compressor's graphs run) with the
dequantization fused. Two ways to round its input, one per export:

- `Int8Kernel` (`--serving_dtype=int8`): each input row by its own largest magnitude at run
  time (CTranslate2's way), the rest of the step in float32. Computing a row's scale takes
  seven TensorFlow ops around each matmul.
- `StaticInt8Kernel` (`--serving_dtype=int8_bfloat16`): by one range per matmul, measured
  once on calibration sentences (`Observed`, `static_step_weights`): one op (QuantizeV2)
  before each matmul, whose bias and dequantization are fused; attention in bfloat16, the
  residual stream (sums and layer norms) in float32, which the matmuls read and return.

Only the step changes (keras_transformer.step, `dense`): the softmax and the search keep the
model's dtype, and so does the encoder, except in int8_bfloat16 exports, whose step weights
carry the encoder's (`Transformer.encoder_weights`) and the encoder-decoder keys' and values'
projections, which then run int8 as well.
The largest error a per-row matmul adds is about 1% of its output's largest magnitude
(bench/sweeps/int8_matmul.py; with 7-bit weights, up to 2%: see _WEIGHT_RANGE).
"""

import dataclasses
from typing import Callable, NamedTuple

import tensorflow as tf
from tensorflow.python.framework import op_def_library

from keras_transformer.normalization import OneDnnNorm

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


class StaticInt8Kernel(NamedTuple):
    """A kernel whose inputs are rounded by one range fixed at export: its int8 values
    [in, out] (an Int8Kernel's), their float32 range per output column as the int8
    matmul reads it (weight_min = -weight_max [out]: qint8's full scale, 127 x scale), the
    float32 input range input_min = -input_max [], input_max the largest input magnitude
    calibration saw (larger inputs are clipped to it), and the float32 bias [out] (zeros
    for a matmul without one). Everything the matmul reads is stored, none of it computed
    at a step."""

    values: tf.Tensor
    weight_min: tf.Tensor
    weight_max: tf.Tensor
    input_min: tf.Tensor
    input_max: tf.Tensor
    bias: tf.Tensor

    @classmethod
    def of(cls, kernel, input_range, bias=None) -> "StaticInt8Kernel":
        """The StaticInt8Kernel of a float kernel [in, out], its inputs' range and its
        bias [out] (None: zeros)."""
        q = quantize_kernel(kernel)
        limit = tf.maximum(tf.cast(input_range, tf.float32), 1e-6)
        bias = tf.zeros_like(q.scales) if bias is None else tf.cast(bias, tf.float32)
        return cls(q.values, -_RANGE * q.scales, _RANGE * q.scales, -limit, limit, bias)


@dataclasses.dataclass(frozen=True, eq=False)
class Observed:
    """A kernel [in, out] multiplied as it is, which records the largest input magnitude
    it multiplies in `largest` (a float32 tf.Variable []): calibration's kernel. Not a
    tuple, so that tf.nest takes it whole: a search reads its weights' variables once,
    before its loop (TransformerStep.start), and this one must stay a variable."""

    kernel: tf.Tensor
    largest: tf.Variable


def _static_int8(q, kernel: StaticInt8Kernel, relu_into: StaticInt8Kernel = None,
                 output=tf.float32):
    """oneDNN's int8 matmul of q (`_quantize`d by the kernel's input range) with the
    kernel's float32 bias and the dequantization fused: [rows, out] in `output` (float32
    or bfloat16); with relu_into, ReLU too and the product rounded into quint8 by
    relu_into's input range (what that kernel's matmul reads next)."""
    return _int8_matmul(q, kernel.values, kernel.bias, kernel.input_min, kernel.input_max,
                        kernel.weight_min, kernel.weight_max, relu_into=None if relu_into is None
                        else (relu_into.input_min, relu_into.input_max), output=output)


def _quantize(x, kernel: StaticInt8Kernel):
    """x [rows, in] rounded into qint8 by the kernel's input range (one QuantizeV2, which
    takes float32: a float32 x saves the cast, and the int8_bfloat16 step keeps its
    residual stream in float32, `static_step_weights`)."""
    return tf.raw_ops.QuantizeV2(input=tf.cast(x, tf.float32), min_range=kernel.input_min,
                                 max_range=kernel.input_max, T=tf.qint8, mode="SCALED",
                                 narrow_range=True).output


def relu_feed_forward(x, inner: StaticInt8Kernel, outer: StaticInt8Kernel):
    """max(0, x W_1 + b_1) W_2 + b_2 of StaticInt8Kernels (the paper's FFN): the inner
    matmul's bias, ReLU and rounding into quint8 by the outer's input range fused into
    it, so that no float tensor [rows, d_ff] is written between the two (3% of the FFN's
    time at 256 rows on one thread of an AVX-512 EPYC): float32 [rows, d_model]. The
    range is the outer's calibrated largest input, which ReLU's output (>= 0) fills in
    quint8's 255 steps."""
    return _static_int8(_static_int8(_quantize(x, inner), inner, relu_into=outer), outer)


def _int8_matmul(q, values, bias, input_min, input_max, weight_min, weight_max,
                 relu_into=None, output=tf.float32):
    """oneDNN's `_QuantizedMatMul` of q [rows, in] (qint8, or quint8 with input_min
    ignored; its range input_min..input_max) and int8 values [in, out] (per-column ranges
    weight_min, weight_max [out]), float32 bias [out] added and the product dequantized to
    `output` (float32 or bfloat16: rounded by the kernel, no cast after it): [rows, out].
    relu_into=(min, max): then ReLU too, and the product rounded into quint8 by that range
    instead. The weight is constant (a model's), so oneDNN keeps its reordered copy from
    one call to the next; reordering it at every call makes the kernel some 600 times
    slower."""
    dtype, fused, extra, outputs = output, ["BiasAdd", "Dequantize"], [], [output]
    if relu_into is not None:
        dtype, fused, extra = tf.quint8, ["BiasAdd", "Relu", "Requantize"], list(relu_into)
        outputs = [dtype, tf.float32, tf.float32]  # and the range it was rounded by
    _, _, op, _ = op_def_library._apply_op_helper(
        "_QuantizedMatMul", name="int8_matmul", device_inputs=[],
        host_inputs=[q, tf.bitcast(values, tf.qint8), bias, input_min, input_max,
                     weight_min, weight_max, *extra],
        Thost_outputs=outputs, Tdevice_outputs=[], T1=q.dtype, T2=tf.qint8,
        Tbias=tf.float32, Tout=dtype, U=tf.float32, fused_ops=fused,
        input_quant_mode="SCALED", output_quant_mode="SCALED", is_weight_const=True,
        is_bias_const=True, transpose_a=False, transpose_b=False, leakyrelu_alpha=0.2)
    return op.outputs[0]


def dense(x, kernel, bias=None, dtype=None):
    """x [rows, in] @ kernel + bias -> [rows, out], the step's one way to project; in
    `dtype` if given (a StaticInt8Kernel's matmul rounds into bfloat16 itself).

    kernel: a tensor [in, out] (float32 or bfloat16, the matmul in its dtype); an
    Int8Kernel: then x is quantized per row (each row divided by its largest magnitude,
    rounded to int8), multiplied as int8 by oneDNN, and the output rescaled and the bias
    added in float32; a StaticInt8Kernel (which carries its bias): x rounded by its fixed
    range, the result float32 (or `dtype`, rounded by the matmul); or an Observed one.
    Otherwise the result is in the kernel's dtype.
    An int8 kernel must be the same at every call of the graph (a weight): oneDNN keeps its
    reordered copy.
    """
    if isinstance(kernel, StaticInt8Kernel):
        if bias is not None:
            raise ValueError("a StaticInt8Kernel carries its own bias")
        return _static_int8(_quantize(x, kernel), kernel, output=dtype or tf.float32)
    y = _dense(x, kernel, bias)
    return y if dtype is None else tf.cast(y, dtype)


def _dense(x, kernel, bias):
    """`dense` of a kernel other than a StaticInt8Kernel."""
    if isinstance(kernel, Observed):
        largest = tf.reduce_max(tf.abs(tf.cast(x, tf.float32)))
        kernel.largest.assign(tf.maximum(kernel.largest, largest))
        kernel = kernel.kernel
    if not isinstance(kernel, Int8Kernel):
        y = tf.matmul(tf.cast(x, kernel.dtype), kernel)
        return y if bias is None else tf.nn.bias_add(y, bias)
    stream = x.dtype
    x = tf.cast(x, tf.float32)
    top = tf.maximum(tf.reduce_max(tf.abs(x), axis=1, keepdims=True), 1e-30)  # [rows, 1]
    q = tf.raw_ops.QuantizeV2(input=x / top, min_range=-1.0, max_range=1.0, T=tf.qint8,
                              mode="SCALED", narrow_range=True)
    # The op reads a kernel's range as qint8's full scale (127 x scale), whatever range
    # quantize_kernel rounded it into.
    # The bias goes in after the rows are scaled back, so the kernel's bias is zero.
    y = _int8_matmul(q.output, kernel.values, tf.zeros_like(kernel.scales), -1.0, 1.0,
                     -_RANGE * kernel.scales, _RANGE * kernel.scales) * top
    return tf.cast(y if bias is None else tf.nn.bias_add(y, tf.cast(bias, tf.float32)), stream)


def map_step_kernels(weights, fn: Callable):
    """Step weights (`Transformer.step_weights`) with the (kernel [in, out], bias [out] or
    None) of every matmul of a decoding step replaced by fn(name, kernel, bias): each
    decoder layer's attention projections and feed-forward kernels ("layers/0/self/input",
    ".../self/output", ".../cross/input", ".../cross/output", ".../feed_forward/1",
    ".../feed_forward/2") and the output projection ("projection": in bfloat16 weights the
    transpose of "output_matrix"); and when the weights carry the encoder's
    (`Transformer.encoder_weights` as "encoder"), each encoder layer's ("encoder/layers/0/
    self/input", ...) and each decoder layer's encoder-decoder keys and values
    ("encoder/key_value/0", ...). The embedding rows, position table and layer norms stay
    as they are."""
    def attention(name, w):
        w = dict(w)
        for part in ("input", "output"):
            w[f"{part}_kernel"], w[f"{part}_bias"] = fn(
                f"{name}/{part}", w[f"{part}_kernel"], w[f"{part}_bias"])
        return w

    def layer(name, w):
        w_1, b_1, w_2, b_2 = w["feed_forward"]
        attentions = {key: attention(f"{name}/{key[:-len('_attention')]}", w[key])
                      for key in ("self_attention", "cross_attention") if key in w}
        return {**w, **attentions, "feed_forward": (*fn(f"{name}/feed_forward/1", w_1, b_1),
                                                    *fn(f"{name}/feed_forward/2", w_2, b_2))}

    embedding = weights["embedding"]
    projection = embedding.get("projection")
    if projection is None:
        projection = tf.transpose(embedding["output_matrix"])
    projection, bias = fn("projection", projection, embedding.get("bias"))
    decoder = weights["decoder"]
    mapped = {**weights,
              "embedding": {"matrix": embedding["matrix"], "projection": projection,
                            **({} if bias is None else {"bias": bias})},
              "decoder": {**decoder, "layers": [layer(f"layers/{i}", w)
                                                for i, w in enumerate(decoder["layers"])]}}
    if "encoder" in weights:
        encoder = weights["encoder"]["encoder"]
        mapped["encoder"] = {
            "encoder": {**encoder, "layers": [layer(f"encoder/layers/{i}", w)
                                              for i, w in enumerate(encoder["layers"])]},
            "key_value": [fn(f"encoder/key_value/{i}", kernel, bias)
                          for i, (kernel, bias) in enumerate(weights["encoder"]["key_value"])]}
    return mapped


def quantize_step_weights(weights):
    """A float32 Transformer's step weights (`Transformer.step_weights`) with every matmul
    of a decoding step int8 (`Int8Kernel`s, `map_step_kernels`). The embedding rows,
    position table, biases and layer norms stay float32.

    Made once (an export stores them), not at every search: quantizing is a pass over
    every weight.
    """
    if "projection" not in weights["embedding"]:
        raise ValueError("int8 step weights are made from a float32 model's")
    return map_step_kernels(weights, lambda name, kernel, bias: (quantize_kernel(kernel), bias))


def observed_step_weights(weights):
    """(step weights whose every matmul records its largest input magnitude: `Observed`,
    {name: that tf.Variable}): what calibration runs searches with."""
    largest = {}

    def observe(name, kernel, bias):
        largest[name] = tf.Variable(0.0, trainable=False, name="largest_input")
        return Observed(kernel, largest[name]), bias

    return map_step_kernels(weights, observe), largest


def static_step_weights(weights, float32_weights, input_ranges):
    """bfloat16 step weights (`Transformer.step_weights` of a bfloat16 Transformer, with
    or without its `encoder_weights` as "encoder": both are made int8, `map_step_kernels`)
    with every matmul a `StaticInt8Kernel` (the float32 model's kernel and bias, from
    float32_weights, the same model's step weights in float32, with input_ranges[name]
    from `observed_step_weights`' searches on calibration sentences) and the float32
    position table: the step's residual stream (the embedding plus positions, the
    residual sums and layer norms) is then float32, which the int8 matmuls read and
    return, and only attention (its products and caches) runs in bfloat16. A bfloat16
    stream would cost a cast on each side of every matmul and layer norm. The layer norms
    are oneDNN's fused one (`OneDnnNorm`), as the matmuls are oneDNN's."""
    exact = {}
    map_step_kernels(float32_weights,
                     lambda name, kernel, bias: exact.setdefault(name, (kernel, bias)))

    def quantize(name, kernel, bias):
        kernel, bias = exact[name]
        return StaticInt8Kernel.of(kernel, input_ranges[name], bias), None

    def one_dnn_norms(stack):  # a Decoder's or an Encoder's step weights
        return {**stack, "final_norm": stack["final_norm"] and OneDnnNorm(*stack["final_norm"]),
                "layers": [{name: OneDnnNorm(*w) if name.endswith("_residual") else w
                            for name, w in layer.items()} for layer in stack["layers"]]}

    weights = map_step_kernels(weights, quantize)
    weights = {**weights, "decoder": one_dnn_norms(weights["decoder"]),
               "positions": float32_weights["positions"]}
    if "encoder" in weights:
        weights["encoder"] = {**weights["encoder"],
                              "encoder": one_dnn_norms(weights["encoder"]["encoder"])}
    return weights
