"""The figures of the docs have one home: the results files in bench/results/.

Every number of the README's Results table and of docs/performance.md's tables is found,
rounded as printed, in a results file of the same host kind and setting:

- each table of docs/performance.md names its results files in a comment on the line above
  it, `<!-- results: bench/results/NAME.json -->`; each row of the table is a row of one of
  their tables: every figure of the doc's row (the numbers of its right-aligned columns, and
  any number with a unit in its other columns) is a number of that row, rounded as printed.
  The section the table sits in names the file's host kind: its last paragraph with a "Host:"
  before the table (from "Host:" on), or its heading and text up to the table if none has;
- each row of the README's Results table links its results file (`bench/results/NAME.json`),
  names the file's host kind, and links the section of docs/performance.md (or another page)
  whose tables it comes from; every number of its figure cell is a number of that file.

So a figure changed in a doc and not in its file fails here, and so does a file changed
without its doc (the tests at the end show both on doctored copies). Reads JSON and
markdown only: no TensorFlow.
"""

import json
import re
import sys
from decimal import ROUND_HALF_EVEN, ROUND_HALF_UP, Decimal
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
RESULTS = REPO / "bench" / "results"
README = REPO / "README.md"
PERFORMANCE = REPO / "docs" / "performance.md"

# bench/results_file.py, the benchmarks' writer of results files, and bench/common.py, which
# keeps what a run prints (neither imports TensorFlow at import); as the scripts import them.
sys.path.insert(0, str(REPO / "bench"))
import common as bench_common  # noqa: E402
import results_file  # noqa: E402
# The host kinds a results file may name, and the part of its file name that says which.
HOST_SLUGS = results_file.HOST_SLUGS
KEYS = ("benchmark", "setting", "host_kind", "host", "versions", "command", "commit", "date",
        "source", "tables")
UNITS = r"x|%|ms|s|MB|GB|GiB|sentences/s|tokens/s|updates/s|GFLOP/s|BLEU|minutes|min"
NUMBER = re.compile(rf"(?<![\w.])(\d{{1,3}}(?:,\d{{3}})+|\d+)(?:\.(\d+))?(\s*(?:{UNITS})(?!\w))?")
COMMENT = re.compile(r"<!--\s*results:\s*(.*?)\s*-->")
RESULTS_LINK = re.compile(r"\((?:\.\./)?(bench/results/[\w.-]+\.json)\)")


# ---------------------------------------------------------------- numbers


class Figure:
    """A number as printed: its digits, its decimals, and its unit if one follows it."""

    def __init__(self, match):
        whole, decimals, unit = match.group(1), match.group(2), match.group(3)
        self.text = whole + (f".{decimals}" if decimals else "")
        self.value = Decimal(self.text.replace(",", ""))
        self.decimals = len(decimals or "")
        self.unit = (unit or "").strip()

    def rounds_to(self, printed: "Figure") -> bool:
        """Whether this figure, rounded as `printed` is printed, is `printed`: it has at least
        as many decimals, and a ratio or a percentage matches only its own kind."""
        if self.decimals < printed.decimals:
            return False
        if printed.unit in ("x", "%") or self.unit in ("x", "%"):
            if printed.unit != self.unit:
                return False
        step = Decimal(1).scaleb(-printed.decimals)
        return any(self.value.quantize(step, rounding=r) == printed.value
                   for r in (ROUND_HALF_UP, ROUND_HALF_EVEN))

    def __repr__(self):
        return self.text + self.unit


def figures(text: str, with_unit_only: bool = False):
    """The numbers of a cell (markdown emphasis and code marks ignored)."""
    text = text.replace("**", "").replace("`", "")
    found = [Figure(m) for m in NUMBER.finditer(text)]
    return [f for f in found if f.unit] if with_unit_only else found


def found_in(figure: Figure, cells) -> bool:
    return any(candidate.rounds_to(figure) for cell in cells for candidate in figures(cell))


