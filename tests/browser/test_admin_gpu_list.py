"""The admin's GPU list in real Chromium: each row starts with where the GPU is and keeps to
one line (the whole UUID used to open the list wrapped over four)."""

from __future__ import annotations

import pytest
from django.test import Client

from inventory.nvml import scan
from inventory.nvml.sim import SimulatedNvml
from inventory.services import apply_discovery

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]


def test_each_gpu_row_keeps_to_one_line_led_by_node_and_index(page, live_server, admin_user):
    apply_discovery("dgx-01", scan(SimulatedNvml.from_model("dgx-a100-80gb", node_name="dgx-01")))
    client = Client()
    client.force_login(admin_user)
    page.context.add_cookies(
        [{"name": "sessionid", "value": client.cookies["sessionid"].value, "url": live_server.url}]
    )

    page.goto(f"{live_server.url}/admin/inventory/gpu/")

    rows = page.locator("#result_list tbody tr")
    assert rows.count() == 8
    assert rows.first.locator("th").inner_text() == "dgx\u201101\u00a0GPU\u00a00"
    heights = rows.evaluate_all("rows => rows.map(row => row.getBoundingClientRect().height)")
    line = page.locator("#result_list tbody tr th").first.evaluate(
        "cell => parseFloat(getComputedStyle(cell).lineHeight) || 18"
    )
    assert max(heights) < 2.5 * line, heights  # one line each (with the cell's padding)
