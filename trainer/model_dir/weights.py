"""Which weights leave a model directory for serving: the latest checkpoint's, the mean
of the last checkpoints (section 6.1), or the moving average a run kept
(`--export_weights`, `--average_last`)."""

import dataclasses
from typing import Callable, List, Optional, Tuple

from keras_transformer import Transformer
from trainer.model_dir import averaging, best, ema, layout

KINDS = ("last", "average", "ema", "best")


@dataclasses.dataclass(frozen=True)
class WeightsChoice:
    """What an export ships.

    Attributes:
      export_weights: one of KINDS: "last", the latest checkpoint's weights; "average",
        the mean of the last `average_last` checkpoints; "ema", the moving average of the
        weights kept in the latest checkpoint (a run with --ema_decay); "best", the
        checkpoint of the best validation score (a run with --keep_best). None: "average"
        when average_last is set, else "last".
      average_last: checkpoints to average (section 6.1: 5 for base, 20 for big).
    """

    export_weights: Optional[str] = None
    average_last: int = 0

    def __post_init__(self):
        if self.export_weights not in (None,) + KINDS:
            raise ValueError(f"unknown weights {self.export_weights!r}; choose one of "
                             f"{', '.join(KINDS)}")
        if self.average_last < 0:
            raise ValueError(f"average_last must not be negative, got {self.average_last}")
        if self.kind == "average" and not self.average_last:
            raise ValueError("averaging needs the number of checkpoints: --average_last=N")

    @property
    def kind(self) -> str:
        """The weights shipped, the default resolved: one of KINDS."""
        return self.export_weights or ("average" if self.average_last else "last")


def final_model(model_dir: str, choice: WeightsChoice = WeightsChoice(),
                warn: Callable[[str], None] = layout.warn_on_stderr
                ) -> Tuple[Transformer, List[str]]:
    """(the float32 model to ship from model_dir, the checkpoint prefixes it comes
    from). Damaged checkpoints are passed over with a `warn` line each."""
    if choice.kind == "average":
        return averaging.average_checkpoints(model_dir, choice.average_last, warn)
    if choice.kind == "best":
        path = best.checkpoint(model_dir)
        if path is None:
            raise FileNotFoundError(f"no best checkpoint in {model_dir}/{best.DIRECTORY}: "
                                    "train with --keep_best")
        return layout.restore_model(model_dir, path), [path]
    path = layout.intact_checkpoints(model_dir, warn=warn)[-1]
    model = layout.restore_model(model_dir, path)
    if choice.kind == "ema":
        ema.load_into(model, path)
    return model, [path]
