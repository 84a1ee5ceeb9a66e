from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("chatparity", "0012_plans"),
    ]

    operations = [
        migrations.AddField(
            model_name="storedresponse",
            name="size",
            field=models.PositiveIntegerField(
                default=0,
                help_text="Bytes of its input items and response object, as stored: what"
                ' CHATPARITY["STORED_RESPONSE_BYTES"] bounds.',
            ),
        ),
    ]
