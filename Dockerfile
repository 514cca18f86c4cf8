# One image for web and workers. GPU hosts add vLLM on top (see docs/ENGINE.md).
FROM python:3.11-slim
ENV PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1
WORKDIR /app
COPY pyproject.toml ./
COPY config ./config
COPY apps ./apps
COPY workers ./workers
RUN pip install --no-cache-dir .
COPY . .
# The processes run as an unprivileged user: the code stays root's (read-only to them); what they
# write (uploads, collected static files, the broker's folder on the embedded defaults) goes to
# TAILTUNE_DATA, the one folder they own.
ENV TAILTUNE_DATA=/data
# Numeric, so that an orchestrator's "run as non-root" check can verify it.
RUN groupadd --system --gid 10001 tailtune \
    && useradd --system --uid 10001 --gid 10001 --home-dir /data --no-create-home --shell /usr/sbin/nologin tailtune \
    && mkdir -p /data && chown 10001:10001 /data && chmod 0700 /data
USER 10001:10001
VOLUME ["/data"]
EXPOSE 8000
CMD ["python", "manage.py", "serve", "--addr", "0.0.0.0", "--no-worker"]
