"""Capture B0 for the create page, the API and ``manage.py baseline_capture``: each source
resolved here, then read by apps/experiments/baseline_capture.py (docs/SPEC.md, "Capturing B0").

Here because one source is this app's: the last approved rollback manifest of an earlier
experiment (a sweep starts where the last one ended, as the gate does).

The trust boundary (docs/SECURITY.md): a user picks a running server by a name the operator set
in ``TAILTUNE_CAPTURE_SOURCES``, never by URL, so nobody can make the service fetch an address
of their choosing; ``url`` is for the operator's command only. Pasted text is only parsed (by
vLLM's own parser, in the engine's interpreter: nothing in it is run or fetched), and a
manifest is read from this service's own approvals.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

from django.conf import settings
from django.core.cache import cache

from apps.approvals.models import Revocation, RollbackManifest
from apps.experiments import baseline_capture as bc
from apps.experiments.spec_capture import CAPTURE_SOURCES

MAX_EXPERIMENT_ID = 2**63 - 1
# vLLM's parser runs in the engine's interpreter: 15-35 s of imports on a busy CPU host. A
# request waits for it, so at most this many run at once (others are told to try again, never
# queued behind them), and a command line already read is answered from the cache.
PARSE_TIMEOUT_S = 120.0
PARSED_KEPT_S = 24 * 3600


def _parse_slots() -> int:
    return max(1, int(getattr(settings, "TAILTUNE_CAPTURE_PARSES", 1)))


def bounded_parse(argv: list[str], engine_python: str) -> dict[str, Any]:
    """vLLM's parser on ``argv`` (workers/engine/vllm_args.parse_serve_command), at most
    TAILTUNE_CAPTURE_PARSES at once across the service's processes (a slot is a cache key held
    for the parse's timeout at most), each distinct command line parsed once a day."""
    from workers.engine import vllm_args

    digest = hashlib.sha256(json.dumps([engine_python, argv]).encode()).hexdigest()
    key = f"capture-parse:{digest}"
    kept = cache.get(key)
    if isinstance(kept, dict):
        return kept
    slots = _parse_slots()
    slot = next(
        (
            f"capture-parse-slot:{i}"
            for i in range(slots)
            if cache.add(f"capture-parse-slot:{i}", 1, PARSE_TIMEOUT_S)
        ),
        None,
    )
    if slot is None:
        raise bc.CaptureBusy(
            "text",
            f"vLLM's parser is reading {slots} other capture{'s' if slots > 1 else ''} right now "
            "(TAILTUNE_CAPTURE_PARSES): try again in half a minute",
        )
    try:
        parsed = vllm_args.parse_serve_command(argv, engine_python, timeout_s=PARSE_TIMEOUT_S)
    finally:
        cache.delete(slot)
    cache.set(key, parsed, PARSED_KEPT_S)
    return parsed


def capture_server_names() -> list[str]:
    """The names of the servers a user may capture B0 from (TAILTUNE_CAPTURE_SOURCES)."""
    return sorted(settings.TAILTUNE_CAPTURE_SOURCES)


def engine_python() -> str:
    """The interpreter of the engine in use, whose vLLM parser reads a deployment's text."""
    return str(settings.ENGINE_DIR / "venv" / "bin" / "python")


def _cache_defaults() -> dict[str, Any]:
    """vLLM's defaults of the flags a server's cache_config_info shows (the pinned catalogue)."""
    from workers.engine import vllm_args

    defaults = vllm_args.catalogue().defaults()
    return {dest: defaults[dest] for dest in bc.CACHE_LABEL_ARGS.values() if dest in defaults}


def _from_server(*, server: str | None, url: str | None, at: str | None) -> bc.Captured:
    if url is not None:  # the operator's own command
        base, name = url, url
    else:
        names = settings.TAILTUNE_CAPTURE_SOURCES
        if not server or server not in names:
            offered = ", ".join(sorted(names)) or "none: the operator sets TAILTUNE_CAPTURE_SOURCES"
            raise bc.CaptureError(
                "server", f"{str(server or '')[:64]!r} is not a server the operator named (named: {offered})"
            )
        base, name = names[server], server
    return bc.from_server(bc.fetch_server(base), name=name, defaults=_cache_defaults(), at=at)


def _manifest(experiment: Any) -> tuple[RollbackManifest, int]:
    if experiment in (None, ""):
        revoked = Revocation.objects.values("approval_id")
        row = RollbackManifest.objects.exclude(approval_id__in=revoked).order_by("-created_at", "-pk").first()
        if row is None:
            raise bc.CaptureError(
                "experiment", "no approved manifest yet: give an experiment, or another source"
            )
        return row, row.experiment_id
    text = str(experiment).strip()
    if not text.isascii() or not text.isdigit() or not 0 < int(text) <= MAX_EXPERIMENT_ID:
        raise bc.CaptureError("experiment", f"must be an experiment's id (a whole number), got {text[:40]!r}")
    pk = int(text)
    row = RollbackManifest.objects.filter(experiment_id=pk).first()
    if row is None:
        raise bc.CaptureError("experiment", f"experiment {pk} has no approved rollback manifest")
    if Revocation.objects.filter(approval_id=row.approval_id).exists():
        raise bc.CaptureError(
            "experiment",
            f"the approval of experiment {pk} was revoked: its manifest is not what production runs",
        )
    return row, pk


def baseline_capture(
    *,
    source: str,
    text: str | None = None,
    server: str | None = None,
    experiment: Any = None,
    container: str | None = None,
    url: str | None = None,
    at: str | None = None,
    bounded: bool = True,
) -> bc.Captured:
    """B0 captured from one source; CaptureError (a SpecError) naming the field at fault.

    ``bounded``: a pasted text's parse takes a slot of TAILTUNE_CAPTURE_PARSES (a web request);
    the operator's command (``bounded=False``) waits for vLLM's parser instead of being refused.

    ``source``: ``server`` (``server``: a name from TAILTUNE_CAPTURE_SOURCES; ``url``: the
    operator's command only), ``command``, ``kubernetes`` or ``helm`` (``text``; ``container``
    picks one where several start vLLM), or ``manifest`` (``experiment``: its id; none: the
    newest approved manifest not revoked).
    """
    if source not in CAPTURE_SOURCES:
        raise bc.CaptureError(
            "source", f"must be one of {', '.join(CAPTURE_SOURCES)}, got {str(source)[:40]!r}"
        )
    if source == "server":
        return _from_server(server=server, url=url, at=at)
    if source == "manifest":
        row, pk = _manifest(experiment)
        raw, _ = row.file("json")
        try:
            doc = json.loads(raw)
        except ValueError:
            raise bc.CaptureError("experiment", f"the manifest of experiment {pk} cannot be read") from None
        return bc.from_manifest(doc, raw, name=f"experiment {pk} (manifest sha256 {row.sha256})", at=at)
    return bc.from_text(
        source,
        text or "",
        engine_python=engine_python(),
        container=(container or "").strip() or None,
        at=at,
        parse=bounded_parse if bounded else None,
    )
