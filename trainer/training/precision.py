"""The precision a run trains in (`--precision`): given, recorded, or measured.

On a CPU, `auto` (the default) times the model's own forward and backward pass
(`Updater.gradients`, the function training runs) on batches of the run's own data in
float32 and in mixed_bfloat16, taking turns, and keeps the faster: no CPU flag predicts it
(an Intel Xeon with AVX-512 BF16 and no AMX trains at 0.65x float32 in bfloat16, an AMD EPYC
with the same flag faster than float32). On GPUs a rule holds (`gpu_precision`).

The chief records the choice in the model directory (`RECORD`), and a resumed run keeps it:
one run never changes precision halfway. An explicit precision always wins, and is recorded
in turn. With several workers, the chief chooses and every worker trains in its choice.
"""

import dataclasses
import functools
import json
import os
import statistics
import time
from typing import Callable, Dict, List, Optional

import tensorflow as tf

from keras_transformer import Transformer, TransformerConfig
from trainer.config import AUTO_PRECISION, PRECISIONS, RunConfig
from trainer.model_dir import files, layout
from trainer.training import distribute

RECORD = layout.PRECISION_FILE
# What `auto` times on a CPU, and the budget of the measurement, tracing included.
CANDIDATES = ("float32", "mixed_bfloat16")
BUDGET_SECONDS = 60.0
# bfloat16 is the less exact: it must be this much faster than float32 to be chosen.
MARGIN = 1.05
# Batches of the run's data timed per precision and round; rounds at most.
BATCHES = 3
ROUNDS = 6


@dataclasses.dataclass(frozen=True)
class Choice:
    """A run's precision and how it was chosen.

    Attributes:
      precision: one of PRECISIONS.
      chosen_by: "flag", "measured", "recorded" (a resumed run: the record's) or "gpu".
      rates: measured tokens/s (source + target) of each candidate, {} unless measured.
      seconds: the measurement's wall time, tracing included (0 unless measured).
    """

    precision: str
    chosen_by: str
    rates: Dict[str, float] = dataclasses.field(default_factory=dict)
    seconds: float = 0.0

    def describe(self) -> str:
        """The line a run prints, e.g. "precision: float32 (1.53x mixed_bfloat16 on this
        CPU: 5,938 against 3,893 tokens/s, measured in 41 s; --precision= to choose)"."""
        how = {"flag": "--precision", "gpu": "on GPUs; --precision= to choose",
               "chief": "the chief's", "recorded": f"recorded in {RECORD} when the run "
               "started; --precision= to choose"}
        if not self.rates:
            return f"precision: {self.precision} ({how[self.chosen_by]})"
        other, = (p for p in self.rates if p != self.precision)
        ratio = self.rates[self.precision] / self.rates[other]
        if ratio >= 1.0:
            speed = f"{ratio:.2f}x {other}"
        else:  # float32 kept within the margin
            speed = (f"{other} {1 / ratio:.2f}x it, under the {MARGIN:.2f}x bfloat16 needs "
                     "to be chosen")
        rates = " against ".join(f"{self.rates[p]:,.0f}" for p in (self.precision, other))
        when = ("measured" if self.chosen_by == "measured"
                else f"recorded in {RECORD} when the run started, measured")
        return (f"precision: {self.precision} ({speed} on this CPU: {rates} tokens/s, "
                f"{when} in {self.seconds:.0f} s; --precision= to choose)")

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)


def gpu_precision() -> str:
    """mixed_float16 on GPUs with tensor cores (compute capability 7.0 and newer), else
    float32. A rule, not a measurement: tensor cores run float16 matmuls at 8-16x their
    float32 rate (V100, A100, H100), far beyond any error of a rule, and a GPU without them
    has no float16 matmul units to gain from."""
    for gpu in tf.config.list_physical_devices("GPU"):
        capability = tf.config.experimental.get_device_details(gpu).get("compute_capability")
        if capability is None or tuple(capability) < (7, 0):
            return "float32"
    return "mixed_float16"


