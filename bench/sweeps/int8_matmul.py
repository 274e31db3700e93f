"""Sweep: can int8 weights make a decoding step's matmuls faster in stock TensorFlow?

Times one decode step's matmul shapes, [rows, in] x [in, out] plus a bias, for both model
sizes the serving-speed work measures (the Multi30k recipe's `small`, d_model 256 and 8,000
pieces; OPUS-MT's, d_model 512 and 58,101 pieces), at --rows (one sentence of 4 beams, and
64 sentences of 4 beams by default), each way:

  float32            tf.matmul + bias_add (oneDNN's fused MatMul)
  bfloat16           the same on bfloat16 weights and a cast input (the bfloat16 export)
  int8 per tensor    the input quantized to int8 with one scale (QuantizeV2, SCALED), the
                     weights int8 with a scale per output channel, oneDNN's _QuantizedMatMul
                     with the bias and the dequantization fused (the kernel Intel Neural
                     Compressor's graphs use; registered in the stock wheel)
  int8 per row       the same with a scale per input row: each row divided by its largest
                     magnitude before the quantization, the output rows multiplied back
                     after it, the bias added then

Each in a tf.while_loop of --calls calls, as the search runs them (per-call cost, dispatch
included), best of --repeats; and each way's largest error against float32, relative to the
output's largest magnitude. Not a test: run it by hand, alone on the machine, from the
repository root:

  python bench/sweeps/int8_matmul.py [--rows=4,256] [--threads=0]
"""

import argparse
import sys
from pathlib import Path

import numpy as np
import tensorflow as tf
from tensorflow.python.framework import op_def_library

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # bench/, for common
import common  # noqa: E402

# (model, matmul, in, out) of one decode step.
SHAPES = [("small", "self-attention QKV", 256, 768), ("small", "attention W^O", 256, 256),
          ("small", "FFN W_1", 256, 1024), ("small", "FFN W_2", 1024, 256),
          ("small", "output projection", 256, 8000),
          ("OPUS-MT", "self-attention QKV", 512, 1536), ("OPUS-MT", "attention W^O", 512, 512),
          ("OPUS-MT", "FFN W_1", 512, 2048), ("OPUS-MT", "FFN W_2", 2048, 512),
          ("OPUS-MT", "output projection", 512, 58101)]


def quantized_matmul(q, q_min, q_max, kernel, kernel_scale, bias):
    """oneDNN's _QuantizedMatMul: int8 q [rows, in] (SCALED in [q_min, q_max]) times int8
    kernel [in, out] (scale per column), + bias, dequantized to float32 [rows, out].

    The kernel comes as tf.int8 and is cast to qint8 here, where it is used: a while
    loop's variables cannot be quantized types (no NextIteration kernel for them)."""
    _, _, op, _ = op_def_library._apply_op_helper(
        "_QuantizedMatMul", name="quantized_matmul", device_inputs=[],
        host_inputs=[q, tf.bitcast(kernel, tf.qint8), bias, q_min, q_max,
                     -127.0 * kernel_scale, 127.0 * kernel_scale],
        Thost_outputs=[tf.float32], Tdevice_outputs=[], T1=tf.qint8, T2=tf.qint8,
        Tbias=tf.float32, Tout=tf.float32, U=tf.float32, fused_ops=["BiasAdd", "Dequantize"],
        input_quant_mode="SCALED", output_quant_mode="SCALED", is_weight_const=True,
        is_bias_const=True, transpose_a=False, transpose_b=False, leakyrelu_alpha=0.2)
    return op.outputs[0]


