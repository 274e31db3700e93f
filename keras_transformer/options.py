"""The search's options, each declared once: its type, its range, whether a request may
set it, which searches read it, and its help text.

`DecodeConfig` (keras_transformer.config) declares each of its fields with `option(...)`;
everything else about an option comes from that declaration: its Python check
(`Option.check`, run by DecodeConfig), its check per row inside a graph
(`Option.check_rows`, run by an export's signatures on a request's values), a signature's
input spec (`Option.dtype`), the flags of the programs (trainer/search_flags.py) and the
table of options in docs/serving.md. A new option is a field of DecodeConfig declared
here, the code that uses it, and its test.

A range names its bounds: numbers, or the name of another option or of a serving limit
(`num_hypotheses` in [1, beam_size], `beam_size` in [1, max_beam_size]); a caller gives
the values of named bounds (`bounds`), and a named bound nobody gives is not checked.

Example: the declaration of beam_size, its Python check and its check per row.

>>> import tensorflow as tf
>>> from keras_transformer.config import OPTIONS
>>> beam_size = next(o for o in OPTIONS if o.name == "beam_size")
>>> beam_size.kind, beam_size.tf_dtype, beam_size.range_text({"max_beam_size": 8})
(<class 'int'>, 'int32', '[1, 8]')
>>> beam_size.check(12, {"max_beam_size": 8})
Traceback (most recent call last):
ValueError: beam_size must be in [1, 8], got 12
>>> ok, message = beam_size.check_rows(tf.constant([4, 12]), {"max_beam_size": 8})
>>> ok.numpy().tolist(), message.numpy()[1].decode()
([True, False], 'beam_size must be in [1, 8], got 12')
"""

import dataclasses
import math
from typing import Any, Mapping, Optional, Tuple, Union

# Which searches read an option: beam search (the translate_with_options signature) and
# sampling (the sample signature).
BEAM, SAMPLE = "beam", "sample"
_DTYPES = {int: "int32", float: "float32", str: "string"}

Bound = Union[None, int, float, str]


