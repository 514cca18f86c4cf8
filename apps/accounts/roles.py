"""The three roles, as Django groups, and the one helper views use to check them."""

from __future__ import annotations

from typing import Any

VIEWER = "viewer"
EXPERIMENTER = "experimenter"
APPROVER = "approver"
ROLES = (VIEWER, EXPERIMENTER, APPROVER)


def has_role(user: Any, role: str) -> bool:
    if not getattr(user, "is_authenticated", False):
        return False
    if user.is_superuser:
        return True
    return user.groups.filter(name=role).exists()
