"""Where Linnet keeps what it builds once and reads back in later processes: the C kernels, the
parser's tables, XLA's executables.

The root is `$LINNET_CACHE`, else `$XDG_CACHE_HOME/linnet`, else `~/.cache/linnet`. Files are
written whole or not at all (`replacing`), so processes racing to fill the same entry each read
a complete file.
"""

from __future__ import annotations

import os
import tempfile
from contextlib import contextmanager
from pathlib import Path


def directory(*parts: str) -> Path:
    """The cache folder `parts` under the root (not created). An OSError where there is no root:
    no LINNET_CACHE or XDG_CACHE_HOME, and no home directory."""
    root = os.environ.get("LINNET_CACHE")
    if not root:
        base = os.environ.get("XDG_CACHE_HOME")
        if not base:
            try:
                base = Path.home() / ".cache"
            except RuntimeError:  # no HOME, and no user entry to find it by
                raise OSError("no home directory to keep a cache in; set LINNET_CACHE") from None
        root = Path(base) / "linnet"
    return Path(root, *parts)


@contextmanager
def replacing(target: Path):
    """Yields a temporary path beside `target` to write; when the block ends without an error it
    becomes `target` in one rename, otherwise it is removed. Creates `target`'s folder."""
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.", suffix=".tmp")
    os.close(fd)
    try:
        yield tmp
        os.replace(tmp, target)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
