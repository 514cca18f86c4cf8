"""The spec validator's error types and its field checker (``_Checker``).

Pure: no Django. ``_Checker`` collects a :class:`FieldError` per problem (the field path and
the reason) instead of stopping at the first, so ``validate_spec`` reports every problem at once.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from collections.abc import Set as AbstractSet
from dataclasses import dataclass
from typing import Any

from apps.experiments.spec_rules import NUMBER_CEILING


@dataclass(frozen=True)
class FieldError:
    path: str
    message: str

    def __str__(self) -> str:
        return f"{self.path}: {self.message}"


class SpecError(ValueError):
    """A spec that cannot be used; ``errors`` lists every problem found."""

    def __init__(self, errors: list[FieldError]) -> None:
        self.errors = errors
        super().__init__("\n".join(str(e) for e in errors))


def _short(value: Any) -> str:
    """A number for an error message: a huge integer is named by its size, not printed whole."""
    if isinstance(value, int) and abs(value) >= 10**18:
        return f"a {len(str(abs(value)))}-digit number"
    return repr(value)


def _encodable(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:  # a lone surrogate, from JSON "\\ud800"
        return False
    return True


class _Checker:
    def __init__(self) -> None:
        self.errors: list[FieldError] = []

    def fail(self, path: str, message: str) -> None:
        self.errors.append(FieldError(path, message))

    def mapping(self, value: Any, path: str, *, required: bool = True) -> dict[str, Any]:
        if value is None and not required:
            return {}
        if not isinstance(value, Mapping):
            self.fail(path, "required mapping is missing" if value is None else "must be a mapping")
            return {}
        return {str(k): v for k, v in value.items()}

    def unknown(self, data: Mapping[str, Any], allowed: AbstractSet[str], path: str) -> None:
        for key in sorted(set(data) - allowed):
            self.fail(f"{path}.{key}" if path else key, "unknown field")

    def text(
        self, data: Mapping[str, Any], key: str, path: str, *, required: bool = True, max_length: int = 10_000
    ) -> str:
        value = data.get(key)
        where = f"{path}.{key}" if path else key
        if value is None or value == "":
            if required:
                self.fail(where, "is required")
            return ""
        if not isinstance(value, (str, int, float)) or isinstance(value, bool):
            self.fail(where, "must be a string")
            return ""
        text = str(value)
        if len(text) > max_length:
            self.fail(where, f"is {len(text)} characters; at most {max_length}")
            return ""
        if "\x00" in text or not _encodable(text):
            self.fail(where, "must be plain text (no NUL character, valid UTF-8)")
            return ""
        return text

    def number(
        self,
        data: Mapping[str, Any],
        key: str,
        path: str,
        *,
        required: bool = True,
        positive: bool = False,
        minimum: float | None = None,
        maximum: float | None = None,
        integer: bool = False,
        default: Any = None,
    ) -> Any:
        where = f"{path}.{key}" if path else key
        if key not in data or data[key] is None:
            if required:
                self.fail(where, "is required")
            return default
        value = data[key]
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            self.fail(where, f"must be a number, got {value!r}")
            return default
        if integer and not (isinstance(value, int) or float(value).is_integer()):
            self.fail(where, f"must be a whole number, got {value!r}")
            return default
        if isinstance(value, float) and not math.isfinite(value):
            self.fail(where, f"must be finite, got {value!r}")
            return default
        if positive and value <= 0:
            self.fail(where, f"must be positive, got {value!r}")
            return default
        if minimum is not None and value < minimum:
            self.fail(where, f"must be at least {minimum}, got {value!r}")
            return default
        ceiling = maximum if maximum is not None else NUMBER_CEILING
        if value > ceiling:
            shown = maximum if maximum is not None else f"{NUMBER_CEILING:g}"
            self.fail(where, f"must be at most {shown}, got {_short(value)}")
            return default
        if minimum is None and not positive and value < -NUMBER_CEILING:
            self.fail(where, f"must be at least {-NUMBER_CEILING:g}, got {_short(value)}")
            return default
        return int(value) if integer else float(value)

    def choice(self, data: Mapping[str, Any], key: str, path: str, choices: tuple[str, ...]) -> str:
        """One of ``choices``; the first when the key is absent."""
        value = data.get(key, choices[0])
        if value not in choices:
            self.fail(f"{path}.{key}", f"must be {' or '.join(choices)}, got {value!r:.60}")
            return choices[0]
        return str(value)

    def boolean(self, data: Mapping[str, Any], key: str, path: str, *, default: bool) -> bool:
        if key not in data or data[key] is None:
            return default
        if not isinstance(data[key], bool):
            self.fail(f"{path}.{key}", f"must be true or false, got {data[key]!r}")
            return default
        return data[key]
