"""Roles and API tokens (moved from ``scheduling`` in migration 0001, data kept)."""

from __future__ import annotations

import hashlib
import secrets

from django.conf import settings
from django.core.validators import RegexValidator
from django.db import models

from gpuadmin.env import UNIX_USERNAME_PATTERN


class Role(models.TextChoices):
    """What a person may do; Django's ``is_staff``/``is_superuser`` make an admin."""

    ADMIN = "admin", "Admin"  # everything, including the catalog, discovery, MIG and policies
    OPERATOR = "operator", "Operator"  # acts on anyone's jobs and on GPUs
    USER = "user", "User"  # submits, sees and cancels their own jobs
    VIEWER = "viewer", "Viewer"  # reads


class Membership(models.Model):
    """A person's role (people without one are users)."""

    user = models.OneToOneField(
        settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="gpuadmin_role"
    )
    role = models.CharField(max_length=10, choices=Role.choices, default=Role.USER)

    def __str__(self) -> str:
        return f"{self.user} ({self.role})"


class ApiToken(models.Model):
    """A bearer token for the API and the CLI; only its SHA-256 is stored."""

    PREFIX = "gpa_"

    user = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="api_tokens"
    )
    name = models.CharField(max_length=100)
    key_prefix = models.CharField(max_length=12, help_text="First characters, to recognise it.")
    digest = models.CharField(max_length=64, unique=True)
    created_at = models.DateTimeField(auto_now_add=True)
    last_used_at = models.DateTimeField(null=True, blank=True)
    revoked_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-pk"]
        verbose_name = "API token"

    def __str__(self) -> str:
        return f"{self.name} ({self.key_prefix}…)"

    @staticmethod
    def hash(key: str) -> str:
        return hashlib.sha256(key.encode()).hexdigest()

    @classmethod
    def new_key(cls) -> str:
        return cls.PREFIX + secrets.token_urlsafe(32)


class UnixAccount(models.Model):
    """The Unix account a person's jobs run as on the nodes (without a row:
    ``GPUADMIN_DEFAULT_UNIX_ACCOUNT``, else their user name; root refused). Admins edit it
    through ``services.set_unix_account`` (audited)."""

    user = models.OneToOneField(
        settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="unix_account"
    )
    username = models.CharField(
        "Unix user name",
        max_length=32,
        validators=[
            RegexValidator(
                UNIX_USERNAME_PATTERN,
                "A Unix user name: letters, digits, '.', '_' and '-', not starting with "
                "'.' or '-', at most 32 characters.",
            )
        ],
        help_text="The account on the nodes that this person's jobs run as.",
    )
    allow_root = models.BooleanField(
        "may run as root",
        default=False,
        help_text="Let jobs run when this account is uid 0 on a node (refused otherwise).",
    )

    class Meta:
        verbose_name = "Unix account"

    def __str__(self) -> str:
        return f"{self.user} -> {self.username}"


class NodeCredential(models.Model):
    """What lets a node agent speak for its node: the agent signs its reports with the
    credential's secret, which is derived from ``SECRET_KEY`` and the salt (``node_signing``),
    so this table holds nothing an agent could sign with."""

    node = models.CharField(max_length=253, db_index=True, help_text="The node it speaks for.")
    salt = models.CharField(max_length=64, editable=False)
    created_at = models.DateTimeField(auto_now_add=True)
    revoked_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-pk"]
        verbose_name = "node credential"

    def __str__(self) -> str:
        return f"{self.node} (#{self.pk})"

    @staticmethod
    def new_salt() -> str:
        return secrets.token_hex(16)
