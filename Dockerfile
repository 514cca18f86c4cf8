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
EXPOSE 8000
CMD ["python", "manage.py", "serve", "--addr", "0.0.0.0", "--no-worker"]
