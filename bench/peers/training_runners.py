"""Ours and the peers training on one pool of real Multi30k batches, taking turns update by
update, as bench/training.py --peers runs them: our Trainer on the pool (`Ours`, fed by
`PoolData`), keras-hub's and torch's runners (keras_hub_transformer.py,
torch_transformer.py), one untimed pass each, then timed passes with each update on the
same batch in turn (`take_turns`), and each one's pieces of one update on one batch; one
`Row` per implementation and precision (`run_pool`). A library for bench/training.py;
nothing here is run.
"""

import dataclasses
import os
import statistics
import sys
import tempfile
import time
from typing import List

import keras
import tensorflow as tf

from trainer.data import input_pipeline
from trainer.training.loop import Trainer

import common
from peers import Batch
from peers.our_trainer import our_trainer


@dataclasses.dataclass(frozen=True)
class PoolData(input_pipeline.Data):
    """The trainer's Data whose training stream repeats the pool (no pipeline threads
    compete with the step for the 2 cores)."""

    pool: tuple = ()

    def train_dataset(self, input_context=None, num_epochs=None):
        datasets = [tf.data.Dataset.from_tensors(((b.source_ids, b.target_input_ids),
                                                  b.target_output_ids)) for b in self.pool]
        dataset = datasets[0]
        for other in datasets[1:]:
            dataset = dataset.concatenate(other)  # shapes differ: the spec becomes [None, None]
        return dataset.repeat(num_epochs)


class Ours:
    """trainer.training.loop.Trainer on the pool: one update = accumulate + apply, as in
    training (the peers' runner protocol, bench/peers/__init__.py)."""

    name = "ours"

    def __init__(self, trainer: Trainer):
        self.trainer = trainer
        self.params = trainer.model.count_params()

    def update(self) -> float:
        self.trainer.update.accumulate(self.trainer.stream.next())
        return float(self.trainer.update.apply().loss)

    def pieces(self, batch: Batch):
        t, update = self.trainer, self.trainer.update
        source, target_in, target_out = (tf.constant(x) for x in dataclasses.astuple(batch))
        cached = iter(t.strategy.distribute_datasets_from_function(
            lambda _: tf.data.Dataset.from_tensors(((source, target_in), target_out)).repeat()))
        forward = tf.function(lambda s, t_in: t.model.packed_logits((s, t_in), training=True)[0])
        return {
            "forward": lambda: forward(source, target_in).numpy(),
            "forward + backward": lambda: [g.numpy() for g in update.gradients(
                source, target_in, target_out)[0][:1]],
            "optimizer": lambda: update.apply().loss.numpy(),
            "update": lambda: (update.accumulate(next(cached)), update.apply().loss.numpy()),
        }


@dataclasses.dataclass
class Row:
    """One implementation in one precision: totals over its timed updates."""

    precision: str
    name: str
    params: int
    seconds: float = 0.0
    updates: int = 0
    real_tokens: int = 0
    padded_tokens: int = 0
    flops: int = 0
    first_loss: float = float("nan")
    last_pass_loss: float = float("nan")
    peak: float = 0.0      # the machine's: the best of TF's and torch's over the run
    own_peak: float = 0.0  # the best of the implementation's framework over the run
    pieces: dict = dataclasses.field(default_factory=dict)

    @property
    def mfu(self) -> float:
        return self.flops / self.seconds / 1e9 / self.peak

    @property
    def own_mfu(self) -> float:
        return self.flops / self.seconds / 1e9 / self.own_peak


def build_pool(data: input_pipeline.Data, size: int) -> PoolData:
    """`data` whose training stream repeats its first `size` training batches, which
    its `pool` holds as Batch."""
    pool = tuple(Batch(source_ids.numpy(), target_input_ids.numpy(), target_output_ids.numpy())
                 for (source_ids, target_input_ids), target_output_ids
                 in data.train_dataset().take(size))
    return PoolData(**{f.name: getattr(data, f.name)
                       for f in dataclasses.fields(input_pipeline.Data)}, pool=pool)


def runners(names, config, precision, pool_data: PoolData, args, model_dir):
    """The implementations `names` on the pool, in that order."""
    paper = args.peer_dropout == "paper"
    made = []
    for name in names:
        if name == "ours":
            keras.utils.set_random_seed(0)
            made.append(Ours(our_trainer(config, pool_data, precision, args, model_dir)))
        elif name.startswith("keras-hub"):
            from peers.keras_hub_transformer import KerasHubTrainer
            made.append(KerasHubTrainer(config, precision, pool_data.pool,
                                        args.schedule_warmup_steps, 0.0 if paper else None,
                                        jit_compile=name.endswith("-xla")))
        else:
            from peers.torch_transformer import TorchTrainer
            made.append(TorchTrainer(config, precision, pool_data.pool,
                                     args.schedule_warmup_steps, paper,
                                     compile=name.endswith("-compile")))
    return made


def take_turns(impls, table: List[Row], pool, passes: int, config):
    """An untimed pass each, then `passes` timed passes over the pool, the
    implementations taking turns on every batch; totals into `table`."""
    for impl, row in zip(impls, table):  # untimed: tracing, every shape once
        row.first_loss = [impl.update() for _ in pool][0]
    for _ in range(passes):
        losses = [[] for _ in impls]
        for batch in pool:
            for impl, row, row_losses in zip(impls, table, losses):
                start = time.perf_counter()
                row_losses.append(impl.update())
                row.seconds += time.perf_counter() - start
                row.updates += 1
                row.real_tokens += batch.real_tokens
                row.padded_tokens += batch.padded_tokens
                row.flops += batch.flops(config)
        for row, row_losses in zip(table, losses):
            row.last_pass_loss = statistics.mean(row_losses)



def run_pool(args, config, precision: str, pool_data: PoolData, probe: Batch,
             loads: List[float]) -> List[Row]:
    """args.implementations on the pool in `precision`: an untimed pass each, then
    args.passes timed passes taking turns, then (args.breakdown_reps) each one's pieces of
    one update on `probe`; the 1-min load average before and after the timed passes into
    `loads`. args: bench/training.py's."""
    with tempfile.TemporaryDirectory() as model_dir:
        impls = runners(args.implementations, config, precision, pool_data, args, model_dir)
        table = [Row(precision, impl.name, impl.params) for impl in impls]
        loads.append(os.getloadavg()[0])
        take_turns(impls, table, pool_data.pool, args.passes, config)
        loads.append(os.getloadavg()[0])
        for impl, row in zip(impls, table):
            if args.breakdown_reps:
                row.pieces = {piece: 1000 * common.median_seconds(fn, args.breakdown_reps)
                              for piece, fn in impl.pieces(probe).items()}
        del impls
    return table


def peer_versions() -> List[str]:
    """The versions of the peers' packages this run imported."""
    found = []
    if "keras_hub" in sys.modules:
        found.append(f"keras-hub {sys.modules['keras_hub'].__version__}")
    if "torch" in sys.modules:
        torch = sys.modules["torch"]
        found.append(f"torch {torch.__version__} ({torch.get_num_threads()} threads)")
    return found
