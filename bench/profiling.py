"""Profile: where does the time go, op type by op type: in a training update, or in the
exported beam search (and how many nodes does the search's loop hold)?

  python bench/profiling.py --training [--precisions=mixed_bfloat16 --batch=128 --length=32]

    Builds the Multi30k recipe's `small` model (vocabulary --vocab_size) in each precision,
    on one batch of --batch x --length random ids (a tenth of the positions padded at the end
    of each row), and times, best of --repeats calls of a tf.function each:
      forward:            the model's logits with training=True (dropout on), on the
                          non-padding positions (Transformer.packed_logits), as in training;
      forward + backward: the summed label-smoothed loss and its gradients, as
                          trainer.training.update.Updater computes them.
    Under a minute.

  python bench/profiling.py --decoding --saved_model=EXPORT/1 [--compare=OLD_EXPORT/1] \\
      [--threads=1] [--one_at_a_time=40]

    The export's `serving_default` on Multi30k test2016 sentences: a batch of --batch_size
    in file order in one call, and one sentence alone. With --compare=OTHER_EXPORT the same
    calls profile a second SavedModel in the same run (an export of the previous code: the
    before/after table of a change), and the two then take turns translating all of --src
    in batches, batch by batch (sentences/s and their ratio per round: the machine's drift
    hits both alike), and its first --one_at_a_time sentences one request at a time,
    request by request (the sums of each sentence's best and median time). About 2 minutes.

  python bench/profiling.py --nodes --saved_model=EXPORT/1 [--compare=OLD_EXPORT/1]

    Not timed: the nodes of each while loop's body in the export's `serving_default`
    (its graph's function library, where the loops' bodies are functions), alone and with
    the functions the body calls (its If branches), in total and by op type, beside
    --compare's and whether the two are equal op type by op type: a change that must leave
    serving_default's trace alone (e.g. to the option signatures) shows it did. A loop is
    named by the nodes down to it from the signature's graph, which two exports share
    (unlike the functions' numbered names). Seconds.

In --training and --decoding, one more call of each runs under the TensorFlow profiler,
whose kernel times are summed by op type from its trace (common.kernel_profile). For the
search, a second table sums them by what they do in a decode step (`ROLES`: the matmuls of
each sublayer, softmax and top-k, beam bookkeeping, the rest), per step: the decoder's ops
carry their sublayer's name scope. On 2 cores TensorFlow runs two ops at once, so kernel
time can exceed wall time; the "executor outside kernels" row is the time the executor
threads spent outside any kernel (scheduling, allocation, the while loop's control flow):
per-op dispatch. (The file is not called profile.py: bench/ comes first on sys.path, and
TensorFlow imports the standard library's `profile`.) Not a test: run it by hand from the
repository root.
"""

import argparse
import collections
import os
import statistics

import numpy as np
import tensorflow as tf

import keras
import keras_transformer
from keras_transformer import (Transformer, TransformerConfig,
                               projected_label_smoothed_cross_entropy)

import common
import graph_nodes
import results_file


def print_op_table(title: str, columns, top: int):
    """columns: [(label, wall seconds, {op type: (seconds, kernels)}, executor seconds)]
    -> one markdown table, kernel ms (kernels) by op type, the `top` op types first."""
    total = collections.Counter()
    for _, _, by_type, _ in columns:
        for op_type, (seconds, _) in by_type.items():
            total[op_type] += seconds
    listed = [op_type for op_type, _ in total.most_common(top)]

    def kernels(by_type, op_types):
        seconds = sum(by_type.get(t, (0.0, 0))[0] for t in op_types)
        count = sum(by_type.get(t, (0.0, 0))[1] for t in op_types)
        return f"{seconds * 1e3:,.1f} ({count})"

    rows = [["wall time (best call)", *(f"**{wall * 1e3:,.1f}**" for _, wall, _, _ in columns)]]
    rows += [[op_type, *(kernels(by_type, [op_type]) for _, _, by_type, _ in columns)]
             for op_type in listed]
    rows.append(["other op types", *(kernels(by_type, set(by_type) - set(listed))
                                     for _, _, by_type, _ in columns)])
    rows.append(["all kernels", *(kernels(by_type, by_type) for _, _, by_type, _ in columns)])
    rows.append(["executor outside kernels",
                 *(f"{executor * 1e3:,.1f}" for *_, executor in columns)])
    common.print_table(["op type", *(f"{label}: ms (kernels)" for label, *_ in columns)],
                       rows, title=f"**{title}**")


