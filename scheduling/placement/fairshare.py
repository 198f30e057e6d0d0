"""Weighted fair share per user and per project, like Slurm's classic fair-share factor.

In one pool, a holder (a user or a project) has `shares` (its quota's `fairshare_weight`,
1 without a quota) and `usage` (its decayed GPU-seconds, `Snapshot.usage`; the decay with the
pool's half-life is applied by whoever builds the snapshot). Both are normalized over the
pool's holders of the same kind: S = shares / all shares, U = usage / all usage. The factor is

    F = 2 ** (-U / S)

1.0 for a holder that used nothing, 0.5 for one that used exactly its share, towards 0 for one
that used far more. A job's factor is the mean of its user's and its project's (its user's
alone without a project). The holders counted are those with usage or a quota in the pool, so
a page that knows only usage and quotas computes the same factor as the engine.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from scheduling.placement.snapshot import QuotaLimit, Snapshot

Holder = tuple[str, str]  # ("user", owner id as text) or ("project", name)
KINDS = ("user", "project")


def fairshare_factor(usage: float, total_usage: float, shares: float, total_shares: float) -> float:
    """Slurm's classic factor 2^(-U/S) from a holder's usage and shares and the pool's totals."""
    if shares <= 0 or total_shares <= 0:
        return 0.0
    if usage <= 0 or total_usage <= 0:
        return 1.0
    return float(2.0 ** (-(usage / total_usage) / (shares / total_shares)))


@dataclass(frozen=True, slots=True)
class Standing:
    """One holder's place in a pool's fair share: its weight and normalized share, its decayed
    usage and normalized usage, and the factor they give."""

    holder: Holder
    weight: float
    share: float
    usage_gpu_s: float
    normalized_usage: float
    factor: float

    def sentence(self) -> str:
        """E.g. "user 7: 25% of the shares, 50% of the recent usage, factor 0.25"."""
        kind, name = self.holder
        return (
            f"{kind} {name}: {self.share:.0%} of the shares, {self.normalized_usage:.0%} of the "
            f"recent usage, factor {self.factor:.2f}"
        )


@dataclass(frozen=True, slots=True)
class FairShareExplanation:
    """Why a user's jobs in a pool get the fair-share points they get ("why is my priority
    what it is"): the user's and the project's standing, the job factor and its points."""

    pool: str | None
    user: Standing
    project: Standing | None
    factor: float
    points: float

    def sentences(self) -> list[str]:
        lines = [self.user.sentence()]
        if self.project is not None:
            lines.append(self.project.sentence())
            lines.append(f"job factor {self.factor:.2f}: the mean of the two")
        lines.append(f"{self.points:,.0f} fair-share priority points")
        return lines


class FairShareTable:
    """Shares and usage of one pool's holders; `factor` is memoized per (owner, project)."""

    def __init__(
        self,
        pool: str | None = None,
        usage: Mapping[tuple[str | None, Holder], float] | None = None,
        quotas: Iterable[QuotaLimit] = (),
    ) -> None:
        self.pool = pool
        self._usage: dict[Holder, float] = {
            holder: max(0.0, used)
            for (usage_pool, holder), used in (usage or {}).items()
            if usage_pool == pool
        }
        self._weights: dict[Holder, float] = {
            quota.holder: quota.fairshare_weight for quota in quotas if quota.pool == pool
        }
        holders = set(self._usage) | set(self._weights)
        self._total_shares = {
            kind: sum(self.weight((k, name)) for k, name in holders if k == kind) for kind in KINDS
        }
        self._total_usage = {
            kind: sum(used for (k, _), used in self._usage.items() if k == kind) for kind in KINDS
        }
        self._factors: dict[tuple[str, str], float] = {}

    @classmethod
    def of(cls, snapshot: Snapshot, pool: str | None) -> FairShareTable:
        return cls(pool, snapshot.usage, snapshot.quotas)

    def weight(self, holder: Holder) -> float:
        return self._weights.get(holder, 1.0)

    def standing(self, holder: Holder) -> Standing:
        kind = holder[0]
        weight = self.weight(holder)
        used = self._usage.get(holder, 0.0)
        # A holder the table does not know yet would join the totals with its weight.
        known = holder in self._usage or holder in self._weights
        total_shares = self._total_shares[kind] + (0.0 if known else weight)
        total_usage = self._total_usage[kind]
        return Standing(
            holder=holder,
            weight=weight,
            share=weight / total_shares if total_shares > 0 else 0.0,
            usage_gpu_s=used,
            normalized_usage=used / total_usage if total_usage > 0 else 0.0,
            factor=fairshare_factor(used, total_usage, weight, total_shares),
        )

    def factor(self, owner: str, project: str = "") -> float:
        """The job factor in [0, 1]: the mean of the user's and the project's."""
        key = (owner, project)
        if key not in self._factors:
            user = self.standing(("user", owner)).factor
            if project:
                user = (user + self.standing(("project", project)).factor) / 2
            self._factors[key] = user
        return self._factors[key]

    def explain(
        self, owner: str, project: str = "", weight: float = 10_000.0
    ) -> FairShareExplanation:
        """The standing behind `factor`, for a user's page; `weight` is the pool's
        `PoolConfig.fairshare_weight` (points for a factor of 1)."""
        factor = self.factor(owner, project)
        return FairShareExplanation(
            pool=self.pool,
            user=self.standing(("user", owner)),
            project=self.standing(("project", project)) if project else None,
            factor=factor,
            points=weight * factor,
        )
