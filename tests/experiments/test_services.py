"""experiment_create: every problem at once, owner included."""

from __future__ import annotations

import pytest

from apps.experiments.models import Experiment
from apps.experiments.spec import SpecError
from apps.lifecycle.creation import experiment_create
from tests.experiments.factories import small_spec


@pytest.mark.django_db
def test_an_unknown_owner_is_reported_with_the_other_errors() -> None:
    spec = small_spec(owner="nobody-here")
    spec["workload"] = {**spec["workload"], "repeats": 0}
    with pytest.raises(SpecError) as info:
        experiment_create(spec=spec)
    assert {e.path for e in info.value.errors} >= {"workload.repeats", "owner"}
    assert Experiment.objects.count() == 0
