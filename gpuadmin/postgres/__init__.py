"""The database backend of gpuadmin's processes: Django's PostgreSQL one, with a cheaper
health check."""
