"""What an export allows a request, apart from how the library searches
(keras_transformer.config.DecodeConfig): the bounds of the option signatures' inputs that
bound a request's work and output. Declared as the search's options are
(keras_transformer.options), without TensorFlow, so that trainer.export defines its flags
before TensorFlow starts.

Example:

>>> from trainer.serving.limits import ServingLimits
>>> ServingLimits.from_dict({"beam_size": 4, "max_beam_size": 6})
ServingLimits(max_beam_size=6)
"""

import dataclasses

from keras_transformer.options import check_fields, option, options_of


@dataclasses.dataclass(frozen=True)
class ServingLimits:
    """What an export allows a request, apart from how the library searches: the bounds
    of its options that bound a request's work and output."""

    max_beam_size: int = option(
        8, int, "The largest beam_size (and number of samples) a request may ask of the "
        "translate_with_options and sample signatures.", low=1)

    def __post_init__(self):
        check_fields(self)

    @classmethod
    def from_dict(cls, fields: dict) -> "ServingLimits":
        """The limits among `fields` (an export's export.json, a model directory's
        decode settings); the others are ignored, missing ones take their defaults."""
        names = {field.name for field in dataclasses.fields(cls)}
        return cls(**{k: v for k, v in fields.items() if k in names})


LIMITS = options_of(ServingLimits)
