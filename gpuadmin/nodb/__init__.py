"""The database backend of a process that has no database: a node agent (``GPUADMIN_AGENT``)."""
