# seam worker image: the project installed as users install it.
#   docker build -t seam .                                   # CPU
#   docker build -t seam:cuda --build-arg BASE=nvidia/cuda:12.8.1-cudnn-runtime-ubuntu24.04 .   # GPU hosts
#   python scripts/images.py   # no image registry or package index: a Debian base and a wheelhouse (README: Docker)
# OFFLINE=true installs from the wheelhouse in docker/wheels (scripts/images.py builds it) instead of the index.
ARG BASE=python:3.11-slim-bookworm
FROM ${BASE}
ARG OFFLINE=false

ENV PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1 PIP_NO_CACHE_DIR=1
# The CUDA base images ship no Python; the slim image already has one.
RUN if ! command -v python3 >/dev/null; then \
      apt-get update && apt-get install -y --no-install-recommends python3 python3-venv && rm -rf /var/lib/apt/lists/*; \
    fi && python3 -m venv /opt/seam
ENV PATH=/opt/seam/bin:$PATH

WORKDIR /srv/seam
# Dependencies first, in a layer of their own: it is rebuilt only when pyproject.toml or the wheelhouse
# changes, not with every change to seam's sources (onnxruntime alone is hundreds of megabytes to install).
COPY pyproject.toml ./
COPY docker/wheels /tmp/wheels
RUN python3 -c "import tomllib; print('\\n'.join(tomllib.load(open('pyproject.toml', 'rb'))['project']['dependencies']))" \
      > /tmp/requirements.txt \
    && if [ "$OFFLINE" = true ]; then \
      pip install --no-index --find-links /tmp/wheels -r /tmp/requirements.txt 'setuptools>=77' wheel ; \
    else \
      pip install --upgrade pip && pip install -r /tmp/requirements.txt 'setuptools>=77' wheel ; \
    fi && rm -rf /tmp/wheels /tmp/requirements.txt
COPY README.md ./
COPY app ./app
COPY agents ./agents
COPY tables ./tables
COPY specs ./specs
COPY models ./models
RUN pip install --no-deps --no-build-isolation --no-index .

# The worker runs as a user of its own, never as root; its state folder is the one place it writes.
# (Written into /etc/passwd directly: a minimal Debian base has no useradd.)
RUN echo 'seam:x:10001:10001:seam worker:/var/lib/seam:/usr/sbin/nologin' >> /etc/passwd \
    && echo 'seam:x:10001:' >> /etc/group \
    && mkdir -p /var/lib/seam && chown 10001:10001 /var/lib/seam
USER seam
ENV SEAM_DATA_DIR=/var/lib/seam \
    SEAM_MODEL_PATH=/srv/seam/models/fraud-mlp.onnx \
    SEAM_WEB_BIND=0.0.0.0 \
    SEAM_WEB_HOST=
VOLUME /var/lib/seam
EXPOSE 6066
ENTRYPOINT ["seam"]
CMD ["worker", "-l", "info"]
