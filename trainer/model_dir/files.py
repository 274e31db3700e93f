"""The model directory's small files (config.json, spm.model, data_counts.json), written
whole: what the data and training code share to write them."""

import uuid
from typing import Union

import tensorflow as tf


def write_atomically(path: str, contents: Union[str, bytes]):
    """Writes `contents` to `path` through a temporary file of this call's own, renamed
    over `path`: a crash leaves no half file, a reader sees the old or the new contents,
    and the workers of a MultiWorkerMirroredStrategy, which write the same file into one
    model directory at once, never rename each other's temporary file away (a shared
    temporary name fails them: tests/test_files.py)."""
    temporary = f"{path}.tmp-{uuid.uuid4().hex}"
    with tf.io.gfile.GFile(temporary, "wb" if isinstance(contents, bytes) else "w") as f:
        f.write(contents)
    tf.io.gfile.rename(temporary, path, overwrite=True)
