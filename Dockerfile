# torchkube images: one file, two targets (see docs/images.md for sizes, timings and choices).
#
#   docker build --target trainer  -t torchkube-trainer  .   # what the training pods run
#   docker build --target operator -t torchkube-operator .   # the control plane, no torch
#
# Needs BuildKit (Docker >= 23 does it by default; DOCKER_BUILDKIT=1 before that). There is no
# `# syntax=` line on purpose: it would pull a frontend image, and the engine's built-in
# frontend already has what is used here (multi-stage, RUN --mount secret and cache).
#
# Behind a TLS-intercepting proxy, hand pip the machine's CA bundle as a build secret, never as
# a file in the image:  --secret id=pip_cert,src=/etc/ssl/certs/ca-certificates.crt

# Slim Python (>= 3.11) for the wheel builder and the operator. Any Debian-like image with
# `python3 -m venv` works; the tests use a base made locally with debootstrap (no registry there).
ARG PYTHON_BASE=python:3.11-slim-bookworm
# A CUDA PyTorch base, e.g. nvcr.io/nvidia/pytorch:<yy.mm>-py3 or pytorch/pytorch (below), or our
# locally made Debian base. When the base already has torch it is used as is; otherwise torch
# (the CUDA build, with its NVIDIA libraries) comes from the package index. Python >= 3.11.
ARG TRAINER_BASE=pytorch/pytorch:2.9.0-cuda12.8-cudnn9-runtime
# Empty: torch from the default index (PyPI's CUDA build). For a CPU-only image without the
# NVIDIA wheels (a fraction of the size):
#   --build-arg TORCH_INDEX_URL=https://download.pytorch.org/whl/cpu
ARG TORCH_INDEX_URL=""
# Numeric, so Kubernetes' runAsNonRoot can verify it; not 1000, which some bases already use.
ARG APP_UID=10001

# --- builder: the lock files, then the torchkube wheel --------------------------------------
FROM ${PYTHON_BASE} AS builder
WORKDIR /src
RUN python3 -m venv /opt/build
RUN --mount=type=secret,id=pip_cert \
    if [ -f /run/secrets/pip_cert ]; then export PIP_CERT=/run/secrets/pip_cert; fi; \
    /opt/build/bin/pip install --no-cache-dir "setuptools>=77" wheel
# The lock files (hack/lock.sh: every package pinned with its hashes) come first, alone, so the
# dependency layers of the final images are rebuilt only when a lock changes, never for a
# source change. The trainer's second layer is trainer.txt less what torch.txt installs, so it
# never touches a torch the base already has.
COPY requirements/ /reqs/
RUN python3 -c 'import re; \
    blocks = lambda path: re.split(r"\n(?=\S)", open(path).read().strip()); \
    name = lambda block: re.split(r"[=\s]", block, maxsplit=1)[0].lower(); \
    torch = {name(b) for b in blocks("/reqs/torch.txt") if not b.startswith("#")}; \
    rest = [b for b in blocks("/reqs/trainer.txt") if not b.startswith("#") and name(b) not in torch]; \
    operator = {name(b) for b in blocks("/reqs/operator.txt") if not b.startswith("#")}; \
    assert "torch" not in operator, "the operator lock must not pull in torch"; \
    open("/reqs/trainer-rest.txt", "w").write("\n".join(rest) + "\n")'
COPY pyproject.toml README.md ./
COPY torchkube ./torchkube
RUN /opt/build/bin/pip wheel --no-deps --no-build-isolation --wheel-dir /dist .

# --- trainer: torchrun workers -----------------------------------------------------------------
FROM ${TRAINER_BASE} AS trainer
ARG TORCH_INDEX_URL
ARG APP_UID
# The user first: its layer then never changes, whatever is rebuilt below.
RUN useradd --uid "$APP_UID" --user-group --create-home --shell /bin/bash torchkube \
    && install -d -o "$APP_UID" -g "$APP_UID" /workspace
# A venv keeps Debian's PEP 668 rule out of the way; --system-site-packages lets it see a torch
# that the base image already has. Bases without ensurepip (Ubuntu without python3-venv) get a
# venv without its own pip and use the base's pip through the system site.
RUN python3 -m venv --system-site-packages /opt/venv \
    || python3 -m venv --clear --system-site-packages --without-pip /opt/venv
ENV PATH=/opt/venv/bin:$PATH \
    VIRTUAL_ENV=/opt/venv
