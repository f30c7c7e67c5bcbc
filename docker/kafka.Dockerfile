# Apache Kafka 4.4 (KRaft, one node) from the jars scripts/kafka_local.py fetches from Maven Central, run by that
# script (`serve`: the same configuration as the tests' broker, listening on the container's network), with
# Kafka's command-line tools (`kafka_local.py tool`/`tools`: the secured variant's ACLs).
#   python scripts/images.py    # builds it as seam-kafka:local (docker-compose.local.yml uses it)
# BASE: any Debian bookworm with Python 3 (docker-compose.local.yml: seam-base:bookworm, built here).
ARG BASE=python:3.11-slim-bookworm
FROM ${BASE}
ARG KAFKA_VERSION=4.4.0
RUN apt-get update && apt-get install -y --no-install-recommends openjdk-17-jre-headless \
    && rm -rf /var/lib/apt/lists/*
COPY scripts/kafka_local.py /opt/kafka/scripts/kafka_local.py
COPY scripts/kafka/pom.xml scripts/kafka/tools-pom.xml scripts/kafka/RunEach.java /opt/kafka/scripts/kafka/
COPY .cache/kafka/libs-${KAFKA_VERSION} /opt/kafka/home/libs-${KAFKA_VERSION}
COPY .cache/kafka/tools-${KAFKA_VERSION} /opt/kafka/home/tools-${KAFKA_VERSION}
# The broker runs as a user of its own, never as root; its data folder (a volume) is the one place it writes.
# (Written into /etc/passwd directly: a minimal Debian base has no useradd.)
RUN echo 'kafka:x:10002:10002:Apache Kafka:/var/lib/kafka:/usr/sbin/nologin' >> /etc/passwd \
    && echo 'kafka:x:10002:' >> /etc/group \
    && mkdir -p /var/lib/kafka/data && chown -R 10002:10002 /var/lib/kafka
USER kafka
ENV KAFKA_HOME=/opt/kafka/home KAFKA_RUN_DIR=/var/lib/kafka/data
VOLUME /var/lib/kafka/data
EXPOSE 9092
ENTRYPOINT ["python3", "/opt/kafka/scripts/kafka_local.py", "serve", "--home", "/opt/kafka/home", \
            "--run-dir", "/var/lib/kafka/data", "--port", "9092"]
CMD ["--advertise", "kafka"]
