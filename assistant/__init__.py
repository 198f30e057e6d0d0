"""The diagnostic assistant: a person's question answered by a model that calls gpuadmin's
read-only queries as tools (docs/users/assistant.md)."""
