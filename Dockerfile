# toolrelay: one image for the web (Daphne), worker and beat processes; see docker-compose.yml.
FROM python:3.11-slim

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    # Import the project from /app (where templates/ and manage.py are), not from site-packages.
    PYTHONPATH=/app

WORKDIR /app

# Dependencies first, so code changes do not reinstall them: exactly the hashed lock file
# (`make lock` regenerates it from pyproject.toml); the project itself runs from /app.
COPY requirements/runtime.txt requirements/runtime.txt
RUN pip install --require-hashes --no-deps -r requirements/runtime.txt

COPY pyproject.toml README.md ./
# Every top-level package of the repository but tests/ and bench/ (tests/deploy/test_image.py checks the list
# and runs the collectstatic step below on exactly these files).
COPY config config
COPY infra infra
COPY proxy proxy
COPY tenants tenants
COPY audit audit
COPY billing billing
COPY alerts alerts
COPY api api
COPY templates templates
COPY manage.py ./
# Only the staticfiles checks run here, so no secrets are needed at build time.
RUN python manage.py collectstatic --no-input -v 0

# The folders the compose volumes mount (report files, the audit journal): a named volume starts as a copy of
# the image's folder, owner included, so the non-root user can write it.
RUN useradd --system --uid 10001 --home-dir /app --shell /usr/sbin/nologin toolrelay \
    && mkdir -p /app/var/media /app/var/journal && chown -R toolrelay /app/var
USER toolrelay

EXPOSE 8000
CMD ["python", "manage.py", "serve", "--host", "0.0.0.0", "--port", "8000", "--proxy-headers"]
