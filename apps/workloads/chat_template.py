"""Chat messages rendered with the pinned tokenizer's own chat template, and counted.

Pure: ``transformers`` (its tokenizer only: no torch), no Django. The rendering is
``transformers``' own ``apply_chat_template``, the reference implementation of chat
templates, which vLLM also calls for ``/v1/chat/completions``. So with the same model
directory (the pinned tokenizer and its template) the string rendered here is the one the
server renders, and the count is the server's ``usage.prompt_tokens``:

- chat: ``apply_chat_template(messages, tokenize=False, add_generation_prompt=True)``, then
  the rendered text encoded with ``add_special_tokens=False`` (the template writes BOS
  itself; vLLM's chat default ``add_special_tokens`` is false);
- completion text: encoded with ``add_special_tokens=True``, as vLLM does for a
  ``/v1/completions`` text prompt.

The template's sha256 is recorded with the trace beside the tokenizer's, so a trace names
the exact rendering its counts came from.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any


class ChatTemplateError(ValueError):
    """A model directory whose tokenizer cannot render chat messages."""


def _quiet_transformers() -> None:
    # transformers advises at import that PyTorch is missing: a tokenizer does not need it.
    os.environ.setdefault("TRANSFORMERS_NO_ADVISORY_WARNINGS", "1")


class ChatRenderer:
    """The model directory's tokenizer (tokenizer.json + tokenizer_config.json) and chat template."""

    def __init__(self, model_dir: str | Path) -> None:
        _quiet_transformers()
        from transformers import AutoTokenizer

        path = Path(model_dir)
        tokenizer_json = path / "tokenizer.json"
        if not tokenizer_json.is_file():
            raise ChatTemplateError(f"no tokenizer.json in {model_dir}")
        self.tokenizer_sha256 = hashlib.sha256(tokenizer_json.read_bytes()).hexdigest()
        # Local files only, and never the model's own code: the directory lies under a
        # model root the operator configured (docs/ENGINE.md, "Where its models may lie").
        self._tok: Any = AutoTokenizer.from_pretrained(
            str(path), local_files_only=True, trust_remote_code=False
        )
        template = self._tok.chat_template
        if isinstance(template, dict):  # named templates: the one used without tools
            template = template.get("default")
        self.template: str | None = template if isinstance(template, str) and template else None
        self.template_sha256 = (
            hashlib.sha256(self.template.encode("utf-8")).hexdigest() if self.template else ""
        )

    def render(self, messages: Sequence[dict[str, str]]) -> str:
        """The prompt text the server builds from ``messages`` (with the assistant's opener)."""
        if self.template is None:
            raise ChatTemplateError(
                "the tokenizer has no chat template (tokenizer_config.json chat_template): "
                "chat requests cannot be rendered as the server would"
            )
        text = self._tok.apply_chat_template(
            [dict(m) for m in messages], tokenize=False, add_generation_prompt=True
        )
        if not isinstance(text, str):
            raise ChatTemplateError(f"the chat template rendered {type(text).__name__}, not text")
        return text

    def chat_ids(self, messages: Sequence[dict[str, str]]) -> list[int]:
        return list(self._tok.encode(self.render(messages), add_special_tokens=False))

    def count_chat(self, messages: Sequence[dict[str, str]]) -> int:
        """The rendered prompt's token count: the server's ``usage.prompt_tokens`` for it."""
        return len(self.chat_ids(messages))

    def count_text(self, prompt: str) -> int:
        """A ``/v1/completions`` text prompt's token count (special tokens added, as the server does)."""
        return len(self._tok.encode(prompt, add_special_tokens=True))
