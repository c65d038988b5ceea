"""Whether a folder can hold the files lavad will write there, found before the work."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path


def make_writable_folder(path: Path) -> None:
    """Make ``path`` (and its parents) and write and remove a file in it.

    Raises OSError when either fails. The write is what counts: a folder that
    exists may still refuse files (its mode, a read-only mount, a full disk's
    reserved blocks).
    """
    path.mkdir(parents=True, exist_ok=True)
    handle, probe = tempfile.mkstemp(dir=path, prefix=".writable-")
    os.close(handle)
    os.unlink(probe)
