"""Token scopes and a required expiry.

Every existing token gets the scopes its user's roles grant today (read with any role, run
with experimenter or superuser, approve with approver) and an expiry at most
TAILTUNE_TOKEN_DAYS (90 unless set) from now: one that never expired, or expired later than
that, now expires then. A token's rights stay bounded by its user's roles at each request.
"""

from datetime import timedelta

from django.conf import settings
from django.db import migrations, models
from django.utils import timezone


def scope_and_expire(apps, schema_editor):
    ApiToken = apps.get_model("accounts", "ApiToken")
    latest = timezone.now() + timedelta(days=int(getattr(settings, "TAILTUNE_TOKEN_DAYS", 90)))
    for token in ApiToken.objects.select_related("user"):
        user = token.user
        groups = set(user.groups.values_list("name", flat=True))
        scopes = []
        if user.is_superuser or groups & {"viewer", "experimenter", "approver"}:
            scopes.append("read")
        if user.is_superuser or "experimenter" in groups:
            scopes.append("run")
        if "approver" in groups:
            scopes.append("approve")
        token.scopes = sorted(scopes)
        if token.expires_at is None or token.expires_at > latest:
            token.expires_at = latest
        token.save(update_fields=["scopes", "expires_at"])


class Migration(migrations.Migration):

    dependencies = [
        ("accounts", "0002_api_tokens"),
    ]

    operations = [
        migrations.AddField(
            model_name="apitoken",
            name="scopes",
            field=models.JSONField(default=list),
        ),
        migrations.RunPython(scope_and_expire, migrations.RunPython.noop),
        migrations.AlterField(
            model_name="apitoken",
            name="expires_at",
            field=models.DateTimeField(),
        ),
    ]
