import io

import pytest
from django.core.management import CommandError, call_command

from gpuadmin.audit.models import AuditEvent
from inventory.models import Gpu, Node
from tests.conftest import REPO_DIR

pytestmark = pytest.mark.django_db


@pytest.fixture(autouse=True)
def sim_state(settings, tmp_path):
    settings.GPUADMIN_SIM_STATE_DIR = tmp_path / "sim"


def load(*args: str) -> str:
    out = io.StringIO()
    call_command("load_fleet", *args, stdout=out)
    return out.getvalue()


def test_models_times_nodes_with_derived_names():
    output = load("--sim", "dgx-h100,pcie-l40s-4x", "--nodes", "2")
    assert list(Node.objects.values_list("hostname", "model", "nvml_backend")) == [
        ("dgx-h100-01", "dgx-h100", "sim"),
        ("dgx-h100-02", "dgx-h100", "sim"),
        ("pcie-l40s-4x-01", "pcie-l40s-4x", "sim"),
        ("pcie-l40s-4x-02", "pcie-l40s-4x", "sim"),
    ]
    assert Gpu.objects.count() == 24
    assert len(set(Gpu.objects.values_list("uuid", flat=True))) == 24
    assert "dgx-h100-02: 8 GPUs, 9 changes recorded" in output
    assert AuditEvent.objects.filter(event_type="node.registered").count() == 4


def test_loading_again_changes_nothing():
    load("--sim", "dgx-a100-40gb")
    events = AuditEvent.objects.count()
    assert load("--sim", "dgx-a100-40gb") == "dgx-a100-40gb-01: 8 GPUs, 0 changes recorded\n"
    assert AuditEvent.objects.count() == events


def test_the_demo_fleet():
    load("--fleet", str(REPO_DIR / "gpuadmin" / "demo_fleet.json"))
    assert Node.objects.count() == 5
    assert Gpu.objects.count() == 36
    assert Gpu.objects.filter(mig_enabled=True).count() == 2


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("--sim", "dgx-a100-40gb,dgx-z9"), "unknown machine model(s) dgx-z9"),
        (("--sim", "dgx-h100", "--nodes", "0"), "--nodes must be at least 1"),
        (("--fleet", "/nonexistent.json"), "--fleet /nonexistent.json"),
    ],
)
def test_bad_arguments_are_refused_before_anything_is_written(args, message):
    with pytest.raises(CommandError, match=message.replace("(", r"\(").replace(")", r"\)")):
        load(*args)
    assert Node.objects.count() == 0
