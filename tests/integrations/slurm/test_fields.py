"""The fields every slurmrestd version writes alike: GRES strings with their GPU indexes, host
lists, TRES counts and job states."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from integrations.slurm.rest.fields import (
    FieldError,
    expand_hostlist,
    gpu_count,
    gpu_indexes,
    gpus_in_tres,
    names,
    split_job_states,
    with_held_gpus,
)
from integrations.slurm.rest.model import SlurmJob, SlurmNode


@pytest.mark.parametrize(
    ("gres", "indexes"),
    [
        ("gpu:2(IDX:0-1)", (0, 1)),
        ("gpu:a100:1(IDX:3)", (3,)),
        ("gpu:4(IDX:0,2-3,7)", (0, 2, 3, 7)),
        ("gpu:h100:2(IDX:0-1),gpu:h200:4(IDX:2-5)", (0, 1, 2, 3, 4, 5)),
        ("gpu:h100:2(IDX:0-1),gpu:h200:0(IDX:)", (0, 1)),
        ("gpu:(null):2(IDX:4,6)", (4, 6)),
        ("gpu:a100:3(IDX:1,3-4),shard:2(IDX:0)", (1, 3, 4)),
        ("gpu:0", ()),
        ("gpu:5", ()),  # v0.0.38's node gres_used: a count, no indexes
        ("gpu:2(IDX:N/A)", ()),
        ("", ()),
        ("N/A", ()),
    ],
)
def test_gpu_indexes_read_idx_lists_exactly(gres: str, indexes: tuple[int, ...]) -> None:
    assert gpu_indexes(gres) == indexes


def idx_text(indexes: set[int]) -> str:
    """Indexes written as Slurm writes them: ranges of consecutive ones, commas between."""
    runs: list[list[int]] = []
    for index in sorted(indexes):
        if runs and index == runs[-1][-1] + 1:
            runs[-1].append(index)
        else:
            runs.append([index])
    return ",".join(str(run[0]) if len(run) == 1 else f"{run[0]}-{run[-1]}" for run in runs)


@given(
    st.lists(
        st.tuples(st.sampled_from(["", "a100:", "h100:"]), st.sets(st.integers(0, 63))),
        max_size=3,
    )
)
def test_any_idx_lists_read_back_exactly(types: list[tuple[str, set[int]]]) -> None:
    gres = ",".join(f"gpu:{kind}{len(held)}(IDX:{idx_text(held)})" for kind, held in types)
    assert gpu_indexes(gres) == tuple(sorted(set().union(*(held for _, held in types))))


@pytest.mark.parametrize(
    ("gres", "count"),
    [
        ("gpu:8", 8),
        ("gpu:a100:4", 4),
        ("gpu:h100:4(S:0-1)", 4),
        ("gpu:a100:4,gpu:h100:4(S:0-1),shard:16", 8),
        ("gpu", 1),
        ("(null)", 0),
        ("", 0),
    ],
)
def test_gpu_count_sums_every_gpu_type(gres: str, count: int) -> None:
    assert gpu_count(gres) == count


@pytest.mark.parametrize("gres", ["gpu:2(IDX:0-x)", "gpu:2(IDX:0-1)junk", "gpu:2(IDX:a)"])
def test_unreadable_gres_is_an_error(gres: str) -> None:
    with pytest.raises(FieldError):
        gpu_indexes(gres)


@pytest.mark.parametrize(
    ("hostlist", "hosts"),
    [
        ("localhost", ("localhost",)),
        ("ia[1-2]", ("ia1", "ia2")),
        ("gpu[01-03,07],cpu9", ("gpu01", "gpu02", "gpu03", "gpu07", "cpu9")),
        ("r[1-2]n[1-2]", ("r1n1", "r1n2", "r2n1", "r2n2")),
        ("cn[8-11]", ("cn8", "cn9", "cn10", "cn11")),
        ("", ()),
    ],
)
def test_expand_hostlist_in_slurms_order(hostlist: str, hosts: tuple[str, ...]) -> None:
    assert expand_hostlist(hostlist) == hosts


@pytest.mark.parametrize("hostlist", ["gpu[1-2", "gpu[a-b]"])
def test_unreadable_hostlist_is_an_error(hostlist: str) -> None:
    with pytest.raises(FieldError):
        expand_hostlist(hostlist)


@pytest.mark.parametrize(
    ("tres", "gpus"),
    [
        ("gres:gpu:2", 2),  # 22.05's tres_per_node
        ("gres/gpu:12", 12),
        ("gres/gpu:h100:1,gres/gpu:h200:1", 2),
        ("gres/gpu=2", 2),
        ("cpu=2,mem=1G,gres/gpu=4,gres/gpu:h100=4", 4),
        ("cpu=1,mem=512M,node=1,billing=1", 0),
        ("", 0),
    ],
)
def test_gpus_in_tres(tres: str, gpus: int) -> None:
    assert gpus_in_tres(tres) == gpus


def test_split_job_states_finds_the_base_state_among_flags() -> None:
    assert split_job_states(("RUNNING",)) == ("RUNNING", ())
    assert split_job_states(("COMPLETING", "RUNNING")) == ("RUNNING", ("COMPLETING",))
    assert split_job_states(("PENDING", "REQUEUED")) == ("PENDING", ("REQUEUED",))
    assert split_job_states(("REVOKED",)) == ("REVOKED", ())


def test_names_are_a_list_of_strings() -> None:
    assert names(["idle", "DRAIN"], "state") == ("IDLE", "DRAIN")
    with pytest.raises(FieldError, match="state is not a list of names: 'mixed'"):
        names("mixed", "state")  # v0.0.38's shape read as v0.0.40's


def test_nodes_get_the_gpus_their_running_jobs_hold() -> None:
    nodes = (SlurmNode("n1", ("MIXED",), gpus_used=(5,)), SlurmNode("n2", ("IDLE",)))
    jobs = (
        SlurmJob(1, "a", "u", "RUNNING", nodes=("n1",), gpus={"n1": (0, 1)}),
        SlurmJob(2, "b", "u", "COMPLETED", nodes=("n2",), gpus={"n2": (3,)}),
    )
    n1, n2 = with_held_gpus(nodes, jobs)
    assert n1.gpus_used == (0, 1, 5)
    assert n2.gpus_used == ()
