"""The programs' search flags, made from the options' declarations
(keras_transformer.options): one flag per option a program offers, of the option's kind
(int: an integer flag, float: a number, str: an enum of its choices), with the
declaration's help and range, framed for the program.

trainer.task, trainer.export and trainer.translate each name the options they offer
(`pick`), their defaults (a DecodeConfig or ServingLimits, or None: unset) and how their
help reads (a prefix such as "SavedModel: ", what an unset flag means); a new option
declared in DecodeConfig reaches a program's flags by its name in that program's list.
The flags are the calling program's (absl lists them under its --help), not this module's.
"""

from typing import Any, Dict, Mapping, Optional, Sequence, Tuple

from absl import flags

from keras_transformer.options import Option

# The flags `define` makes belong to the module that calls it: its --help lists them.
flags.disclaim_key_flags()

_DEFINE = {int: flags.DEFINE_integer, float: flags.DEFINE_float}


def pick(declared: Sequence[Option], *names: str) -> Tuple[Option, ...]:
    """The Options of `declared` (an `options_of` tuple) called `names`, in that order;
    a name not declared is a KeyError naming it."""
    by_name = {o.name: o for o in declared}
    missing = [name for name in names if name not in by_name]
    if missing:
        raise KeyError(f"no declared option {', '.join(missing)}")
    return tuple(by_name[name] for name in names)


def help_text(declared: Option, prefix: str = "", note: str = "") -> str:
    """A flag's help: prefix, the declaration's help, then its range (a number's, when
    bounded; absl lists an enum's choices itself) and `note` (what an unset flag means),
    e.g. "The length penalty's exponent: 0 turns it off. Range [0.0, inf); default: the
    export's."."""
    notes = [f"range {declared.range_text()}"] if declared.choices is None and (
        declared.low is not None or declared.high is not None) else []
    if note:
        notes.append(note)
    text = prefix + declared.help
    if notes:
        sentence = "; ".join(notes)
        text += f" {sentence[0].upper()}{sentence[1:]}."
    return text


def define(options: Sequence[Option], defaults: Optional[Any] = None, *, prefix: str = "",
           unset: str = "", names: Mapping[str, str] = None,
           values: Mapping[str, Any] = None, notes: Mapping[str, str] = None,
           flag_values: flags.FlagValues = flags.FLAGS) -> Dict[str, str]:
    """Defines a flag for each of `options` in `flag_values`; returns {option name: flag
    name}, in the options' order.

    Args:
      options: the Options offered (`pick`).
      defaults: a dataclass instance whose field of each option's name is its flag's
        default (a DecodeConfig, ServingLimits), or None: every flag unset (None).
      prefix: put before every help text ("SavedModel: ").
      unset: with defaults None, what an unset flag means, ending each help ("default:
        the export's").
      names: flag names that differ from their option's ({"top_k": "sample_topk"}).
      values: defaults that differ from `defaults`' ({"seed": 0}); such a flag's help
        says nothing of `unset`.
      notes: per option, what its help ends with instead of `unset`.
    """
    names, values, notes = names or {}, values or {}, notes or {}
    defined = {}
    for declared in options:
        name = names.get(declared.name, declared.name)
        if declared.name in values:
            default, note = values[declared.name], ""
        else:
            default = None if defaults is None else getattr(defaults, declared.name)
            note = unset if defaults is None else ""
        text = help_text(declared, prefix, notes.get(declared.name, note))
        if declared.kind is str and declared.choices is not None:
            flags.DEFINE_enum(name, default, declared.choices, text, flag_values=flag_values)
        elif declared.kind is str:
            flags.DEFINE_string(name, default, text, flag_values=flag_values)
        elif declared.kind in _DEFINE:
            _DEFINE[declared.kind](name, default, text, flag_values=flag_values)
        else:
            raise TypeError(f"option {declared.name}: no flag for a {declared.kind.__name__}")
        defined[declared.name] = name
    return defined


def given(defined: Mapping[str, str],
          flag_values: flags.FlagValues = flags.FLAGS) -> Dict[str, Any]:
    """{option name: value} of the flags of `defined` (`define`'s answer) given on the
    command line or in a flagfile."""
    return {option: flag_values[name].value for option, name in defined.items()
            if flag_values[name].present}
