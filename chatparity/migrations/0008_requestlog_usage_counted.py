from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("chatparity", "0007_usagedashboard_moves_to_its_app"),
    ]

    operations = [
        migrations.AddField(
            model_name="requestlog",
            name="usage_counted",
            field=models.BooleanField(
                default=False,
                help_text="The tokens were counted by the gateway: the backend reported none,"
                " or numbers it could not believe.",
            ),
        ),
    ]
