"""What the benchmarks share: the machine, versions and command each report states, the
markdown table it prints, timing and profiling, the matmul peak and model FLOPs behind MFU,
Multi30k, the export under test (what it was exported with, its signatures) and timing its
translations.

Every table and summary line printed is kept for bench/results_file.py.

Imported by every script in bench/ (`python bench/<name>.py` puts bench/ on sys.path; the
sweeps in bench/sweeps/ add it). Not part of the package, and not run. TensorFlow is
imported inside the functions that use it: bench/decoding.py's CTranslate2 workers import
this module and run without TensorFlow in their process.

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
computes the masked half too. (Older tables in bench/runs.md counted every position,
S' = B*S and T' = B*T: 25-30% more on Multi30k's batches.)
"""

import collections
import functools
import glob
import importlib
import json
import os
import platform
import shlex
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple, Union

BENCH = Path(__file__).resolve().parent
REPO = BENCH.parent
MULTI30K = REPO.parent / "shared" / "data" / "multi30k"
MATMUL_SIZE = 2048
MATMUL_CHAIN = 4  # matmuls per timed call, so dispatch does not count
_FLAGS = ("avx2", "fma", "avx512f", "avx512_bf16", "avx512_fp16", "avx_vnni", "avx512_vnni",
          "amx_tile", "amx_bf16", "amx_int8")


# ---------------------------------------------------------------- what a report states


def cpu_info() -> Tuple[str, List[str]]:
    """(model name, the vector, bfloat16, AMX and VNNI flags present) from /proc/cpuinfo."""
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
    """One line: cores, CPU model, the flags that matter for matmuls (AVX2 alone: no
    AVX-512, no bfloat16 units), memory."""
    model, flags = cpu_info()
    memory = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2 ** 30
    return (f"{os.cpu_count()} cores, {model}, flags: {' '.join(flags) or 'none'}, "
            f"no GPU, {memory:.0f} GiB")


def load_average() -> str:
    """The 1-, 5- and 15-minute load averages: other processes slow a benchmark down."""
    return ", ".join(f"{x:.1f}" for x in os.getloadavg())


def command() -> str:
    """This run's command, as typed from the repository root."""
    return "python " + " ".join(map(shlex.quote, sys.argv))


def versions(*extra: str) -> str:
    """Python, TensorFlow, tensorflow-text and Keras versions, oneDNN's switch, then
    `extra` (e.g. "CTranslate2 4.8.5")."""
    import keras
    import tensorflow as tf
    import tensorflow_text
    onednn = os.environ.get("TF_ENABLE_ONEDNN_OPTS", "unset (on)")
    return ", ".join([f"Python {platform.python_version()}", f"TensorFlow {tf.__version__}",
                      f"tensorflow-text {tensorflow_text.__version__}",
                      f"Keras {keras.__version__}", *extra,
                      f"TF_ENABLE_ONEDNN_OPTS={onednn}"])


# The lines above this run's tables (print_header), kept for write_results.
HEADER: Dict[str, str] = {}


def print_header(rows: Sequence[Tuple[str, object]]):
    """The lines above a report's tables, `name: value`, names right-aligned; rows whose
    value is None or "" are left out."""
    rows = [(name, value) for name, value in rows if value not in (None, "")]
    HEADER.update((name, in_repository(str(value))) for name, value in rows)
    width = max(len(name) for name, _ in rows)
    print()
    for name, value in rows:
        print(f"{name:>{width}}: {value}")
    print()


# Every table and summary line this run printed, in order: what write_results writes.
PRINTED: List[dict] = []


def print_table(header: Sequence[str], rows: Sequence[Sequence[object]],
                text_columns: Union[int, Sequence[int]] = 1, title: Optional[str] = None):
    """A markdown table, `title` above it: its text columns (the first `text_columns`, or
    those indices) left-aligned, the others (the figures) right-aligned; cells are printed
    as given (format them before). The table is kept for write_results."""
    PRINTED.append({"title": (title or "").replace("**", "").rstrip(":"),
                     "header": [str(h) for h in header],
                     "rows": [[str(cell).replace("**", "") for cell in row] for row in rows]})
    if isinstance(text_columns, int):
        text_columns = range(text_columns)
    if title:
        print(f"{title}\n")
    print("| " + " | ".join(header) + " |")
    print("|" + "".join("---|" if i in text_columns else "---:|" for i in range(len(header))))
    for row in rows:
        print("| " + " | ".join(str(cell) for cell in row) + " |")
    print()


