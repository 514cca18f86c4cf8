"""Users in each role and small experiments, shared by the view and approval tests."""

from __future__ import annotations

import pytest

from tests.experiments.factories import UserFactory, make_experiment
from tests.ui.factories import analysed


@pytest.fixture(autouse=True)
def fast_passwords(settings):  # type: ignore[no-untyped-def]
    # Real password hashing costs about a second per user on this machine; tests only log in.
    settings.PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]


@pytest.fixture
def viewer(db):  # type: ignore[no-untyped-def]
    return UserFactory(username="vera", roles=["viewer"])


@pytest.fixture
def author(db):  # type: ignore[no-untyped-def]
    return UserFactory(username="erin", roles=["experimenter"])


@pytest.fixture
def other_experimenter(db):  # type: ignore[no-untyped-def]
    return UserFactory(username="oscar", roles=["experimenter"])


@pytest.fixture
def approver(db):  # type: ignore[no-untyped-def]
    return UserFactory(username="ada", roles=["approver"])


@pytest.fixture
def nobody(db):  # type: ignore[no-untyped-def]
    return UserFactory(username="nobody")


@pytest.fixture
def experiment(author):  # type: ignore[no-untyped-def]
    return make_experiment(owner=author, name="ui-small")


@pytest.fixture
def analysed_experiment(author):  # type: ignore[no-untyped-def]
    return analysed(make_experiment(owner=author, name="ui-analysed"))


@pytest.fixture
def roles(transactional_db):  # type: ignore[no-untyped-def]
    """The role groups, for tests on a flushed database (transactional tests flush between tests,
    groups made by the migration included)."""
    from django.contrib.auth.models import Group

    for name in ("viewer", "experimenter", "approver"):
        Group.objects.get_or_create(name=name)
