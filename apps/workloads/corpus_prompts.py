"""Generated traffic with a team's prompts: a stored corpus, rendered once, drawn per request.

Pure: standard library and numpy, plus a renderer given by the caller (the pinned
tokenizer's chat template, apps/workloads/chat_template.py). A spec's ``workload.prompts:
{corpus_sha256: ...}`` names a corpus stored by ``corpus_import`` (or a request log's); the
generator (apps/workloads/generate.py) then keeps its arrivals and class quotas and, instead
of exact-length token ids, gives each request one of its class's corpus entries, drawn with
a seed derived like every other draw. A request's ``input_tokens`` is its entry's rendered
count (the chat template's, for chat messages), so the records, the class lengths and the
server's prefill agree; its output length stays the class's (sent exactly, as for
generated traffic).

Entries that leave no room for the class's output in the context are left out (counted);
a class the corpus has no usable entry for is an error naming it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np

from apps.workloads.corpus import Corpus, CorpusEntry


class CorpusPromptError(ValueError):
    """A corpus that cannot give a class its prompts; the message names the class."""


class Renderer(Protocol):
    tokenizer_sha256: str
    template_sha256: str

    def count_chat(self, messages: Sequence[dict[str, str]]) -> int: ...

    def count_text(self, prompt: str) -> int: ...


@dataclass(frozen=True)
class Prompt:
    entry: CorpusEntry
    input_tokens: int


@dataclass
class CorpusPrompts:
    """A corpus's entries per class with their rendered counts, ready to be drawn from."""

    sha256: str
    tokenizer_sha256: str
    template_sha256: str
    by_class: dict[str, list[Prompt]] = field(default_factory=dict)
    too_long: dict[str, int] = field(default_factory=dict)

    def lengths(self) -> dict[str, dict[str, int]]:
        """Per class: its usable entries, and the median and longest rendered count."""
        out = {}
        for name, prompts in self.by_class.items():
            counts = [p.input_tokens for p in prompts]
            out[name] = {"entries": len(counts), "median": int(np.median(counts)), "max": max(counts)}
        return out

    def draw(self, labels: Sequence[str], rng: np.random.Generator) -> list[Prompt]:
        """One entry per request label, uniformly among its class's (with replacement)."""
        missing = sorted({label for label in labels if not self.by_class.get(label)})
        if missing:
            raise CorpusPromptError(f"the corpus has no usable prompt for class(es) {', '.join(missing)}")
        picks = [int(i) for i in rng.integers(0, 2**62, size=len(labels))]
        return [
            self.by_class[label][i % len(self.by_class[label])]
            for label, i in zip(labels, picks, strict=True)
        ]


def corpus_prompts(
    corpus: Corpus,
    *,
    sha256: str,
    renderer: Renderer,
    max_model_len: int,
    output_tokens: Mapping[str, int],
) -> CorpusPrompts:
    """Render every entry of the classes in ``output_tokens`` and keep those that fit the context
    with their class's output."""
    out = CorpusPrompts(
        sha256=sha256, tokenizer_sha256=renderer.tokenizer_sha256, template_sha256=renderer.template_sha256
    )
    for entry in corpus.entries:
        if entry.klass not in output_tokens:
            continue
        if entry.messages is not None:
            n = renderer.count_chat(entry.messages)
        else:
            n = renderer.count_text(entry.prompt or "")
        if n < 1 or n + int(output_tokens[entry.klass]) > max_model_len:
            out.too_long[entry.klass] = out.too_long.get(entry.klass, 0) + 1
            continue
        out.by_class.setdefault(entry.klass, []).append(Prompt(entry, n))
    return out


def prompt_fields(prompt: Prompt) -> dict[str, Any]:
    """A drawn entry as a trace request's prompt fields."""
    entry = prompt.entry
    if entry.messages is not None:
        return {"messages": [dict(m) for m in entry.messages]}
    return {"prompt": entry.prompt}
