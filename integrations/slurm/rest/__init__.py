"""slurmrestd, plain Python (no Django): a client, and one small parser per OpenAPI version the
server may offer, each turning its answers into the same dataclasses (``model``)."""
