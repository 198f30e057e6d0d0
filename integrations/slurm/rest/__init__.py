"""slurmrestd, plain Python (no Django): a client, and one small parser per OpenAPI version the
server may offer, each turning its answers into the same dataclasses (``model``). How it chooses
the version, where GPU indexes come from, and the errors: docs/development/design-notes.md,
"Reading slurmrestd"."""
