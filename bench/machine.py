"""What every benchmark reports about the machine: CPU, matmul peak, model FLOPs.

Shared by the scripts in bench/ (`python bench/<name>.py` puts bench/ on sys.path, so they
`import machine`). Not part of the package.

Model FLOPs (the convention of PaLM, appendix B: matmuls only). A batch is B pairs padded
to S source and T target positions, of which S' and T' are tokens (not padding);
d = d_model, f = d_ff, a = heads * d_k (= heads * d_v here), V = vocabulary, N = layers:

    encoder layer:  S' * (2*4*d*a + 2*2*d*f)            Q, K, V, O projections, FFN
                    + B * 2*2*S*S*a                     Q K^T and weights . V
    decoder layer:  T' * (2*4*d*a + 2*2*d*a + 2*2*d*f)  self Q K V O, cross Q O, FFN
                    + S' * 2*2*d*a                      cross K, V of the encoder output
                    + B * (2*2*T*T*a + 2*2*T*S*a)       self- and cross-attention
    output:         T' * 2*d*V                          pre-softmax projection
    forward = N * (encoder layer + decoder layer) + output;   update = 3 * forward

(the backward pass costs two forward matmuls per matmul). Position-wise matmuls count the
tokens only: the work a batch needs. An implementation that computes them at padding too
(the peers; ours under XLA) does B*S - S' and B*T - T' positions more that the count
leaves out, as lost MFU. Attention counts the padded blocks, which every implementation
computes; the causal mask does not halve the self-attention count, since the step
computes the masked half too. (Older tables in docs/runs.md counted every position,
S' = B*S and T' = B*T: 25-30% more on Multi30k's batches.)
"""

import collections
import glob
import os
import platform
import shlex
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Dict, List, Optional, Tuple

import tensorflow as tf

MULTI30K = Path(__file__).resolve().parents[1].parent / "shared" / "data" / "multi30k"


def multi30k_data(data_dir=MULTI30K, **fields):
    """The trainer's DataConfig for Multi30k train/val in `data_dir`, with `fields`."""
    from trainer.config import DataConfig
    data_dir = Path(data_dir)
    return DataConfig(train_src=str(data_dir / "train.en.gz"),
                      train_tgt=str(data_dir / "train.de.gz"),
                      eval_src=str(data_dir / "val.en"), eval_tgt=str(data_dir / "val.de"),
                      **fields)
MATMUL_SIZE = 2048
MATMUL_CHAIN = 4  # matmuls per timed call, so dispatch does not count
_FLAGS = ("avx512f", "avx512_bf16", "avx512_fp16", "avx_vnni", "avx512_vnni",
          "amx_tile", "amx_bf16", "amx_int8")


def cpu_info() -> Tuple[str, List[str]]:
    """(model name, the bfloat16 / AMX / VNNI flags present) from /proc/cpuinfo."""
    model, flags = platform.processor() or "unknown", set()
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            for line in f:
                if line.startswith("model name"):
                    model = line.split(":", 1)[1].strip()
                elif line.startswith("flags"):
                    flags = set(line.split(":", 1)[1].split())
    except OSError:
        pass
    return model, [flag for flag in _FLAGS if flag in flags]


def describe() -> str:
    """One line: cores, CPU model, the flags that matter for bfloat16, memory."""
    model, flags = cpu_info()
    memory = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2 ** 30
    return (f"{os.cpu_count()} cores, {model}, flags: {' '.join(flags) or 'none'}, "
            f"no GPU, {memory:.0f} GiB")


def set_threads(threads: int):
    """TensorFlow's intra- and inter-op threads (0: its default, one per core); call it
    before TensorFlow runs anything."""
    if threads:
        tf.config.threading.set_intra_op_parallelism_threads(threads)
        tf.config.threading.set_inter_op_parallelism_threads(threads)


def print_run(threads: int):
    """The report's first lines: machine, load average at the end, threads, command."""
    load = ", ".join(f"{x:.1f}" for x in os.getloadavg())
    print(f"\n   machine: {describe()}, load average {load} at the end")
    print(f"   threads: {threads or 'default'}")
    print(f"   command: python {' '.join(map(shlex.quote, sys.argv))}\n")


def seconds(fn) -> float:
    """Wall time of one call of fn()."""
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def median_seconds(fn, reps: int) -> float:
    """Median wall time of `reps` calls of fn() after one untimed call (TF eager on the CPU
    returns when the work is done)."""
    fn()
    return statistics.median(seconds(fn) for _ in range(reps))