@dataclasses.dataclass(frozen=True)
class Option:
    """One option of the search.

    Attributes:
      kind: int, float or str, its Python type.
      help: what it does, one or two sentences, for flags and docs.
      low, high: its range; a number, a name of another option or serving limit, or None
        (unbounded). low_open: the range excludes low ("(0.0, inf)").
      choices: a str option's allowed values.
      optional: None is allowed (the option is then off or takes another's value).
      request: a request may set it, per sentence (an export's signature input).
      searches: which searches read it (BEAM, SAMPLE).
      dtype: the signature input's dtype, when not int32 / float32 / string.
      name: the field's name (set by DecodeConfig).
    """

    kind: type
    help: str
    low: Bound = None
    high: Bound = None
    low_open: bool = False
    choices: Optional[Tuple[str, ...]] = None
    optional: bool = False
    request: bool = False
    searches: Tuple[str, ...] = (BEAM, SAMPLE)
    dtype: Optional[str] = None
    name: str = ""

    @property
    def tf_dtype(self) -> str:
        """The dtype of its signature input: int32, int64, float32 or string."""
        return self.dtype or _DTYPES[self.kind]

    def range_text(self, bounds: Mapping[str, Any] = None, named=()) -> str:
        """Its range as the errors write it: "[1, 8]", "(0.0, inf)", "[1, beam_size=4]",
        or "one of exact, transformers, first". bounds: the values of named bounds;
        named: the bounds written with their name (another option's: a request's)."""
        if self.choices is not None:
            return "one of " + ", ".join(self.choices)

        opening = "(" if self.low_open or self.low is None else "["
        closing = ")" if self.high is None else "]"
        return (f"{opening}{_bound_text(self.low, '-inf', bounds, named)}, "
                f"{_bound_text(self.high, 'inf', bounds, named)}{closing}")

    def message(self, value_text: str, range_text: str) -> str:
        """The one-line error of a value out of its range."""
        if self.choices is not None:
            return f"{self.name} must be {range_text}, got {value_text}"
        return f"{self.name} must be in {range_text}, got {value_text}"

    def check(self, value, bounds: Mapping[str, Any] = None, named=()) -> None:
        """Raises ValueError naming the option, its range and `value` when a Python value
        lies outside it (tensors are left to `check_rows`); bounds and named: as
        `range_text`."""
        bounds = bounds or {}
        if not _is_python(value) or (value is None and self.optional):
            return
        if value is None or not isinstance(value, (self.kind, int) if self.kind is float
                                           else self.kind) or isinstance(value, bool):
            raise ValueError(f"{self.name} must be a {self.kind.__name__}, got {value!r}")
        if self.choices is not None:
            if value not in self.choices:
                raise ValueError(self.message(repr(value), self.range_text()))
            return
        low, high = (bounds.get(b, None) if isinstance(b, str) else b
                     for b in (self.low, self.high))
        within = math.isfinite(value) if self.kind is float else True
        if _is_python(low) and low is not None:
            within &= value > low if self.low_open else value >= low
        if _is_python(high) and high is not None:
            within &= value <= high
        if not within:
            raise ValueError(self.message(_text(value), self.range_text(bounds, named)))

    def check_rows(self, values, bounds: Mapping[str, Any] = None, named=()):
        """(ok bool [batch], message tf.string [batch]) for a request's values [batch]
        inside a graph: which rows lie in the range (bounds: Python values or tensors
        [batch]), and each row's error as `check` words it."""
        import tensorflow as tf

        bounds = bounds or {}
        if self.choices is not None:
            ok = tf.reduce_any(tf.equal(values[:, None], tf.constant(self.choices)[None]), 1)
            return ok, tf.strings.join([self.message("", self.range_text()), values])
        ok = tf.ones_like(values, tf.bool)
        if values.dtype.is_floating:
            ok &= tf.math.is_finite(values)
        for bound, compare in ((self.low, tf.greater if self.low_open else tf.greater_equal),
                               (self.high, tf.less_equal)):
            if isinstance(bound, str):
                if bound not in bounds:
                    continue
                bound = bounds[bound]
            if bound is not None:
                ok &= compare(values, tf.cast(bound, values.dtype))
        range_text = self._range_rows(bounds, named)
        text = tf.strings.as_string(values, shortest=True) if values.dtype.is_floating \
            else tf.strings.as_string(values)
        return ok, tf.strings.join([f"{self.name} must be in ", range_text, ", got ", text])

    def _range_rows(self, bounds, named):
        """The range's text per row, tf.string [batch] or a scalar, where a bound is a
        tensor [batch] (another option's per-row values)."""
        import tensorflow as tf

        tensors = {name: value for name, value in bounds.items() if tf.is_tensor(value)}
        if not any(b in tensors for b in (self.low, self.high)):
            return self.range_text(bounds, named)
        parts = []
        for bound, infinite in ((self.low, "-inf"), (self.high, "inf")):
            if bound in tensors:
                prefix = f"{bound}=" if bound in named else ""
                parts.append(tf.strings.join([prefix, tf.strings.as_string(tensors[bound])]))
            else:
                parts.append(_bound_text(bound, infinite, bounds, named))
        opening = "(" if self.low_open or self.low is None else "["
        closing = ")" if self.high is None else "]"
        return tf.strings.join([opening, parts[0], ", ", parts[1], closing])


def option(default, kind: type, help: str, **declaration):
    """A dataclass field of `default` declared as an Option (its name: the field's)."""
    return dataclasses.field(default=default,
                             metadata={"option": Option(kind, help, **declaration)})


def options_of(cls) -> Tuple[Option, ...]:
    """The Options declared by dataclass `cls`'s fields, in field order, named."""
    return tuple(dataclasses.replace(f.metadata["option"], name=f.name)
                 for f in dataclasses.fields(cls) if "option" in f.metadata)


def check_fields(config, bounds: Mapping[str, Any] = None) -> None:
    """Checks every declared field of dataclass `config` against its range, with `bounds`
    the values of named bounds (a bound another field names is checked where both meet:
    num_hypotheses <= beam_size by beam search); raises ValueError for the first out of
    its range."""
    for declared in options_of(type(config)):
        declared.check(getattr(config, declared.name), bounds)


def _bound_text(bound, infinite, bounds, named) -> str:
    """One end of a range as the errors write it: a number, a named bound's value (as
    name=value when it is in `named`), or `infinite` for none."""
    if bound is None:
        return infinite
    if isinstance(bound, str):
        if bounds is None or bound not in bounds:
            return bound
        value = _text(bounds[bound])
        return f"{bound}={value}" if bound in named else value
    return str(bound)


def _is_python(value) -> bool:
    return value is None or isinstance(value, (bool, int, float, str))


def _text(value) -> str:
    """A value as the errors write it: 12, 1.5, inf, nan; a string as is."""
    if isinstance(value, float):
        return f"{value:g}"
    return str(value)
