"""The peers: the paper's Transformer as keras-hub layers (`keras_hub_transformer.py`) and
as torch.nn.Transformer (`torch_transformer.py`), with this project's architecture, and a
training runner for each; and how bench/training.py and bench/decoding.py run them beside
ours: our Trainer alone (`our_trainer.py`), ours and the peers training on one pool taking
turns (`training_runners.py`), decoding in-process (`decoding_runners.py`) and our
SavedModel and CTranslate2 each in a worker process (`decoding_workers.py`), and which of
those processes the race against CTranslate2 runs and what tables they make
(`ctranslate2_race.py`). A library;
nothing here is run.

What is matched: N=3, d_model 256, d_ff 1024, 4 heads (TransformerConfig.small), post-norm,
ReLU, sinusoidal positions, embeddings scaled by sqrt(d_model), one matrix for source and
target embeddings and the pre-softmax projection, dropout on embeddings and every sublayer
output, label smoothing over non-pad targets, Adam(0.9, 0.98, 1e-9) on the warm-up schedule
lr = d^-0.5 min(s^-0.5, s w^-1.5). With the paper's dropout sites, the peers' dropout on
attention weights (keras-hub's and torch's `dropout` also apply there) and torch's dropout
inside the FFN are 0, so every model drops out where the paper (section 5.4) and ours do.
torch.nn.Transformer's extra final encoder/decoder LayerNorms are removed (the paper's
post-norm stack has none, nor have ours and keras-hub's).

A runner does one update per call on its own copy of the pool's batches, in the pool's
order: `name`, `params`, `update() -> loss` and `pieces(batch) -> {piece: fn}` (the parts
of one update on one batch, for the breakdown).

torch and keras-hub are installed for the benchmarks only, not as dependencies of the
project:

  pip install torch==2.13.0          # the local CPU wheel; no other version (CUDA: GBs)
  pip install keras-hub --dry-run    # must not change keras / tensorflow / tensorflow-text
  pip install keras-hub --no-deps && pip install tokenizers --no-deps
"""

import dataclasses

import numpy as np

from common import update_flops

MODULES = ("keras_hub", "torch")  # what the peers import


@dataclasses.dataclass(frozen=True)
class Batch:
    """One training batch of the pool, as numpy."""

    source_ids: np.ndarray         # int32 [batch, length]
    target_input_ids: np.ndarray   # int32 [batch, length]
    target_output_ids: np.ndarray  # int32 [batch, length]

    @property
    def shape(self):
        return self.source_ids.shape

    @property
    def real_tokens(self) -> int:
        return int(np.count_nonzero(self.source_ids) + np.count_nonzero(self.target_output_ids))

    @property
    def padded_tokens(self) -> int:
        return self.source_ids.size + self.target_output_ids.size

    def flops(self, config) -> int:
        return update_flops(config, self.shape[0], self.shape[1], self.target_output_ids.shape[1],
                            np.count_nonzero(self.source_ids),
                            np.count_nonzero(self.target_output_ids))
