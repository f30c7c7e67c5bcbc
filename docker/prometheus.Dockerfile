# Prometheus from Debian's package, where the public prom/prometheus image cannot be pulled.
#   python scripts/images.py    # builds it as seam-prometheus:local (docker-compose.local.yml uses it)
ARG BASE=seam-base:bookworm
FROM ${BASE}
RUN apt-get update && apt-get install -y --no-install-recommends prometheus && rm -rf /var/lib/apt/lists/*
EXPOSE 9090
ENTRYPOINT ["/usr/bin/prometheus"]
