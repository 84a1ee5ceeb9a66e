from django.db import migrations

# Until chatparity 0007 the dashboard's proxy model was the core app's.
CORE_LABEL, DASHBOARD_LABEL, MODEL = "chatparity", "chatparity_dashboard", "usagedashboard"


def relabel(apps, schema_editor, old_label, new_label):
    """Move the proxy's content type, and so its permissions and whoever holds them, from
    ``old_label`` to ``new_label``, unless ``new_label`` already has one of its own."""
    ContentType = apps.get_model("contenttypes", "ContentType")
    types = ContentType.objects.using(schema_editor.connection.alias)
    if not types.filter(app_label=new_label, model=MODEL).exists():
        types.filter(app_label=old_label, model=MODEL).update(app_label=new_label)


def adopt_permissions(apps, schema_editor):
    relabel(apps, schema_editor, CORE_LABEL, DASHBOARD_LABEL)


def return_permissions(apps, schema_editor):
    relabel(apps, schema_editor, DASHBOARD_LABEL, CORE_LABEL)


class Migration(migrations.Migration):
    initial = True

    dependencies = [
        ("chatparity", "0007_usagedashboard_moves_to_its_app"),
        ("contenttypes", "0002_remove_content_type_name"),
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
        migrations.RunPython(adopt_permissions, return_permissions),
    ]
