"""When the server received each request and gave its first token, on the server's clock moved
onto the replay's (workers/engine/spans.py ``_align_clocks``): two nullable nanosecond times, NULL
on every record written before."""

from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ("runs", "0014_requestrecord_server_timings"),
    ]

    operations = [
        migrations.AddField(
            model_name="requestrecord",
            name="server_arrival_ns",
            field=models.BigIntegerField(null=True),
        ),
        migrations.AddField(
            model_name="requestrecord",
            name="server_first_token_ns",
            field=models.BigIntegerField(null=True),
        ),
    ]
