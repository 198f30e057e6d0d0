"""The OpenAPI schema the documentation site carries (docs/reference/openapi.yaml) is the one
the server serves at /api/schema/: a change to the API without the file fails here."""

import difflib

from tests.conftest import REPO_DIR

DOCUMENTED = REPO_DIR / "docs" / "reference" / "openapi.yaml"
REGENERATE = "gpuadmin manage spectacular --file docs/reference/openapi.yaml"


def test_the_documented_schema_is_the_served_one(client):
    answer = client.get("/api/schema/")
    assert answer.status_code == 200
    served = answer.content.decode().splitlines()
    documented = DOCUMENTED.read_text().splitlines()
    diff = difflib.unified_diff(
        documented, served, "docs/reference/openapi.yaml", "/api/schema/", lineterm="", n=1
    )
    changed = list(diff)
    assert not changed, f"the API changed; regenerate the file: {REGENERATE}\n" + "\n".join(
        changed[:60]
    )