# What a kernel does in a decode step, by its node's name scope and its op type: the table
# rows of `print_role_table`, in order.
ROLES = ("matmul: self-attention", "matmul: cross-attention", "matmul: feed-forward",
         "matmul: output projection", "matmul: other", "softmax and top-k",
         "beam bookkeeping: gather, concat, select, scatter",
         "attention's other ops (elementwise attention, reshapes)",
         "other ops (norms, residuals, activations, casts, shapes)",
         "outside the loop (tokenizer, encoder, set-up)")
BOOKKEEPING = {"GatherV2", "GatherNd", "ConcatV2", "SelectV2", "Select", "Where",
               "TensorScatterUpdate", "ScatterNd", "Tile"}
SCOPES = (("self_attention", "self-attention"), ("cross_attention", "cross-attention"),
          ("feed_forward", "feed-forward"), ("output_projection", "output projection"))


def role(node: str, op_type: str) -> str:
    """The ROLES row of a kernel of node `node` and type `op_type`."""
    if "/while/" not in f"/{node}":
        return ROLES[-1]
    scope = next((label for name, label in SCOPES if f"/{name}" in f"/{node}"), None)
    if "MatMul" in op_type or op_type == "Einsum":
        return f"matmul: {scope or 'other'}"
    if op_type in ("Softmax", "LogSoftmax", "TopKV2"):
        return "softmax and top-k"
    if op_type in BOOKKEEPING:
        return "beam bookkeeping: gather, concat, select, scatter"
    if scope in ("self-attention", "cross-attention") and "/residual/" not in node:
        return "attention's other ops (elementwise attention, reshapes)"
    return "other ops (norms, residuals, activations, casts, shapes)"


def by_op_type(by_role_and_type):
    """{(role, op type): (seconds, kernels)} -> {op type: (seconds, kernels)}."""
    total = collections.defaultdict(lambda: [0.0, 0])
    for (_, op_type), (seconds, count) in by_role_and_type.items():
        total[op_type][0] += seconds
        total[op_type][1] += count
    return {k: tuple(v) for k, v in total.items()}


def print_role_table(title: str, columns):
    """columns: [(label, wall seconds, {(role, op type): (seconds, kernels)}, executor
    seconds)] -> a table of kernel ms per decode step by role, and each role's share of the
    kernel and executor time inside the loop. Steps: the output projection's kernels."""
    rows, header = [], ["in a decode step"]
    per_column = []
    for label, wall, by_key, executor in columns:
        by_role = collections.defaultdict(float)
        for (name, _), (seconds, _) in by_key.items():
            by_role[name] += seconds
        steps = sum(count for (name, _), (_, count) in by_key.items()
                    if name == "matmul: output projection") or 1
        in_loop = sum(v for k, v in by_role.items() if k != ROLES[-1]) + executor
        per_column.append((by_role, steps, in_loop, executor))
        header.append(f"{label}: ms per step (share of the loop)")
    for name in ROLES[:-1] + ("executor outside kernels (dispatch, loop control)",):
        cells = []
        for by_role, steps, in_loop, executor in per_column:
            seconds = executor if name.startswith("executor") else by_role.get(name, 0.0)
            cells.append(f"{seconds / steps * 1e3:,.2f} ({seconds / max(in_loop, 1e-12):.0%})")
        rows.append([name, *cells])
    rows.append(["steps (output projections run)", *(str(steps) for _, steps, _, _ in per_column)])
    rows.append([ROLES[-1] + ", ms per call",
                 *(f"{by_role.get(ROLES[-1], 0.0) * 1e3:,.1f}" for by_role, *_ in per_column)])
    rows.append(["wall time of the call, ms", *(f"{wall * 1e3:,.1f}" for _, wall, *_ in columns)])
    common.print_table(header, rows, title=f"**{title}**")


