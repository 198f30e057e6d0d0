"""bench/replay.py's simulator on a tiny synthetic trace: every policy, the real engine among
them, keeps the invariants a replay's figures rest on."""

from __future__ import annotations

import sys
from collections.abc import Callable
from functools import partial
from pathlib import Path
from random import Random

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))

from replay import engine_schedulers  # noqa: E402
from replay_baselines import baselines  # noqa: E402
from replay_sim import Cluster, Decision, EngineScheduler, JobState, Scheduler, simulate  # noqa: E402
from replay_traces import (  # noqa: E402
    HELIOS_ESTIMATE_ERRORS,
    NodeSpec,
    Partition,
    TraceJob,
    Workload,
    with_helios_estimates,
)

from scheduling.placement import JobRequest, PoolConfig  # noqa: E402


def tiny_trace(seed: int = 7, jobs: int = 60) -> Partition:
    """Four 4-GPU nodes, a burst of 1-8 GPU jobs that keeps a queue, two projects."""
    rng = Random(seed)
    nodes = tuple(NodeSpec(f"n{i}", 4, "sim") for i in range(4))
    trace = tuple(
        TraceJob(
            id=number,
            submit=float(rng.randrange(0, 4000)),
            duration=float(rng.randrange(60, 3000)),
            gpus=rng.choice((1, 1, 1, 2, 4, 8)),
            project=rng.choice(("a", "b")),
        )
        for number in range(1, jobs + 1)
    )
    return Partition("tiny", nodes, trace)


class Checked:
    """Wraps a scheduler and checks, at every pass, the state the simulator keeps."""

    def __init__(self, inner: Scheduler) -> None:
        self.inner = inner
        self.name = inner.name
        self.preemptive = inner.preemptive
        self.started: list[int] = []

    def wake_at(self, cluster: Cluster, now: float) -> float | None:
        return self.inner.wake_at(cluster, now)

    def decide(self, cluster: Cluster, now: float) -> Decision:
        holders: dict[int, int] = {}
        for job_id, run in cluster.running.items():
            for gpu in run.gpu_ids:
                assert gpu not in holders, f"GPU {gpu} held by {holders[gpu]} and {job_id}"
                holders[gpu] = job_id
        assert sum(len(r.gpu_ids) for r in cluster.running.values()) == len(holders)
        decision = self.inner.decide(cluster, now)
        self.started += [job_id for job_id, _ in decision.starts]
        return decision


POLICIES: dict[str, Callable[[], Scheduler]] = {
    **engine_schedulers(estimates=False, preemptible=False, quotas=None),
    **{
        f"{name} preemptible": factory
        for name, factory in engine_schedulers(False, True, {"a": 8, "b": 8}).items()
    },
    **{name: partial(lambda name: baselines()[name], name) for name in baselines()},
}


@pytest.mark.parametrize("name", sorted(POLICIES))
def test_every_job_completes_once_and_no_gpu_is_double_booked(name: str) -> None:
    partition = tiny_trace()
    scheduler = Checked(POLICIES[name]())
    result = simulate(partition, scheduler)

    assert result.unfinished == 0
    assert len(result.jct) == len(partition.jobs)
    durations = sorted(job.duration for job in partition.jobs)
    # Each job's JCT is at least its run time: the waits are never negative.
    assert min(result.wait) >= -1e-6
    assert sum(result.jct) >= sum(durations) - 1e-6
    busy = sum(job.duration * job.gpus for job in partition.jobs)
    assert result.busy_gpu_s == pytest.approx(busy)
    assert result.figures()["util"] <= 1.0
    if result.preemptions == 0:
        assert sorted(scheduler.started) == sorted(job.id for job in partition.jobs)


def test_strict_fifo_starts_jobs_in_arrival_order() -> None:
    partition = tiny_trace(seed=3)
    scheduler = Checked(baselines()["fifo"])
    simulate(partition, scheduler)

    order = {job.id: (job.submit, job.id) for job in partition.jobs}
    assert scheduler.started == sorted(scheduler.started, key=order.__getitem__)