def print_summary(line: str):
    """A summary line under a table (e.g. each engine at its best), kept for write_results
    as a one-cell row of the run's "summary lines" table."""
    print(line + "\n")
    if not PRINTED or PRINTED[-1]["title"] != SUMMARY:
        PRINTED.append({"title": SUMMARY, "header": ["line"], "rows": []})
    PRINTED[-1]["rows"].append([line])


SUMMARY = "summary lines"


def in_repository(text: str) -> str:
    """`text` with this checkout's absolute paths written relative to its root (and those
    beside it as ../), as a reader's checkout has them."""
    return text.replace(str(REPO) + os.sep, "").replace(str(REPO.parent) + os.sep, "../")


def require(modules: Sequence[str], what: str):
    """Imports `modules` or ends the program with one line naming what needs them (e.g.
    the peers, installed for the benchmarks only) and how to install them."""
    missing = []
    for name in modules:
        try:
            importlib.import_module(name)
        except ImportError:
            missing.append(name.replace("_", "-"))
    if missing:
        sys.exit(f"{sys.argv[0]}: error: {what} needs {' and '.join(missing)}, not installed "
                 "here (bench/README.md, 'How to run them', says how)")


# ---------------------------------------------------------------- timing


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


def best_seconds(fn, reps: int) -> float:
    """Best wall time of `reps` calls of fn() (the caller warms it up)."""
    return min(seconds(fn) for _ in range(reps))


def set_threads(threads: int, inter: int = None):
    """TensorFlow's intra-op threads and its inter-op threads (default: as many; 0: its
    default, one per core); call it before TensorFlow runs anything."""
    if threads:
        import tensorflow as tf
        tf.config.threading.set_intra_op_parallelism_threads(threads)
        tf.config.threading.set_inter_op_parallelism_threads(inter or threads)


# ---------------------------------------------------------------- data and exports


def multi30k_data(data_dir=MULTI30K, **fields):
    """The trainer's DataConfig for Multi30k train/val in `data_dir`, with `fields`."""
    from trainer.config import DataConfig
    data_dir = Path(data_dir)
    return DataConfig(train_src=str(data_dir / "train.en.gz"),
                      train_tgt=str(data_dir / "train.de.gz"),
                      eval_src=str(data_dir / "val.en"), eval_tgt=str(data_dir / "val.de"),
                      **fields)


def read_lines(path, limit: int = 0) -> List[str]:
    """The lines of a text file, without their newlines; the first `limit` (0: all)."""
    with open(path, encoding="utf-8") as f:
        lines = f.read().splitlines()
    return lines[:limit] if limit else lines


def export_info(version_dir) -> dict:
    """An export version's assets.extra/export.json ({} for an export without one), read
    without TensorFlow."""
    path = Path(version_dir) / "assets.extra" / "export.json"
    return json.loads(path.read_text(encoding="utf-8")) if path.exists() else {}


def export_options(version_dir):
    """trainer.serving.saved_model.Options of the weights and search an export version
    was exported with (the paper's search for an export that does not say), so that
    in-process rows decode what the export decodes."""
    from keras_transformer import DecodeConfig
    from trainer.model_dir.weights import WeightsChoice
    from trainer.serving import saved_model
    info = export_info(version_dir)
    kind = info.get("weights", "last")
    average_last = len(info.get("checkpoints", [])) if kind == "average" else 0
    return saved_model.Options(weights=WeightsChoice(kind, average_last),
                               decode=DecodeConfig.from_dict(info))


class Export:
    """The SavedModel under test (a version or its export directory): where it is, what it
    was exported with, and (loaded on first use) its signatures and target vocabulary."""

    def __init__(self, path):
        from trainer.serving import saved_model
        self.version_dir = saved_model.resolve(path)
        self.info = export_info(self.version_dir)
        self.options = export_options(self.version_dir)
        self.decode = self.options.decode
        self.serving_row = f"SavedModel serving_default, beam {self.decode.beam_size}"

    @functools.cached_property
    def loaded(self):
        from trainer.serving import saved_model
        return saved_model.load(self.version_dir)

    @functools.cached_property
    def processor(self):
        """The target vocabulary, to count output tokens."""
        import sentencepiece
        assets = Path(self.version_dir) / "assets"
        vocabulary = assets / "spm.model"
        if not vocabulary.exists():
            vocabulary = assets / "spm_target.model"
        return sentencepiece.SentencePieceProcessor(model_file=str(vocabulary))

    def describe(self) -> str:
        d = self.decode
        return (f"{self.version_dir} ({self.options.weights.kind} weights, "
                f"{self.info.get('serving_dtype', 'float32')}); beam {d.beam_size}, alpha "
                f"{d.alpha}, outputs of at most source + {d.max_extra_length} tokens")


