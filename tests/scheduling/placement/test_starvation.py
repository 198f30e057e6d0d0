"""No job starves, under every policy, with backfill on and off: passes simulated over time.

Jobs arrive on every pass for the whole run and finish by their true runtimes (never longer
than their estimates, nor than the one maximum runtime R). Usage (fair share) is what jobs ran.

Jobs carry predicted runtimes, often wrong: a job predicted to end before the first waiting
job starts may pass it and run on, but only while that job has waited less than the trust
window T (the pool's `prediction_trust_intervals` aging intervals); after that only estimates
let jobs pass. Both T and QSSF's horizon are the pool's: one pool below sets its own.

The bound, for a job J submitted at t0: after its policy's horizon H (when it ranks ahead of
every job submitted later: the points its standing can lack, times the aging interval; LAS:
its promotion to the top queue) only the jobs K submitted before t0 + H and still waiting at
t0 can be ahead of it. The first waiting job starts within T + R plus a pass (EASY backfill,
or strict order, keeps its start once mispredicted jobs may no longer pass it) unless the
order changes above it, which each job of K does at most once (promotion, or passing the
fair-share starvation limit). So J starts by t0 + H + 2 (|K| + 1) (T + R + pass) + pass.
"""

from __future__ import annotations

import math
from collections import defaultdict
from dataclasses import dataclass, field, replace
from random import Random

import pytest
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

from scheduling.placement import (
    DEFAULT_PRIORITY_POINTS,
    JobRequest,
    PoolConfig,
    Qssf,
    RunningJob,
    Sjf,
    plan,
)
from scheduling.placement.engine import EVERYWHERE
from scheduling.placement.planner import _Partition
from scheduling.placement.policies import LAS_STARVE_MULTIPLE
from tests.scheduling.placement.builders import NOW, Fleet

PASS_S = 60.0
MAX_RUNTIME_S = 600.0
AGING_S = 0.25  # one point per quarter second: horizons of minutes, not days
CONFIGS = {
    # Every pool's aging interval also bounds how long predictions let jobs pass the head.
    "fcfs": PoolConfig(policy="fcfs", aging_interval_s=AGING_S),
    "priority": PoolConfig(policy="priority", aging_interval_s=AGING_S),
    "sjf": PoolConfig(policy="sjf", aging_interval_s=AGING_S),
    "fairshare": PoolConfig(policy="fairshare", aging_interval_s=AGING_S),
    "las": PoolConfig(policy="las", las_thresholds_gpu_s=(300.0, 1000.0), aging_interval_s=AGING_S),
    "qssf": PoolConfig(policy="qssf", aging_interval_s=AGING_S),
    # A pool's own settings: size counts four times as much, predictions are trusted a third
    # as long.
    "qssf-steep": PoolConfig(
        policy="qssf",
        aging_interval_s=AGING_S,
        qssf_points_per_halving=1000,
        prediction_trust_intervals=120,
    ),
}
SIMULATIONS = settings(
    max_examples=12,
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)


def trust_s(config: PoolConfig) -> float:
    """How long a head may be passed by jobs only predicted (maybe wrongly) to end before it
    starts."""
    return config.prediction_trust_intervals * config.aging_interval_s


def horizon_s(config: PoolConfig, job: JobRequest) -> float:
    """How long until `job` ranks ahead of every job submitted after it."""
    points = DEFAULT_PRIORITY_POINTS.values()
    spread = max(points) - min(points)
    return {
        "fcfs": 0.0,
        "priority": spread * AGING_S,
        "sjf": Sjf().size_points(replace(job, estimated_duration_s=1.0)) * AGING_S,
        "fairshare": (spread + config.fairshare_weight) * AGING_S,
        "las": LAS_STARVE_MULTIPLE * job.attained_service_s / job.gpu_count,
        "qssf": Qssf(
            aging_interval_s=AGING_S, points_per_halving=config.qssf_points_per_halving
        ).starvation_limit_s,
    }[config.policy]


