"""The three roles, as Django groups, and the one helper views use to check them."""

from __future__ import annotations

from typing import Any

VIEWER = "viewer"
EXPERIMENTER = "experimenter"
APPROVER = "approver"
ROLES = (VIEWER, EXPERIMENTER, APPROVER)


def has_role(user: Any, role: str) -> bool:
    """Membership of the role's group. A superuser administers (viewer and experimenter come with
    it) but approves only as a member of the approver group, like anyone else: four eyes hold
    for administrators too."""
    if not getattr(user, "is_authenticated", False):
        return False
    if user.is_superuser and role != APPROVER:
        return True
    return user.groups.filter(name=role).exists()
