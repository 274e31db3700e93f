"""Multi30k task 1, English-German (Elliott et al., 2016), from the official
multi30k/dataset repository: the files that the Multi30k recipe
(trainer/flagfiles/multi30k.cfg) and the tests read, checked against their SHA-256.

    python -m trainer.data.multi30k --output_dir=DIR

DIR then holds, as ../shared/data/multi30k does beside a development checkout:

  train.{en,de}.gz                 29,000 pairs, raw (true case, untokenized)
  val.{en,de}, test2016.{en,de}    1,014 and 1,000 pairs, raw
  tok/{val,test2016}.lc.norm.tok.{en,de}
                                   the official lowercased, punctuation-normalised,
                                   Moses-tokenized references (tokenized BLEU)

The raw files are cleaned of whitespace only (tabs and non-breaking spaces to spaces, runs
collapsed, ends stripped: 1 line of train.en, 129 of train.de and 1 of val.de change);
the tokenized ones are kept byte for byte. DIR appears whole or not at all. Terms:
derived in part from Flickr30K, for non-commercial research and educational use.
"""

import dataclasses
import gzip
import hashlib
import os
import urllib.error
import urllib.request
from typing import Callable, Sequence

from trainer.model_dir import files as model_files

# The repository at a fixed commit, so that the checksums below always hold.
BASE_URL = ("https://raw.githubusercontent.com/multi30k/dataset/"
            "a3d2e0d26b56f3846f66a952536ffed4e401d05a/data/task1")


@dataclasses.dataclass(frozen=True)
class File:
    """One file: where it is under the base URL, the SHA-256 of its bytes there, and
    where it goes in the output directory (".gz" there: gzip; a raw file is cleaned)."""
    remote: str
    sha256: str
    local: str

    @property
    def raw(self) -> bool:
        return self.remote.startswith("raw/")


FILES = (
    File("raw/train.en.gz", "d79cfa999dd4c51d2cb42499b6796d5a882c3a8a961923c25a898c90f8bbd56f",
         "train.en.gz"),
    File("raw/train.de.gz", "726e39b2fa9eb9ffb6dc763fb35a179f80fae06ffc5d28b6ace5faa883de28a6",
         "train.de.gz"),
    File("raw/val.en.gz", "14f7d25ddd868909a9213e361768460edcacdd6ab9d1e77b92560dc10c10dc28",
         "val.en"),
    File("raw/val.de.gz", "f0cba2f995189cf5770f29a8a9a537a3ad3f51657ad873405082ff6863a5e75a",
         "val.de"),
    File("raw/test_2016_flickr.en.gz",
         "611d361c6334bc7246101d48097c13cf5c4413c5befc793cc629934359d532d9", "test2016.en"),
    File("raw/test_2016_flickr.de.gz",
         "9204244e408ccb38d2a55cfcd344df15005fc42a07a6e55ca6c52b6ababb8cc8", "test2016.de"),
    File("tok/val.lc.norm.tok.en",
         "46573ce391ae227f1c72f873392436a20ef18e0a6d518098cfbd70b77c8572ec",
         "tok/val.lc.norm.tok.en"),
    File("tok/val.lc.norm.tok.de",
         "97232bd273eceb7207f689527386a97e4be2616b18ada47576bdaf96c8ae1f00",
         "tok/val.lc.norm.tok.de"),
    File("tok/test_2016_flickr.lc.norm.tok.en",
         "5b7f32627cf99eced828311b955dae9800bb52bc8b91cf8b6526829e605b29d2",
         "tok/test2016.lc.norm.tok.en"),
    File("tok/test_2016_flickr.lc.norm.tok.de",
         "c6a33d39d48f9f510de147651316cd9d918e09ad0219df734a2f16b6baccacc4",
         "tok/test2016.lc.norm.tok.de"),
)


class DownloadError(Exception):
    """A file could not be fetched, or is not the file expected; the message is one line."""


def clean(text: bytes) -> bytes:
    """UTF-8 lines with tabs and every other Unicode space made one space, runs collapsed
    and ends stripped (lines split at "\\n" only, each ending in one)."""
    lines = text.decode("utf-8").split("\n")
    if lines[-1] == "":
        lines.pop()
    return "".join(" ".join(line.split()) + "\n" for line in lines).encode("utf-8")


def fetch(url: str, sha256: str) -> bytes:
    """The bytes at `url` (https:// or file://), checked against their SHA-256."""
    try:
        with urllib.request.urlopen(url, timeout=120) as response:
            data = response.read()
    except (urllib.error.URLError, OSError) as e:
        raise DownloadError(f"cannot download {url}: {getattr(e, 'reason', e)}") from None
    digest = hashlib.sha256(data).hexdigest()
    if digest != sha256:
        raise DownloadError(f"{url} has SHA-256 {digest}, expected {sha256}: not the "
                            "official file (a changed mirror or a damaged download)")
    return data


def download(output_dir: str, base_url: str = BASE_URL, files: Sequence[File] = FILES,
             report: Callable[[str], None] = print) -> str:
    """Downloads `files` from `base_url` into the new directory output_dir, checked and
    laid out as the module docstring says; returns output_dir. `report` hears one line
    per file.

    Raises:
      DownloadError: a file cannot be fetched or fails its checksum; output_dir is then
        left as it was.
      FileExistsError: output_dir exists and is not empty.
    """
    output_dir = output_dir.rstrip("/")
    if os.path.isdir(output_dir) and os.listdir(output_dir):
        raise FileExistsError(f"{output_dir} exists and is not empty: download into a new "
                              "directory")
    with model_files.staged_directory(os.path.dirname(os.path.abspath(output_dir))) as staging:
        for i, file in enumerate(files, 1):
            data = fetch(f"{base_url.rstrip('/')}/{file.remote}", file.sha256)
            if file.raw:
                data = clean(gzip.decompress(data) if file.remote.endswith(".gz") else data)
            if file.local.endswith(".gz"):
                data = gzip.compress(data, mtime=0)
            path = os.path.join(staging.path, file.local)
            os.makedirs(os.path.dirname(path), exist_ok=True)
            with open(path, "wb") as f:
                f.write(data)
            report(f"[{i}/{len(files)}] {file.local}: {len(data):,} bytes, SHA-256 checked")
        staging.publish(output_dir)
    return output_dir


def main(argv):
    from absl import flags

    from trainer import cli
    del argv
    output_dir = flags.FLAGS.output_dir
    if not output_dir:
        cli.fail("--output_dir is required")
    try:
        download(output_dir, flags.FLAGS.base_url)
    except FileExistsError as e:
        cli.fail(str(e))
    except DownloadError as e:
        cli.fail(str(e), status=1)
    print(f"Multi30k en-de in {output_dir}; train on it with\n"
          f"  python -m trainer.task --flagfile=trainer/flagfiles/multi30k.cfg "
          f"--train_src={output_dir}/train.en.gz --train_tgt={output_dir}/train.de.gz "
          f"--eval_src={output_dir}/val.en --eval_tgt={output_dir}/val.de")


if __name__ == "__main__":
    from absl import flags

    from trainer import cli
    flags.DEFINE_string("output_dir", None, "The new directory to download Multi30k into.")
    flags.DEFINE_string("base_url", BASE_URL, "Where the repository's data/task1 files are: "
                        "https:// or a local mirror's file:// address.")
    cli.run(main)