@dataclass
class Simulation:
    """A fleet of DGX nodes, passes every minute, and what happened to every job."""

    nodes: int
    config: PoolConfig
    fleet: Fleet = field(default_factory=Fleet)
    now: float = NOW
    submitted: list[JobRequest] = field(default_factory=list)
    runtime: dict[int, float] = field(default_factory=dict)
    started: dict[int, float] = field(default_factory=dict)
    # Running: job id -> (GPU ids, true end).
    running: dict[int, tuple[tuple[int, ...], float]] = field(default_factory=dict)
    usage: dict[tuple[str, str], float] = field(default_factory=lambda: defaultdict(float))

    def __post_init__(self) -> None:
        for n in range(self.nodes):
            self.fleet.dgx(f"dgx-{n}")

    def submit(self, request: JobRequest, runtime: float) -> None:
        assert runtime <= (request.expected_runtime_s or MAX_RUNTIME_S) <= MAX_RUNTIME_S
        self.submitted.append(replace(request, submitted_at=self.now))
        self.runtime[request.id] = runtime

    def step(self) -> None:
        """Jobs that ended by now free their GPUs; one pass; its placements start."""
        for job_id, (_, end) in list(self.running.items()):
            if end <= self.now:
                del self.running[job_id]
        holder = {gpu_id: job_id for job_id, (ids, _) in self.running.items() for gpu_id in ids}
        gpus = tuple(replace(gpu, allocated_to=holder.get(gpu.id)) for gpu in self.fleet.gpus)
        jobs = {request.id: request for request in self.submitted}
        running = tuple(
            RunningJob(
                job_id,
                ids,
                self.started[job_id],
                self.started[job_id] + (jobs[job_id].expected_runtime_s or MAX_RUNTIME_S),
                predicted_end=self.predicted_end(jobs[job_id]),
                owner=jobs[job_id].owner,
            )
            for job_id, (ids, _) in self.running.items()
        )
        queue = tuple(request for request in self.submitted if request.id not in self.started)
        snapshot = self.fleet.snapshot(
            *queue,
            now=self.now,
            gpus=gpus,
            running=running,
            pools={None: self.config},
            usage={(None, holder): used for holder, used in self.usage.items()},
        )
        for placement in plan(snapshot).placements:
            self.started[placement.job_id] = self.now
            end = self.now + self.runtime[placement.job_id]
            self.running[placement.job_id] = (placement.gpu_ids, end)
        for job_id, (ids, _) in self.running.items():
            self.usage[("user", jobs[job_id].owner)] += len(ids) * PASS_S
            self.usage[("project", jobs[job_id].project)] += len(ids) * PASS_S
        self.now += PASS_S

    def predicted_end(self, job: JobRequest) -> float | None:
        """The end history predicted at its start (only without an estimate, as the loop)."""
        if job.estimated_duration_s is not None or job.predicted_runtime_s is None:
            return None
        return self.started[job.id] + job.predicted_runtime_s

    def late_jobs(
        self, judged_by: PoolConfig | None = None
    ) -> list[tuple[int, float, float | None]]:
        """Jobs whose bound (the simulated pool's, or `judged_by`'s) has passed and that did
        not start by it: (id, bound, start)."""
        config = judged_by or self.config
        late = []
        for job in self.submitted:
            t0 = job.submitted_at
            ahead_until = t0 + horizon_s(config, job)
            ahead = [
                other
                for other in self.submitted
                if other.id != job.id
                and other.submitted_at < ahead_until
                and self.started.get(other.id, float("inf")) >= t0
            ]
            head_wait = MAX_RUNTIME_S + PASS_S + trust_s(config)
            bound = ahead_until + 2 * (len(ahead) + 1) * head_wait + PASS_S
            start = self.started.get(job.id)
            if bound < self.now and (start is None or start > bound):
                late.append((job.id, bound, start))
        return late


def random_arrivals(rng: Random, simulation: Simulation, passes: int) -> None:
    shapes = [(1, 1), (1, 1), (2, 1), (4, 1), (8, 1)] + [(8, 2)] * (simulation.nodes > 1)
    next_id = 1
    for _ in range(passes):
        for _ in range(rng.choice((0, 0, 1, 1, 2))):
            gpus, nodes = rng.choice(shapes)
            runtime = rng.uniform(PASS_S, MAX_RUNTIME_S)
            estimate = rng.choice((None, runtime, min(2 * runtime, MAX_RUNTIME_S)))
            # History's guess: often wrong, by far, both ways.
            predicted = rng.choice((None, runtime, runtime / 10, 3 * runtime))
            simulation.submit(
                JobRequest(
                    id=next_id,
                    owner=rng.choice(("ann", "bob", "cyd")),
                    priority=rng.choice(("low", "normal", "high", "critical")),
                    submitted_at=simulation.now,
                    gpus_per_node=gpus,
                    node_count=nodes,
                    # A DGX A100's NUMA nodes have 2 GPUs each: every job fits the hardware.
                    topology=rng.choice(("any", "any", "nvlink") + ("numa",) * (gpus <= 2)),
                    estimated_duration_s=estimate,
                    max_runtime_s=MAX_RUNTIME_S,
                    project=rng.choice(("x", "y")),
                    attained_service_s=rng.choice((0.0, 0.0, 200.0, 800.0, 2000.0)),
                    predicted_runtime_s=predicted,
                ),
                runtime,
            )
            next_id += 1
        simulation.step()


