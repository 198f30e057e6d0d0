"""A GPU reset before probation: the shipped policies of faults NVIDIA clears only by a GPU reset
or a node reboot (XID 79 and the lost GPU, uncorrectable ECC errors, row remapping: remaps and
retired pages take effect at the reset) keep the GPU out of service until a reset through its
agent succeeded or a person returns it. Those that reset also fence first, so that probation
follows the reset; the contained error (XID 94) and a pending remap drain the GPU.

The values are written here, not imported: a migration must not change with later code.
"""

from typing import Any

from django.db import migrations, models

# The shipped policies that wait for a reset before probation.
RESET_FIRST = (
    "XID 48: double-bit ECC error",
    "XID 64: row remapping failure",
    "XID 74: NVLink error",
    "XID 79: fallen off the bus",
    "XID 94: contained memory error",
    "XID 95: uncontained memory error",
    "XIDs NVIDIA resolves with RESET_GPU",
    "XIDs NVIDIA resolves with RESTART_BM",
    "Uncorrectable ECC errors",
    "Row remap pending",
    "Row remap failure",
    "GPU lost",
)
# Those whose actions change: (before, after).
ACTIONS: dict[str, tuple[list[str], list[str]]] = {
    "XID 48: double-bit ECC error": (
        ["requeue_job", "reset_gpu"],
        ["requeue_job", "degrade_gpu", "reset_gpu"],
    ),
    "XID 64: row remapping failure": (
        ["requeue_job", "reset_gpu"],
        ["requeue_job", "degrade_gpu", "reset_gpu"],
    ),
    "XID 95: uncontained memory error": (
        ["requeue_job", "reset_gpu"],
        ["requeue_job", "degrade_gpu", "reset_gpu"],
    ),
    "Uncorrectable ECC errors": (
        ["alert", "requeue_job", "degrade_gpu"],
        ["alert", "requeue_job", "degrade_gpu", "reset_gpu"],
    ),
    "XID 94: contained memory error": (["requeue_job"], ["requeue_job", "drain_gpu"]),
    "Row remap pending": (["alert"], ["alert", "drain_gpu"]),
}
RESET_WORDS = (
    " Probation starts only after a successful GPU reset through the agent, or a person "
    "returns the GPU."
)


def require_resets(apps: Any, schema_editor: Any) -> None:
    """The shipped rows as an admin left them: a policy whose actions were edited keeps them."""
    policy = apps.get_model("health", "RecoveryPolicy")
    for row in policy.objects.filter(name__in=RESET_FIRST):
        before, after = ACTIONS.get(row.name, (row.actions, row.actions))
        if row.actions == before:
            row.actions = after
        row.reset_before_probation = True
        if not row.description.endswith(RESET_WORDS):
            row.description += RESET_WORDS
        row.save(update_fields=["actions", "reset_before_probation", "description"])


def back_to_probation_alone(apps: Any, schema_editor: Any) -> None:
    policy = apps.get_model("health", "RecoveryPolicy")
    for row in policy.objects.filter(name__in=RESET_FIRST):
        before, after = ACTIONS.get(row.name, (row.actions, row.actions))
        if row.actions == after:
            row.actions = before
        row.description = row.description.removesuffix(RESET_WORDS)
        row.save(update_fields=["actions", "description"])


class Migration(migrations.Migration):
    dependencies = [("health", "0005_gpusample_time_index")]

    operations = [
        migrations.AddField(
            model_name="quarantine",
            name="reset_at",
            field=models.DateTimeField(
                blank=True,
                help_text="When a reset of the GPU succeeded while it was fenced.",
                null=True,
            ),
        ),
        migrations.AddField(
            model_name="quarantine",
            name="reset_required",
            field=models.BooleanField(
                default=False,
                help_text="Its policy asked for a GPU reset before probation (kept here: the "
                "policy may change or go).",
            ),
        ),
        migrations.AddField(
            model_name="recoverypolicy",
            name="reset_before_probation",
            field=models.BooleanField(
                default=False,
                help_text="Probation starts only after a successful GPU reset through the "
                "node's agent (or a person returns the GPU): faults NVIDIA clears by a reset "
                "or a node reboot (XID 79, uncorrectable ECC: row remapping and page "
                "retirement take effect at reset).",
            ),
        ),
        migrations.RunPython(require_resets, back_to_probation_alone),
    ]
