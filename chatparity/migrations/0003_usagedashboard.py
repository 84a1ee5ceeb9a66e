from django.db import migrations


class Migration(migrations.Migration):
    dependencies = [
        ("chatparity", "0002_key_scope_expiry_and_throughput"),
    ]

    operations = [
        migrations.CreateModel(
            name="UsageDashboard",
            fields=[],
            options={
                "verbose_name": "usage dashboard",
                "verbose_name_plural": "usage dashboard",
                "proxy": True,
                "indexes": [],
                "constraints": [],
            },
            bases=("chatparity.requestlog",),
        ),
    ]