# ---------------------------------------------------------------- markdown


def cells(line: str):
    return [c.strip() for c in line.strip().strip("|").split("|")]


def markdown_tables(text: str):
    """Each table of a markdown text: {line, header, right (the right-aligned columns), rows,
    results (the files its comment names), context (its section up to the table)}."""
    lines = text.splitlines()
    tables, heading, fenced = [], 0, False
    i = 0
    while i < len(lines):
        line = lines[i]
        if line.startswith("```"):
            fenced = not fenced
        elif not fenced and line.startswith("#"):
            heading = i
        elif (not fenced and line.startswith("|") and i + 1 < len(lines)
              and re.fullmatch(r"\|[-:| ]+\|", lines[i + 1].strip())):
            aligns = cells(lines[i + 1])
            j = i - 1
            while j > heading and not lines[j].strip():
                j -= 1
            comment = COMMENT.search(lines[j]) if j > heading else None
            table = {"line": i + 1, "header": cells(line),
                     "right": {k for k, a in enumerate(aligns) if a.endswith(":")},
                     "results": comment.group(1).split() if comment else [],
                     "context": "\n".join(lines[heading:i]), "rows": []}
            i += 2
            while i < len(lines) and lines[i].startswith("|"):
                table["rows"].append((i + 1, cells(lines[i])))
                i += 1
            tables.append(table)
            continue
        i += 1
    return tables


def sections(text: str):
    """{anchor: the section's text, its subsections included}, as GitHub makes anchors."""
    lines, out, fenced = text.splitlines(), {}, False
    heads = []
    for i, line in enumerate(lines):
        if line.startswith("```"):
            fenced = not fenced
        elif not fenced and re.match(r"#+ ", line):
            heads.append((i, len(line) - len(line.lstrip("#")), line.lstrip("#").strip()))
    for k, (i, level, title) in enumerate(heads):
        end = next((j for j, lv, _ in heads[k + 1:] if lv <= level), len(lines))
        anchor = re.sub(r"[^\w\- ]", "", title.lower()).replace(" ", "-")
        out[anchor] = "\n".join(lines[i:end])
    return out


def load(path: str) -> dict:
    return json.loads((REPO / path).read_text(encoding="utf-8"))


def file_rows(result: dict):
    return [row for table in result["tables"] for row in table["rows"]]


# ---------------------------------------------------------------- the checks


def check_tables(text: str, read=load):
    """What in a page's tables is not in its results files: a list of messages."""
    problems = []
    for table in markdown_tables(text):
        where = f"the table at line {table['line']}"
        if not table["results"]:
            problems.append(f"{where} names no results file (<!-- results: ... --> above it)")
            continue
        results = [read(path) for path in table["results"]]
        paragraphs = re.split(r"\n\s*\n", table["context"])
        hosts = [p[p.index("Host:"):] for p in paragraphs if "Host:" in p]
        context = " ".join((hosts[-1] if hosts else table["context"]).split())
        for result, path in zip(results, table["results"]):
            if result["host_kind"] not in context:
                problems.append(f"{where}: its section does not name {path}'s host kind "
                                f"{result['host_kind']!r}")
        rows = [row for result in results for row in file_rows(result)]
        for line, row in table["rows"]:
            wanted = [f for k, cell in enumerate(row)
                      for f in figures(cell, with_unit_only=k not in table["right"])]
            if wanted and not any(all(found_in(f, file_row) for f in wanted)
                                  for file_row in rows):
                best = max(rows, key=lambda r: sum(found_in(f, r) for f in wanted))
                missing = [f for f in wanted if not found_in(f, best)]
                problems.append(f"line {line}: {missing} not in any row of "
                                f"{', '.join(table['results'])} (closest: {best})")
    return problems


def results_table(text: str):
    """The README's Results table."""
    tables = [t for t in markdown_tables(text) if t["context"].startswith("## Results\n")]
    assert tables, "the README has no Results table"
    return tables[0]