def bfloat16_instructions() -> bool:
    """Whether the CPU lists bfloat16 matmul instructions (AVX-512 BF16 or AMX), for tests
    that skip bfloat16 cases without them. Not a speed: `choose` measures that."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            flags = f.read()
    except OSError:
        return False
    return "avx512_bf16" in flags or "amx_bf16" in flags


def read_record(model_dir: str) -> Optional[Choice]:
    """The Choice recorded in model_dir (None when there is none)."""
    path = os.path.join(model_dir, RECORD)
    if not tf.io.gfile.exists(path):
        return None
    with tf.io.gfile.GFile(path) as f:
        saved = json.load(f)
    return Choice(saved["precision"], "recorded", saved.get("rates", {}),
                  saved.get("seconds", 0.0))


def write_record(model_dir: str, choice: Choice):
    tf.io.gfile.makedirs(model_dir)
    files.write_atomically(os.path.join(model_dir, RECORD),
                           json.dumps(choice.to_dict(), indent=2))


def measure(model_config: TransformerConfig, batches: List, run: RunConfig,
            budget: float = BUDGET_SECONDS, rounds: int = ROUNDS) -> Dict[str, float]:
    """Tokens/s (source + target, padding not counted) of the forward and backward pass of
    each of CANDIDATES on `batches` ([((source_ids, target_input_ids), target_output_ids)],
    int32 [batch, length] each), in the run's jit_compile mode.

    Each precision first runs every batch untimed (tracing, the kernels' first shapes);
    then rounds time one pass over the batches each, the first to go alternating, while
    the next round fits in `budget` seconds from the call (at least one round)."""
    from trainer.training.update import Updater, make_optimizer  # the room's own update
    start = time.perf_counter()
    gradients = {}
    for precision in CANDIDATES:
        model = Transformer(model_config, dtype=precision)
        model.build()
        single = dataclasses.replace(run, precision=precision, num_cpu_replicas=0)
        update = Updater(model, make_optimizer(model_config, single),
                         tf.distribute.get_strategy(), single)
        gradients[precision] = update.gradients
        _pass(update.gradients, batches)
    tokens = sum(float(tf.math.count_nonzero(source) + tf.math.count_nonzero(target))
                 for (source, _), target in batches)
    times = {precision: [] for precision in CANDIDATES}
    for turn in range(rounds):
        order = CANDIDATES if turn % 2 == 0 else CANDIDATES[::-1]
        for precision in order:
            times[precision].append(_pass(gradients[precision], batches))
        spent = time.perf_counter() - start
        if spent + sum(t[-1] for t in times.values()) > budget:
            break
    return {precision: tokens / statistics.median(seconds)
            for precision, seconds in times.items()}


def _pass(gradients: Callable, batches: List) -> float:
    """Seconds of one forward and backward pass over `batches`."""
    start = time.perf_counter()
    for (source, target_input), target_output in batches:
        _, totals = gradients(source, target_input, target_output)
        totals.loss_sum.numpy()
    return time.perf_counter() - start


def faster(rates: Dict[str, float]) -> str:
    """mixed_bfloat16 when it is at least MARGIN times float32's rate, else float32."""
    return ("mixed_bfloat16" if rates["mixed_bfloat16"] >= MARGIN * rates["float32"]
            else "float32")


def measured_choice(model_config: TransformerConfig, data, run: RunConfig) -> Choice:
    """The faster precision (`faster`) on the first BATCHES batches of `data`'s training
    stream (`measure`), with the rates and the seconds it took."""
    start = time.perf_counter()
    rates = measure(model_config, list(data.train_dataset().take(BATCHES)), run)
    return Choice(faster(rates), "measured", rates, time.perf_counter() - start)


def choose(model_config: TransformerConfig, data, run: RunConfig, strategy,
           log: Callable[[str], None] = print) -> Choice:
    """The run's precision: run.precision if given; with AUTO_PRECISION, the model
    directory's record (a resumed run), else `gpu_precision` on GPUs, else
    `measured_choice`. The chief records it; with several workers every worker returns
    the chief's. Logs the choice's line."""
    if run.precision != AUTO_PRECISION:
        choice = Choice(run.precision, "flag")
    elif not distribute.is_chief():
        choice = Choice(_chief_to_all(strategy, None), "chief")
    else:
        choice = read_record(run.model_dir)
        if choice is None and tf.config.list_physical_devices("GPU"):
            choice = Choice(gpu_precision(), "gpu")
        elif choice is None:
            log(f"precision: timing float32 against mixed_bfloat16 on this CPU "
                f"(at most {BUDGET_SECONDS:.0f} s; --precision= skips it)")
            choice = measured_choice(model_config, data, run)
        if distribute.cluster_workers() > 1:
            _chief_to_all(strategy, choice.precision)
    if distribute.is_chief() and choice.chosen_by != "recorded":
        write_record(run.model_dir, choice)
    log(choice.describe())
    return choice


def _chief_to_all(strategy: tf.distribute.Strategy, precision: Optional[str]) -> str:
    """The chief's `precision` on every worker (one all-reduce; the others pass None)."""
    code = PRECISIONS.index(precision) + 1 if precision else 0

    @functools.partial(tf.function, autograph=False)
    def broadcast():
        def replica_fn():
            context = tf.distribute.get_replica_context()
            mine = tf.where(tf.equal(context.replica_id_in_sync_group, 0), code, 0)
            return context.all_reduce(tf.distribute.ReduceOp.SUM, mine)
        return strategy.experimental_local_results(strategy.run(replica_fn))[0]

    return PRECISIONS[int(broadcast().numpy()) - 1]
