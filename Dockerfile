# syntax=docker/dockerfile:1
# dlq-sidecar container image.
#   docker build -t dlq-sidecar:0.1.0 .
# Stage 1 downloads the pinned, hash-checked dependency wheels (requirements/image.txt) and builds
# the project's own wheel with a pinned, hash-checked build backend (requirements/build.txt), its
# pure core (sidecar/core) compiled by mypyc (DLQ_SIDECAR_MYPYC=1, setup.py; with a C compiler
# from the distribution's packages, in this stage only); stage 2 installs them from those wheels
# only (no compiler, no build tools, no network in the final stage, every dependency file checked
# against its hash), checks the compiled core is what imports, and runs as a non-root user whose
# UID/GID match the Helm chart's podSecurityContext (10001). requirements/README.md says how the
# pinned files are regenerated.
# The base: python:3.11-slim, or any image of Python 3.11 (scripts/build-image makes one from Debian bookworm's
# packages where no registry is reachable) that has, beyond a Python interpreter: pip and venv, `python` on PATH,
# the Python headers (libpython3.11-dev on Debian), CA certificates, apt-get with Debian's archive (stage 1 installs
# gcc), groupadd/useradd, and no EXTERNALLY-MANAGED marker (pip installs into the system Python here).
ARG PYTHON_IMAGE=python:3.11-slim

FROM ${PYTHON_IMAGE} AS build
ENV PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PIP_NO_CACHE_DIR=1
WORKDIR /src
# The C compiler mypyc's output needs (the image's Python ships its headers). Not pinned: the
# distribution's current compiler is the one that matches its libc; it never reaches stage 2.
# hadolint ignore=DL3008
RUN apt-get update \
    && apt-get install -y --no-install-recommends gcc libc6-dev \
    && rm -rf /var/lib/apt/lists/*
COPY requirements/image.txt requirements/build.txt ./requirements/
# Binary wheels only: a wheel built here would not match the hashes the final stage checks.
RUN pip download --require-hashes --no-deps --only-binary=:all: \
        --dest /wheels -r requirements/image.txt \
    && pip install --require-hashes --no-deps -r requirements/build.txt
# Only what the wheel needs (see .dockerignore), so code-unrelated changes keep the cache.
COPY pyproject.toml setup.py README.md config.example.yaml ./
# sidecar/ops/demo/data links to these two (the demo's package data).
COPY examples/python/app.py ./examples/python/
COPY sidecar ./sidecar
RUN DLQ_SIDECAR_MYPYC=1 pip wheel --no-deps --no-build-isolation --wheel-dir /dist .

FROM ${PYTHON_IMAGE}
ENV PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PIP_NO_CACHE_DIR=1 \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1
RUN groupadd --system --gid 10001 dlq \
    && useradd --system --uid 10001 --gid 10001 --no-create-home \
        --home-dir /nonexistent --shell /usr/sbin/nologin dlq
# The bind mounts keep the wheels out of the final image's layers.
RUN --mount=type=bind,from=build,source=/wheels,target=/wheels \
    --mount=type=bind,from=build,source=/dist,target=/dist \
    --mount=type=bind,from=build,source=/src/requirements,target=/requirements \
    pip install --no-index --find-links=/wheels --require-hashes -r /requirements/image.txt \
    && pip install --no-index --no-deps /dist/dlq_sidecar-*.whl \
    && python -c "import sys, sidecar.core; sys.exit(not sidecar.core.compiled())"
# Numeric user, so Kubernetes can verify runAsNonRoot without resolving the name.
USER 10001:10001
EXPOSE 8787
ENTRYPOINT ["dlq-sidecar"]
CMD ["run", "-c", "/etc/dlq-sidecar/config.yaml"]
