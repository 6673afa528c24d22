# bothyd in a container.
#
# Privileges: the namespace runtime creates mount, pid, uts, ipc, network and cgroup namespaces,
# mounts overlayfs, proc, tmpfs and devpts, writes per-sandbox cgroups and sets seccomp filters.
# That needs root in the container with CAP_SYS_ADMIN, CAP_SETUID/CAP_SETGID, CAP_SYS_CHROOT,
# CAP_MKNOD, CAP_KILL, CAP_NET_ADMIN (to bring up loopback in a new network namespace), a
# writable cgroup filesystem, and no seccomp/AppArmor profile of the engine's that forbids
# mount(2) and unshare(2). Sandboxes with a disk of their own (resources.disk_mb) also need the
# host's loop devices (/dev/loop-control and /dev/loop*, which --privileged passes) and mke2fs,
# installed below. In practice:
#
#   docker run --privileged --cgroupns=host -p 127.0.0.1:7780:7780 \
#     -v bothy-state:/var/lib/bothy -v /path/to/token:/run/secrets/bothy-token:ro bothyd
#
# Off loopback bothyd refuses to start without a token, hence BOTHY_TOKEN_FILE below.

FROM golang:1.26-bookworm AS build
WORKDIR /src
COPY go.mod go.sum ./
RUN go mod download
COPY . .
ARG VERSION=dev
RUN CGO_ENABLED=0 go build -trimpath -ldflags "-s -w -X main.version=${VERSION}" -o /out/bothyd ./cmd/bothyd \
 && CGO_ENABLED=0 go build -trimpath -ldflags "-s -w" -o /out/bothyd-runtime ./cmd/bothyd-runtime \
 && CGO_ENABLED=0 go build -trimpath -ldflags "-s -w -X main.version=${VERSION}" -o /out/bothy ./cmd/bothy

FROM debian:bookworm-slim
# The host image of a sandbox is this container's /usr: install here what workloads should find.
RUN apt-get update && apt-get install -y --no-install-recommends ca-certificates procps e2fsprogs \
 && rm -rf /var/lib/apt/lists/*
# bothyd-runtime beside bothyd: sandboxes start from the small binary.
COPY --from=build /out/bothyd /out/bothyd-runtime /out/bothy /usr/local/bin/
ENV BOTHY_LISTEN=0.0.0.0:7780 \
    BOTHY_ROOT=/var/lib/bothy \
    BOTHY_TOKEN_FILE=/run/secrets/bothy-token
VOLUME /var/lib/bothy
EXPOSE 7780
HEALTHCHECK --interval=10s --timeout=3s --start-period=5s CMD ["/usr/local/bin/bothyd", "healthcheck"]
ENTRYPOINT ["/usr/local/bin/bothyd"]