def check_readme(text: str, performance: str, read=load):
    """What in the README's Results table is not in the results files it links."""
    problems = []
    table = results_table(text)
    figure_column = table["header"].index("figure")
    performance_sections = sections(performance)
    for line, row in table["rows"]:
        joined = " | ".join(row)
        paths = RESULTS_LINK.findall(joined)
        if not paths:
            problems.append(f"README line {line}: links no results file")
            continue
        results = {path: read(path) for path in paths}
        kinds = [r["host_kind"] for r in results.values() if r["host_kind"] in joined]
        if not kinds:
            problems.append(f"README line {line}: names none of its files' host kinds "
                            f"{sorted({r['host_kind'] for r in results.values()})}")
        for anchor in re.findall(r"docs/performance\.md#([\w-]+)", joined):
            named = " ".join(t for t in markdown_tables(performance_sections.get(anchor, ""))
                             for t in t["results"])
            for path in paths:
                if path not in named:
                    problems.append(f"README line {line}: performance.md#{anchor} has no "
                                    f"table of {path}")
        rows = [row for path, r in results.items() if r["host_kind"] in kinds
                for row in file_rows(r)]
        cell = row[figure_column]
        for kind in HOST_SLUGS:
            cell = cell.replace(kind, "")
        for f in figures(cell):
            if not any(found_in(f, file_row) for file_row in rows):
                problems.append(f"README line {line}: {f} not in {', '.join(paths)}")
    return problems


# ---------------------------------------------------------------- the real files


def result_files():
    return sorted(RESULTS.glob("*.json"))


@pytest.mark.parametrize("path", result_files(), ids=lambda p: p.name)
def test_a_results_file_says_where_and_how_it_was_measured(path):
    result = json.loads(path.read_text(encoding="utf-8"))
    assert [k for k in KEYS if k not in result] == []
    assert result["host_kind"] in HOST_SLUGS, result["host_kind"]
    slug = HOST_SLUGS[result["host_kind"]]
    assert f"-{slug}-" in path.name or path.stem.endswith(f"-{slug}"), (path.name, slug)
    assert re.fullmatch(r"[0-9a-f]{7,40}", result["commit"]), result["commit"]
    assert result["tables"] and all(t["header"] and t["rows"] for t in result["tables"])
    assert all(len(row) == len(t["header"]) for t in result["tables"] for row in t["rows"])


def test_performance_tables_are_the_results_files_figures():
    assert check_tables(PERFORMANCE.read_text(encoding="utf-8")) == []


def test_readme_results_are_the_results_files_figures():
    assert check_readme(README.read_text(encoding="utf-8"),
                        PERFORMANCE.read_text(encoding="utf-8")) == []


def test_every_results_file_is_cited():
    """A results file that no page cites is a figure without a claim."""
    cited = set(RESULTS_LINK.findall(README.read_text(encoding="utf-8")))
    for table in markdown_tables(PERFORMANCE.read_text(encoding="utf-8")):
        cited.update(table["results"])
    for page in (REPO / "docs").glob("*.md"):
        cited.update(RESULTS_LINK.findall(page.read_text(encoding="utf-8")))
    uncited = [p.name for p in result_files() if f"bench/results/{p.name}" not in cited]
    assert uncited == []


def test_readme_rows_are_one_line_claims():
    """One headline figure and its host kind per row, in about 15 words."""
    table = results_table(README.read_text(encoding="utf-8"))
    for line, row in table["rows"]:
        words = " ".join(row[:2]).replace("**", "").split()
        assert len(words) <= 18, (line, len(words), row[:2])


# ---------------------------------------------------------------- the checks on doctored copies

