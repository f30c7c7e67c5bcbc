# Prometheus from Debian's package, where the public prom/prometheus image cannot be pulled.
#   python scripts/images.py    # builds it as seam-prometheus:local (docker-compose.local.yml uses it)
ARG BASE=seam-base:bookworm
FROM ${BASE}
RUN apt-get update && apt-get install -y --no-install-recommends prometheus && rm -rf /var/lib/apt/lists/*
# It runs as the package's own user (made by its install script), never as root; its storage (/prometheus,
# where docker-compose.yml mounts a volume, as in the public image) is the one place it writes.
RUN id prometheus && mkdir -p /prometheus && chown prometheus:prometheus /prometheus
USER prometheus
VOLUME /prometheus
EXPOSE 9090
ENTRYPOINT ["/usr/bin/prometheus"]
