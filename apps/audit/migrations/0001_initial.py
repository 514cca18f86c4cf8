"""AuditEvent moves here from approvals (#33) and keeps its table: the model is created in the
migration state only; approvals' 0004 removes it from approvals' state. No row moves. Its content
type is relabelled, so the permissions and admin history that name it follow the model."""

import django.db.models.deletion
from django.conf import settings
from django.db import migrations, models


def _relabel(apps, schema_editor, old: str, new: str) -> None:  # type: ignore[no-untyped-def]
    ContentType = apps.get_model("contenttypes", "ContentType")
    if not ContentType.objects.filter(app_label=new, model="auditevent").exists():
        ContentType.objects.filter(app_label=old, model="auditevent").update(app_label=new)


def forwards(apps, schema_editor):  # type: ignore[no-untyped-def]
    _relabel(apps, schema_editor, "approvals", "audit")


def backwards(apps, schema_editor):  # type: ignore[no-untyped-def]
    _relabel(apps, schema_editor, "audit", "approvals")


class Migration(migrations.Migration):
    initial = True

    dependencies = [
        ("approvals", "0003_revocation"),
        ("experiments", "0001_initial"),
        ("contenttypes", "0002_remove_content_type_name"),
        migrations.swappable_dependency(settings.AUTH_USER_MODEL),
    ]

    operations = [
        migrations.SeparateDatabaseAndState(
            state_operations=[
                migrations.CreateModel(
                    name="AuditEvent",
                    fields=[
                        (
                            "id",
                            models.BigAutoField(
                                auto_created=True, primary_key=True, serialize=False, verbose_name="ID"
                            ),
                        ),
                        ("at", models.DateTimeField(auto_now_add=True, db_index=True)),
                        ("action", models.CharField(db_index=True, max_length=64)),
                        ("target", models.CharField(blank=True, max_length=200)),
                        ("detail", models.JSONField(blank=True, default=dict)),
                        (
                            "actor",
                            models.ForeignKey(
                                blank=True,
                                null=True,
                                on_delete=django.db.models.deletion.SET_NULL,
                                to=settings.AUTH_USER_MODEL,
                            ),
                        ),
                        (
                            "experiment",
                            models.ForeignKey(
                                blank=True,
                                null=True,
                                on_delete=django.db.models.deletion.SET_NULL,
                                related_name="audit_events",
                                to="experiments.experiment",
                            ),
                        ),
                    ],
                    options={"db_table": "approvals_auditevent", "ordering": ["-at", "-id"]},
                ),
            ],
            database_operations=[],
        ),
        migrations.RunPython(forwards, backwards),
    ]
