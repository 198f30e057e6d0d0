"""Every tool's schema, derived from its signature, is a valid JSON schema; arguments
generated from it are accepted by it and by the tool, which then answers (or refuses in
words) without writing anything; arguments outside it are refused alike by the schema and by
the tool's binding."""

from __future__ import annotations

import json
from datetime import date
from typing import Any

import jsonschema  # type: ignore[import-untyped]
import pytest

from assistant.schema import ArgumentsInvalid, bind
from assistant.services import cap, read_only
from assistant.tools import TOOLS, Tool, ToolRefused
from gpuadmin.access.models import Role
from gpuadmin.audit.models import AuditEvent

pytestmark = pytest.mark.django_db

SAMPLE = {"string": "dgx-01", "integer": 1, "number": 1.5, "boolean": True}


def example(prop: dict[str, Any]) -> Any:
    """A value the property's schema allows (not null where it can be)."""
    if "enum" in prop:
        return next(choice for choice in prop["enum"] if choice is not None)
    kind = prop["type"][0] if isinstance(prop["type"], list) else prop["type"]
    if prop.get("format") == "date":
        return date.today().isoformat()
    return SAMPLE[kind]


def generated(schema: dict[str, Any]) -> list[dict[str, Any]]:
    """Arguments from the schema: the required ones alone; every one; every one null (where
    null is allowed); and for each enum, each of its choices."""
    props = schema["properties"]
    required = {name: example(props[name]) for name in schema.get("required", [])}
    full = {name: example(prop) for name, prop in props.items()}
    nulls = {
        name: None if "null" in prop["type"] else full[name]
        for name, prop in props.items()
        if isinstance(prop["type"], list) or name in required
    }
    choices = [
        {**required, name: choice}
        for name, prop in props.items()
        for choice in prop.get("enum", [])
    ]
    return [required, full, nulls, *choices]


@pytest.mark.parametrize("tool", TOOLS.values(), ids=list(TOOLS))
def test_arguments_generated_from_each_schema_are_taken(tool: Tool, make_user, fleet):
    admin = make_user("root", Role.ADMIN)
    jsonschema.Draft202012Validator.check_schema(tool.parameters)
    validator = jsonschema.Draft202012Validator(tool.parameters)
    assert tool.description
    for arguments in generated(tool.parameters):
        validator.validate(arguments)
        kwargs = bind(tool.function, json.dumps(arguments))
        try:
            result = read_only(lambda kwargs=kwargs: tool.function(admin, **kwargs))
        except ToolRefused as refusal:
            assert str(refusal)
            continue
        assert isinstance(result, dict)
        json.loads(cap(result, 16000))
    assert not AuditEvent.objects.filter(actor=admin).exists()


@pytest.mark.parametrize("tool", TOOLS.values(), ids=list(TOOLS))
def test_arguments_outside_each_schema_are_refused_by_both(tool: Tool):
    validator = jsonschema.Draft202012Validator(tool.parameters)
    props = tool.parameters["properties"]
    wrong = {"string": 7, "integer": "7", "number": "7", "boolean": "yes"}
    bad: list[dict[str, Any]] = [{"no_such_argument": 1}]
    for name, prop in props.items():
        kind = prop["type"][0] if isinstance(prop["type"], list) else prop["type"]
        bad.append({name: wrong[kind]})
        if "enum" in prop:
            bad.append({name: "no-such-choice"})
        if "null" not in prop["type"] and "default" in prop:
            bad.append({name: None})
    for arguments in bad:
        arguments = {
            **{n: example(props[n]) for n in tool.parameters.get("required", [])},
            **arguments,
        }
        assert not validator.is_valid(arguments), arguments
        with pytest.raises(ArgumentsInvalid):
            bind(tool.function, json.dumps(arguments))


def test_a_result_over_the_cap_keeps_its_first_rows_and_says_so():
    rows = [{"ref": f"GPU {index} of dgx-01", "pad": "x" * 90} for index in range(64)]

    text = cap({"gpus": rows, "total": 64}, 1000)

    assert len(text) <= 1000
    shown = json.loads(text)
    assert shown["gpus"] == rows[: len(shown["gpus"])]
    assert shown["truncated"] == {"gpus": 64}
    assert shown["total"] == 64


def test_a_tool_that_tried_to_write_would_be_refused_by_the_database(make_user):
    from django.contrib.auth.models import User
    from django.db import DatabaseError

    with pytest.raises(DatabaseError, match="read-only transaction"):
        read_only(lambda: make_user("intruder"))

    assert not User.objects.filter(username="intruder").exists()
    make_user("after")  # the connection writes again outside it