def ways(kernel: np.ndarray, bias: np.ndarray):
    """{way: x float32 [rows, in] -> float32 [rows, out]} for one matmul's weights."""
    scale = np.maximum(np.abs(kernel).max(axis=0), 1e-12) / 127.0  # [out]
    int8 = tf.constant(np.round(kernel / scale).astype(np.int8))
    f32, b32 = tf.constant(kernel), tf.constant(bias)
    bf16, bbf16 = tf.cast(f32, tf.bfloat16), tf.cast(b32, tf.bfloat16)
    scale = tf.constant(scale.astype(np.float32))
    zeros = tf.zeros_like(b32)

    def per_tensor(x):
        top = tf.reduce_max(tf.abs(x))
        q = tf.quantization.quantize(x, -top, top, tf.qint8, mode="SCALED", narrow_range=True)
        return quantized_matmul(q.output, q.output_min, q.output_max, int8, scale, b32)

    def per_row(x):
        top = tf.maximum(tf.reduce_max(tf.abs(x), axis=1, keepdims=True), 1e-30)  # [rows, 1]
        q = tf.quantization.quantize(x / top, -1.0, 1.0, tf.qint8, mode="SCALED",
                                     narrow_range=True)
        return tf.nn.bias_add(quantized_matmul(q.output, -1.0, 1.0, int8, scale, zeros) * top,
                              b32)

    return {"float32": lambda x: tf.nn.bias_add(tf.matmul(x, f32), b32),
            "bfloat16": lambda x: tf.cast(tf.nn.bias_add(tf.matmul(tf.cast(x, tf.bfloat16), bf16),
                                                         bbf16), tf.float32),
            "int8 per tensor": per_tensor, "int8 per row": per_row}


def per_call_us(matmul, x, calls: int, repeats: int) -> float:
    def body(i, total):
        return i + 1, total + matmul(x + tf.cast(i, tf.float32) * 1e-9)[0, 0]

    loop = tf.function(lambda: tf.while_loop(lambda i, _: i < calls, body, (0, 0.0))[1])
    loop()  # trace
    return common.best_seconds(loop, repeats) / calls * 1e6


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", default="4,256")
    parser.add_argument("--calls", type=int, default=50)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--threads", type=int, default=0)
    args = parser.parse_args(argv)
    common.set_threads(args.threads)
    rng = np.random.default_rng(0)
    results = []
    for model, name, inputs, outputs in SHAPES:
        # Weights as a trained layer's, roughly: normal with a few larger columns.
        kernel = (rng.normal(size=(inputs, outputs)) / np.sqrt(inputs)).astype(np.float32)
        kernel *= rng.lognormal(0.0, 0.5, size=outputs).astype(np.float32)
        bias = (rng.normal(size=outputs) * 0.1).astype(np.float32)
        matmuls = ways(kernel, bias)
        for rows in map(int, args.rows.split(",")):
            x = tf.constant(rng.normal(size=(rows, inputs)).astype(np.float32))
            exact = matmuls["float32"](x).numpy()
            times = {way: per_call_us(fn, x, args.calls, args.repeats)
                     for way, fn in matmuls.items()}
            # (In a tf.function: _QuantizedMatMul is built as a graph node.)
            errors = {way: np.abs(tf.function(fn)(x).numpy() - exact).max() /
                      np.abs(exact).max() for way, fn in matmuls.items()}
            results.append((model, name, rows, inputs, outputs, times, errors))
    common.print_header([("machine", f"{common.describe()}, load average "
                                     f"{common.load_average()} at the end"),
                         ("versions", common.versions()),
                         ("threads", args.threads or "default"),
                         ("command", common.command())])
    way_names = list(results[0][5])
    common.print_table(
        ["model", "matmul", "rows", "in x out",
         *(f"{way}, us (x float32)" for way in way_names),
         *(f"{way}, error" for way in way_names[1:])],
        [[model, name, rows, f"{i} x {o}",
          *(f"{times[w]:,.1f} ({times['float32'] / times[w]:.2f}x)" for w in way_names),
          *(f"{errors[w]:.4f}" for w in way_names[1:])]
         for model, name, rows, i, o, times, errors in results],
        title="**one decode step's matmul (+ bias), per call in a tf.while_loop**")


if __name__ == "__main__":
    common.timed_main(main)
