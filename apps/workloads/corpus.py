"""A prompt corpus: prompt texts or chat messages per class, stored by hash like a trace.

Pure: standard library only. The canonical corpus is JSONL: a header line
``{"format": "tailtune-corpus", "version": 1, "meta": {...}}`` then one entry per line,
``{"class": ..., "index": i, "messages": [...]}`` or ``{"class": ..., "index": i, "prompt":
"..."}``, each line canonical JSON (sorted keys, no spaces, ASCII). Its sha256 is the
corpus's name (``corpus_sha256`` of the runs that replay it), so the same prompts are
stored once.

Two ways in, both by content (a file's bytes, never a path a spec names):

- a corpus file the team approves (:func:`corpus_from_file`): JSONL of ``{"class": ...,
  "messages": [...]}`` or ``{"class": ..., "prompt": "..."}`` lines, spelled any way;
- a request log (apps/workloads/requestlog.py), whose prompts become the corpus of the
  trace that replays them.

Either way every text passes the team's redaction (apps/workloads/redaction.py) while it is
parsed, before anything is stored. Messages are checked to what the replay sends and the
chat template renders: roles ``system``, ``user`` and ``assistant``, text content (a list of
text parts is joined with newlines, as vLLM does for a template that takes plain strings, so
what is rendered here and what the server renders are the same string) and an optional
``name``.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from apps.workloads.redaction import Redactor

FORMAT = "tailtune-corpus"
VERSION = 1
ROLES = ("system", "user", "assistant")
MESSAGE_KEYS = ("role", "content", "name")

Message = dict[str, str]


class CorpusError(ValueError):
    """A corpus or request log that breaks its format; ``line`` is 1-based, None for the whole file."""

    def __init__(self, line: int | None, message: str) -> None:
        self.line = line
        self.message = message
        super().__init__(f"line {line}: {message}" if line is not None else message)


def canonical_line(obj: Mapping[str, Any]) -> str:
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), ensure_ascii=True) + "\n"


def _content(value: Any, where: str, line: int) -> str:
    if isinstance(value, str):
        return value
    if isinstance(value, list):
        texts = []
        for j, part in enumerate(value):
            if (
                not isinstance(part, dict)
                or part.get("type") != "text"
                or not isinstance(part.get("text"), str)
            ):
                kind = part.get("type") if isinstance(part, dict) else type(part).__name__
                raise CorpusError(
                    line, f"{where}.content[{j}]: only text parts can be replayed, not {kind!r}"
                )
            texts.append(part["text"])
        return "\n".join(texts)
    raise CorpusError(line, f"{where}.content must be text or a list of text parts")


def check_messages(value: Any, line: int, *, redact: Redactor | None = None) -> list[Message]:
    """The messages of one request or corpus entry, checked, normalised and redacted.

    Each becomes ``{"role", "content"[, "name"]}`` with text content; anything the replay
    could not send as it is rendered (other roles, tool calls, images) is a CorpusError
    naming the line and the message.
    """
    if not isinstance(value, list) or not value:
        raise CorpusError(line, "messages must be a non-empty list")
    out: list[Message] = []
    for i, message in enumerate(value):
        where = f"messages[{i}]"
        if not isinstance(message, dict):
            raise CorpusError(line, f"{where} must be an object")
        extra = sorted(set(message) - set(MESSAGE_KEYS))
        if extra:
            raise CorpusError(
                line, f"{where}: {', '.join(extra)} cannot be replayed (only role, content and name)"
            )
        role = message.get("role")
        if role not in ROLES:
            raise CorpusError(line, f"{where}.role must be one of {', '.join(ROLES)}, got {role!r}")
        if "content" not in message:
            raise CorpusError(line, f"{where}.content is required")
        content = _content(message["content"], where, line)
        entry: Message = {"role": role, "content": redact.text(content) if redact else content}
        if "name" in message:
            if not isinstance(message["name"], str) or not message["name"]:
                raise CorpusError(line, f"{where}.name must be a non-empty string")
            entry["name"] = redact.text(message["name"]) if redact else message["name"]
        out.append(entry)
    return out


def check_prompt(value: Any, line: int, *, redact: Redactor | None = None) -> str:
    """A completion prompt: one non-empty text (a list of prompts is a batch, refused)."""
    if not isinstance(value, str) or not value:
        raise CorpusError(line, "prompt must be one non-empty text (batched prompts are not replayed)")
    return redact.text(value) if redact else value


@dataclass
class CorpusEntry:
    klass: str
    messages: list[Message] | None = None
    prompt: str | None = None

    def to_json(self, index: int) -> dict[str, Any]:
        out: dict[str, Any] = {"class": self.klass, "index": index}
        if self.messages is not None:
            out["messages"] = self.messages
        else:
            out["prompt"] = self.prompt
        return out


@dataclass
class Corpus:
    meta: dict[str, Any]
    entries: list[CorpusEntry] = field(default_factory=list)

    def classes(self) -> dict[str, int]:
        """Entries per class, in first-seen order."""
        counts: dict[str, int] = {}
        for entry in self.entries:
            counts[entry.klass] = counts.get(entry.klass, 0) + 1
        return counts


def corpus_dumps(corpus: Corpus) -> bytes:
    """The canonical bytes of a corpus (what its sha256 names)."""
    parts = [canonical_line({"format": FORMAT, "version": VERSION, "meta": corpus.meta})]
    parts.extend(canonical_line(e.to_json(i)) for i, e in enumerate(corpus.entries))
    return "".join(parts).encode("ascii")


def corpus_sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _entry(obj: Any, line: int, redact: Redactor | None) -> CorpusEntry:
    if not isinstance(obj, dict):
        raise CorpusError(line, "each line must be a JSON object")
    klass = obj.get("class")
    if not isinstance(klass, str) or not klass:
        raise CorpusError(line, "class must be a non-empty string")
    if ("messages" in obj) == ("prompt" in obj):
        raise CorpusError(line, "an entry needs messages or prompt (one of them)")
    if "messages" in obj:
        return CorpusEntry(klass=klass, messages=check_messages(obj["messages"], line, redact=redact))
    return CorpusEntry(klass=klass, prompt=check_prompt(obj["prompt"], line, redact=redact))


def _json_lines(data: bytes) -> list[tuple[int, Any]]:
    try:
        text = data.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        raise CorpusError(data[: exc.start].count(b"\n") + 1, "not valid UTF-8") from None
    out: list[tuple[int, Any]] = []
    for number, raw in enumerate(text.split("\n"), start=1):
        raw = raw.removesuffix("\r")
        if not raw.strip():
            continue
        try:
            out.append((number, json.loads(raw)))
        except json.JSONDecodeError as exc:
            raise CorpusError(number, f"not valid JSON: {exc.msg}") from None
    if not out:
        raise CorpusError(1, "empty file")
    return out


def corpus_from_file(data: bytes, *, redact: Redactor) -> Corpus:
    """A team's corpus file (JSONL of class + messages or prompt) as a canonical corpus.

    Every line is checked and redacted before anything is returned; the first problem raises
    CorpusError naming its line. Blank lines are skipped (they carry nothing).
    """
    entries = [_entry(obj, number, redact) for number, obj in _json_lines(data)]
    corpus = Corpus(meta={"source": "file", "redaction": redact.summary()}, entries=entries)
    corpus.meta["classes"] = corpus.classes()
    return corpus


def corpus_loads(data: bytes) -> Corpus:
    """Parse canonical corpus bytes strictly: every line spelled as :func:`corpus_dumps` would."""
    try:
        text = data.decode("ascii")
    except UnicodeDecodeError as exc:
        raise CorpusError(
            data[: exc.start].count(b"\n") + 1, "non-ASCII byte in a canonical corpus"
        ) from None
    if not text.endswith("\n"):
        raise CorpusError(text.count("\n") + 1, "the last line must end with a newline")
    lines = text[:-1].split("\n")
    objects = []
    for number, raw in enumerate(lines, start=1):
        try:
            obj = json.loads(raw)
        except json.JSONDecodeError as exc:
            raise CorpusError(number, f"not valid JSON: {exc.msg}") from None
        if not isinstance(obj, dict) or canonical_line(obj) != raw + "\n":
            raise CorpusError(number, "not canonical JSON (sorted keys, no spaces, ASCII)")
        objects.append(obj)
    header = objects[0]
    if (
        header.get("format") != FORMAT
        or header.get("version") != VERSION
        or set(header)
        != {
            "format",
            "version",
            "meta",
        }
    ):
        raise CorpusError(
            1, f'header must be {{"format": "{FORMAT}", "version": {VERSION}, "meta": {{...}}}}'
        )
    if not isinstance(header["meta"], dict):
        raise CorpusError(1, "meta must be an object")
    corpus = Corpus(meta=header["meta"])
    for number, obj in enumerate(objects[1:], start=2):
        if obj.get("index") != number - 2 or set(obj) - {"class", "index", "messages", "prompt"}:
            raise CorpusError(number, f"an entry holds class, index ({number - 2}) and messages or prompt")
        entry = _entry(obj, number, None)
        if entry.messages is not None and entry.messages != obj["messages"]:
            raise CorpusError(number, "messages not in their normal form")
        corpus.entries.append(entry)
    return corpus
