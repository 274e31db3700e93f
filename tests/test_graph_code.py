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
    assert len(calls) >= 13  # the update, validation and serving signatures at least
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
