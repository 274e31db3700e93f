"""A benchmark run's results file, bench/results/<script>-<host kind>-<setting>.json: the
host kind and CPU flags, the versions, the command, the git commit and every table and
summary line the run printed (bench/common.py keeps them). The figures the docs quote are
these files' figures; tests/test_results.py checks them."""

import json
import os
import platform
import re
import subprocess
import time
from pathlib import Path
from typing import Dict, List, Optional, Sequence, Tuple

import common

RESULTS = common.BENCH / "results"
# The host kinds a results file names, by what a host's matmuls can use, and the part of
# the file's name that says which (tests/test_results.py reads this table).
HOST_SLUGS = {
    "Intel Xeon, AMX": "xeon-amx",
    "Intel Xeon, AVX-512 BF16, no AMX": "xeon-avx512bf16-noamx",
    "Intel Xeon, AVX-512, no BF16": "xeon-avx512-nobf16",
    "Intel Xeon, AVX2 only": "xeon-avx2",
    "AMD EPYC, AVX-512 BF16": "epyc-avx512",
    "AMD EPYC, AVX-512, no BF16": "epyc-avx512-nobf16",
    "AMD EPYC, AVX2 only": "epyc-avx2",
}

def host_kind(model: Optional[str] = None, flags: Optional[Sequence[str]] = None) -> str:
    """This host's kind (a key of HOST_SLUGS), from its CPU's model name and flags (by
    default this machine's): the vendor, then the matmul units it has."""
    if model is None:
        model, flags = common.cpu_info()
    flags = set(flags or ())
    vendor = ("AMD EPYC" if "AMD" in model else "Intel Xeon" if "Intel" in model
              else model.strip() or "unknown CPU")
    if "amx_bf16" in flags:
        return f"{vendor}, AMX"
    if "avx512_bf16" in flags:
        return f"{vendor}, AVX-512 BF16" + (", no AMX" if vendor == "Intel Xeon" else "")
    if "avx512f" in flags:
        return f"{vendor}, AVX-512, no BF16"
    return f"{vendor}, AVX2 only" if "avx2" in flags else vendor


def package_versions(*names: str) -> Dict[str, str]:
    """Python's version and the installed versions of TensorFlow, tensorflow-text, Keras and
    `names` (those installed), read from the packages' metadata without importing them."""
    from importlib import metadata
    found = {"python": platform.python_version()}
    for name in ("tensorflow", "tensorflow-text", "keras", *names):
        try:
            found[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            pass
    return found


def git_commit() -> Tuple[str, bool]:
    """(the checkout's commit, whether tracked files differ from it); ("unknown", False)
    outside a git checkout."""
    def git(*args):
        return subprocess.run(["git", "-C", str(common.REPO), *args], capture_output=True,
                              text=True, timeout=30)
    head = git("rev-parse", "HEAD")
    if head.returncode:
        return "unknown", False
    dirty = git("status", "--porcelain", "--untracked-files=no").stdout.strip()
    return head.stdout.strip(), bool(dirty)


def slug(text: str) -> str:
    """A file-name part: lower case, words joined by hyphens."""
    return re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-")


def add_results_flag(parser, default: Optional[str]):
    """`--results=SETTING`: the setting part of this run's results file name, bench/results/
    <script>-<host kind>-SETTING.json; `default` unless given (None: the script names it by
    what the run measures); --results= writes none."""
    parser.add_argument(
        "--results", default=default,
        help="the setting part of the results file's name, bench/results/<script>-<host "
             "kind>-SETTING.json (default: " + (repr(default) if default else "what the run "
             "measures") + "); --results= writes none")


def dumps_results(result: dict) -> str:
    """A results file's JSON: one line per key, per table's title and header, and per row."""
    def table(t):
        rows = ",\n".join("    " + json.dumps(r, ensure_ascii=False) for r in t["rows"])
        return ("  {\"title\": " + json.dumps(t["title"], ensure_ascii=False) + ",\n"
                "   \"header\": " + json.dumps(t["header"], ensure_ascii=False) + ",\n"
                "   \"rows\": [\n" + rows + "]}")
    lines = [f" {json.dumps(k)}: {json.dumps(v, ensure_ascii=False)}"
             for k, v in result.items() if k != "tables"]
    lines.append(' "tables": [\n' + ",\n".join(table(t) for t in result["tables"]) + "]")
    return "{\n" + ",\n".join(lines) + "\n}\n"


def write_results(script: str, setting_slug: str, setting: str, packages: Sequence[str] = (),
                  extra: Optional[dict] = None, directory: Optional[Path] = None,
                  tables: Optional[List[dict]] = None) -> Optional[Path]:
    """Writes this run's results file, bench/results/<script>-<host kind>-<setting_slug>.json,
    and prints its path: the setting in words, the host kind and CPU, the versions of the
    usual packages and `packages`, the command, the commit, the date, `extra` (e.g. the
    matmul peaks, the search rules) and every table and summary line printed (or
    `tables`). The file of an earlier run of the same script, host kind and setting is
    replaced (git keeps it). No file when setting_slug is empty (--results=)."""
    if not setting_slug:
        return None
    model, flags = common.cpu_info()
    kind = host_kind(model, flags)
    commit, dirty = git_commit()
    result = {"benchmark": f"bench/{script}.py", "setting": setting, "host_kind": kind,
              "host": {"cpu": model, "cores": os.cpu_count(), "flags": flags},
              "versions": package_versions(*packages),
              "command": common.in_repository(common.command()),
              "commit": commit, "date": time.strftime("%Y-%m-%d"),
              "source": f"bench/{script}.py output"}
    if dirty:
        result["commit_note"] = "the checkout had uncommitted changes to tracked files"
    if common.HEADER:
        result["header"] = dict(common.HEADER)
    result.update(extra or {})
    result["tables"] = list(common.PRINTED if tables is None else tables)
    directory = Path(directory or RESULTS)
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / (f"{slug(script)}-{HOST_SLUGS.get(kind, slug(kind))}-"
                        f"{slug(setting_slug)}.json")
    path.write_text(dumps_results(result), encoding="utf-8")
    print(f"results: {common.in_repository(str(path))}")
    return path
