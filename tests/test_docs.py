"""The documentation cannot rot: every `python -m trainer.<program> --flag` in README.md and
docs/*.md is a flag that program defines, and every relative link resolves to a file (and
its #anchor to a heading of that file)."""

import functools
import re
import subprocess
import sys

import pytest

from conftest import REPO

PAGES = sorted([REPO / "README.md", REPO / "CONTRIBUTING.md", *(REPO / "bench").glob("*.md"),
                *(REPO / "docs").glob("*.md")])
COMMAND = re.compile(r"python -m trainer\.(\w+(?:\.\w+)*)([^\n`|#]*)")
FLAG = re.compile(r"(?<![\w-])--(\w+)")
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")


def commands(text: str):
    """(program, [flag, ...]) for every `python -m trainer.<program> ...` in a page: a
    command runs to the end of its line (backslash continuations joined), an inline code
    span's closing backtick, a table cell's bar or a comment."""
    for match in COMMAND.finditer(text.replace("\\\n", " ")):
        yield match.group(1), FLAG.findall(match.group(2))


@functools.lru_cache(maxsize=None)
def defined_flags(program: str) -> frozenset:
    """The flags `python -m trainer.<program> --helpfull` lists, absl's own included; a
    boolean flag also as its --no form."""
    result = subprocess.run([sys.executable, "-m", f"trainer.{program}", "--helpfull"],
                            cwd=REPO, capture_output=True, text=True, timeout=120)
    names = set()
    for negatable, name in re.findall(r"^\s+--(\[no\])?(\w+)", result.stdout, re.M):
        names.add(name)
        if negatable:
            names.add(f"no{name}")
    assert names, f"trainer.{program} --helpfull listed no flags:\n{result.stderr[-2000:]}"
    return frozenset(names)


def github_anchor(heading: str) -> str:
    """The #anchor GitHub gives a markdown heading."""
    text = re.sub(r"[^\w\- ]", "", heading.strip().lower().replace("`", ""))
    return text.replace(" ", "-")


def anchors(page) -> set:
    text = re.sub(r"```.*?```", "", page.read_text(encoding="utf-8"), flags=re.S)
    found, seen = set(), {}
    for heading in re.findall(r"^#+ (.+)$", text, re.M):
        anchor = github_anchor(heading)
        found.add(anchor if anchor not in seen else f"{anchor}-{seen[anchor]}")
        seen[anchor] = seen.get(anchor, 0) + 1
    return found


def test_the_pages_are_found():
    names = {page.relative_to(REPO).as_posix() for page in PAGES}
    assert {"README.md", "CONTRIBUTING.md", "docs/training.md", "docs/serving.md",
            "bench/runs.md"} <= names


@pytest.mark.parametrize("page", PAGES, ids=lambda page: page.relative_to(REPO).as_posix())
def test_every_command_flag_exists_in_its_program(page):
    text = page.read_text(encoding="utf-8")
    unknown = []
    for program, flags in commands(text):
        assert (REPO / "trainer" / f"{program.replace('.', '/')}.py").exists(), \
            f"{page.name}: python -m trainer.{program} is not a program"
        unknown += [f"trainer.{program} --{flag}" for flag in flags
                    if flag not in defined_flags(program)]
    assert not unknown, f"{page.name} names flags its programs do not define: {unknown}"


@pytest.mark.parametrize("page", PAGES, ids=lambda page: page.relative_to(REPO).as_posix())
def test_every_relative_link_resolves(page):
    broken = []
    text = re.sub(r"```.*?```", "", page.read_text(encoding="utf-8"), flags=re.S)
    for target in LINK.findall(text):
        if re.match(r"[a-z]+:", target):
            continue  # a web address
        path, _, anchor = target.partition("#")
        linked = (page.parent / path).resolve() if path else page
        if not linked.exists():
            broken.append(target)
        elif anchor and linked.suffix == ".md" and anchor not in anchors(linked):
            broken.append(target)
    assert not broken, f"{page.name} links to what is not there: {broken}"


def test_the_checks_catch_what_they_look_for(tmp_path):
    """A made-up flag and a link to a missing file or heading are found."""
    page = tmp_path / "page.md"
    page.write_text("# Title\n\n`python -m trainer.translate --saved_model=x --made_up=1`\n"
                    "[a](missing.md) [b](#title) [c](#no-such-heading)\n")
    (program, flags), = commands(page.read_text())
    assert program == "translate" and "made_up" in flags
    assert list(commands("`python -m trainer.data.multi30k --output_dir=DIR`.")) == \
        [("data.multi30k", ["output_dir"])]
    assert "made_up" not in defined_flags("translate")
    assert "saved_model" in defined_flags("translate")
    assert anchors(page) == {"title"}
    assert github_anchor("Decoding options against `serving_default`") == \
        "decoding-options-against-serving_default"
