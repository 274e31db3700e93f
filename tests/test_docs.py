"""The documentation cannot rot: every `python -m trainer.<program> --flag` in the pages
(README.md, CONTRIBUTING.md, CHANGELOG.md, docs/*.md, bench/*.md) is a flag that program
defines, every relative link resolves to a file (and its #anchor to a heading of that file),
and every script a page names exists. And the pages speak to a reader, not to the team: no
issue numbers, no counts of work periods ("two sessions ago"), no team names for benchmarks
in the user's pages, no paths outside the checkout."""

import functools
import re
import subprocess
import sys

import pytest

from conftest import REPO

PAGES = sorted([REPO / "README.md", REPO / "CONTRIBUTING.md", REPO / "CHANGELOG.md",
                *(REPO / "bench").glob("*.md"), *(REPO / "docs").glob("*.md")])
COMMAND = re.compile(r"python -m trainer\.(\w+(?:\.\w+)*)([^\n`|#]*)")
FLAG = re.compile(r"(?<![\w-])--(\w+)")
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")
# What no reader can follow. An issue's number, in prose or in a heading's anchor.
ISSUE_NUMBER = re.compile(r"\bissues?[ -]#?\d+|\((?:#\d+)\)|(?<![\w&/#])#\d+\b|"
                          r"\b(?:PR|pull request)[ -]#?\d+", re.I)
# A count or a place of the team's work periods; TensorFlow's and pytest's sessions ("TF
# Serving's session loader", "the session's tiny model") are names and pass.
WORK_PERIOD = re.compile(
    r"\b(?:this|last|next|previous|same|each|every|earlier|later|helper|one|two|three|four|"
    r"five|six|seven|eight|nine|ten|\d+(?:st|nd|rd|th)?|first|second|third|fourth|fifth|"
    r"sixth|seventh|eighth|ninth|tenth|eleventh|twelfth|\w+teenth|twentieth)\s+sessions?\b"
    r"(?!\s+loaders?)|"
    r"\bsessions?\s+(?:ago|before|earlier|later|\d+)\b|\bsession-\d+", re.I)
# The team's names for a benchmark, in the pages a user reads (README.md, docs/); bench/'s
# notes may call the CTranslate2 benchmark a race, as bench/peers/ctranslate2_race.py does.
TEAM_WORDS = re.compile(r"\brace(?:s|\d+)?\b|\btaking turns\b", re.I)
# Absolute paths outside the checkout, which no reader has (/tmp/ in an example the user
# runs is fine, and so is ../shared/data/multi30k, beside the checkout, where the Multi30k
# flagfile and the tests read the files that `python -m trainer.data.multi30k` downloads).
OUTSIDE = re.compile(r"(?<![\w.])(?:/work/|/home/|/root/|/Users/)|\.\./shared/(?!data\b)")
# A script a page names: a path in the repository, or a program.
SCRIPT = re.compile(r"(?<![\w./-])(?:\.\./)*((?:bench|tests|trainer|keras_transformer)/[\w/-]*\.py)"
                    r"|python -m ((?:trainer|bench)(?:\.\w+)+)")


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
    assert {"README.md", "CONTRIBUTING.md", "CHANGELOG.md", "docs/training.md",
            "docs/serving.md", "bench/runs.md"} <= names


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


def unreadable(page_name: str, text: str) -> list:
    """What a page says that only the team can follow: issue numbers, counts of work
    periods, paths outside the checkout, and in README.md and docs/ the team's names for
    a benchmark; each as `line N: "..."`."""
    checks = [ISSUE_NUMBER, WORK_PERIOD, OUTSIDE]
    if not page_name.startswith("bench/"):
        checks.append(TEAM_WORDS)
    found = []
    for number, line in enumerate(text.splitlines(), 1):
        for check in checks:
            found += [f"line {number}: {match.group(0)!r}" for match in check.finditer(line)]
    return found


def missing_scripts(text: str) -> list:
    """The scripts and programs a page names that the repository does not hold."""
    missing = []
    for path, module in SCRIPT.findall(text.replace("\\\n", " ")):
        if path and not (REPO / path).exists():
            missing.append(path)
        elif module and not any((REPO / module.replace(".", "/")).with_suffix(suffix).exists()
                                for suffix in (".py", "")):
            missing.append(f"python -m {module}")
    return missing


@pytest.mark.parametrize("page", PAGES, ids=lambda page: page.relative_to(REPO).as_posix())
def test_the_page_speaks_to_a_reader_not_to_the_team(page):
    name = page.relative_to(REPO).as_posix()
    found = unreadable(name, page.read_text(encoding="utf-8"))
    assert not found, (f"{name} says what only the team can follow (issue numbers, work "
                       f"periods, team names, paths outside the checkout): {found}")


@pytest.mark.parametrize("page", PAGES, ids=lambda page: page.relative_to(REPO).as_posix())
def test_every_script_a_page_names_exists(page):
    missing = missing_scripts(page.read_text(encoding="utf-8"))
    assert not missing, f"{page.name} names scripts that are not there: {missing}"


def test_the_reader_checks_catch_what_they_look_for(tmp_path):
    """A doctored page trips every check, and the names that look alike pass."""
    page = tmp_path / "page.md"
    page.write_text("# Speed (issue 62)\n\n"
                    "Measured two sessions ago, as issue #61 said (#60); see\n"
                    "[runs](runs.md#where-the-time-goes-issue-62) and PR #7.\n"
                    "The race, taking turns, in the last session; the sixteenth session's "
                    "code; race5's exports.\n"
                    "`python /work/bench/profile.py`, ../shared/notes/run.sh, /home/me/x\n"
                    "`python bench/no_such_script.py`, tests/test_no_such.py, "
                    "`python -m trainer.no_such_program`, trainer/serving/marian.py\n")
    text = page.read_text()
    found = " ".join(unreadable("docs/page.md", text))
    for said in ("issue 62", "issue #61", "(#60)", "issue-62", "PR #7", "two sessions",
                 "race", "taking turns", "last session", "sixteenth session", "race5",
                 "/work/", "../shared/", "/home/"):
        assert repr(said) in found, said
    # bench/'s notes may name the CTranslate2 race; nothing else changes for them.
    bench = " ".join(unreadable("bench/page.md", text))
    assert "race" not in bench.lower() and "taking turns" not in bench and "issue 62" in bench
    assert missing_scripts(text) == ["bench/no_such_script.py",
                                     "tests/test_no_such.py",
                                     "python -m trainer.no_such_program"]
    # What looks alike and is fine: TensorFlow's and pytest's sessions, a /tmp/ example,
    # an HTML entity, a GitHub issue's web address, the scripts that exist.
    fine = ("TF Serving's session loader runs a session per model, 2 session loaders; the "
            "session's tiny model; `python -m trainer.task --model_dir=/tmp/run`; an HTML "
            "entity &#8203;, both sessions; "
            "https://github.com/tensorflow/tensorflow/issues/12345; the issues below; "
            "--src=../shared/data/multi30k/val.en, with ../shared beside the checkout; "
            "bench/peers/ctranslate2_race.py, ../trainer/data/shuffling.py, "
            "`python -m trainer.data.multi30k`, `python bench/decoding.py`")
    assert unreadable("docs/x.md", fine) == []
    assert missing_scripts(fine) == []