@pytest.mark.parametrize("backfill", [True, False], ids=["backfill", "strict"])
@pytest.mark.parametrize("policy", sorted(CONFIGS))
def test_every_job_starts_within_its_bound(policy: str, backfill: bool) -> None:
    config = replace(CONFIGS[policy], backfill=backfill, preemption=False)

    @SIMULATIONS
    @given(rng=st.randoms(use_true_random=False), nodes=st.integers(1, 3))
    def simulate(rng: Random, nodes: int) -> None:
        simulation = Simulation(nodes, config)
        random_arrivals(rng, simulation, passes=240)
        assert simulation.late_jobs() == []

    simulate()


BIG = 10_000


def adversary(config: PoolConfig, passes: int, mispredicted: bool = False) -> Simulation:
    """Every pass, a critical 1-GPU job of two passes' runtime; on the second pass, a
    low-priority 8-GPU job: without a reservation the node is never whole again.
    `mispredicted`: the small jobs give no estimate and are predicted to take a second."""
    simulation = Simulation(1, config)
    for i in range(passes):
        small = JobRequest(1 + i, "bob", "critical", NOW, 1, estimated_duration_s=2 * PASS_S)
        if mispredicted:
            small = replace(small, estimated_duration_s=None, predicted_runtime_s=1.0)
        simulation.submit(replace(small, max_runtime_s=2 * PASS_S), 2 * PASS_S)
        if i == 1:
            big = JobRequest(BIG, "ann", "low", NOW, 8, max_runtime_s=MAX_RUNTIME_S)
            simulation.submit(big, MAX_RUNTIME_S)
        simulation.step()
    return simulation


@pytest.mark.parametrize("mispredicted", [False, True], ids=["estimated", "mispredicted"])
@pytest.mark.parametrize("policy", sorted(CONFIGS))
def test_a_stream_of_small_jobs_does_not_starve_a_large_one(
    policy: str, mispredicted: bool
) -> None:
    simulation = adversary(replace(CONFIGS[policy], preemption=False), 240, mispredicted)

    assert BIG in simulation.started
    assert simulation.late_jobs() == []


def test_the_bound_catches_a_pass_without_reservations(monkeypatch: pytest.MonkeyPatch) -> None:
    """Proof the check can fail: with every job free to take the first waiting job's GPUs,
    the large job starves."""
    monkeypatch.setattr(_Partition, "view", lambda self, job: EVERYWHERE)

    simulation = adversary(replace(CONFIGS["fcfs"], preemption=False), passes=240)

    assert BIG not in simulation.started
    assert [job_id for job_id, _, _ in simulation.late_jobs()] == [BIG]


def test_the_random_check_can_fail(monkeypatch: pytest.MonkeyPatch) -> None:
    """Proof the random simulation can catch starvation: LIFO order starves early jobs."""
    monkeypatch.setattr(
        "scheduling.placement.policies.Fcfs.order",
        lambda self, jobs, now: sorted(jobs, key=lambda job: (-job.submitted_at, -job.id)),
    )
    config = replace(CONFIGS["fcfs"], preemption=False)

    @settings(SIMULATIONS, max_examples=30, phases=[Phase.generate])
    @given(rng=st.randoms(use_true_random=False))
    def simulate(rng: Random) -> None:
        simulation = Simulation(1, config)
        random_arrivals(rng, simulation, passes=240)
        assert simulation.late_jobs() == []

    with pytest.raises(AssertionError):
        simulate()


def test_the_bound_catches_predictions_trusted_for_ever() -> None:
    """Proof the check can fail: in a pool that trusts predictions for ever, jobs predicted
    to take a second keep passing the large job and running on, so its node is never whole
    (late by the bound of the default window)."""
    config = replace(CONFIGS["fcfs"], preemption=False)

    simulation = adversary(replace(config, prediction_trust_intervals=math.inf), 240, True)

    assert BIG not in simulation.started
    assert [job_id for job_id, _, _ in simulation.late_jobs(judged_by=config)] == [BIG]


def test_a_pools_longer_trust_window_delays_a_large_job_within_its_own_bound() -> None:
    """The window is the pool's: trusting predictions for 10,000 aging intervals (2,500 s
    here) lets mispredicted jobs hold the large job past the default window's bound, and no
    further than its own."""
    config = replace(CONFIGS["fcfs"], preemption=False)

    default = adversary(config, 240, mispredicted=True)
    trusting = adversary(replace(config, prediction_trust_intervals=10_000), 240, True)

    assert default.started[BIG] < trusting.started[BIG]
    assert trusting.late_jobs() == []
    assert [job_id for job_id, _, _ in trusting.late_jobs(judged_by=config)] == [BIG]
