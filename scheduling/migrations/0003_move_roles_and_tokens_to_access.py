"""Roles and API tokens move to the project package (``gpuadmin.access``), rows kept: their
tables are renamed here and the models leave scheduling's state; ``access`` 0001 adopts them."""

from django.db import migrations


class Migration(migrations.Migration):
    dependencies = [
        ("scheduling", "0002_allocation_time_from_database"),
    ]

    operations = [
        migrations.SeparateDatabaseAndState(
            database_operations=[
                migrations.AlterModelTable(name="membership", table="access_membership"),
                migrations.AlterModelTable(name="apitoken", table="access_apitoken"),
            ],
            state_operations=[
                migrations.DeleteModel(name="Membership"),
                migrations.DeleteModel(name="ApiToken"),
            ],
        ),
    ]