def test_a_gpu_given_twice_is_refused() -> None:
    partition = Partition(
        "two",
        (NodeSpec("n0", 1, "sim"),),
        (TraceJob(1, 0.0, 10.0, 1, "a"), TraceJob(2, 0.0, 10.0, 1, "a")),
    )

    class Greedy:
        name, preemptive = "greedy", False

        def wake_at(self, cluster: Cluster, now: float) -> float | None:
            return None

        def decide(self, cluster: Cluster, now: float) -> Decision:
            return Decision([(job_id, (0,)) for job_id in cluster.queue], [], 0.0)

    with pytest.raises(AssertionError, match="double-booked"):
        simulate(partition, Greedy())


def test_the_engine_predicts_only_from_jobs_that_ended_before_each_submission() -> None:
    """The replay feeds the engine's predictor its simulated completions, as the loop feeds
    it finished jobs: no job's own duration, nor that of one still running, is ever used."""
    node = (NodeSpec("n0", 4, "sim"),)
    jobs = (
        TraceJob(1, submit=0.0, duration=1000.0, gpus=1, project="a"),
        TraceJob(2, submit=10.0, duration=5000.0, gpus=1, project="a"),  # 1 still runs
        TraceJob(3, submit=1500.0, duration=20.0, gpus=1, project="a"),  # after 1 ended
        TraceJob(4, submit=1500.0, duration=20.0, gpus=2, project="b"),
    )
    seen: dict[int, float | None] = {}

    class Recording(EngineScheduler):
        def request(self, state: JobState) -> JobRequest:
            made = super().request(state)
            seen.setdefault(made.id, made.predicted_runtime_s)
            return made

    simulate(Partition("p", node, jobs), Recording("qssf", PoolConfig(policy="qssf")))

    # Job 2 came while job 1 ran: nothing had ended. Jobs 3 and 4 came after job 1 ended
    # (job 4: another project and GPU count, so the pool's runs of any size).
    assert seen == {1: None, 2: None, 3: 1000.0, 4: 1000.0}


def test_helios_estimates_are_off_by_its_published_error_distribution() -> None:
    """Each share of jobs within its relative error, over and under alike, never below one
    second, the same for the same seed; nothing else of a job changes."""
    jobs = tuple(TraceJob(n, submit=0.0, duration=1000.0, gpus=1, project="a") for n in range(4000))
    workload = Workload("w", (Partition("p", (NodeSpec("n0", 8, "sim"),), jobs),), {})
    noisy = with_helios_estimates(workload, seed=3)
    [partition] = noisy.partitions
    # Over-estimates show the drawn error whole (an under-estimate past -100 % is one second).
    errors = [job.estimate / job.duration - 1 for job in partition.jobs if job.estimate > 1000]
    for share, _, high in HELIOS_ESTIMATE_ERRORS[:-1]:
        within = sum(error <= high for error in errors) / len(errors)
        assert within == pytest.approx(share, abs=0.04), (high, within)
    under = sum(job.estimate < job.duration for job in partition.jobs) / len(jobs)
    assert under == pytest.approx(0.5, abs=0.03)
    assert min(job.estimate for job in partition.jobs) >= 1.0
    assert [job.estimate for job in with_helios_estimates(workload, seed=3).partitions[0].jobs] == [
        job.estimate for job in partition.jobs
    ]
    assert all(
        (job.id, job.duration, job.gpus) == (old.id, old.duration, old.gpus)
        for job, old in zip(partition.jobs, jobs, strict=True)
    )


def test_a_running_jobs_expected_end_is_its_start_plus_its_declared_estimate() -> None:
    """As the loop reckons it: the engine never sees the true end of a job with an estimate."""
    node = (NodeSpec("n0", 1, "sim"),)
    jobs = (
        TraceJob(1, submit=0.0, duration=1000.0, gpus=1, project="a", estimate=300.0),
        TraceJob(2, submit=10.0, duration=50.0, gpus=1, project="a", estimate=60.0),
    )
    ends: dict[int, float | None] = {}

    class Recording(EngineScheduler):
        def decide(self, cluster: Cluster, now: float) -> Decision:
            snapshot = self.snapshot(cluster, now)
            ends.update((run.id, run.expected_end) for run in snapshot.running)
            return super().decide(cluster, now)

    simulate(Partition("p", node, jobs), Recording("fcfs", PoolConfig(policy="fcfs")))
    assert ends[1] == 300.0