def tf_matmul_peak(dtype, runs: int) -> float:
    """Best GFLOP/s of MATMUL_CHAIN chained n x n x n matmuls in a tf.function.

    bfloat16 inputs and output, as Keras' mixed_bfloat16 Dense layers run them.
    """
    n = MATMUL_SIZE
    # x W with W ~ N(0, 1/n) keeps x at unit scale, so the chain never overflows.
    x = tf.cast(tf.random.normal([n, n], seed=1), dtype)
    w = tf.cast(tf.random.normal([n, n], stddev=n ** -0.5, seed=2), dtype)

    @tf.function
    def chain(x, w):
        for _ in range(MATMUL_CHAIN):
            x = tf.matmul(x, w)
        return x[0, 0]

    chain(x, w).numpy()  # trace
    best = min(seconds(lambda: chain(x, w).numpy()) for _ in range(runs))
    return MATMUL_CHAIN * 2 * n ** 3 / best / 1e9


def forward_flops(config, batch: int, source_len: int, target_len: int,
                  source_tokens: Optional[int] = None, target_tokens: Optional[int] = None) -> int:
    """Matmul FLOPs of one forward pass over a batch (module docstring): the position-wise
    matmuls (projections, feed-forward, pre-softmax) of its tokens, and attention's
    Q K^T and weights x V over the padded [length x length] blocks, which every
    implementation computes.

    Args:
      config: a keras_transformer.TransformerConfig.
      batch, source_len, target_len: the padded batch shape [B, S] -> [B, T].
      source_tokens, target_tokens: the non-padding positions. Defaults to every position
        (B S and B T): the padded count, what an implementation that computes at padding
        runs.
    """
    d, f, vocab = config.d_model, config.d_ff, config.vocab_size
    a_k, a_v = config.num_heads * config.d_k, config.num_heads * config.d_v
    source_tokens = batch * source_len if source_tokens is None else source_tokens
    target_tokens = batch * target_len if target_tokens is None else target_tokens
    projections = 2 * (2 * d * a_k + 2 * d * a_v)  # Q and K to a_k, V to a_v, O back to d
    feed_forward = 2 * 2 * d * f
    encoder = (source_tokens * (projections + feed_forward)
               + batch * 2 * source_len * source_len * (a_k + a_v))
    decoder = (target_tokens * (projections + 2 * (d * a_k + a_v * d) + feed_forward)
               + source_tokens * 2 * (d * a_k + d * a_v)
               + batch * 2 * (target_len * target_len + target_len * source_len) * (a_k + a_v))
    output = target_tokens * 2 * d * vocab
    return config.num_layers * (encoder + decoder) + output


def update_flops(config, batch: int, source_len: int, target_len: int,
                 source_tokens: Optional[int] = None, target_tokens: Optional[int] = None
                 ) -> int:
    """Forward + backward (2x forward) matmul FLOPs of one update on one batch
    (`forward_flops`'s arguments)."""
    return 3 * forward_flops(config, batch, source_len, target_len, source_tokens,
                             target_tokens)


# Kernel names in a TF profiler trace are "op name:OpType"; the executor's own spans are these.
EXECUTOR_SPAN = "ExecutorState::Process"


def kernel_profile(fn) -> Tuple[Dict[str, Tuple[float, int]], float]:
    """({op type: (kernel seconds, kernels run)}, executor seconds outside kernels) of one
    call of fn() under the TensorFlow profiler, from its trace (`*.xplane.pb`).

    On 2 cores TensorFlow runs two ops at once, so kernel time can exceed wall time; the
    executor figure is the time the executor threads spent outside any kernel (scheduling,
    allocation, control flow): per-op dispatch. oneDNN kernels ("_Mkl" prefixes) count
    under their op type.
    """
    log_dir = tempfile.mkdtemp(prefix="kernel_profile_")
    tf.profiler.experimental.start(log_dir)
    fn()
    tf.profiler.experimental.stop()
    from tensorflow.tsl.profiler.protobuf import xplane_pb2
    space = xplane_pb2.XSpace()
    with open(glob.glob(os.path.join(log_dir, "**", "*.xplane.pb"), recursive=True)[0],
              "rb") as f:
        space.ParseFromString(f.read())
    by_type = collections.defaultdict(lambda: [0.0, 0])
    executor = kernels = 0.0
    for plane in space.planes:
        names = plane.event_metadata
        for line in plane.lines:
            if not line.name.startswith("tf_Compute"):
                continue
            for event in line.events:
                name, seconds = names[event.metadata_id].name, event.duration_ps / 1e12
                if name == EXECUTOR_SPAN:
                    executor += seconds
                elif ":" in name:
                    op_type = name.rsplit(":", 1)[1].replace("_Mkl", "")
                    by_type[op_type][0] += seconds
                    by_type[op_type][1] += 1
                    kernels += seconds
    return {k: tuple(v) for k, v in by_type.items()}, max(executor - kernels, 0.0)
