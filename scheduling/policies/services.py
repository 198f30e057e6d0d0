"""Each pool's policy: its fields checked by their bounds and set (audited)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from django.contrib.auth.models import User
from django.core.exceptions import ValidationError
from django.core.validators import MaxValueValidator, MinValueValidator
from django.db import transaction

from gpuadmin.audit.services import changed_values, record
from gpuadmin.refusals import FieldRefusal
from inventory.models import Pool
from scheduling.loop import dispatch
from scheduling.models import (
    PolicyName,
    PoolPolicy,
)
from scheduling.policies import quotas

# What each policy field may say: (least, most) for numbers (the API's, the admin's and the
# service's bounds); the signals a job may be asked to checkpoint on before its grace ends.
POLICY_LIMITS: dict[str, tuple[int, int]] = {
    "aging_interval_s": (1, 7 * 24 * 3600),
    "fairshare_half_life_s": (60, 365 * 24 * 3600),
    "fairshare_weight": (0, 1_000_000),
    "preempt_grace_s": (0, 3600),
    "preempt_exempt_s": (0, 7 * 24 * 3600),
    "las_min_run_s": (0, 7 * 24 * 3600),
    "reservation_release_after_s": (0, 7 * 24 * 3600),
    "qssf_points_per_halving": (1, 100_000),
    "prediction_trust_intervals": (0, 1_000_000),
}
LAS_THRESHOLDS_MAX = 8  # queues of least attained service: at most 9
LAS_THRESHOLD_LIMITS = (1, 10**9)  # GPU-seconds
PREEMPT_SIGNALS = ("SIGTERM", "SIGINT", "SIGHUP", "SIGQUIT", "SIGUSR1", "SIGUSR2")
POLICY_FIELDS: tuple[str, ...] = (
    "policy",
    "backfill",
    "aging_interval_s",
    "fairshare_half_life_s",
    "fairshare_weight",
    "las_thresholds_gpu_s",
    "qssf_points_per_halving",
    "prediction_trust_intervals",
    "allow_borrowing",
    "preemption",
    "preempt_exempt_s",
    "las_min_run_s",
    "preempt_signal",
    "preempt_grace_s",
    "dynamic_mig",
    "reservation_auto_approve",
    "reservation_release_after_s",
)
BOOLEAN_POLICY_FIELDS = frozenset(
    {"backfill", "allow_borrowing", "preemption", "dynamic_mig", "reservation_auto_approve"}
)


class PolicyInvalid(FieldRefusal):
    """A policy value that cannot be set, naming the field and why."""


def _bounded(field: str, value: Any, low: int, high: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int):
        raise PolicyInvalid(field, "a whole number")
    try:
        MinValueValidator(low)(value)
        MaxValueValidator(high)(value)
    except ValidationError as exc:
        raise PolicyInvalid(field, exc.messages[0]) from None


def check_policy(fields: Mapping[str, Any]) -> None:
    """``PolicyInvalid`` naming the first of ``fields`` (policy field -> new value) that a
    pool's policy cannot take."""
    for name, value in fields.items():
        if name not in POLICY_FIELDS:
            raise PolicyInvalid(name, "not a policy setting")
        if name == "policy" and value not in PolicyName.values:
            raise PolicyInvalid(name, f"one of {', '.join(PolicyName.values)}")
        if name in BOOLEAN_POLICY_FIELDS and not isinstance(value, bool):
            raise PolicyInvalid(name, "true or false")
        if name in POLICY_LIMITS:
            _bounded(name, value, *POLICY_LIMITS[name])
        if name == "preempt_signal" and value not in PREEMPT_SIGNALS:
            raise PolicyInvalid(name, f"one of {', '.join(PREEMPT_SIGNALS)}")
        if name == "las_thresholds_gpu_s":
            if not isinstance(value, list | tuple) or len(value) > LAS_THRESHOLDS_MAX:
                raise PolicyInvalid(name, f"a list of at most {LAS_THRESHOLDS_MAX} GPU-seconds")
            for threshold in value:
                _bounded(name, threshold, *LAS_THRESHOLD_LIMITS)
            if list(value) != sorted(set(value)):
                raise PolicyInvalid(name, "GPU-seconds in increasing order, each once")


def set_pool_policy(pool: Pool | None, *, actor: User, **fields: Any) -> PoolPolicy:
    """Change ``pool``'s policy (None: the GPUs in no pool): ``PolicyInvalid`` names a bad
    value; the fields that change are audited ``scheduler.policy_changed`` (before/after, the
    pool in the message) and the loop is woken to re-order its queue. A pool without a policy
    row gets one with its first change (nothing is written when nothing changes: its
    ``updated_at`` stays null, "the defaults, never changed")."""
    check_policy(fields)

    def changes(config: PoolPolicy) -> tuple[dict[str, Any], dict[str, Any]]:
        return changed_values({name: getattr(config, name) for name in fields}, fields)

    with transaction.atomic():
        locked = PoolPolicy.objects.select_for_update()
        config = locked.filter(pool=pool).first() or PoolPolicy(pool=pool)
        if config.pk is None and changes(config)[1]:
            PoolPolicy.objects.get_or_create(pool=pool)
            config = locked.get(pool=pool)
        old, new = changes(config)
        if new:
            for name, value in new.items():
                setattr(config, name, value)
            config.save(update_fields=[*new, "updated_at"])
            record(
                "scheduler.policy_changed",
                actor=actor,
                target=config,
                before=old,
                after=new,
                message=f"policy of {quotas.pool_label(pool.name if pool else None)}",
            )
            transaction.on_commit(dispatch.wake)
    return config
