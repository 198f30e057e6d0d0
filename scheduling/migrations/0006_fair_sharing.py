"""Fair sharing: pool policies, quotas, reservations (an exclusion constraint per GPU), MIG
and MPS allocations (a trigger guards the sharing rules), arrays, dependencies, preemption,
MIG re-layouts and daily accounting. The loop's one policy becomes the no-pool policy."""

import django.contrib.postgres.constraints
import django.contrib.postgres.fields
import django.contrib.postgres.fields.ranges
import django.core.validators
import django.db.models.deletion
from django.conf import settings
from django.db import migrations, models


# One allocation decision per GPU at a time, and the sharing rules across allocation kinds:
# a whole GPU shares with nothing, MIG devices only with MIG devices (each device once: the
# partial unique index), MPS shares only with MPS shares and at most 100 percent of the SMs.
# The GPU row lock queues concurrent writers, so each sees the others' committed rows.
ALLOCATION_GUARD_SQL = """
CREATE FUNCTION scheduling_allocation_guard() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    clash text;
    given integer;
BEGIN
    IF NEW.released_at IS NOT NULL THEN
        RETURN NEW;
    END IF;
    PERFORM 1 FROM inventory_gpu WHERE id = NEW.gpu_id FOR UPDATE;
    SELECT kind INTO clash FROM scheduling_allocation
     WHERE gpu_id = NEW.gpu_id AND released_at IS NULL AND id <> NEW.id
       AND (NEW.kind = 'gpu' OR kind <> NEW.kind)
     LIMIT 1;
    IF FOUND THEN
        RAISE EXCEPTION 'GPU % is already allocated (%): it cannot also be given as %',
            NEW.gpu_id, clash, NEW.kind
            USING ERRCODE = 'unique_violation', CONSTRAINT = 'allocation_gpu_sharing';
    END IF;
    IF NEW.kind = 'mps' THEN
        SELECT COALESCE(SUM(mps_percent), 0) INTO given FROM scheduling_allocation
         WHERE gpu_id = NEW.gpu_id AND released_at IS NULL AND kind = 'mps' AND id <> NEW.id;
        IF given + NEW.mps_percent > 100 THEN
            RAISE EXCEPTION 'GPU % has MPS shares of % percent: % more would pass 100',
                NEW.gpu_id, given, NEW.mps_percent
                USING ERRCODE = 'check_violation', CONSTRAINT = 'allocation_mps_at_most_100';
        END IF;
    END IF;
    RETURN NEW;
END
$$;
CREATE TRIGGER scheduling_allocation_guard
    BEFORE INSERT OR UPDATE OF released_at, kind, gpu_id, mps_percent ON scheduling_allocation
    FOR EACH ROW EXECUTE FUNCTION scheduling_allocation_guard();
"""
ALLOCATION_GUARD_DROP_SQL = """
DROP TRIGGER scheduling_allocation_guard ON scheduling_allocation;
DROP FUNCTION scheduling_allocation_guard();
"""


def policy_to_pool_policy(apps, schema_editor):
    """The loop's one policy becomes the policy of the GPUs in no pool."""
    settings = apps.get_model("scheduling", "SchedulerSettings").objects.filter(pk=1).first()
    if settings is not None:
        apps.get_model("scheduling", "PoolPolicy").objects.update_or_create(
            pool=None,
            defaults={"policy": settings.policy, "aging_interval_s": settings.aging_interval_s},
        )


def pool_policy_to_policy(apps, schema_editor):
    default = apps.get_model("scheduling", "PoolPolicy").objects.filter(pool=None).first()
    if default is not None:
        apps.get_model("scheduling", "SchedulerSettings").objects.filter(pk=1).update(
            policy=default.policy if default.policy in ("fcfs", "priority") else "priority",
            aging_interval_s=default.aging_interval_s,
        )


