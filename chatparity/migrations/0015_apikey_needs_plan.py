from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("chatparity", "0014_requestlog_omitted_tools"),
    ]

    operations = [
        migrations.AddField(
            model_name="apikey",
            name="needs_plan",
            field=models.BooleanField(
                default=False,
                help_text="Serves only while its owner has a plan, within it (the keys made in"
                " the portal): an owner who loses their plan, or is deleted, loses the key too.",
                verbose_name="needs a plan",
            ),
        ),
    ]