DOCTORED = {
    "bench/results/demo-xeon-amx-setting.json": {
        "host_kind": "Intel Xeon, AMX",
        "tables": [{"title": "t", "header": ["system", "sentences/s", "x other"], "rows": [
            ["ours", "448.9", "1.54x"], ["other", "290.7", "1.00x"]]}]},
}
PAGE = """# Page

## A section

- Host: 2-core Intel Xeon, AMX.

<!-- results: bench/results/demo-xeon-amx-setting.json -->

| system | sentences/s | ratio |
|---|---:|---:|
| ours | 448.9 | **1.54x** |
| other | 290.7 | 1.00x |
"""
README_PAGE = """# R

## Results

| claim | figure | page |
|---|---|---|
| decoding sentences/s against the other | 1.54x (Intel Xeon, AMX) | \
[table](docs/performance.md#a-section), [data](bench/results/demo-xeon-amx-setting.json) |
"""


def test_the_matcher_rounds_as_printed():
    one = [Figure(m) for m in NUMBER.finditer("1.5x 1.54x 1.545x 448.94 12,356 19.3%")]
    assert [str(f) for f in one] == ["1.5x", "1.54x", "1.545x", "448.94", "12,356", "19.3%"]
    assert one[1].rounds_to(one[0]) and one[2].rounds_to(one[1])
    assert not one[0].rounds_to(one[1])  # fewer decimals than printed
    assert figures("448.9")[0].rounds_to(figures("449")[0])
    assert not figures("448.9")[0].rounds_to(figures("448")[0])
    assert not figures("1.54")[0].rounds_to(figures("1.54x")[0])  # a ratio is a ratio
    assert [str(f) for f in figures("2 requests in flight, 1 thread each")] == ["2", "1"]
    assert figures("sentences/s, file order", with_unit_only=True) == []
    assert [str(f) for f in figures("ours 22.0 ms, 1.08x", with_unit_only=True)] == [
        "22.0ms", "1.08x"]


def test_a_figure_changed_in_the_doc_but_not_in_its_file_fails():
    read = DOCTORED.__getitem__
    assert check_tables(PAGE, read) == []
    assert check_readme(README_PAGE, PAGE, read) == []
    changed = PAGE.replace("448.9", "449.9")
    assert len(check_tables(changed, read)) == 1 and "449.9" in check_tables(changed, read)[0]
    assert check_tables(PAGE.replace("1.54x", "1.55x"), read) != []
    assert check_readme(README_PAGE.replace("1.54x", "1.64x"), PAGE, read) != []
    # a figure that is in the file, but of another row, does not count
    assert check_tables(PAGE.replace("| other | 290.7", "| other | 448.9"), read) != []
    # the host kind must be the file's, in the section and in the README's row
    assert check_tables(PAGE.replace("Intel Xeon, AMX", "AMD EPYC, AVX-512 BF16"), read) != []
    assert check_readme(README_PAGE.replace("(Intel Xeon, AMX)", "(AMD EPYC, AVX2 only)"),
                        PAGE, read) != []
    # a table without its results file
    assert check_tables(PAGE.replace("<!-- results: bench/results/demo-xeon-amx-setting.json -->",
                                     ""), read) != []


def test_the_real_pages_fail_when_a_figure_changes():
    """The same on the real pages: one figure moved by one in its last digit, in the
    README's table and in the first table of docs/performance.md, fails the check."""
    performance = PERFORMANCE.read_text(encoding="utf-8")
    table = next(t for t in markdown_tables(performance) if t["right"])
    line, row = table["rows"][0]
    column = min(table["right"])
    figure = figures(row[column])[0]
    bumped = figure.text[:-1] + str((int(figure.text[-1]) + 1) % 10)
    lines = performance.splitlines()
    lines[line - 1] = lines[line - 1].replace(f"| {row[column]} |",
                                              f"| {row[column].replace(figure.text, bumped)} |", 1)
    assert lines[line - 1] != performance.splitlines()[line - 1]
    assert check_tables("\n".join(lines)) != []

    readme = README.read_text(encoding="utf-8")
    r_line, r_row = results_table(readme)["rows"][1]
    figure = figures(r_row[1])[0]
    bumped = figure.text[:-1] + str((int(figure.text[-1]) + 1) % 10)
    lines = readme.splitlines()
    lines[r_line - 1] = lines[r_line - 1].replace(figure.text, bumped, 1)
    assert check_readme("\n".join(lines), performance) != []


