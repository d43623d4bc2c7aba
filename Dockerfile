# syntax=docker/dockerfile:1
# islwatch container image: `docker build -t islwatch:local .`
# Tokenizers are not baked in: mount a tokenizer folder and point `tokenizer` / `model_tokenizers` at it,
# or give hub ids and they are downloaded at start into HF_HOME (a volume; see docs/ops.md, "Container image").
ARG PYTHON_IMAGE=python:3.11-slim-bookworm

# ---- build: install islwatch and its dependencies into a virtualenv (all wheels: no compiler needed)
FROM ${PYTHON_IMAGE} AS build
ENV PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PIP_NO_CACHE_DIR=1 \
    PYTHONDONTWRITEBYTECODE=1
RUN python -m venv /opt/islwatch
ENV PATH=/opt/islwatch/bin:$PATH
WORKDIR /src
COPY pyproject.toml README.md ./
COPY proxy ./proxy
COPY loadgen ./loadgen
# The README's install command.
RUN pip install .

# ---- runtime: the virtualenv only, a non-root user, nothing to build with
FROM ${PYTHON_IMAGE}
RUN groupadd --system --gid 10001 islwatch \
 && useradd --system --uid 10001 --gid islwatch --home-dir /var/lib/islwatch --create-home \
      --shell /usr/sbin/nologin islwatch \
 && mkdir -p /var/lib/islwatch/hf \
 && chown -R islwatch:islwatch /var/lib/islwatch
COPY --from=build /opt/islwatch /opt/islwatch
ENV PATH=/opt/islwatch/bin:$PATH \
    PYTHONUNBUFFERED=1 \
    HF_HOME=/var/lib/islwatch/hf \
    ISLWATCH_HEALTHCHECK_URL=http://127.0.0.1:9100/healthz
# Downloaded tokenizers survive restarts when this is a named volume (compose) or a PVC (Kubernetes).
VOLUME ["/var/lib/islwatch/hf"]
USER 10001:10001
WORKDIR /var/lib/islwatch
# 9000: the OpenAI API relayed to the upstream; 9100: /metrics, /healthz, /readyz (set `admin` to
# 0.0.0.0:9100 to reach it from outside the container; the healthcheck works either way).
EXPOSE 9000 9100
# The slim image has no curl: Python's urllib is the probe. Set ISLWATCH_HEALTHCHECK_URL when `admin` moves.
HEALTHCHECK --interval=15s --timeout=5s --start-period=60s --retries=3 \
  CMD ["python", "-c", "import os, urllib.request; urllib.request.urlopen(os.environ['ISLWATCH_HEALTHCHECK_URL'], timeout=3)"]
ENTRYPOINT ["islwatch"]
# `docker run islwatch:local` needs an upstream: -e ISLWATCH_UPSTREAM=http://host:8000, or
# `proxy --config /etc/islwatch/islwatch.yaml` with the file mounted.
CMD ["proxy"]
