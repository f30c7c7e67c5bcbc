# Apache Kafka 4.4 (KRaft, one node) from the jars scripts/kafka_local.py fetches from Maven Central, run by that
# script (`serve`: the same configuration as the tests' broker, listening on the container's network).
#   python scripts/images.py    # builds it as seam-kafka:local (docker-compose.local.yml uses it)
ARG BASE=seam-base:bookworm
FROM ${BASE}
ARG KAFKA_VERSION=4.4.0
RUN apt-get update && apt-get install -y --no-install-recommends openjdk-17-jre-headless \
    && rm -rf /var/lib/apt/lists/*
COPY scripts/kafka_local.py /opt/kafka/scripts/kafka_local.py
COPY scripts/kafka/pom.xml /opt/kafka/scripts/kafka/pom.xml
COPY .cache/kafka/libs-${KAFKA_VERSION} /opt/kafka/home/libs-${KAFKA_VERSION}
VOLUME /var/lib/kafka/data
EXPOSE 9092
ENTRYPOINT ["python3", "/opt/kafka/scripts/kafka_local.py", "serve", "--home", "/opt/kafka/home", \
            "--run-dir", "/var/lib/kafka/data", "--port", "9092"]
CMD ["--advertise", "kafka"]
