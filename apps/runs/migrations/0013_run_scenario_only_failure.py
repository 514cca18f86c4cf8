"""Run.kind alone says what a run is: ``scenario`` keeps only a failure scenario's name.

Forward, the uniform, calibration, pace and rehearsal runs lose the label their ``scenario``
repeated from their kind; backward, they get it again (a pace run's was "calibration").
"""

from django.db import migrations, models

# What migration 0011's constraint made ``scenario`` hold for each kind that is not a failure scenario.
LABELS = {"uniform": "uniform", "calibration": "calibration", "pace": "calibration", "rehearsal": "rehearsal"}


def scenario_only_failure(apps, schema_editor):
    Run = apps.get_model("runs", "Run")
    Run.objects.exclude(kind="scenario").exclude(scenario="").update(scenario="")


def scenario_labels_back(apps, schema_editor):
    Run = apps.get_model("runs", "Run")
    for kind, label in LABELS.items():
        Run.objects.filter(kind=kind).update(scenario=label)


class Migration(migrations.Migration):
    dependencies = [
        ("runs", "0012_host_operator_names"),
    ]

    operations = [
        migrations.RemoveConstraint(model_name="run", name="run_kind_matches_scenario"),
        migrations.RunPython(scenario_only_failure, scenario_labels_back),
        migrations.AddConstraint(
            model_name="run",
            constraint=models.CheckConstraint(
                condition=models.Q(
                    models.Q(("kind", "scenario"), models.Q(("scenario", ""), _negated=True)),
                    models.Q(models.Q(("kind", "scenario"), _negated=True), ("scenario", "")),
                    _connector="OR",
                ),
                name="run_scenario_only_on_scenario_kind",
            ),
        ),
    ]
