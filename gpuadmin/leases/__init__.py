"""Leases: one holder at a time of a named role (a placement pass, beat, a MIG re-layout)
across processes and machines, kept in a PostgreSQL row instead of a session-level advisory
lock, so that it holds behind PgBouncer's transaction pooling and survives a failover."""
