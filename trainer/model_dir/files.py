"""Writing whole: a file (config.json, spm.model, data_counts.json) or a directory (an
export, a conversion, an average) appears complete or not at all. What the data, training,
conversion and serving code share to write them."""

import contextlib
import errno
import os
import shutil
import uuid
from typing import Iterator, Union


def write_atomically(path: str, contents: Union[str, bytes]):
    """Writes `contents` to `path` through a temporary file of this call's own, renamed
    over `path`: a crash leaves no half file, a reader sees the old or the new contents,
    and the workers of a MultiWorkerMirroredStrategy, which write the same file into one
    model directory at once, never rename each other's temporary file away (a shared
    temporary name fails them: tests/test_files.py). Paths may be any tf.io.gfile path."""
    import tensorflow as tf  # here, not above: a program that writes only directories
    # (python -m trainer.data.multi30k) starts without TensorFlow

    temporary = f"{path}.tmp-{uuid.uuid4().hex}"
    try:
        with tf.io.gfile.GFile(temporary, "wb" if isinstance(contents, bytes) else "w") as f:
            f.write(contents)
        tf.io.gfile.rename(temporary, path, overwrite=True)
    except BaseException:  # a full disk, say: no temporary file left behind
        if tf.io.gfile.exists(temporary):
            tf.io.gfile.remove(temporary)
        raise


class StagingDirectory:
    """A directory being written, `<parent>/.tmp-<uuid>`, to be published under its final
    name in `parent` with one rename. Made by `staged_directory`."""

    def __init__(self, parent: str):
        self.parent = parent
        self.path = os.path.join(parent, f".tmp-{uuid.uuid4().hex}")
        self.published = False

    def publish(self, final: str, replace: bool = False) -> str:
        """Renames the staging directory to `final` (in the same parent, so the rename is
        atomic); returns final.

        Without `replace`, `final` must not exist or be empty: FileExistsError otherwise
        (another writer took the name first; the staging directory is kept, so the caller
        may try another name). With `replace`, an old `final` is first renamed aside and
        then removed: a reader sees the old directory or the new one, or for an instant
        none, never a mixture."""
        if os.path.dirname(os.path.abspath(final)) != os.path.abspath(self.parent):
            raise ValueError(f"{final} is not in {self.parent}, where it was staged")
        aside = None
        if replace and os.path.lexists(final):
            aside = f"{self.path}-old"
            os.rename(final, aside)
        try:
            os.rename(self.path, final)
        except OSError as e:
            if aside is not None:
                os.rename(aside, final)  # the old one back: a failed publish changes nothing
            if e.errno in (errno.EEXIST, errno.ENOTEMPTY):
                raise FileExistsError(errno.EEXIST, "exists and is not empty", final) from None
            raise
        self.published = True
        if aside is not None:
            shutil.rmtree(aside, ignore_errors=True)
        return final


@contextlib.contextmanager
def staged_directory(parent: str) -> Iterator[StagingDirectory]:
    """A fresh, empty StagingDirectory in `parent` (made if missing), this call's own (two
    writers at once never share one). Whatever leaves the `with` block unpublished, an
    error included, is removed: a failed write leaves nothing behind.

    Example:
      with files.staged_directory(model_dir) as staging:
          write_everything(staging.path)
          staging.publish(os.path.join(model_dir, "averaged"), replace=True)
    """
    os.makedirs(parent, exist_ok=True)
    staging = StagingDirectory(parent)
    os.mkdir(staging.path)
    try:
        yield staging
    finally:
        if not staging.published:
            shutil.rmtree(staging.path, ignore_errors=True)