# Layer 1, the big one (several GB): torch and what it pulls in, as locked in torch.txt (with
# their hashes), rebuilt only when that lock or the base changes. Another TORCH_INDEX_URL (the
# CPU-only builds) has other wheels than the lock's: there torch comes at the locked version,
# without hashes. The pip cache mount lives in the builder's cache, outside every image.
COPY --from=builder /reqs/torch.txt /tmp/reqs/
RUN --mount=type=secret,id=pip_cert --mount=type=cache,target=/root/.cache/pip,sharing=locked \
    if [ -f /run/secrets/pip_cert ]; then export PIP_CERT=/run/secrets/pip_cert; fi; \
    if python -c "import torch" 2>/dev/null; then \
        echo "torch $(python -c 'import torch; print(torch.__version__)') comes with the base"; \
    elif [ -n "$TORCH_INDEX_URL" ]; then \
        python -m pip install --index-url "$TORCH_INDEX_URL" \
            "$(grep -o '^torch==[^ ]*' /tmp/reqs/torch.txt)"; \
    else \
        python -m pip install --require-hashes -r /tmp/reqs/torch.txt; \
    fi
# Layer 2: the other locked dependencies (small), without torch's, so pip never replaces the
# base's build (--no-deps: the lock already lists every one of them).
COPY --from=builder /reqs/trainer-rest.txt /tmp/reqs/
RUN --mount=type=secret,id=pip_cert --mount=type=cache,target=/root/.cache/pip,sharing=locked \
    if [ -f /run/secrets/pip_cert ]; then export PIP_CERT=/run/secrets/pip_cert; fi; \
    python -m pip install --no-deps --require-hashes -r /tmp/reqs/trainer-rest.txt
# Layer 3: torchkube itself (kilobytes), the only layer a source change rebuilds.
COPY --from=builder /dist/ /tmp/dist/
RUN python -m pip install --no-cache-dir --no-deps /tmp/dist/*.whl && rm -rf /tmp/dist /tmp/reqs
# NCCL_DEBUG=WARN: NCCL's own reason reaches the pod log when a collective fails.
# TORCH_NCCL_ASYNC_ERROR_HANDLING=1: a failed or timed-out collective kills the process, so
#   torchrun and the operator restart it instead of it hanging forever.
# OMP_NUM_THREADS=1: several workers per pod must not oversubscribe the CPUs; override per job.
ENV NCCL_DEBUG=WARN \
    TORCH_NCCL_ASYNC_ERROR_HANDLING=1 \
    OMP_NUM_THREADS=1 \
    PYTHONUNBUFFERED=1
USER ${APP_UID}:${APP_UID}
WORKDIR /workspace
# No entrypoint: the operator sets the pod's command to `torchrun ... -m torchkube.trainer`, and
# `docker run IMAGE torchrun ...` (or python, or bash) works the same way by hand. The empty
# ENTRYPOINT also drops a base's own (NGC images print a banner through theirs).
ENTRYPOINT []
CMD ["torchrun", "--help"]

# --- operator: the control plane (kopf), no torch ------------------------------------------------
FROM ${PYTHON_BASE} AS operator
ARG APP_UID
RUN useradd --uid "$APP_UID" --user-group --no-create-home --home-dir /nonexistent \
        --shell /usr/sbin/nologin torchkube
RUN python3 -m venv /opt/venv
ENV PATH=/opt/venv/bin:$PATH \
    VIRTUAL_ENV=/opt/venv \
    PYTHONUNBUFFERED=1
# The `operator` extra as locked (with hashes), then the wheel with --no-deps: torchkube's own
# dependency list names torch (for the trainer), which must not be installed here.
COPY --from=builder /reqs/operator.txt /tmp/reqs/
RUN --mount=type=secret,id=pip_cert --mount=type=cache,target=/root/.cache/pip,sharing=locked \
    if [ -f /run/secrets/pip_cert ]; then export PIP_CERT=/run/secrets/pip_cert; fi; \
    python -m pip install --require-hashes -r /tmp/reqs/operator.txt
COPY --from=builder /dist/ /tmp/dist/
RUN python -m pip install --no-cache-dir --no-deps /tmp/dist/*.whl && rm -rf /tmp/dist /tmp/reqs
USER ${APP_UID}:${APP_UID}
ENTRYPOINT ["torchkube", "operator"]
