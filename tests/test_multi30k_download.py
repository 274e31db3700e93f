"""`python -m trainer.data.multi30k` fetches Multi30k from the official repository's layout,
refuses any file whose SHA-256 differs, and lays out what the recipe reads; tested against
local file:// mirrors (this machine has no internet)."""

import gzip
import hashlib
import subprocess
import sys

import pytest

from conftest import MULTI30K, REPO, _env, needs_multi30k
from trainer.config import DataConfig
from trainer.data import multi30k, sources

# Two pairs per split, with the whitespace that the raw files' cleaning removes.
ENGLISH = ["A\tman  in a\u00a0hat. ", " Two dogs play."]
GERMAN = ["Ein Mann  mit Hut.", "Zwei\u00a0Hunde spielen.\t"]


def official_like(file: multi30k.File) -> bytes:
    """Made-up bytes in the form of `file` in the repository: gzip for raw/, a tokenized
    lowercased text for tok/. The same bytes at every call: gzip's header time is fixed."""
    lines = ENGLISH if ".en" in file.remote else GERMAN
    if file.raw:
        return gzip.compress("".join(f"{line}\n" for line in lines).encode(), mtime=0)
    return "".join(f"{' '.join(line.lower().split())}\n" for line in lines).encode()


@pytest.fixture
def mirror(tmp_path):
    """(file:// base URL, its files' table: multi30k.FILES with these files' checksums)."""
    root = tmp_path / "mirror" / "data" / "task1"
    table = []
    for file in multi30k.FILES:
        data = official_like(file)
        (root / file.remote).parent.mkdir(parents=True, exist_ok=True)
        (root / file.remote).write_bytes(data)
        table.append(multi30k.File(file.remote, hashlib.sha256(data).hexdigest(), file.local))
    return root.as_uri(), table


def test_the_download_lays_out_clean_files_that_the_recipe_reads(mirror, tmp_path):
    base_url, table = mirror
    lines = []
    output = multi30k.download(str(tmp_path / "multi30k"), base_url, table, lines.append)
    assert len(lines) == len(table) and lines[0].startswith("[1/10] train.en.gz: ")
    out = tmp_path / "multi30k"
    assert sorted(str(p.relative_to(out)) for p in out.rglob("*") if p.is_file()) == \
        sorted(file.local for file in multi30k.FILES)
    assert gzip.decompress((out / "train.en.gz").read_bytes()).decode() == \
        "A man in a hat.\nTwo dogs play.\n"
    assert (out / "val.de").read_text() == "Ein Mann mit Hut.\nZwei Hunde spielen.\n"
    # The tokenized references are kept byte for byte.
    assert (out / "tok" / "test2016.lc.norm.tok.de").read_bytes() == official_like(
        next(f for f in multi30k.FILES if f.local == "tok/test2016.lc.norm.tok.de"))
    # What the Multi30k recipe's flags point at.
    source = sources.select(DataConfig(
        train_src=f"{output}/train.en.gz", train_tgt=f"{output}/train.de.gz",
        eval_src=f"{output}/val.en", eval_tgt=f"{output}/val.de"))
    assert source.size("train") == 2 and source.size("validation") == 2
    assert sorted(p.name for p in tmp_path.iterdir()) == ["mirror", "multi30k"]


def test_a_file_that_fails_its_checksum_is_named_and_nothing_is_left(mirror, tmp_path):
    base_url, table = mirror
    damaged = tmp_path / "mirror" / "data" / "task1" / "raw" / "val.de.gz"
    data = damaged.read_bytes()
    damaged.write_bytes(data[:-1] + bytes([data[-1] ^ 1]))
    with pytest.raises(multi30k.DownloadError) as raised:
        multi30k.download(str(tmp_path / "multi30k"), base_url, table)
    message = str(raised.value)
    assert message.startswith(f"{base_url}/raw/val.de.gz has SHA-256 "), message
    assert hashlib.sha256(damaged.read_bytes()).hexdigest() in message
    assert f"expected {table[3].sha256}" in message and "\n" not in message
    assert sorted(p.name for p in tmp_path.iterdir()) == ["mirror"], "no output, no staging"


def test_a_missing_file_and_a_used_directory_are_refused(mirror, tmp_path):
    base_url, table = mirror
    (tmp_path / "mirror" / "data" / "task1" / "tok" / "val.lc.norm.tok.en").unlink()
    with pytest.raises(multi30k.DownloadError, match=r"cannot download file://\S+/tok/val"):
        multi30k.download(str(tmp_path / "multi30k"), base_url, table)
    (tmp_path / "used").mkdir()
    (tmp_path / "used" / "notes.txt").write_text("mine")
    with pytest.raises(FileExistsError, match="exists and is not empty"):
        multi30k.download(str(tmp_path / "used"), base_url, table)
    assert [p.name for p in (tmp_path / "used").iterdir()] == ["notes.txt"]


@pytest.mark.slow
def test_the_program_checks_the_official_checksums_and_says_so_in_one_line(mirror, tmp_path):
    # The made-up mirror is not the official repository: its first file fails the
    # official SHA-256, so the program stops there.
    base_url, _ = mirror
    result = subprocess.run([sys.executable, "-m", "trainer.data.multi30k",
                             f"--output_dir={tmp_path / 'multi30k'}", f"--base_url={base_url}"],
                            cwd=REPO, env=_env(), capture_output=True, text=True, timeout=120)
    assert result.returncode == 1 and result.stdout == ""
    assert result.stderr.strip().splitlines() == [
        f"trainer.data.multi30k: error: {base_url}/raw/train.en.gz has SHA-256 "
        f"{hashlib.sha256(official_like(multi30k.FILES[0])).hexdigest()}, expected "
        f"{multi30k.FILES[0].sha256}: not the official file (a changed mirror or a damaged "
        "download)"]
    assert not (tmp_path / "multi30k").exists()


TOKENIZED = [file for file in multi30k.FILES if not file.raw]


@needs_multi30k(*(file.local for file in TOKENIZED))
def test_the_official_checksums_match_the_tokenized_references_of_the_multi30k_copy():
    # The tokenized references are copied byte for byte, so a copy made by this program
    # (or ../shared's) holds files whose SHA-256 is the table's.
    for file in TOKENIZED:
        assert hashlib.sha256((MULTI30K / file.local).read_bytes()).hexdigest() == file.sha256
