# etcd for tests/container/run.sh's compose.etcd.yaml run: Debian's
# etcd-server (the version the other tests run) at the path the etcd
# project's images use, /usr/local/bin/etcd, so that compose file runs
# unchanged here, where no image registry can be reached.
ARG BASE=debian:bookworm-20250811-slim
FROM ${BASE}
ARG DEBIAN_FRONTEND=noninteractive
RUN apt-get update \
 && apt-get install -y --no-install-recommends etcd-server etcd-client \
 && rm -rf /var/lib/apt/lists/* \
 && ln -s /usr/bin/etcd /usr/local/bin/etcd \
 && ln -s /usr/bin/etcdctl /usr/local/bin/etcdctl
CMD ["/usr/local/bin/etcd"]
