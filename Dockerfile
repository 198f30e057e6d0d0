# One image for every gpuadmin process: web, worker, beat and node agents.

# The documentation site (`make docs`), built in a stage of its own: its toolchain
# (docs/requirements.txt) stays out of the application's image.
FROM python:3.11-slim AS docs
WORKDIR /src
COPY docs/requirements.txt docs/requirements.txt
RUN pip install --no-cache-dir -r docs/requirements.txt
COPY mkdocs.yml ./
COPY docs docs
RUN NO_MKDOCS_2_WARNING=1 mkdocs build --strict

FROM python:3.11-slim
ENV PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1 \
    GPUADMIN_DATA_DIR=/var/lib/gpuadmin STATIC_ROOT=/app/staticfiles GPUADMIN_DOCS_DIR=/app/site
WORKDIR /app
COPY pyproject.toml README.md manage.py ./
COPY gpuadmin gpuadmin
COPY inventory inventory
COPY health health
COPY scheduling scheduling
COPY integrations integrations
COPY assistant assistant
COPY templates templates
COPY static static
COPY --from=docs /src/site site
# collectstatic and whitenoise.compress leave a gzip copy beside each file, which WhiteNoise
# sends to the browsers that accept it.
RUN pip install --no-cache-dir . \
    && SECRET_KEY=collectstatic-only-build-key-0123456789abcdef \
       DATABASE_URL=postgresql://build@localhost/build REDIS_URL=redis://localhost \
       python manage.py collectstatic --noinput \
    && python -m whitenoise.compress --quiet site \
    && useradd --system --home /var/lib/gpuadmin gpuadmin \
    && mkdir -p /var/lib/gpuadmin && chown gpuadmin /var/lib/gpuadmin
USER gpuadmin
EXPOSE 8000 50051
CMD ["gpuadmin", "serve", "--bind", "0.0.0.0:8000"]