# ---------------------------------------------------------------- a training update


def random_batch(batch: int, length: int, vocab_size: int, seed: int = 0):
    """((source_ids, target_input_ids), target_output_ids) int32 [batch, length], the last
    tenth of every row padded."""
    rng = np.random.default_rng(seed)
    ids = rng.integers(4, vocab_size, size=(3, batch, length), dtype=np.int32)
    ids[:, :, length - length // 10:] = 0
    source, target_input, target_output = (tf.constant(x) for x in ids)
    return (source, target_input), target_output


def update_pieces(model: Transformer, batch):
    """{name: tf.function} of the two timed pieces on `batch`."""
    (source_ids, target_input_ids), target_output_ids = batch
    label_smoothing = model.config.label_smoothing

    @tf.function
    def forward():
        return model.packed_logits((source_ids, target_input_ids), training=True)[0]

    @tf.function
    def forward_backward():
        with tf.GradientTape() as tape:
            outputs, packing = model.packed_logits((source_ids, target_input_ids),
                                                   training=True, project=False)
            loss_sum, _, _ = projected_label_smoothed_cross_entropy(
                packing.pack(target_output_ids), outputs, model.embedding.matrix(),
                label_smoothing)
        return tape.gradient(loss_sum, model.trainable_variables)

    return {"forward": forward, "forward + backward": forward_backward}


def measure_training(args):
    """[(label, wall seconds, kernels by op type, executor seconds)] of every precision's
    pieces, and the batch's forward matmul FLOPs."""
    config = TransformerConfig.small(vocab_size=args.vocab_size)
    batch = random_batch(args.batch, args.length, args.vocab_size)
    columns = []
    for precision in args.precisions.split(","):
        keras.utils.set_random_seed(0)
        model = Transformer(config, dtype=precision)
        model.build()
        for name, fn in update_pieces(model, batch).items():
            fn()  # trace, first-call allocations
            wall = common.best_seconds(lambda: tf.nest.map_structure(np.asarray, fn()),
                                       args.repeats)
            columns.append((f"{precision} {name}", wall, *common.kernel_profile(fn)))
    (source_ids, _), target_output_ids = batch
    flops = common.forward_flops(config, args.batch, args.length, args.length,
                                 int(tf.math.count_nonzero(source_ids)),
                                 int(tf.math.count_nonzero(target_output_ids)))
    return columns, flops


def profile_training(args):
    columns, flops = measure_training(args)
    common.print_header([
        ("machine", f"{common.describe()}, load average {common.load_average()} at the end"),
        ("versions", common.versions(f"keras_transformer from "
                                     f"{os.path.dirname(keras_transformer.__file__)}")),
        ("model", f"TransformerConfig.small, vocabulary {args.vocab_size}, batch "
                  f"{args.batch} x {args.length} (source and target), "
                  f"{flops / 1e9:.1f} forward matmul GFLOP"),
        ("command", common.command()),
    ])
    print_op_table(f"one update's pieces, best of {args.repeats} calls", columns, args.top)


# ---------------------------------------------------------------- the exported search


def profile_call(function, texts, repeats: int):
    """(best wall seconds of `repeats` calls, {(role, op type): (kernel seconds, kernels
    run)} of one profiled call, executor seconds outside kernels) for
    function(inputs=texts)."""
    inputs = tf.constant(texts)
    function(inputs=inputs)  # warm-up: thread pools, first-call allocations
    wall = common.best_seconds(lambda: function(inputs=inputs), repeats)
    return (wall, *common.kernel_profile(lambda: function(inputs=inputs),
                                         group=lambda node, op: (role(node, op), op)))


def interleaved(functions, texts, batch_size, rounds):
    """Seconds [rounds, len(functions), batches]: each round translates all of texts in
    batches of batch_size, every function in turn on each batch, the first alternating by
    round (so a drift of the machine's speed falls on both alike)."""
    batches = [tf.constant(texts[i:i + batch_size]) for i in range(0, len(texts), batch_size)]
    for function in functions:
        function(inputs=batches[0])
    seconds = [[[] for _ in functions] for _ in range(rounds)]
    for round_ in range(rounds):
        order = list(range(len(functions)))[::1 if round_ % 2 == 0 else -1]
        for batch in batches:
            for j in order:
                seconds[round_][j].append(common.seconds(lambda: functions[j](inputs=batch)))
    return seconds


def measure_decoding(args, texts):
    """(the batch's profile columns, the single sentence's, seconds of the exports taking
    turns batch by batch, and request by request)."""
    from trainer.serving import saved_model
    exports = [("this", args.saved_model)] + ([("compare", args.compare)] if args.compare
                                              else [])
    batch, single, functions = [], [], []
    for label, path in exports:
        function = saved_model.load(path).signatures["serving_default"]
        functions.append(function)
        batch.append((label, *profile_call(function, texts[:args.batch_size], args.repeats)))
        single.append((label, *profile_call(function, texts[:1], args.repeats)))
    seconds, requests = [], []
    if args.compare:
        seconds = interleaved(functions, texts, args.batch_size, args.rounds)
        requests = interleaved(functions, texts[:args.one_at_a_time], 1, args.rounds + 4)
    return batch, single, seconds, requests


def print_turns_tables(args, sentences: int, seconds, requests):
    ratios = [sum(compare) / sum(this) for this, compare in seconds]
    common.print_table(
        ["round", "this, sentences/s", "compare, sentences/s", "this / compare"],
        [[round_, f"{sentences / sum(this):.1f}", f"{sentences / sum(compare):.1f}",
          f"{ratio:.3f}x"] for round_, ((this, compare), ratio)
         in enumerate(zip(seconds, ratios), 1)]
        + [["median", "", "", f"{statistics.median(ratios):.3f}x"]],
        title=f"**serving_default on all {sentences} sentences in batches of "
              f"{args.batch_size}, the two exports measured in alternation batch by batch**")
    # Each sentence's best and median over the rounds, summed over the sentences.
    per_request = [list(zip(*(round_[j] for round_ in requests))) for j in range(2)]
    best, median = ([sum(map(statistic, times)) for times in per_request]
                    for statistic in (min, statistics.median))
    common.print_table(
        ["each sentence's", "this, ms (sum)", "compare, ms (sum)", "time, this / compare"],
        [[name, f"{this * 1e3:.0f}", f"{compare * 1e3:.0f}", f"{this / compare:.3f}x"]
         for name, (this, compare) in (("best", best), ("median", median))],
        title=f"**serving_default on the first {args.one_at_a_time} sentences one request "
              f"at a time, the two exports measured in alternation request by request, "
              f"{len(requests)} rounds**")


def profile_decoding(args):
    from trainer.serving import saved_model
    common.set_threads(args.threads)
    texts = common.read_lines(args.src)
    batch, single, seconds, requests = measure_decoding(args, texts)
    beam = common.export_options(saved_model.resolve(args.saved_model)).decode.beam_size
    onednn = " ".join(f"{k}={v}" for k, v in sorted(os.environ.items())
                      if k.startswith(("TF_ONEDNN", "TF_ENABLE_ONEDNN")))
    common.print_header([
        ("machine", f"{common.describe()}, load average {common.load_average()} at the end"),
        ("versions", common.versions()),
        ("threads", args.threads or "default"),
        ("oneDNN env", onednn or "-"),
        ("this", args.saved_model),
        ("compare", args.compare or "-"),
        ("command", common.command()),
    ])
    for title, columns in ((f"the first {args.batch_size} test2016 sentences in one call",
                            batch), ("the first test2016 sentence alone", single)):
        print_role_table(f"serving_default, {title}, beam {beam}: kernel time by role",
                         columns)
        print_op_table(f"serving_default, {title}, beam {beam}: kernel time by op type",
                       [(label, wall, by_op_type(by_key), executor)
                        for label, wall, by_key, executor in columns], args.top)
    if args.compare:
        print_turns_tables(args, len(texts), seconds, requests)


# ---------------------------------------------------------------- main


def parse_args(argv):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    mode = parser.add_mutually_exclusive_group(required=True)
    mode.add_argument("--training", action="store_true", help="a training update's pieces")
    mode.add_argument("--decoding", action="store_true", help="an export's serving_default")
    mode.add_argument("--nodes", action="store_true", help="the node counts of each while "
                      "loop's body in an export's serving_default (and --compare's), not "
                      "timed")
    parser.add_argument("--repeats", type=int, default=None,
                        help="timed calls, the best kept (default 5, --decoding 3)")
    parser.add_argument("--top", type=int, default=None,
                        help="op types listed (default 25, --decoding 14)")
    training = parser.add_argument_group("--training")
    training.add_argument("--precisions", default="float32,mixed_bfloat16")
    training.add_argument("--batch", type=int, default=128)
    training.add_argument("--length", type=int, default=32)
    training.add_argument("--vocab_size", type=int, default=8000)
    decoding = parser.add_argument_group("--decoding and --nodes")
    decoding.add_argument("--saved_model", help="the export (a version directory)")
    decoding.add_argument("--compare", help="a second export version directory, profiled "
                          "or counted in the same run (e.g. the previous code's export)")
    decoding.add_argument("--src", default=str(common.MULTI30K / "test2016.en"))
    decoding.add_argument("--batch_size", type=int, default=64)
    decoding.add_argument("--rounds", type=int, default=4, help="with --compare: passes "
                          "over --src, the two exports taking turns batch by batch, the "
                          "first alternating by round; even, since the export that goes "
                          "second on a batch runs some 5%% faster on the EPYC")
    decoding.add_argument("--one_at_a_time", type=int, default=40, help="with --compare: "
                          "the first this many sentences also one request at a time, the "
                          "two exports taking turns request by request for --rounds + 4 "
                          "rounds (one sentence's latency, which a best-of-3 on one "
                          "sentence leaves to the machine's drift)")
    decoding.add_argument("--threads", type=int, default=0, help="TensorFlow's intra- and "
                          "inter-op threads (0: one per core)")
    results_file.add_results_flag(parser, None)
    args = parser.parse_args(argv)
    if args.results is None:  # the default: what is profiled
        args.results = (f"decoding-{args.threads or 'default'}-threads" if args.decoding
                        else "nodes" if args.nodes else "training")
    if (args.decoding or args.nodes) and not args.saved_model:
        parser.error(f"--{'decoding' if args.decoding else 'nodes'} needs --saved_model")
    if args.rounds < 2 or args.rounds % 2:
        parser.error(f"--rounds must be even (got {args.rounds}): each export goes first in "
                     "half of them")
    args.repeats = args.repeats or (3 if args.decoding else 5)
    args.top = args.top or (14 if args.decoding else 25)
    return args


def main(argv=None):
    args = parse_args(argv)
    if args.training:
        profile_training(args)
        setting = (f"a training update's pieces, batch {args.batch} x {args.length}, "
                   f"{args.precisions}")
    elif args.nodes:
        graph_nodes.count_nodes(args)
        setting = (f"serving_default's while-loop node counts of {args.saved_model}"
                   + (f" and {args.compare}" if args.compare else ""))
    else:
        profile_decoding(args)
        setting = (f"serving_default of {args.saved_model}, batches of {args.batch_size}, "
                   f"{args.threads or 'default'} threads")
    results_file.write_results("profiling", args.results, common.in_repository(setting))


if __name__ == "__main__":
    common.timed_main(main)