class Migration(migrations.Migration):
    dependencies = [
        ("inventory", "0008_gpu_mps_shared"),
        ("scheduling", "0005_scheduler_settings_verbose_name"),
        migrations.swappable_dependency(settings.AUTH_USER_MODEL),
    ]

    operations = [
        migrations.CreateModel(
            name="JobArray",
            fields=[
                (
                    "id",
                    models.BigAutoField(
                        auto_created=True, primary_key=True, serialize=False, verbose_name="ID"
                    ),
                ),
                (
                    "spec",
                    models.CharField(help_text="As submitted, e.g. 0-999%50.", max_length=200),
                ),
                ("size", models.PositiveIntegerField()),
                (
                    "max_running",
                    models.PositiveIntegerField(
                        blank=True,
                        help_text="Tasks running at once (the %N); empty: no cap.",
                        null=True,
                    ),
                ),
                ("submitted_at", models.DateTimeField(auto_now_add=True)),
            ],
            options={
                "ordering": ["-pk"],
            },
        ),
        migrations.CreateModel(
            name="JobDependency",
            fields=[
                (
                    "id",
                    models.BigAutoField(
                        auto_created=True, primary_key=True, serialize=False, verbose_name="ID"
                    ),
                ),
                (
                    "kind",
                    models.CharField(
                        choices=[
                            ("afterok", "After it completes"),
                            ("afterany", "After it ends"),
                            ("afternotok", "After it fails"),
                        ],
                        max_length=10,
                    ),
                ),
            ],
            options={
                "verbose_name_plural": "job dependencies",
            },
        ),
        migrations.CreateModel(
            name="MigRelayout",
            fields=[
                (
                    "id",
                    models.BigAutoField(
                        auto_created=True, primary_key=True, serialize=False, verbose_name="ID"
                    ),
                ),
                (
                    "layout_name",
                    models.CharField(help_text="all-1g.10gb, balanced or custom.", max_length=64),
                ),
                (
                    "layout",
                    models.JSONField(help_text="GPU instance profile names with placement starts."),
                ),
                ("previous_layout", models.JSONField(blank=True, default=list)),
                (
                    "preempt",
                    models.BooleanField(
                        default=False, help_text="Preempt its jobs (else wait for them to end)."
                    ),
                ),
                (
                    "state",
                    models.CharField(
                        choices=[
                            ("draining", "Waiting for its jobs"),
                            ("applying", "Applying the layout"),
                            ("verifying", "Verifying by a re-scan"),
                            ("done", "Done"),
                            ("failed", "Failed (rolled back)"),
                            ("canceled", "Canceled"),
                        ],
                        default="draining",
                        max_length=10,
                    ),
                ),
                ("step_deadline", models.DateTimeField(blank=True, null=True)),
                ("message", models.TextField(blank=True)),
                ("created_at", models.DateTimeField(auto_now_add=True)),
                ("finished_at", models.DateTimeField(blank=True, null=True)),
            ],
            options={
                "verbose_name": "MIG re-layout",
                "ordering": ["-pk"],
            },
        ),
        migrations.CreateModel(
            name="PoolPolicy",
            fields=[
                (
                    "id",
                    models.BigAutoField(
                        auto_created=True, primary_key=True, serialize=False, verbose_name="ID"
                    ),
                ),
                (
                    "policy",
                    models.CharField(
                        choices=[
                            ("fcfs", "First come, first served"),
                            ("priority", "Priority with aging"),
                            ("sjf", "Shortest job first (the user's estimate)"),
                            ("fairshare", "Weighted fair share"),
                            ("las", "Least attained service (Tiresias)"),
                        ],
                        default="priority",
                        max_length=16,
                    ),
                ),
                (
                    "backfill",
                    models.BooleanField(
                        default=True,
                        help_text="EASY backfill: a later job may start first if it does not delay the first waiting job's start (by estimates, else maximum runtimes).",
                    ),
                ),
                (
                    "aging_interval_s",
                    models.PositiveIntegerField(
                        default=60,
                        help_text="A waiting job gains one priority point per interval (1,000 points per level).",
                        validators=[django.core.validators.MinValueValidator(1)],
                    ),
                ),
                (
                    "fairshare_half_life_s",
                    models.PositiveIntegerField(
                        default=604800,
                        help_text="Past usage counts half after this long (Slurm's PriorityDecayHalfLife).",
                        validators=[django.core.validators.MinValueValidator(60)],
                    ),
                ),
                (
                    "fairshare_weight",
                    models.PositiveIntegerField(
                        default=10000,
                        help_text="Priority points a fully under-served user gains over a fully over-served one.",
                    ),
                ),
                (
                    "las_thresholds_gpu_s",
                    django.contrib.postgres.fields.ArrayField(
                        base_field=models.PositiveIntegerField(),
                        blank=True,
                        default=list,
                        help_text="Least attained service: GPU-seconds at which a job drops to the next queue (empty: 3,600 and 36,000).",
                        size=None,
                    ),
                ),
                (
                    "allow_borrowing",
                    models.BooleanField(
                        default=True,
                        help_text="Over-quota work may run on idle GPUs as preemptible, reclaimed first.",
                    ),
                ),
                (
                    "preemption",
                    models.BooleanField(
                        default=True,
                        help_text="Higher-priority or under-share jobs may preempt preemptible work.",
                    ),
                ),
                ("preempt_signal", models.CharField(default="SIGTERM", max_length=10)),
                (
                    "preempt_grace_s",
                    models.PositiveIntegerField(
                        default=30,
                        help_text="Time to checkpoint.",
                        validators=[django.core.validators.MaxValueValidator(3600)],
                    ),
                ),
                (
                    "dynamic_mig",
                    models.BooleanField(
                        default=False,
                        help_text="The scheduler may create MIG instances on idle MIG-mode GPUs for MIG jobs.",
                    ),
                ),
                (
                    "reservation_auto_approve",
                    models.BooleanField(
                        default=True,
                        help_text="Reservations within the requester's quota need no admin.",
                    ),
                ),
                (
                    "reservation_release_after_s",
                    models.PositiveIntegerField(
                        default=900,
                        help_text="A reservation with no job running this long after its start is released.",
                    ),
                ),
                ("updated_at", models.DateTimeField(auto_now=True)),
            ],
            options={
                "verbose_name": "pool policy",
                "verbose_name_plural": "pool policies",
            },
        ),
        migrations.CreateModel(
            name="Quota",
            fields=[
                (
                    "id",
                    models.BigAutoField(
                        auto_created=True, primary_key=True, serialize=False, verbose_name="ID"
                    ),
                ),
                ("project", models.CharField(blank=True, max_length=100)),
                (
                    "max_gpus",
                    models.PositiveIntegerField(
                        blank=True,
                        help_text="Empty: no limit.",
                        null=True,
                        verbose_name="GPUs at once",
                    ),
                ),
                (
                    "gpu_hours",
                    models.PositiveIntegerField(
                        blank=True,
                        help_text="Empty: no limit.",
                        null=True,
                        verbose_name="GPU-hours per period",
                    ),
                ),
                (
                    "period",
                    models.CharField(
                        choices=[("day", "Day"), ("week", "Week"), ("month", "Month")],
                        default="month",
                        max_length=5,
                    ),
                ),
                (
                    "fairshare_weight",
                    models.PositiveIntegerField(
                        default=1,
                        help_text="Shares (Slurm's fairshare).",
                        validators=[django.core.validators.MinValueValidator(1)],
                    ),
                ),
                ("updated_at", models.DateTimeField(auto_now=True)),
            ],
            options={
                "ordering": ["pool__name", "project", "user__username"],
            },
        ),
        migrations.CreateModel(
            name="Reservation",
            fields=[
                (
                    "id",
                    models.BigAutoField(
                        auto_created=True, primary_key=True, serialize=False, verbose_name="ID"
                    ),
                ),
                ("project", models.CharField(blank=True, max_length=100)),
                (
                    "gpu_count",
                    models.PositiveSmallIntegerField(
                        validators=[django.core.validators.MinValueValidator(1)]
                    ),
                ),
                ("gpu_model", models.CharField(blank=True, max_length=100)),
                ("start", models.DateTimeField()),
                ("end", models.DateTimeField()),
                (
                    "state",
                    models.CharField(
                        choices=[
                            ("requested", "Requested"),
                            ("approved", "Approved"),
                            ("rejected", "Rejected"),
                            ("canceled", "Canceled"),
                            ("released", "Released"),
                            ("ended", "Ended"),
                        ],
                        default="requested",
                        max_length=10,
                    ),
                ),
                ("note", models.TextField(blank=True, max_length=2000)),
                (
                    "message",
                    models.TextField(blank=True, help_text="Why it was rejected or released."),
                ),
                ("created_at", models.DateTimeField(auto_now_add=True)),
                ("first_used_at", models.DateTimeField(blank=True, null=True)),
                ("released_at", models.DateTimeField(blank=True, null=True)),
            ],
            options={
                "ordering": ["start", "pk"],
            },
        ),
        migrations.CreateModel(
            name="ReservationGpu",
            fields=[
                (
                    "id",
                    models.BigAutoField(
                        auto_created=True, primary_key=True, serialize=False, verbose_name="ID"
                    ),
                ),
                ("during", django.contrib.postgres.fields.ranges.DateTimeRangeField()),
            ],
        ),
        migrations.CreateModel(
            name="UsageDay",
            fields=[
                (
                    "id",
                    models.BigAutoField(
                        auto_created=True, primary_key=True, serialize=False, verbose_name="ID"
                    ),
                ),
                ("day", models.DateField()),
                ("project", models.CharField(blank=True, max_length=100)),
                ("allocated_gpu_s", models.FloatField(default=0)),
                ("used_gpu_s", models.FloatField(default=0, help_text="Utilization-weighted.")),
                ("idle_held_gpu_s", models.FloatField(default=0)),
                (
                    "mig_slice_s",
                    models.FloatField(default=0, help_text="MIG compute slices x seconds."),
                ),
                (
                    "mps_gpu_s",
                    models.FloatField(default=0, help_text="MPS shares as fractions of a GPU."),
                ),
                ("energy_j", models.FloatField(default=0)),
            ],
            options={
                "ordering": ["-day"],
            },
        ),
        migrations.RemoveConstraint(
            model_name="allocation",
            name="allocation_one_active_per_gpu",
        ),
        migrations.AddField(
            model_name="allocation",
            name="device_uuid",
            field=models.CharField(
                blank=True,
                help_text="What CUDA_VISIBLE_DEVICES names: GPU-... or MIG-...",
                max_length=64,
            ),
        ),
        migrations.AddField(
            model_name="allocation",
            name="kind",
            field=models.CharField(
                choices=[("gpu", "Whole GPU"), ("mig", "MIG device"), ("mps", "MPS share")],
                default="gpu",
                max_length=3,
            ),
        ),
        migrations.AddField(
            model_name="allocation",
            name="mig_instance",
            field=models.ForeignKey(
                blank=True,
                null=True,
                on_delete=django.db.models.deletion.SET_NULL,
                related_name="+",
                to="inventory.miginstance",
            ),
        ),
        migrations.AddField(
            model_name="allocation",
            name="mps_memory_mib",
            field=models.PositiveIntegerField(blank=True, null=True),
        ),
        migrations.AddField(
            model_name="allocation",
            name="mps_percent",
            field=models.PositiveSmallIntegerField(blank=True, null=True),
        ),
        migrations.AddField(
            model_name="job",
            name="array_index",
            field=models.PositiveIntegerField(blank=True, null=True),
        ),
        migrations.AddField(
            model_name="job",
            name="borrowed",
            field=models.BooleanField(default=False),
        ),
        migrations.AddField(
            model_name="job",
            name="mig_profile",
            field=models.CharField(
                blank=True,
                help_text="e.g. 1g.10gb: one MIG device.",
                max_length=32,
                verbose_name="MIG profile",
            ),
        ),
        migrations.AddField(
            model_name="job",
            name="mps_memory_mib",
            field=models.PositiveIntegerField(
                blank=True, null=True, verbose_name="MPS memory limit (MiB)"
            ),
        ),
        migrations.AddField(
            model_name="job",
            name="mps_percent",
            field=models.PositiveSmallIntegerField(
                blank=True,
                null=True,
                validators=[
                    django.core.validators.MinValueValidator(1),
                    django.core.validators.MaxValueValidator(100),
                ],
                verbose_name="MPS share (% of SMs)",
            ),
        ),
        migrations.AddField(
            model_name="job",
            name="pool",
            field=models.ForeignKey(
                blank=True,
                help_text="The pool whose GPUs it runs on; none: the GPUs in no pool.",
                null=True,
                on_delete=django.db.models.deletion.PROTECT,
                related_name="+",
                to="inventory.pool",
            ),
        ),
        migrations.AddField(
            model_name="job",
            name="preempt_requested_at",
            field=models.DateTimeField(blank=True, null=True),
        ),
        migrations.AddField(
            model_name="job",
            name="preempted_by",
            field=models.ForeignKey(
                blank=True,
                null=True,
                on_delete=django.db.models.deletion.SET_NULL,
                related_name="+",
                to="scheduling.job",
            ),
        ),
        migrations.AddIndex(
            model_name="allocation",
            index=models.Index(
                condition=models.Q(("released_at__isnull", True)),
                fields=["gpu"],
                name="allocation_gpu_active",
            ),
        ),
        migrations.AddIndex(
            model_name="allocation",
            index=models.Index(fields=["released_at"], name="allocation_released"),
        ),
        migrations.AddConstraint(
            model_name="allocation",
            constraint=models.UniqueConstraint(
                condition=models.Q(("kind", "gpu"), ("released_at__isnull", True)),
                fields=("gpu",),
                name="allocation_one_active_per_gpu",
            ),
        ),
        migrations.AddConstraint(
            model_name="allocation",
            constraint=models.UniqueConstraint(
                condition=models.Q(("kind", "mig"), ("released_at__isnull", True)),
                fields=("mig_instance",),
                name="allocation_one_active_per_mig_device",
            ),
        ),
        migrations.AddConstraint(
            model_name="allocation",
            constraint=models.CheckConstraint(
                condition=models.Q(
                    models.Q(("kind", "mps"), ("mps_percent__gte", 1), ("mps_percent__lte", 100)),
                    models.Q(
                        models.Q(("kind", "mps"), _negated=True),
                        ("mps_memory_mib__isnull", True),
                        ("mps_percent__isnull", True),
                    ),
                    _connector="OR",
                ),
                name="allocation_mps_share_only_for_mps",
            ),
        ),
        migrations.AddField(
            model_name="jobarray",
            name="owner",
            field=models.ForeignKey(
                on_delete=django.db.models.deletion.PROTECT,
                related_name="+",
                to=settings.AUTH_USER_MODEL,
            ),
        ),
        migrations.AddField(
            model_name="job",
            name="array",
            field=models.ForeignKey(
                blank=True,
                null=True,
                on_delete=django.db.models.deletion.PROTECT,
                related_name="tasks",
                to="scheduling.jobarray",
            ),
        ),
        migrations.AddField(
            model_name="jobdependency",
            name="job",
            field=models.ForeignKey(
                on_delete=django.db.models.deletion.CASCADE,
                related_name="dependencies",
                to="scheduling.job",
            ),
        ),
        migrations.AddField(
            model_name="jobdependency",
            name="on",
            field=models.ForeignKey(
                on_delete=django.db.models.deletion.PROTECT,
                related_name="dependents",
                to="scheduling.job",
            ),
        ),
        migrations.AddField(
            model_name="migrelayout",
            name="gpu",
            field=models.ForeignKey(
                on_delete=django.db.models.deletion.PROTECT, related_name="+", to="inventory.gpu"
            ),
        ),
        migrations.AddField(
            model_name="migrelayout",
            name="node",
            field=models.ForeignKey(
                on_delete=django.db.models.deletion.PROTECT, related_name="+", to="inventory.node"
            ),
        ),
        migrations.AddField(
            model_name="migrelayout",
            name="requested_by",
            field=models.ForeignKey(
                null=True,
                on_delete=django.db.models.deletion.SET_NULL,
                related_name="+",
                to=settings.AUTH_USER_MODEL,
            ),
        ),
        migrations.AddField(
            model_name="poolpolicy",
            name="pool",
            field=models.OneToOneField(
                blank=True,
                null=True,
                on_delete=django.db.models.deletion.CASCADE,
                related_name="policy",
                to="inventory.pool",
            ),
        ),
        migrations.AddField(
            model_name="quota",
            name="pool",
            field=models.ForeignKey(
                blank=True,
                null=True,
                on_delete=django.db.models.deletion.CASCADE,
                to="inventory.pool",
            ),
        ),
        migrations.AddField(
            model_name="quota",
            name="user",
            field=models.ForeignKey(
                blank=True,
                null=True,
                on_delete=django.db.models.deletion.CASCADE,
                to=settings.AUTH_USER_MODEL,
            ),
        ),
        migrations.AddField(
            model_name="reservation",
            name="decided_by",
            field=models.ForeignKey(
                blank=True,
                null=True,
                on_delete=django.db.models.deletion.SET_NULL,
                related_name="+",
                to=settings.AUTH_USER_MODEL,
            ),
        ),
        migrations.AddField(
            model_name="reservation",
            name="node",
            field=models.ForeignKey(
                blank=True,
                null=True,
                on_delete=django.db.models.deletion.PROTECT,
                to="inventory.node",
            ),
        ),
        migrations.AddField(
            model_name="reservation",
            name="owner",
            field=models.ForeignKey(
                on_delete=django.db.models.deletion.PROTECT,
                related_name="+",
                to=settings.AUTH_USER_MODEL,
            ),
        ),
        migrations.AddField(
            model_name="reservation",
            name="pool",
            field=models.ForeignKey(
                blank=True,
                null=True,
                on_delete=django.db.models.deletion.PROTECT,
                to="inventory.pool",
            ),
        ),
        migrations.AddField(
            model_name="reservation",
            name="requested_gpus",
            field=models.ManyToManyField(blank=True, related_name="+", to="inventory.gpu"),
        ),
        migrations.AddField(
            model_name="job",
            name="reservation",
            field=models.ForeignKey(
                blank=True,
                help_text="Runs on this reservation's GPUs, inside its window.",
                null=True,
                on_delete=django.db.models.deletion.PROTECT,
                related_name="jobs",
                to="scheduling.reservation",
            ),
        ),
        migrations.AddIndex(
            model_name="job",
            index=models.Index(fields=["array", "state"], name="job_array_state"),
        ),
        migrations.AddConstraint(
            model_name="job",
            constraint=models.CheckConstraint(
                condition=models.Q(
                    ("mig_profile", ""), ("mps_percent__isnull", True), _connector="OR"
                ),
                name="job_mig_or_mps_not_both",
            ),
        ),
        migrations.AddConstraint(
            model_name="job",
            constraint=models.CheckConstraint(
                condition=models.Q(
                    models.Q(("mig_profile", ""), ("mps_percent__isnull", True)),
                    models.Q(("gpu_count", 1), ("node_count", 1)),
                    _connector="OR",
                ),
                name="job_shares_are_single_gpu",
            ),
        ),
        migrations.AddConstraint(
            model_name="job",
            constraint=models.CheckConstraint(
                condition=models.Q(
                    ("mps_percent__isnull", True),
                    models.Q(("mps_percent__gte", 1), ("mps_percent__lte", 100)),
                    _connector="OR",
                ),
                name="job_mps_percent_range",
            ),
        ),
        migrations.AddConstraint(
            model_name="job",
            constraint=models.UniqueConstraint(
                fields=("array", "array_index"), name="job_array_index_unique"
            ),
        ),
        migrations.AddField(
            model_name="reservationgpu",
            name="gpu",
            field=models.ForeignKey(
                on_delete=django.db.models.deletion.PROTECT,
                related_name="reservation_holds",
                to="inventory.gpu",
            ),
        ),
        migrations.AddField(
            model_name="reservationgpu",
            name="reservation",
            field=models.ForeignKey(
                on_delete=django.db.models.deletion.CASCADE,
                related_name="holds",
                to="scheduling.reservation",
            ),
        ),
        migrations.AddField(
            model_name="usageday",
            name="pool",
            field=models.ForeignKey(
                blank=True,
                null=True,
                on_delete=django.db.models.deletion.CASCADE,
                to="inventory.pool",
            ),
        ),
        migrations.AddField(
            model_name="usageday",
            name="user",
            field=models.ForeignKey(
                on_delete=django.db.models.deletion.CASCADE,
                related_name="+",
                to=settings.AUTH_USER_MODEL,
            ),
        ),
        migrations.AddConstraint(
            model_name="jobdependency",
            constraint=models.UniqueConstraint(fields=("job", "on"), name="job_dependency_once"),
        ),
        migrations.AddConstraint(
            model_name="jobdependency",
            constraint=models.CheckConstraint(
                condition=models.Q(("job", models.F("on")), _negated=True),
                name="job_dependency_not_self",
            ),
        ),
        migrations.AddConstraint(
            model_name="migrelayout",
            constraint=models.UniqueConstraint(
                condition=models.Q(("state__in", ("draining", "applying", "verifying"))),
                fields=("node",),
                name="mig_relayout_one_open_per_node",
            ),
        ),
        migrations.AddConstraint(
            model_name="poolpolicy",
            constraint=models.UniqueConstraint(
                fields=("pool",), name="pool_policy_one_per_pool", nulls_distinct=False
            ),
        ),
        migrations.AddConstraint(
            model_name="quota",
            constraint=models.CheckConstraint(
                condition=models.Q(
                    models.Q(("user__isnull", True), models.Q(("project", ""), _negated=True)),
                    models.Q(("user__isnull", False), ("project", "")),
                    _connector="OR",
                ),
                name="quota_user_or_project",
            ),
        ),
        migrations.AddConstraint(
            model_name="quota",
            constraint=models.UniqueConstraint(
                fields=("pool", "user", "project"),
                name="quota_one_per_holder_and_pool",
                nulls_distinct=False,
            ),
        ),
        migrations.AddIndex(
            model_name="reservation",
            index=models.Index(fields=["state", "end"], name="reservation_state_end"),
        ),
        migrations.AddConstraint(
            model_name="reservation",
            constraint=models.CheckConstraint(
                condition=models.Q(("end__gt", models.F("start"))),
                name="reservation_ends_after_start",
            ),
        ),
        migrations.AddConstraint(
            model_name="reservationgpu",
            constraint=django.contrib.postgres.constraints.ExclusionConstraint(
                expressions=[
                    (
                        models.Func(
                            models.F("gpu"),
                            models.F("gpu"),
                            models.Value("[]"),
                            function="int8range",
                        ),
                        "&&",
                    ),
                    ("during", "&&"),
                ],
                name="reservation_gpu_no_overlap",
            ),
        ),
        migrations.AddConstraint(
            model_name="reservationgpu",
            constraint=models.UniqueConstraint(
                fields=("reservation", "gpu"), name="reservation_gpu_once"
            ),
        ),
        migrations.AddConstraint(
            model_name="usageday",
            constraint=models.UniqueConstraint(
                fields=("day", "pool", "user", "project"),
                name="usage_day_once",
                nulls_distinct=False,
            ),
        ),
        migrations.RunSQL(ALLOCATION_GUARD_SQL, ALLOCATION_GUARD_DROP_SQL),
        migrations.RunPython(policy_to_pool_policy, pool_policy_to_policy),
        migrations.RemoveField(
            model_name="schedulersettings",
            name="aging_interval_s",
        ),
        migrations.RemoveField(
            model_name="schedulersettings",
            name="policy",
        ),
    ]