def timed_translation(translate, texts, batch_size, **options):
    """(translations, seconds) after one warm-up batch (tracing, thread pools); options:
    the options signatures' scalar inputs (every text gets the empty target prefix), the
    first hypothesis kept."""
    from trainer.serving.client import translate_texts
    prefixes = {"target_prefixes": [""] * len(texts)} if options else {}
    warmup = {"target_prefixes": prefixes["target_prefixes"][:batch_size]} if options else {}
    translate_texts(translate, texts[:batch_size], batch_size, **warmup, **options)
    start = time.perf_counter()
    translations = translate_texts(translate, texts, batch_size, **prefixes, **options)
    seconds = time.perf_counter() - start
    return [t[0] if isinstance(t, list) else t for t in translations], seconds


def target_tokens(processor, translations) -> int:
    """Output subwords + EOS, as the decoder produced them (re-tokenized output)."""
    return sum(len(processor.encode(t)) + 1 for t in translations)


def print_speed_table(rows, title: str):
    """Rows (name, sentences, seconds, target tokens) as sentences/s and tokens/s."""
    print_table(["decoding", "sentences", "seconds", "sentences/s", "target tokens/s"],
                [[name, n, f"{seconds:.1f}", f"{n / seconds:.1f}", f"{tokens / seconds:,.0f}"]
                 for name, n, seconds, tokens in rows], title=title)


# ---------------------------------------------------------------- matmul peak and FLOPs


def tf_matmul_peak(dtype, runs: int) -> float:
    """Best GFLOP/s of MATMUL_CHAIN chained n x n x n matmuls in a tf.function.

    bfloat16 inputs and output, as Keras' mixed_bfloat16 Dense layers run them.
    """
    import tensorflow as tf
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
    best = best_seconds(lambda: chain(x, w).numpy(), runs)
    return MATMUL_CHAIN * 2 * n ** 3 / best / 1e9


def peak_description(runs: int) -> str:
    """What a matmul peak figure is."""
    return f"{MATMUL_CHAIN} chained {MATMUL_SIZE}^3 matmuls, best of {runs} calls"


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
    return config.encoder_layers * encoder + config.decoder_layers * decoder + output


def update_flops(config, batch: int, source_len: int, target_len: int,
                 source_tokens: Optional[int] = None, target_tokens: Optional[int] = None
                 ) -> int:
    """Forward + backward (2x forward) matmul FLOPs of one update on one batch
    (`forward_flops`'s arguments)."""
    return 3 * forward_flops(config, batch, source_len, target_len, source_tokens,
                             target_tokens)


# ---------------------------------------------------------------- profiles

# Kernel names in a TF profiler trace are "op name:OpType"; the executor's own spans are these.
EXECUTOR_SPAN = "ExecutorState::Process"


def kernel_profile(fn, group=None) -> Tuple[Dict[Any, Tuple[float, int]], float]:
    """({op type: (kernel seconds, kernels run)}, executor seconds outside kernels) of one
    call of fn() under the TensorFlow profiler, from its trace (`*.xplane.pb`); with
    group(node name, op type) -> key, the kernels are summed by that key instead.

    On 2 cores TensorFlow runs two ops at once, so kernel time can exceed wall time; the
    executor figure is the time the executor threads spent outside any kernel (scheduling,
    allocation, control flow): per-op dispatch. oneDNN kernels ("_Mkl" prefixes) count
    under their op type.
    """
    import tensorflow as tf
    from tensorflow.tsl.profiler.protobuf import xplane_pb2
    log_dir = tempfile.mkdtemp(prefix="kernel_profile_")
    tf.profiler.experimental.start(log_dir)
    fn()
    tf.profiler.experimental.stop()
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
                name, spent = names[event.metadata_id].name, event.duration_ps / 1e12
                if name == EXECUTOR_SPAN:
                    executor += spent
                elif ":" in name:
                    node, op_type = name.rsplit(":", 1)
                    op_type = op_type.replace("_Mkl", "")
                    key = op_type if group is None else group(node, op_type)
                    by_type[key][0] += spent
                    by_type[key][1] += 1
                    kernels += spent
    return {k: tuple(v) for k, v in by_type.items()}, max(executor - kernels, 0.0)


def timed_main(main: Callable[[], None]):
    """Runs main() and prints how long the whole run took."""
    start = time.perf_counter()
    main()
    print(f"({time.perf_counter() - start:.0f} s)")
