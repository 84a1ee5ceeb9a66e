from django.db import migrations


class Migration(migrations.Migration):
    """The usage dashboard is the opt-in app ``chatparity_dashboard`` now (its 0001 creates
    the proxy again there and carries over the permissions granted on this one)."""

    dependencies = [
        ("chatparity", "0006_security"),
    ]

    operations = [
        migrations.DeleteModel(name="UsageDashboard"),
    ]
