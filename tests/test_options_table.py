"""docs/serving.md's tables of request options and serving limits are their declarations:
the tables are rendered here from keras_transformer.config.OPTIONS (through
trainer.serving.options.request_options) and trainer.serving.options.LIMITS, and the page
must hold them exactly, so an option added, renamed, re-ranged or re-worded in the code
and not in the page fails (its message prints the table to paste). And the page's
requests to the options signatures, REST and gRPC, send every input those signatures
require, one value per sentence."""

import ast
import dataclasses
import json
import re

import pytest

from conftest import REPO
from keras_transformer.config import OPTIONS, DecodeConfig
from trainer.serving.limits import LIMITS, ServingLimits
from trainer.serving.options import SIGNATURES, input_specs, request_options

PAGE = REPO / "docs" / "serving.md"
OPTIONS_HEADER = ("| option | type | range | default | signatures | what it does |\n"
                  "|---|---|---|---|---|---|")
LIMITS_HEADER = ("| limit | range | default | what it bounds |\n"
                 "|---|---|---|---|")


def _cell(text: str) -> str:
    return text.replace("|", "\\|")


def _default(value) -> str:
    """A default as the tables write it: none, `exact`, 4, 0.6."""
    if value is None:
        return "none"
    if isinstance(value, str):
        return f"`{value}`"
    return str(value)


def _range(option, signature: str) -> str:
    """The option's range in `signature`: a signature without a beam_size input (sample)
    bounds what beam_size would by max_beam_size, as its checks do."""
    names = {o.name for o in request_options(signature)}
    bounds = {} if "beam_size" in names else {"beam_size": "max_beam_size"}
    return option.range_text(bounds)


def signatures_of(option) -> list:
    return [s for s in SIGNATURES if option in request_options(s)]


def options_table() -> str:
    """The table of request options: one row per option a request of translate_with_options
    or sample sends, in declaration order (the signatures' input order)."""
    rows = [OPTIONS_HEADER]
    defaults = DecodeConfig()
    for option in OPTIONS:
        signatures = signatures_of(option)
        if not signatures:
            continue
        ranges = {s: _range(option, s) for s in signatures}
        if len(set(ranges.values())) == 1:
            range_cell = f"`{ranges[signatures[0]]}`"
        else:
            range_cell = "; ".join(f"`{r}` ({s})" for s, r in ranges.items())
        rows.append(" | ".join([
            f"| `{option.name}`", option.tf_dtype, _cell(range_cell),
            _default(getattr(defaults, option.name)),
            ", ".join(f"`{s}`" for s in signatures), _cell(option.help)]) + " |")
    return "\n".join(rows)


def limits_table() -> str:
    """The table of serving limits (trainer.export's flags of the same names)."""
    rows = [LIMITS_HEADER]
    defaults = ServingLimits()
    for limit in LIMITS:
        rows.append(" | ".join([f"| `{limit.name}`", f"`{limit.range_text()}`",
                                _default(getattr(defaults, limit.name)),
                                _cell(limit.help)]) + " |")
    return "\n".join(rows)


@pytest.mark.parametrize("table", [options_table, limits_table], ids=lambda t: t.__name__)
def test_the_serving_page_holds_the_table_its_declarations_make(table):
    expected = table()
    assert expected in PAGE.read_text(encoding="utf-8"), (
        f"docs/serving.md's {table.__name__.replace('_', ' ')} is not what the declarations "
        f"say (keras_transformer/config.py, trainer/serving/options.py); paste this in its "
        f"place:\n\n{expected}\n")


def test_the_options_table_has_a_row_for_every_option_input_of_each_signature():
    rows = options_table().splitlines()[2:]
    for signature in SIGNATURES:
        inputs = [spec.name for spec in input_specs(signature)][2:]
        assert inputs == [re.match(r"\| `(\w+)`", row).group(1) for row in rows
                          if f"`{signature}`" in row.split(" | ")[4]], signature
    assert all(row.count(" | ") == 5 for row in rows), "a help text broke a row"
    assert [field.name for field in dataclasses.fields(ServingLimits)] == \
        [limit.name for limit in LIMITS]


def _required(signature: str) -> set:
    return {spec.name for spec in input_specs(signature)}


def rest_bodies(text: str) -> list:
    """The JSON bodies of the page's curl commands (`-d '{...}'`)."""
    return [json.loads(body) for body in re.findall(r"-d '(\{.*?\})'", text, re.S)]


def grpc_calls(text: str) -> list:
    """(signature, keyword names) of each `predict("<signature>", name=...)` call in the
    page's Python blocks."""
    calls = []
    for block in re.findall(r"```python\n(.*?)```", text, re.S):
        for node in ast.walk(ast.parse(block)):
            if (isinstance(node, ast.Call) and getattr(node.func, "id", "") == "predict"
                    and node.args and isinstance(node.args[0], ast.Constant)):
                calls.append((node.args[0].value, {k.arg for k in node.keywords}))
    return calls


def test_the_pages_rest_requests_send_every_input_one_value_per_sentence():
    bodies = [b for b in rest_bodies(PAGE.read_text(encoding="utf-8"))
              if b.get("signature_name") in SIGNATURES]
    assert {b["signature_name"] for b in bodies} >= {"translate_with_options"}
    for body in bodies:
        required = _required(body["signature_name"])
        if "inputs" in body:  # columnar: each input a [batch] list
            columns = body["inputs"]
            assert set(columns) == required, sorted(required ^ set(columns))
            sizes = {name: len(value) for name, value in columns.items()}
            assert len(set(sizes.values())) == 1, sizes
        else:  # rows: each instance holds every input, one value each
            for instance in body["instances"]:
                assert set(instance) == required, sorted(required ^ set(instance))
                assert not any(isinstance(v, list) for v in instance.values()), instance


def test_the_pages_grpc_requests_send_every_input():
    calls = [(s, names) for s, names in grpc_calls(PAGE.read_text(encoding="utf-8"))
             if s in SIGNATURES]
    assert calls, "docs/serving.md shows a gRPC request to an options signature"
    for signature, names in calls:
        assert names == _required(signature), (signature,
                                               sorted(names ^ _required(signature)))


def test_the_checks_catch_a_missing_input_and_a_stale_row():
    """A page that leaves out min_length, or a table row with another range, is caught."""
    required = _required("translate_with_options") - {"min_length"}
    body = json.dumps({"signature_name": "translate_with_options",
                       "inputs": {name: ["x"] for name in required}})
    page = f"curl -d '{body}'\n```python\npredict(\"sample\", inputs=texts)\n```\n"
    (parsed,), ((signature, names),) = rest_bodies(page), grpc_calls(page)
    assert set(parsed["inputs"]) != _required("translate_with_options")
    assert signature == "sample" and names != _required("sample")
    stale = options_table().replace("`[1, max_beam_size]`", "`[1, 16]`")
    assert stale != options_table()
