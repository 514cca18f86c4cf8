"""Where a model may be loaded from: the host's model roots (``TAILTUNE_MODEL_ROOTS``).

Pure: no Django, nothing of ours imported. The spec's check (apps/experiments/spec.py, with
the roots the service knows), the create page, the trace importers and the launcher on the
worker (workers/engine/launcher.build_launch, with the worker's own roots) all ask
:func:`model_path_problem`. Its steps:

1. Refuse control characters and any ``..`` component, before the file system is touched.
2. Make the path absolute (a relative one starts at ``base_dir``) and normalise it lexically.
3. The lexical path must lie under a root (as configured, or as that root resolves): a path
   outside every root is refused without a look at the file system, so the answer says
   nothing about what exists there.
4. Resolve symbolic links (non-strict: a path that does not exist yet resolves as far as it
   exists) and require the result under a resolved root: a link inside a root that leads out
   of it is refused with the same message as a path outside, exists or not.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path

PARENT_MESSAGE = "must not contain '..': give the model directory's own path"
CONTROL_MESSAGE = "must not contain control characters"


def outside_message(roots: Sequence[str]) -> str:
    """The one message for a path outside the roots (step 3 or 4; it exists or not)."""
    listed = ", ".join(roots) if roots else "none are set"
    return f"must be a model directory under the host's model roots ({listed}; TAILTUNE_MODEL_ROOTS)"


def _within(path: str, root: str) -> bool:
    return path == root or path.startswith(root.rstrip(os.sep) + os.sep)


def model_path_problem(path: str, roots: Sequence[str] | None, *, base_dir: str | Path) -> str | None:
    """Why ``path`` may not be loaded as a model here (module docstring, steps 1-4); None when
    it may. ``roots`` None checks steps 1 only (no roots known: a pure spec check)."""
    if any(ord(ch) < 32 or ord(ch) == 127 for ch in path):
        return CONTROL_MESSAGE
    if ".." in path.replace("\\", "/").split("/"):
        return PARENT_MESSAGE
    if roots is None:
        return None
    absolute = os.path.normpath(os.path.join(os.fspath(base_dir), path))
    given = [os.path.normpath(root) for root in roots]
    resolved = [os.path.realpath(root) for root in given]
    if not any(_within(absolute, root) for root in given + resolved):
        return outside_message(roots)
    if not any(_within(os.path.realpath(absolute), root) for root in resolved):
        return outside_message(roots)
    return None
