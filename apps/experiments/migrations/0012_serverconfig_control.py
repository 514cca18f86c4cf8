# An A/A control cell (issue #34 item 6): the spec's candidates[].control.

from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("experiments", "0011_experiment_hardware_id"),
    ]

    operations = [
        migrations.AddField(
            model_name="serverconfig",
            name="control",
            field=models.BooleanField(default=False),
        ),
    ]
