"""The model roots this service knows, and the check every path that names a model goes through.

A model path is a path on the host that serves it, so the roots are the host's
(``TAILTUNE_MODEL_ROOTS``, workers/engine/model_paths.py). When a spec or a trace import is
checked, the service accepts a path under this process's own roots or under those an enabled
host registered (apps/runs/hosts.host_register_local); the worker checks again with its own
roots before it starts a server (workers/engine/launcher.build_launch), so a path only one host
allows never starts a server on another.

Every caller gives the same answer for a path outside the roots, whether or not it exists:
nothing here touches the file system outside them before refusing (the create page must not
tell whether a directory on the server exists).
"""

from __future__ import annotations

import os

from django.conf import settings

from apps.runs.models import Host
from workers.engine.model_paths import model_path_problem


def model_roots_known(*, hosts: bool = True) -> tuple[str, ...]:
    """This process's TAILTUNE_MODEL_ROOTS, then (``hosts``) those of every enabled host, without
    repeats."""
    roots = [str(root) for root in settings.TAILTUNE_MODEL_ROOTS]
    if not hosts:
        return tuple(dict.fromkeys(roots))
    for registered in (
        Host.objects.filter(enabled=True).order_by("name").values_list("model_roots", flat=True)
    ):
        if isinstance(registered, list):
            roots += [r for r in registered if isinstance(r, str) and os.path.isabs(r)]
    return tuple(dict.fromkeys(roots))


def model_path_error(path: str) -> str | None:
    """Why ``path`` may not be named as a model here (relative paths start at the service's
    directory, as apps/workloads/services.tokenizer_dir reads them); None when it may."""
    return model_path_problem(path, model_roots_known(), base_dir=settings.BASE_DIR)
