"""No churn: two users who both always want the whole fleet, every job preemptible, a pass
every minute for hours, under every policy. Preemption follows the pool's own order, spares
a job for `preempt_exempt_s` after its start, and fair share needs a margin, so GPUs do not
go back and forth between the users; a negative control shows that without those rules they
do."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field, replace
from itertools import pairwise
from random import Random

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from scheduling.placement import JobRequest, PoolConfig, RunningJob, plan
from scheduling.placement import preemption as preemption_module
from tests.scheduling.placement.builders import NOW, Fleet

PASS_S = 60.0
HOUR = 3600.0
USERS = ("alice", "bob")
POLICIES = ("fcfs", "priority", "sjf", "fairshare", "las", "qssf")
# Orders in which two jobs never swap places as time passes (they age alike; runtimes,
# priorities and submissions are fixed): a job that stopped another is never stopped by it.
FIXED_ORDER = ("fcfs", "priority", "sjf")
SIMULATIONS = settings(
    max_examples=8,
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)


@dataclass(frozen=True)
class Stop:
    """One preemption of one victim."""

    at: float
    preemptor: int
    preemptor_owner: str
    victim: int
    victim_owner: str
    victim_started: float
    gpu_ids: tuple[int, ...]


@dataclass
class Churn:
    """Passes over DGX nodes; each user keeps `backlog` jobs waiting; usage decays with
    `half_life_s`; victims go back to the queue at once with the service they attained."""

    config: PoolConfig
    rng: Random
    nodes: int = 1
    backlog: int = 3
    half_life_s: float = 4 * HOUR
    now: float = NOW
    fleet: Fleet = field(default_factory=Fleet)
    requests: dict[int, JobRequest] = field(default_factory=dict)  # as submitted
    waiting: dict[int, JobRequest] = field(default_factory=dict)
    running: dict[int, RunningJob] = field(default_factory=dict)
    left_s: dict[int, float] = field(default_factory=dict)  # true runtime still to run
    service: Counter[int] = field(default_factory=Counter)  # GPU-seconds of earlier attempts
    usage: Counter[str] = field(default_factory=Counter)
    stops: list[Stop] = field(default_factory=list)

    def __post_init__(self) -> None:
        for n in range(self.nodes):
            self.fleet.dgx(f"dgx-{n}")

    def submit(self, user: str) -> None:
        job_id = len(self.requests) + 1
        estimate = self.rng.choice((0.5, 1.0, 3.0, 6.0)) * HOUR
        request = JobRequest(
            id=job_id,
            owner=user,
            priority=self.rng.choice(("normal", "normal", "high")),
            submitted_at=self.now,
            gpus_per_node=self.rng.choice((1, 2, 4, 8)),
            estimated_duration_s=estimate,
            preemptible=True,
        )
        self.requests[job_id] = self.waiting[job_id] = request
        self.left_s[job_id] = estimate * self.rng.uniform(0.5, 1.0)

    def run(self, passes: int) -> None:
        for _ in range(passes):
            self.step()

    def step(self) -> None:
        for user in USERS:
            while sum(job.owner == user for job in self.waiting.values()) < self.backlog:
                self.submit(user)
        holder = {gpu_id: job.id for job in self.running.values() for gpu_id in job.gpu_ids}
        gpus = tuple(replace(gpu, allocated_to=holder.get(gpu.id)) for gpu in self.fleet.gpus)
        snapshot = self.fleet.snapshot(
            *self.waiting.values(),
            now=self.now,
            gpus=gpus,
            running=tuple(self.running.values()),
            pools={None: self.config},
            usage={(None, ("user", user)): used for user, used in self.usage.items()},
        )
        result = plan(snapshot)
        for decision in result.preemptions:
            for victim_id in decision.victims:
                self.stop(decision.job_id, self.running.pop(victim_id))
        for placement in result.placements:
            job = self.waiting.pop(placement.job_id)
            self.running[job.id] = RunningJob(
                id=job.id,
                gpu_ids=placement.gpu_ids,
                started_at=self.now,
                expected_end=self.now + (job.estimated_duration_s or 0.0),
                owner=job.owner,
                priority=job.priority,
                submitted_at=job.submitted_at,
                preemptible=True,
                attained_service_s=float(self.service[job.id]),
            )
        self.now += PASS_S
        decay = 0.5 ** (PASS_S / self.half_life_s)
        for user in USERS:
            self.usage[user] *= decay
        for job in list(self.running.values()):
            self.usage[job.owner] += len(job.gpu_ids) * PASS_S
            if job.started_at + self.left_s[job.id] <= self.now:
                del self.running[job.id]

    def stop(self, preemptor: int, victim: RunningJob) -> None:
        owner = self.requests[preemptor].owner
        self.stops.append(
            Stop(
                self.now,
                preemptor,
                owner,
                victim.id,
                victim.owner,
                victim.started_at,
                victim.gpu_ids,
            )
        )
        ran = self.now - victim.started_at
        self.service[victim.id] += ran * len(victim.gpu_ids)
        self.left_s[victim.id] -= ran
        self.waiting[victim.id] = replace(
            self.requests[victim.id],
            attained_service_s=float(self.service[victim.id]),
            queued_at=self.now,
        )

    def handovers(self) -> int:
        """Preemptions by one user's job of the other's."""
        return sum(stop.preemptor_owner != stop.victim_owner for stop in self.stops)


CONFIGS = {
    name: PoolConfig(policy=name, las_thresholds_gpu_s=(1800.0, 7200.0))  # type: ignore[arg-type]
    for name in POLICIES
}


@SIMULATIONS
@given(
    policy=st.sampled_from(POLICIES),
    seed=st.integers(0, 2**16),
    nodes=st.integers(1, 2),
    half_life_h=st.sampled_from((1.0, 4.0, 24.0)),
)
def test_no_churn_between_two_users_over_many_passes(
    policy: str, seed: int, nodes: int, half_life_h: float
) -> None:
    exempt = 600.0
    churn = Churn(
        replace(CONFIGS[policy], preempt_exempt_s=exempt),
        Random(seed),
        nodes=nodes,
        half_life_s=half_life_h * HOUR,
    )
    churn.run(360)  # six hours

    # No job is stopped within its exemption (all are preemptible; none borrowed).
    assert all(stop.at - stop.victim_started >= exempt for stop in churn.stops)
    if policy in FIXED_ORDER:
        pairs = {(stop.preemptor, stop.victim) for stop in churn.stops}
        assert not any((victim, preemptor) in pairs for preemptor, victim in pairs)
    # A GPU taken by preemption is not taken again before its new job's exemption ends.
    taken: dict[int, list[float]] = {}
    for stop in churn.stops:
        for gpu_id in stop.gpu_ids:
            taken.setdefault(gpu_id, []).append(stop.at)
    for times in taken.values():
        assert all(later - earlier >= exempt for earlier, later in pairwise(times))


def old_rules(monkeypatch: pytest.MonkeyPatch) -> None:
    """Preemption as it was: no look at the pool's order, no margin (and no exemption)."""
    monkeypatch.setattr(preemption_module.Victims, "ranks_below", lambda self, victim, job: True)
    monkeypatch.setattr(preemption_module, "FAIRSHARE_MARGIN", 0.0)


@pytest.mark.parametrize(("policy", "seed"), [("fcfs", 0), ("priority", 1), ("fairshare", 0)])
def test_without_the_rules_the_users_trade_gpus_back_and_forth(
    monkeypatch: pytest.MonkeyPatch, policy: str, seed: int
) -> None:
    """The negative control: the same six hours with the old rule hand GPUs from one user
    to the other hundreds of times (Pollux's workload 2 with every job preemptible: 1,103
    preemptions for 160 jobs)."""
    ruled = Churn(CONFIGS[policy], Random(seed))
    ruled.run(360)
    old_rules(monkeypatch)
    unruled = Churn(replace(CONFIGS[policy], preempt_exempt_s=0.0), Random(seed))
    unruled.run(360)

    assert ruled.handovers() <= 5
    assert unruled.handovers() >= 100
