"""Roles and API tokens (moved from ``scheduling`` in migration 0001, data kept)."""

from __future__ import annotations

import hashlib
import secrets

from django.conf import settings
from django.db import models


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
