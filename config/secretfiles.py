"""Files that hold a secret (the generated SECRET_KEY, the first admin's password).

A secret file is born with its final mode and its whole content, and nothing already at its
path is followed or replaced:

1. a temporary file beside it is created 0600 with O_CREAT|O_EXCL|O_NOFOLLOW (``mkstemp``),
   so the secret never sits in a file that others may read, whatever the umask;
2. the secret is written to it and flushed to disk;
3. it is linked under the final name: ``link(2)`` fails if anything is there (a file, a
   symbolic link planted by someone else) and never follows it, so a second process that
   raced us keeps its file and a reader sees the whole secret or no file;
4. the temporary name is removed.

Reading opens with O_NOFOLLOW too: a secret is read from the plain file, never through a link.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path


def create_secret_file(path: Path, text: str) -> None:
    """Write ``text`` to a new file at ``path`` that only its owner can read (FileExistsError if
    anything is at ``path`` already, a symbolic link included)."""
    fd, temporary = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    try:
        with os.fdopen(fd, "w") as fh:
            fh.write(text)
            fh.flush()
            os.fsync(fh.fileno())
        os.link(temporary, path)
    finally:
        os.unlink(temporary)


def read_secret_file(path: Path) -> str:
    """The text of the plain file at ``path`` (OSError for a symbolic link or a missing file)."""
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
    with os.fdopen(fd) as fh:
        return fh.read()
