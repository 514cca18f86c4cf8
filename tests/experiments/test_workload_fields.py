"""The workload's scalars are declared once (apps/experiments/workload_fields.py); the two places
that must still write them out, the stored spec's type and the Workload row's columns, say the
same, and the create form and the export take them from the declaration."""

from __future__ import annotations

import typing

import pytest
from django.db import models

from apps.experiments.forms import ExperimentForm
from apps.experiments.models import Workload
from apps.experiments.spec_types import Workload as WorkloadSpec
from apps.experiments.workload_fields import WORKLOAD_FIELDS, WORKLOAD_KEYS, WORKLOAD_STRUCTURE
from tests.experiments.factories import SMALL_SPEC, make_experiment

COLUMN_TYPES = {int: (models.IntegerField,), float: (models.FloatField,), str: (models.CharField,)}


def test_the_stored_spec_type_declares_the_same_scalars_in_the_same_order() -> None:
    hints = typing.get_type_hints(WorkloadSpec)
    assert set(hints) == WORKLOAD_KEYS
    scalars = [name for name in hints if name not in WORKLOAD_STRUCTURE]
    assert scalars == [f.name for f in WORKLOAD_FIELDS]
    for f in WORKLOAD_FIELDS:
        assert hints[f.name] is f.kind, f.name
        assert f.name in WorkloadSpec.__required_keys__, f.name


@pytest.mark.parametrize("field", [f for f in WORKLOAD_FIELDS if f.column], ids=lambda f: f.name)
def test_each_column_has_the_declared_kind_and_default(field) -> None:  # type: ignore[no-untyped-def]
    column = Workload._meta.get_field(field.name)
    assert isinstance(column, COLUMN_TYPES[field.kind]), type(column)
    assert column.default == field.default and not column.null
    if field.choices:
        assert column.max_length >= max(len(value) for value in field.values)


def test_a_scalar_that_is_no_column_is_only_in_the_stored_spec() -> None:
    columns = {f.name for f in Workload._meta.get_fields()}
    assert [f.name for f in WORKLOAD_FIELDS if f.name not in columns] == [
        f.name for f in WORKLOAD_FIELDS if not f.column
    ]


def test_the_create_form_shows_each_declared_field_in_the_workload_section() -> None:
    form = ExperimentForm()
    workload = dict(form.sections())["Workload"]
    shown = [b.name for b in workload if b.name in {f.name for f in WORKLOAD_FIELDS}]
    assert shown == [f.name for f in WORKLOAD_FIELDS if f.form]
    for f in WORKLOAD_FIELDS:
        if f.form:
            bound = form[f.name]
            assert bound.initial == f.default and bound.help_text == f.help
            assert [value for value, _ in getattr(bound.field, "choices", ())] == list(f.values)


@pytest.mark.django_db
def test_the_export_gives_every_scalar_back_as_stored() -> None:
    from apps.experiments.services import experiment_to_spec

    experiment = make_experiment(
        workload={**SMALL_SPEC["workload"], "uniform_companion": True, "output_mode": "natural"}
    )
    exported = experiment_to_spec(experiment=experiment)["workload"]
    assert {f.name: exported[f.name] for f in WORKLOAD_FIELDS} == {
        f.name: experiment.spec["workload"][f.name] for f in WORKLOAD_FIELDS
    }
    assert exported["uniform_companion"] is True and exported["output_mode"] == "natural"
