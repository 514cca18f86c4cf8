"""A search's screening trial as a cell (issue #36): ``ServerConfig.role`` gains ``trial``, a
choices change only (the default manager that hides unconfirmed trials is not in migrations)."""

from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("experiments", "0012_serverconfig_control"),
    ]

    operations = [
        migrations.AlterField(
            model_name="serverconfig",
            name="role",
            field=models.CharField(
                choices=[("baseline", "Baseline"), ("candidate", "Candidate"), ("trial", "Trial")],
                max_length=16,
            ),
        ),
    ]
