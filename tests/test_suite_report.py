"""tests/suite_report.py, in a pytest of its own on a few throwaway tests: a skip outside
--allowed-skips fails the run, one the list names does not, and every run prints its
slowest tests."""

import os
import subprocess
import sys

import pytest

from conftest import REPO

THROWAWAY = '''
import time
import pytest

def test_passes():
    time.sleep(0.2)

def test_skips_where_root_is_missing():
    pytest.skip("needs root")

@pytest.mark.skipif(True, reason="no wheel here")
def test_skips_by_mark():
    pass
'''


def _pytest(tmp_path, *args):
    (tmp_path / "test_throwaway.py").write_text(THROWAWAY)
    return subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "suite_report",
                           "-p", "no:cacheprovider", "-p", "no:randomly", str(tmp_path), *args],
                          cwd=tmp_path, capture_output=True, text=True, timeout=120,
                          env={**os.environ, "PYTHONPATH": str(REPO / "tests")})


@pytest.mark.slow  # two pytest runs: 3-4 s each
def test_a_skip_the_list_does_not_name_fails_the_run_and_is_named(tmp_path):
    allowed = tmp_path / "allowed.txt"
    allowed.write_text("# comment\n*::test_skips_by_mark | no wheel for this machine\n")
    result = _pytest(tmp_path, f"--allowed-skips={allowed}")
    assert result.returncode == 1, result.stdout
    assert "NOT ALLOWED: test_throwaway.py::test_skips_where_root_is_missing: needs root" in (
        result.stdout), result.stdout
    assert "NOT ALLOWED: test_throwaway.py::test_skips_by_mark" not in result.stdout
    allowed.write_text("*::test_skips_* | both allowed\n")
    result = _pytest(tmp_path, f"--allowed-skips={allowed}")
    assert result.returncode == 0 and "NOT ALLOWED" not in result.stdout, result.stdout
    assert "2 skipped, 1 allowed" in result.stdout


@pytest.mark.slow
def test_without_the_list_skips_pass_and_the_slowest_tests_are_listed_first(tmp_path):
    result = _pytest(tmp_path)
    assert result.returncode == 0, result.stdout
    section = result.stdout.split("slowest tests (setup + call + teardown)", 1)[1]
    first = section.split("\n", 1)[1].splitlines()[0]
    assert first.endswith("test_throwaway.py::test_passes") and float(first.split()[0]) >= 0.2


def test_the_repositorys_list_is_well_formed_and_names_tests_that_exist():
    from suite_report import allowed_skips
    allowed = allowed_skips(REPO / "tests" / "allowed_skips.txt")
    assert allowed
    for pattern in allowed:
        assert (REPO / pattern.split("::")[0]).is_file(), pattern
