# One image for every gpuadmin process: web, worker, beat and node agents.
FROM python:3.11-slim

ENV PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1 \
    GPUADMIN_DATA_DIR=/var/lib/gpuadmin STATIC_ROOT=/app/staticfiles
WORKDIR /app
COPY pyproject.toml README.md manage.py ./
COPY gpuadmin gpuadmin
COPY inventory inventory
COPY health health
COPY scheduling scheduling
COPY templates templates
COPY static static
RUN pip install --no-cache-dir . \
    && SECRET_KEY=collectstatic-only-build-key-0123456789abcdef \
       DATABASE_URL=postgresql://build@localhost/build REDIS_URL=redis://localhost \
       python manage.py collectstatic --noinput \
    && useradd --system --home /var/lib/gpuadmin gpuadmin \
    && mkdir -p /var/lib/gpuadmin && chown gpuadmin /var/lib/gpuadmin
USER gpuadmin
EXPOSE 8000
CMD ["gpuadmin", "serve", "--bind", "0.0.0.0:8000"]
