"""The shipped recovery policies, grounded in NVIDIA's XID catalog (its "Resolution Bucket
(Immediate Action)" per XID, ``health/data/xid_catalog.json``). Admins edit them in the admin.

The values are written here, not imported: a migration must not change with later code.
"""

from typing import Any

from django.db import migrations

DAY_S = 86_400
# (name, kind, xid, resolution, severity, actions, extra fields, description)
POLICIES: list[tuple[str, str, int | None, str, str, list[str], dict[str, Any], str]] = [
    # --- application XIDs: the job that caused it fails; the GPU stays in service
    (
        "XID 13: graphics engine exception",
        "xid",
        13,
        "",
        "warning",
        ["fail_job"],
        {},
        "NVIDIA: a user application fault (out-of-bounds access, illegal instruction); "
        "RESTART_APP, investigate with WORKFLOW_XID_13. Only that job fails (the one of the "
        "XID's pid when the report names it).",
    ),
    (
        "XID 31: GPU memory page fault",
        "xid",
        31,
        "",
        "warning",
        ["fail_job"],
        {},
        "NVIDIA: an MMU fault, typically an application bug (illegal address); RESTART_APP, "
        "investigate with WORKFLOW_XID_31. Only that job fails.",
    ),
    (
        "XID 43: GPU stopped processing",
        "xid",
        43,
        "",
        "warning",
        ["fail_job"],
        {},
        "NVIDIA: a user application hit a software-induced fault and must terminate; the GPU "
        "remains healthy (IGNORE). Only that job fails.",
    ),
    (
        "XID 45: preemptive cleanup",
        "xid",
        45,
        "",
        "info",
        ["fail_job"],
        {},
        "NVIDIA: the driver tore the application down (Ctrl-C, SIGKILL, a GPU reset, or a "
        "previous error; WORKFLOW_XID_45: alone, nothing to do for the GPU). Only that job "
        "fails; a job already stopped by another policy is left alone.",
    ),
    # --- faults that need a reset
    (
        "XID 48: double-bit ECC error",
        "xid",
        48,
        "",
        "critical",
        ["requeue_job", "reset_gpu"],
        {"escalate_after": 3},
        "NVIDIA WORKFLOW_XID_48: alone, RESET_GPU; with XID 63/64, drain and reset. The GPU's "
        "jobs are requeued (a reset would end them anyway) and the GPU is reset through its "
        "agent; the third in 24 h takes it offline.",
    ),
    (
        "XID 63: row remapping event",
        "xid",
        63,
        "",
        "info",
        ["alert"],
        {},
        "NVIDIA: IGNORE (the remapper handled an ECC error; the new row takes effect at the "
        "next GPU reset). An admin is told.",
    ),
    (
        "XID 64: row remapping failure",
        "xid",
        64,
        "",
        "critical",
        ["requeue_job", "reset_gpu"],
        {"escalate_after": 3},
        "NVIDIA: RESET_GPU, then CONTACT_SUPPORT. Jobs requeued, GPU reset; the third in 24 h "
        "takes it offline.",
    ),
    (
        "XID 74: NVLink error",
        "xid",
        74,
        "",
        "critical",
        ["alert", "requeue_job", "reset_gpu"],
        {"escalate_after": 3},
        "NVIDIA WORKFLOW_NVLINK_ERR: a GPU reset or node reboot is needed to clear it. Jobs "
        "requeued, GPU reset, admin told; the third in 24 h takes it offline.",
    ),
    (
        "XID 79: fallen off the bus",
        "xid",
        79,
        "",
        "critical",
        ["alert", "requeue_job", "offline_gpu"],
        {},
        "NVIDIA: RESTART_BM (the node must be restarted), CONTACT_SUPPORT. The GPU goes "
        "offline at once and its jobs are requeued elsewhere.",
    ),
    (
        "XID 92: high single-bit ECC error rate",
        "xid",
        92,
        "",
        "warning",
        ["alert"],
        {},
        "NVIDIA: IGNORE, then CONTACT_SUPPORT. An admin is told.",
    ),
    (
        "XID 93: InfoROM wear limit",
        "xid",
        93,
        "",
        "info",
        ["alert"],
        {},
        "NVIDIA: IGNORE (a provisioned InfoROM wear limit), then CONTACT_SUPPORT.",
    ),
    (
        "XID 94: contained memory error",
        "xid",
        94,
        "",
        "warning",
        ["requeue_job"],
        {},
        "NVIDIA: RESTART_APP: the error is contained to one application, which must be "
        "restarted; the others and the GPU are fine. That job (of the XID's pid) is requeued.",
    ),
    (
        "XID 95: uncontained memory error",
        "xid",
        95,
        "",
        "critical",
        ["requeue_job", "reset_gpu"],
        {"escalate_after": 3},
        "NVIDIA: RESET_GPU: the error affects every application on the GPU, which must be "
        "reset before they restart. Jobs requeued, GPU reset; the third in 24 h: offline.",
    ),
    # --- the other XIDs, by NVIDIA's resolution bucket
    (
        "XIDs NVIDIA resolves with RESET_GPU",
        "xid",
        None,
        "RESET_GPU",
        "critical",
        ["requeue_job", "reset_gpu"],
        {"escalate_after": 3},
        "Jobs requeued, GPU reset through its agent; the third in 24 h takes it offline.",
    ),
    (
        "XIDs NVIDIA resolves with RESTART_APP",
        "xid",
        None,
        "RESTART_APP",
        "warning",
        ["fail_job"],
        {},
        "The application should be restarted; a reset is not needed. The job fails with the "
        "XID named; the GPU stays in service.",
    ),
    (
        "XIDs NVIDIA resolves with RESTART_BM",
        "xid",
        None,
        "RESTART_BM",
        "critical",
        ["alert", "requeue_job", "offline_gpu"],
        {},
        "The node must be restarted: the GPU goes offline, its jobs are requeued.",
    ),
    (
        "XIDs NVIDIA resolves with CHECK_MECHANICALS",
        "xid",
        None,
        "CHECK_MECHANICALS",
        "critical",
        ["alert", "requeue_job", "offline_gpu"],
        {},
        "Seating or power connections need checking by hand: offline, jobs requeued.",
    ),
    (
        "XIDs NVIDIA resolves with CONTACT_SUPPORT",
        "xid",
        None,
        "CONTACT_SUPPORT",
        "warning",
        ["alert"],
        {},
        "An admin is told.",
    ),
    (
        "XIDs NVIDIA says to IGNORE",
        "xid",
        None,
        "IGNORE",
        "info",
        [],
        {},
        "Stored (on the GPU's page), nothing done.",
    ),
    (
        "NVLink5 XIDs (144-150)",
        "xid",
        None,
        "WORKFLOW_NVLINK5_ERR",
        "warning",
        ["alert"],
        {},
        "The action depends on the registers in the message (the catalog's 144-150 decode): "
        "an admin is told.",
    ),
    (
        "XIDs unknown to NVIDIA's catalog",
        "xid",
        None,
        "UNKNOWN_XID",
        "warning",
        ["alert"],
        {},
        "An XID the catalog does not list (a newer driver): stored and alerted, never dropped.",
    ),
    (
        "Any other XID",
        "xid",
        None,
        "",
        "warning",
        ["alert"],
        {},
        "XIDs of the catalog without a policy of their own or of their bucket.",
    ),
    # --- counters, clocks and the node
    (
        "Uncorrectable ECC errors",
        "ecc_uncorrected",
        None,
        "",
        "critical",
        ["alert", "requeue_job", "degrade_gpu"],
        {},
        "The GPU is fenced (degraded) and its jobs requeued; probation returns it.",
    ),
    (
        "Correctable ECC errors above a rate",
        "ecc_corrected",
        None,
        "",
        "warning",
        ["degrade_gpu"],
        {"threshold": 100.0, "probation_s": 3600},
        "Above the threshold (errors per hour on the GPU) it takes no new work until an hour "
        "passes without more.",
    ),
    (
        "Retired pages",
        "retired_pages",
        None,
        "",
        "warning",
        ["alert"],
        {},
        "A page was retired (pre-A100 GPUs); an admin is told.",
    ),
    (
        "Row remap pending",
        "remap_pending",
        None,
        "",
        "warning",
        ["alert"],
        {},
        "A row is marked for remapping, applied at the next GPU reset; an admin is told.",
    ),
    (
        "Row remap failure",
        "remap_failure",
        None,
        "",
        "critical",
        ["alert", "requeue_job", "offline_gpu"],
        {},
        "No spare rows left: the GPU goes offline, its jobs are requeued.",
    ),
    (
        "Temperature above a threshold",
        "thermal",
        None,
        "",
        "warning",
        ["degrade_gpu"],
        {"threshold": 90.0, "probation_s": 120},
        "Above the threshold (degrees C) the GPU takes no new work until it has cooled "
        "(GPUADMIN_THERMAL_HYSTERESIS_C below) for the probation period; running work goes on.",
    ),
    ("Power brake", "power", None, "", "info", [], {}, "Stored; the clocks recover by themselves."),
    ("NVLink errors", "nvlink", None, "", "warning", ["alert"], {}, "An admin is told."),
    (
        "GPU lost",
        "gpu_lost",
        None,
        "",
        "critical",
        ["alert", "requeue_job", "offline_gpu"],
        {},
        "NVML_ERROR_GPU_IS_LOST (fallen off the bus): offline now, jobs requeued.",
    ),
    (
        "Queries failing",
        "query_failing",
        None,
        "",
        "warning",
        ["alert", "degrade_gpu"],
        {},
        "NVML keeps failing on the GPU: no new work until it answers again.",
    ),
    (
        "Heartbeat lost",
        "heartbeat_lost",
        None,
        "",
        "critical",
        ["alert"],
        {},
        "The node's agent went silent past the grace: an admin is told. Nothing is fenced by "
        "default (its GPUs are unschedulable while it is unreachable anyway).",
    ),
]


def add_policies(apps: Any, schema_editor: Any) -> None:
    policy = apps.get_model("health", "RecoveryPolicy")
    rows = [
        policy(
            name=name,
            kind=kind,
            xid=xid,
            resolution=resolution,
            severity=severity,
            actions=actions,
            description=description,
            escalate_window_s=DAY_S,
            escalate_to="offline_gpu",
            **extra,
        )
        for name, kind, xid, resolution, severity, actions, extra, description in POLICIES
    ]
    # Idempotent: the integration tests write the shipped policies again after a flush.
    policy.objects.bulk_create(rows, ignore_conflicts=True)


def remove_policies(apps: Any, schema_editor: Any) -> None:
    apps.get_model("health", "RecoveryPolicy").objects.filter(
        name__in=[row[0] for row in POLICIES]
    ).delete()


class Migration(migrations.Migration):
    dependencies = [("health", "0001_health_events_alerts_telemetry")]

    operations = [migrations.RunPython(add_policies, remove_policies)]