# ---------------------------------------------------------------- the writer


def test_the_host_kind_is_named_by_what_its_matmuls_can_use():
    kind = results_file.host_kind
    assert kind("Intel(R) Xeon(R) Platinum 8481C", ["avx512_bf16", "amx_bf16"]) == "Intel Xeon, AMX"
    assert kind("Intel(R) Xeon(R) Platinum 8581C", ["avx512f", "avx512_bf16"]) == \
        "Intel Xeon, AVX-512 BF16, no AMX"
    assert kind("Intel(R) Xeon(R) Platinum 8375C", ["avx2", "avx512f"]) == \
        "Intel Xeon, AVX-512, no BF16"
    assert kind("AMD EPYC 9B14", ["avx2", "avx512f", "avx512_bf16"]) == "AMD EPYC, AVX-512 BF16"
    assert kind("AMD EPYC 7B12", ["avx2", "fma"]) == "AMD EPYC, AVX2 only"
    flag_sets = [["amx_bf16"], ["avx512_bf16"], ["avx512f"], ["avx2"]]
    assert all(kind(vendor, flags) in HOST_SLUGS for vendor in ("Intel Xeon", "AMD EPYC")
               for flags in flag_sets if not (vendor == "AMD EPYC" and "amx_bf16" in flags))


def test_a_benchmark_writes_what_it_printed(tmp_path, capsys, monkeypatch):
    """write_results: the tables print_table printed and the summary lines, with the host,
    versions, command and commit, under a name of the host kind and setting; the file
    passes the checks above."""
    monkeypatch.setattr(bench_common, "PRINTED", [])
    monkeypatch.setattr(bench_common, "HEADER", {})
    monkeypatch.setattr(bench_common, "cpu_info",
                        lambda: ("AMD EPYC 9B14", ["avx2", "avx512_bf16"]))
    monkeypatch.setattr(bench_common.sys, "argv", ["bench/decoding.py", f"--src={REPO}/x.en"])
    bench_common.print_header([("machine", "2 cores"), ("data", f"{REPO.parent}/shared/x")])
    bench_common.print_table(["system", "sentences/s"], [["ours", "448.9"], ["theirs", "290.7"]],
                             title="Throughput:")
    bench_common.print_summary("Each at its best: ours 448.9 sentences/s; 1.54x CTranslate2.")
    path = results_file.write_results("decoding", "equal-rules-2inflight", "a setting",
                                      directory=tmp_path)
    assert path.name == "decoding-epyc-avx512-equal-rules-2inflight.json"
    assert "results: " in capsys.readouterr().out
    result = json.loads(path.read_text(encoding="utf-8"))
    assert [k for k in KEYS if k not in result] == []
    assert result["host_kind"] == "AMD EPYC, AVX-512 BF16" and result["setting"] == "a setting"
    assert result["command"] == "python bench/decoding.py --src=x.en"
    assert result["header"] == {"machine": "2 cores", "data": "../shared/x"}
    assert [t["title"] for t in result["tables"]] == ["Throughput", "summary lines"]
    assert result["tables"][0]["rows"] == [["ours", "448.9"], ["theirs", "290.7"]]
    assert "python" in result["versions"]
    page = PAGE.replace("demo-xeon-amx-setting", path.stem).replace("Intel Xeon, AMX",
                                                                   "AMD EPYC, AVX-512 BF16")
    read = lambda name: json.loads((tmp_path / Path(name).name).read_text(encoding="utf-8"))
    assert check_tables(page.replace("| other | 290.7 | 1.00x |", "| other | 290.7 |  |"),
                        read) == []
    assert results_file.write_results("decoding", "", "none", directory=tmp_path) is None
