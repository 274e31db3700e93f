"""What a test run reports at its end, beside pytest's own summary (tests/conftest.py imports
these hooks): the 15 slowest tests, each its setup, call and teardown together, so that the
suite's growth shows in every run; the 10 tests that grew their process's resident memory
most, and each process's largest, since a worker that keeps what its tests built presses the
machine until everything crawls; and, with `--allowed-skips=FILE` (CI's run, `.ci/run`),
every skip checked against FILE's list of allowed ones, a skip outside it failing the run.

FILE holds one allowed skip a line, `<glob over the test's id> | <why it may skip>`; blank
lines and lines starting with "#" are left out. Under pytest-xdist these hooks run in the
controller, which receives every worker's reports. With SUITE_MEMORY_LOG=FILE in the
environment, each test appends `<process> <MB before> <MB after> <test id>` to FILE as it
ends, for a run that dies before its summary."""

import fnmatch
import os
from collections import defaultdict
from pathlib import Path

import pytest

SLOWEST = 15
GREW_MOST = 10
_PAGE = os.sysconf("SC_PAGE_SIZE")

_seconds = defaultdict(float)  # test id -> setup + call + teardown
_skipped = {}  # test id -> pytest's reason
_grew = {}  # test id -> (process, bytes its resident memory grew over setup..teardown)
_largest = defaultdict(int)  # process -> its largest resident memory after a test


def resident_bytes() -> int:
    """This process's resident memory now, from /proc/self/statm (0 where there is none)."""
    try:
        return int(Path("/proc/self/statm").read_text().split()[1]) * _PAGE
    except OSError:
        return 0


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item):
    item.stash[_BEFORE] = resident_bytes()


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    """The teardown's report carries the process's name and its resident memory before the
    setup and after the teardown, to the controller under pytest-xdist."""
    outcome = yield
    report = outcome.get_result()
    if call.when == "teardown" and _BEFORE in item.stash:
        process, before, after = (os.environ.get("PYTEST_XDIST_WORKER", "pytest"),
                                  item.stash[_BEFORE], resident_bytes())
        report.user_properties.append(("memory", (process, before, after)))
        if os.environ.get("SUITE_MEMORY_LOG"):  # a line a test, as it ends, for a run that dies
            with open(os.environ["SUITE_MEMORY_LOG"], "a") as log:
                log.write(f"{process} {before >> 20} {after >> 20} {item.nodeid}\n")


_BEFORE = pytest.StashKey[int]()


def pytest_addoption(parser):
    parser.addoption("--allowed-skips", metavar="FILE", default=None,
                     help="fail the run on a skip that FILE does not list "
                          "(lines: <test id glob> | <reason>)")


def allowed_skips(path: Path) -> dict:
    """{test id glob: reason} of an allowed-skips file; ValueError naming a line that is
    not `<glob> | <reason>`."""
    allowed = {}
    for number, line in enumerate(path.read_text().splitlines(), 1):
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        pattern, bar, reason = (part.strip() for part in line.partition("|"))
        if not bar or not pattern or not reason:
            raise ValueError(f"{path}:{number}: not '<test id glob> | <reason>': {line}")
        allowed[pattern] = reason
    return allowed


def unexpected(skipped: dict, allowed: dict) -> dict:
    """The skips of `skipped` ({test id: reason}) that no glob of `allowed` matches."""
    return {test: reason for test, reason in skipped.items()
            if not any(fnmatch.fnmatchcase(test, pattern) for pattern in allowed)}


def _worker(config) -> bool:
    return hasattr(config, "workerinput")  # a pytest-xdist worker: its controller reports


def pytest_runtest_logreport(report):
    _seconds[report.nodeid] += report.duration
    for name, value in report.user_properties:
        if name == "memory":
            process, before, after = value
            _grew[report.nodeid] = process, after - before
            _largest[process] = max(_largest[process], after)
    if report.skipped and not hasattr(report, "wasxfail"):
        reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else str(
            report.longrepr)
        _skipped[report.nodeid] = reason.removeprefix("Skipped: ")


def pytest_terminal_summary(terminalreporter, config):
    if _worker(config):
        return
    if _seconds:
        terminalreporter.section(f"the {SLOWEST} slowest tests (setup + call + teardown)")
        for test, seconds in sorted(_seconds.items(), key=lambda item: -item[1])[:SLOWEST]:
            terminalreporter.write_line(f"{seconds:8.1f} s  {test}")
        terminalreporter.write_line(f"{sum(_seconds.values()):8.1f} s  in all "
                                    f"{len(_seconds)} tests, workers' time")
    if _grew:
        terminalreporter.section(f"the {GREW_MOST} tests that grew their process's resident "
                                 "memory most")
        for test, (process, grew) in sorted(_grew.items(), key=lambda i: -i[1][1])[:GREW_MOST]:
            terminalreporter.write_line(f"{grew / 2**20:+8.0f} MB  {process}  {test}")
        for process, largest in sorted(_largest.items()):
            terminalreporter.write_line(f"{largest / 2**20:8.0f} MB  {process}'s largest")
    path = config.getoption("allowed_skips")
    if path is None:
        return
    allowed = allowed_skips(Path(path))
    terminalreporter.section(f"skips against {path}")
    terminalreporter.write_line(f"{len(_skipped)} skipped, {len(allowed)} allowed")
    for test, reason in sorted(unexpected(_skipped, allowed).items()):
        terminalreporter.write_line(f"NOT ALLOWED: {test}: {reason}", red=True)


@pytest.hookimpl(trylast=True)
def pytest_sessionfinish(session, exitstatus):
    path = session.config.getoption("allowed_skips")
    if not _worker(session.config) and path is not None and unexpected(_skipped, allowed_skips(Path(path))) and \
            exitstatus == pytest.ExitCode.OK:
        session.exitstatus = pytest.ExitCode.TESTS_FAILED
