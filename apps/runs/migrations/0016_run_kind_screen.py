"""A search's screening run (issue #36): ``Run.kind`` gains ``screen``, a choices change only."""

from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("runs", "0015_requestrecord_server_clock"),
    ]

    operations = [
        migrations.AlterField(
            model_name="run",
            name="kind",
            field=models.CharField(
                choices=[
                    ("sweep", "Sweep"),
                    ("uniform", "Uniform"),
                    ("calibration", "Calibration"),
                    ("pace", "Pace"),
                    ("scenario", "Scenario"),
                    ("rehearsal", "Rehearsal"),
                    ("screen", "Screen"),
                ],
                db_index=True,
                default="sweep",
                max_length=16,
            ),
        ),
    ]
