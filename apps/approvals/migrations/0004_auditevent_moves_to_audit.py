"""AuditEvent moves to apps/audit (#33): removed from approvals' migration state only; the table
approvals_auditevent stays, and audit's 0001 takes it over in the state."""

from django.db import migrations


class Migration(migrations.Migration):
    dependencies = [
        ("approvals", "0003_revocation"),
        ("audit", "0001_initial"),
    ]

    operations = [
        migrations.SeparateDatabaseAndState(
            state_operations=[migrations.DeleteModel(name="AuditEvent")],
            database_operations=[],
        ),
    ]
