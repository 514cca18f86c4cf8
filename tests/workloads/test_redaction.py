from __future__ import annotations

import hashlib
import json

import pytest

from apps.workloads.redaction import RedactionError, parse_rules, redactor


def test_it_replaces_emails_keys_and_numbers_and_counts_them() -> None:
    r = redactor(rules=["email", "key", "number"])
    text = r.text(
        "Mail robin13@example.org or ring 555-0159; key sk-demo0e4wyg9kguzakfd0td1m, "
        "hash 9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08."
    )
    assert text == "Mail [EMAIL] or ring [NUMBER]; key [KEY], hash [KEY]."
    assert r.counts == {"email": 1, "key": 2, "number": 1}


def test_it_replaces_only_the_rules_named() -> None:
    r = redactor(rules=["email"])
    assert r.text("robin@example.org paid 40 euros") == "[EMAIL] paid 40 euros"
    assert redactor().text("robin@example.org") == "robin@example.org"
    assert not redactor().active


def test_it_applies_a_teams_own_patterns_and_keeps_only_their_hash() -> None:
    source = r"Project (?:Lantern|Harbour)"
    r = redactor(rules=["number"], patterns=[source])
    assert r.text("Project Lantern ships in 3 weeks") == "[REDACTED] ships in [NUMBER] weeks"
    summary = r.summary()
    assert summary["pattern_sha256"] == [hashlib.sha256(source.encode()).hexdigest()]
    assert summary["replaced"] == {"number": 1, "pattern 1": 1}
    assert "Lantern" not in json.dumps(summary)


@pytest.mark.parametrize(
    ("rules", "patterns", "message"),
    [
        (["emails"], [], "unknown redaction rule(s) 'emails'"),
        ([], ["(unclosed"], "redaction pattern 1: not a valid regular expression"),
        ([], ["x", "a*"], "redaction pattern 2: matches the empty string"),
    ],
)
def test_it_refuses_rules_it_cannot_apply(rules: list[str], patterns: list[str], message: str) -> None:
    with pytest.raises(RedactionError, match=message.replace("(", r"\(").replace(")", r"\)")):
        redactor(rules=rules, patterns=patterns)


def test_it_parses_a_comma_list_of_rules() -> None:
    assert parse_rules(" email, key ,,number") == ["email", "key", "number"]
    with pytest.raises(RedactionError):
        parse_rules("email,phone")
