"""The learning-rate schedule of the paper (section 5.3)."""

import keras
from keras import ops


@keras.saving.register_keras_serializable(package="keras_transformer")
class WarmupSchedule(keras.optimizers.schedules.LearningRateSchedule):
    """lrate = scale * d_model^-0.5 * min(step^-0.5, step * warmup_steps^-1.5).

    Linear warm-up for `warmup_steps`, then decay with the inverse square root of the
    step. Keras optimizers call the schedule with the number of updates already applied,
    which starts at 0; step 0 is treated as step 1 so the formula stays finite.

    Args:
      d_model: model width.
      warmup_steps: linear warm-up length. Defaults to 4000, the paper's.
      scale: multiplies the whole schedule. Defaults to 1.0, the paper's.

    Example:

    >>> import keras
    >>> from keras_transformer import WarmupSchedule
    >>> schedule = WarmupSchedule(d_model=512, warmup_steps=4000)
    >>> round(float(schedule(4000)), 6)  # the peak: 512^-0.5 * 4000^-0.5
    0.000699
    >>> optimizer = keras.optimizers.Adam(schedule, beta_1=0.9, beta_2=0.98, epsilon=1e-9)
    """

    def __init__(self, d_model, warmup_steps=4000, scale=1.0):
        self.d_model = d_model
        self.warmup_steps = warmup_steps
        self.scale = scale

    def __call__(self, step):
        step = ops.maximum(ops.cast(step, "float32"), 1.0)
        return (self.scale * self.d_model ** -0.5
                * ops.minimum(ops.rsqrt(step), step * self.warmup_steps ** -1.5))

    def get_config(self):
        return {"d_model": self.d_model, "warmup_steps": self.warmup_steps, "scale": self.scale}
