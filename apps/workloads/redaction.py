"""Redaction of what a team marks sensitive in prompt text, before anything is stored.

Pure: standard library only. A team names rules (``email``, ``key``, ``number``) and may add
its own regular expressions; :meth:`Redactor.text` replaces every match with a placeholder
(``[EMAIL]``, ``[KEY]``, ``[NUMBER]``, ``[REDACTED]`` for a team's own pattern) and counts
the replacements. The request-log importer and the corpus importer run every prompt text
and message through it while parsing, so neither the stored corpus nor the stored trace
ever holds the original text. What is kept about the redaction is the rule names, the
sha256 of each own pattern (a pattern can itself spell what it hides, so it is not kept)
and the counts.

Order: keys first (a key can contain an ``@`` or digits), then e-mail addresses, then the
team's own patterns in their order, then numbers last, so that a number inside an address
or a key never breaks the longer match. No placeholder contains a digit or an ``@``, so a
later rule never rewrites an earlier placeholder.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Sequence
from dataclasses import dataclass, field

# Named rules: (placeholder, pattern). Keys: the prefixes API keys and tokens commonly carry
# (OpenAI-style sk-, GitHub ghp_/gho_/ghs_, Slack xox?-, AWS AKIA, Google AIza), long hex
# strings (hashes, secrets) and long runs mixing letters and digits.
NAMED_RULES: dict[str, tuple[str, str]] = {
    "key": (
        "[KEY]",
        r"\b(?:sk|pk|rk|ghp|gho|ghs|xox[abprs]|AKIA|AIza)[-_A-Za-z0-9]{12,}"
        r"|\b[A-Fa-f0-9]{32,}\b"
        r"|\b(?=[A-Za-z0-9_-]*\d)(?=[A-Za-z0-9_-]*[A-Za-z])[A-Za-z0-9_-]{24,}\b",
    ),
    "email": ("[EMAIL]", r"[A-Za-z0-9._%+-]+@[A-Za-z0-9-]+(?:\.[A-Za-z0-9-]+)*\.[A-Za-z]{2,}"),
    "number": ("[NUMBER]", r"\d+(?:[.,:/-]\d+)*"),
}
# The order rules apply in; a team's own patterns go before "number".
_ORDER_BEFORE = ("key", "email")
_ORDER_AFTER = ("number",)
CUSTOM_PLACEHOLDER = "[REDACTED]"


class RedactionError(ValueError):
    """A rule or pattern that cannot be used; the message names it."""


@dataclass(frozen=True)
class _Rule:
    name: str
    placeholder: str
    pattern: re.Pattern[str]


@dataclass
class Redactor:
    """The rules a team chose, compiled, with the count of replacements made so far."""

    rules: tuple[_Rule, ...]
    names: tuple[str, ...]
    pattern_sha256: tuple[str, ...]
    counts: dict[str, int] = field(default_factory=dict)

    def text(self, value: str) -> str:
        """``value`` with every match of every rule replaced by its placeholder."""
        for rule in self.rules:
            value, n = rule.pattern.subn(rule.placeholder, value)
            if n:
                self.counts[rule.name] = self.counts.get(rule.name, 0) + n
        return value

    @property
    def active(self) -> bool:
        return bool(self.rules)

    def summary(self) -> dict[str, object]:
        """What is kept about the redaction: rule names, own patterns' sha256, counts; no text."""
        return {
            "rules": list(self.names),
            "pattern_sha256": list(self.pattern_sha256),
            "replaced": dict(sorted(self.counts.items())),
        }


def redactor(*, rules: Sequence[str] = (), patterns: Sequence[str] = ()) -> Redactor:
    """Compile the named ``rules`` and the team's own regular expressions ``patterns``.

    An unknown rule name, a pattern that does not compile, or one that matches the empty
    string (it would insert a placeholder between every character) is a RedactionError.
    """
    unknown = [r for r in rules if r not in NAMED_RULES]
    if unknown:
        raise RedactionError(
            f"unknown redaction rule(s) {', '.join(map(repr, unknown))} (known: {', '.join(NAMED_RULES)})"
        )
    chosen = list(dict.fromkeys(rules))
    compiled: list[_Rule] = []
    for name in _ORDER_BEFORE:
        if name in chosen:
            placeholder, named = NAMED_RULES[name]
            compiled.append(_Rule(name, placeholder, re.compile(named)))
    digests: list[str] = []
    for i, source in enumerate(patterns, start=1):
        try:
            own = re.compile(source)
        except re.error as exc:
            raise RedactionError(f"redaction pattern {i}: not a valid regular expression: {exc}") from None
        if own.fullmatch(""):
            raise RedactionError(f"redaction pattern {i}: matches the empty string")
        digests.append(hashlib.sha256(source.encode("utf-8")).hexdigest())
        compiled.append(_Rule(f"pattern {i}", CUSTOM_PLACEHOLDER, own))
    for name in _ORDER_AFTER:
        if name in chosen:
            placeholder, named = NAMED_RULES[name]
            compiled.append(_Rule(name, placeholder, re.compile(named)))
    return Redactor(rules=tuple(compiled), names=tuple(chosen), pattern_sha256=tuple(digests))


def parse_rules(text: str) -> list[str]:
    """``email,key`` -> ["email", "key"]; empty items are ignored, unknown names refused."""
    names = [part.strip() for part in text.split(",") if part.strip()]
    redactor(rules=names)  # refuses unknown names
    return names
