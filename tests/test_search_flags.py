"""The programs' search flags come from the options' declarations (trainer/search_flags.py):
each program offers a flag per declared option it names, of the option's kind and choices,
at the program's defaults (trainer.task: TRAINED_DECODE; trainer.export: DecodeConfig()'s
and ServingLimits()'s; trainer.translate: unset, the export's, but --seed 0), listed under
the program's own --help; an option added to a dataclass gets its flag."""

import dataclasses
import subprocess
import sys
import xml.etree.ElementTree as ElementTree
from pathlib import Path

import pytest
from absl import flags

from keras_transformer.config import OPTIONS, DecodeConfig
from keras_transformer.options import Option, option, options_of
from trainer import search_flags
from trainer.config import TRAINED_DECODE

REPO = Path(__file__).resolve().parents[1]

# The options each program offers, and its defaults (None: unset).
TRAINING_SEARCH = ("beam_size", "alpha", "length_penalty", "stopping", "patience", "min_length")
REQUEST_OPTIONS = tuple(o.name for o in OPTIONS if o.request)
# trainer.translate's flags whose names differ from their options'.
TRANSLATE_NAMES = {"top_k": "sample_topk", "top_p": "sample_topp"}


def helpxml(program: str) -> dict:
    """(usage text, {flag name: <flag> element}) of `python -m trainer.<program>
    --helpxml`, its own flags only (those of its file, which its --help lists)."""
    result = subprocess.run([sys.executable, "-m", f"trainer.{program}", "--helpxml"],
                            capture_output=True, text=True, cwd=REPO, timeout=300)
    root = ElementTree.fromstring(result.stdout)
    own = {flag.findtext("name"): flag for flag in root.iter("flag")
           if flag.findtext("file").endswith(f"trainer/{program}.py")}
    return root.findtext("usage"), own


@pytest.fixture(scope="module")
def described():
    """Each program's --helpxml, read once."""
    return {program: helpxml(program) for program in ("task", "export", "translate")}


def expected_flags(program: str):
    """[(flag name, Option, default)] of the declared options `program` offers."""
    from trainer.serving.limits import LIMITS, ServingLimits
    by_name = {o.name: o for o in OPTIONS}
    if program == "task":
        return [(name, by_name[name], getattr(TRAINED_DECODE, name)) for name in TRAINING_SEARCH]
    if program == "export":
        return ([(name, by_name[name], getattr(DecodeConfig(), name)) for name in TRAINING_SEARCH]
                + [(o.name, o, getattr(ServingLimits(), o.name)) for o in LIMITS])
    return [(TRANSLATE_NAMES.get(name, name), by_name[name], 0 if name == "seed" else None)
            for name in REQUEST_OPTIONS]


def parsed_default(flag, declared: Option):
    """A --helpxml flag's default as a Python value of the option's kind (None: unset)."""
    if flag.findtext("current") == "None":
        return None
    return declared.kind(flag.findtext("default"))


XML_TYPES = {int: "int", float: "float"}


@pytest.mark.parametrize("program", ["task", "export", "translate"])
def test_each_program_has_a_flag_of_each_option_it_offers_of_its_kind_and_default(
        program, described):
    usage, own = described[program]
    for name, declared, default in expected_flags(program):
        assert name in own, f"trainer.{program} has no --{name} among its own flags"
        flag = own[name]
        assert flag.findtext("key") == "yes"
        if declared.choices is not None:
            assert flag.findtext("type") == "string enum"
            assert tuple(v.text for v in flag.iter("enum_value")) == declared.choices
        else:
            assert flag.findtext("type") == XML_TYPES[declared.kind]
        assert parsed_default(flag, declared) == default, name
        # The help is the declaration's; the docstring (--help's first lines) names it.
        assert declared.help in flag.findtext("meaning")
        assert f"--{name}" in usage, f"trainer.{program}'s docstring does not name --{name}"


def test_translate_frames_each_unset_flag_as_the_exports_and_export_as_the_savedmodels(
        described):
    _, translate = described["translate"]
    for name, declared, default in expected_flags("translate"):
        meaning = translate[name].findtext("meaning")
        if default is None and declared.name != "num_hypotheses":
            assert meaning.lower().endswith("default: the export's."), meaning
    _, export = described["export"]
    for name, declared, _ in expected_flags("export"):
        assert "SavedModel: " + declared.help in export[name].findtext("meaning")


def test_a_new_option_of_a_dataclass_gets_its_flag():
    """A throwaway dataclass with DecodeConfig's options and one more: `define` makes a
    flag of each in a FlagValues of its own (the global FLAGS untouched)."""
    added = dataclasses.make_dataclass(
        "WithRepetition", [
            ("repetition_penalty", float,
             option(1.0, float, "Divides a repeated token's logit.", low=1.0, request=True)),
            ("repeats", str, option("allowed", str, "Whether a token may repeat.",
                                    choices=("allowed", "never")))],
        bases=(DecodeConfig,), frozen=True)
    declared = options_of(added)
    assert {o.name for o in declared} == {o.name for o in OPTIONS} | {"repetition_penalty",
                                                                      "repeats"}
    values = flags.FlagValues()
    before = set(flags.FLAGS)
    defined = search_flags.define(declared, added(), prefix="P: ", flag_values=values)
    assert set(flags.FLAGS) == before
    assert list(defined) == [o.name for o in declared]
    for o in declared:
        flag = values[defined[o.name]]
        assert flag.default == getattr(added(), o.name)
        assert "P: " + o.help in flag.help
        if o.choices is not None:
            assert tuple(flag.parser.enum_values) == o.choices
        else:
            assert isinstance(flag.parser, {int: flags.IntegerParser,
                                             float: flags.FloatParser}[o.kind])
    assert "Range [1.0, inf)." in values["repetition_penalty"].help
    values(["program", "--repetition_penalty=1.3", "--repeats=never", "--beam_size=2"])
    assert search_flags.given(defined, values) == {"repetition_penalty": 1.3,
                                                   "repeats": "never", "beam_size": 2}


def test_unset_flags_renamed_flags_and_their_own_defaults():
    values = flags.FlagValues()
    offered = search_flags.pick(OPTIONS, "beam_size", "top_k", "seed", "num_hypotheses")
    defined = search_flags.define(offered, None, unset="default: theirs",
                                  names={"top_k": "topk"}, values={"seed": 3},
                                  notes={"num_hypotheses": "default: 1"}, flag_values=values)
    assert defined == {"beam_size": "beam_size", "top_k": "topk", "seed": "seed",
                       "num_hypotheses": "num_hypotheses"}
    assert [values[name].default for name in defined.values()] == [None, None, 3, None]
    assert values["beam_size"].help.endswith("Range [1, max_beam_size]; default: theirs.")
    assert values["num_hypotheses"].help.endswith("; default: 1.")
    assert "theirs" not in values["seed"].help
    values(["program"])
    assert search_flags.given(defined, values) == {}


def test_pick_refuses_an_option_nobody_declared():
    with pytest.raises(KeyError, match="beam_width"):
        search_flags.pick(OPTIONS, "beam_size", "beam_width")

