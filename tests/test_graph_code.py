"""The project's graph code is traced without AutoGraph (docs/design.md, "Graph code").

Its control flow on tensors is written as tf.cond and tf.while_loop, so AutoGraph's
conversion would only add time: it took about a third of a first export's tracing. These
tests read the source, so that a new tf.function or search entry point cannot bring the
conversion back unnoticed (the traced graphs are the same either way)."""

import ast
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
# The library's entry points that callers trace in their own tf.functions, by module.
ENTRY_POINTS = {"beam.py": ["beam_search"], "decoding.py": ["greedy_search", "search_single_path"],
                "sampling.py": ["sample_search"], "transformer.py": ["sequence_log_probs"]}


def _calls_of_tf_function(tree):
    """Every call tf.function(...) in a module's syntax tree."""
    return [node for node in ast.walk(tree) if isinstance(node, ast.Call)
            and ast.unparse(node.func) == "tf.function"]


def test_every_tf_function_of_the_programs_turns_autograph_off():
    calls = [(path, call) for path in sorted((REPO / "trainer").rglob("*.py"))
             for call in _calls_of_tf_function(ast.parse(path.read_text()))]
    assert len(calls) >= 12  # the update, validation and serving signatures at least
    for path, call in calls:
        keywords = {k.arg: ast.unparse(k.value) for k in call.keywords}
        assert keywords.get("autograph") == "False", (
            f"{path.relative_to(REPO)}:{call.lineno}: tf.function without autograph=False")


@pytest.mark.parametrize("module", sorted(ENTRY_POINTS))
def test_the_librarys_search_entry_points_are_not_converted_in_a_callers_tf_function(module):
    tree = ast.parse((REPO / "keras_transformer" / module).read_text())
    decorators = {node.name: [ast.unparse(d) for d in node.decorator_list]
                  for node in tree.body if isinstance(node, ast.FunctionDef)}
    for name in ENTRY_POINTS[module]:
        assert "tf.autograph.experimental.do_not_convert" in decorators[name], (
            f"keras_transformer/{module}: {name} is converted by a caller's AutoGraph")


# tf.data's methods that trace the functions they are given, AutoGraph on by default.
DATASET_METHODS = {"map", "flat_map", "filter", "interleave", "scan", "group_by_window", "reduce"}
DO_NOT_CONVERT = "tf.autograph.experimental.do_not_convert"


def test_every_function_the_programs_give_tf_data_is_not_converted():
    """tf.data converts a function it is given unless it is do_not_convert: about 1 s of
    every trainer's start (the tokenizer's methods, converted with the functions that call
    them), and a temporary file per function."""
    given = 0
    for path in sorted((REPO / "trainer").rglob("*.py")):
        tree = ast.parse(path.read_text())
        decorators = {node.name: [ast.unparse(d) for d in node.decorator_list]
                      for node in ast.walk(tree) if isinstance(node, ast.FunctionDef)}
        for call in ast.walk(tree):
            if not (isinstance(call, ast.Call) and isinstance(call.func, ast.Attribute)
                    and call.func.attr in DATASET_METHODS
                    and ast.unparse(call.func) != "functools.reduce"):
                continue
            for arg in [*call.args, *(keyword.value for keyword in call.keywords)]:
                where = f"{path.relative_to(REPO)}:{arg.lineno}"
                assert not isinstance(arg, ast.Lambda), f"{where}: a lambda AutoGraph converts"
                if isinstance(arg, ast.Name) and arg.id in decorators:
                    assert DO_NOT_CONVERT in decorators[arg.id], f"{where}: {arg.id} is converted"
                    given += 1
                given += isinstance(arg, ast.Call) and ast.unparse(arg.func) == DO_NOT_CONVERT
    assert given >= 12  # the tokenizing, bucketing, counting and shuffling functions at least
