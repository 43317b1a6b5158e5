# PicoMQ node image: `docker build -t picomq .` at the repository root builds the node from
# source (the `runtime` target, the last stage) on debian:bookworm-slim.
#
# Build arguments:
#   BASE_IMAGE       the runtime base (default debian:bookworm-slim); any Debian bookworm-like
#                    image with bash and useradd. One that already has ca-certificates needs
#                    no network during the build.
#   RUST_VERSION     the toolchain of the build stage (default: the one the project is
#                    developed with).
#   PREBUILT_BINARY  with `--target runtime-prebuilt` only: the path, inside the build context,
#                    of a `pico` built elsewhere (default `pico` at the context's root), copied
#                    in instead of building. The context is then a directory holding that file:
#                      mkdir ctx && cp target/release/pico ctx/ &&
#                      docker build --target runtime-prebuilt -f Dockerfile -t picomq ctx
#                    It must run on the base's glibc: build it on bookworm (or older).
# Stages are ordered so that the runtime-prebuilt target never needs the build stage: the
# classic builder (DOCKER_BUILDKIT=0) builds every stage up to its target, BuildKit only the
# ones the target uses. The classic builder cannot run the build stage's cache mounts, so
# building from source needs BuildKit (the default builder since Docker 23).
#
# io_uring: the engine (glommio) runs on io_uring, and two container defaults stop it:
#   * seccomp: Docker's default profile blocks io_uring_setup/io_uring_enter/io_uring_register
#     on recent Docker versions (25+), so the node fails at startup with EPERM. Run with
#     `--security-opt seccomp=unconfined`, or with a profile of your own that allows those three
#     syscalls. (The host kernel must allow io_uring too: sysctl kernel.io_uring_disabled=0.)
#   * locked memory: io_uring rings are locked memory, and the node refuses to start below
#     8 MiB; run with `--ulimit memlock=-1` (or at least memlock=8388608).
#   docker run --rm -p 127.0.0.1:4437:4437 -p 127.0.0.1:9090:9090 \
#     --security-opt seccomp=unconfined --ulimit memlock=-1 \
#     -v "$PWD/tokens:/etc/picomq/tokens:ro" picomq
# The compose files under harness/ set both (security_opt, ulimits).
# scripts/container-check.sh builds the image both ways on a local base and runs it.
# No `# syntax=` line: BuildKit would pull that frontend image from a registry, and the
# built-in frontend (Docker 20.10 and later) has everything used here, cache mounts included.

ARG BASE_IMAGE=debian:bookworm-slim
# The toolchain the project is developed with; override with --build-arg RUST_VERSION=...
ARG RUST_VERSION=1.95

# ---- runtime-base: everything of the node image but the binary ----
FROM ${BASE_IMAGE} AS runtime-base
# The binary links only libc, libm and libgcc_s (all in the base image; SQLite is bundled and
# TLS is rustls). ca-certificates gives rustls the system roots for https:// S3 endpoints; it
# is installed only when the base lacks it, so a base that has it builds offline.
RUN if ! dpkg-query -W -f '${Status}\n' ca-certificates 2>/dev/null | grep -q ' installed$'; then \
        apt-get update \
        && apt-get install -y --no-install-recommends ca-certificates \
        && rm -rf /var/lib/apt/lists/*; \
    fi \
    && useradd --system --uid 10001 --user-group --home-dir /var/lib/picomq --shell /usr/sbin/nologin picomq \
    && mkdir -p /var/lib/picomq /etc/picomq \
    && chown picomq:picomq /var/lib/picomq

# All state lives under /var/lib/picomq: with the defaults below the metadata log is
# data/meta.db, the write-ahead logs data/wal/ and the file:// bucket objects/. A named volume
# takes the directory's owner (picomq) on first use; a bind mount must be writable by uid 10001.
WORKDIR /var/lib/picomq
VOLUME /var/lib/picomq
USER picomq

# 4437: the Pico protocol listener. 4438: the Durable Streams listener (opened by default on
# the host of --listen; --ds-listen off closes it). 9090: the admin listener (/health, /ready,
# /metrics, the dashboard and the admin API).
EXPOSE 4437 4438 9090

# /ready answers 200 once every core serves. No curl in the image: bash's /dev/tcp does the
# request, on the port of PICO_ADMIN_LISTEN when that is set, else 9090. Assumes the admin
# listener without TLS (disable with --no-healthcheck).
HEALTHCHECK --interval=10s --timeout=3s --start-period=10s --retries=3 \
    CMD ["bash", "-c", "port=${PICO_ADMIN_LISTEN:-:9090}; exec 3<>/dev/tcp/127.0.0.1/${port##*:} && printf 'GET /ready HTTP/1.1\\r\\nHost: localhost\\r\\nConnection: close\\r\\n\\r\\n' >&3 && head -n 1 <&3 | grep -q ' 200 '"]

ENTRYPOINT ["pico"]
# Listeners on 0.0.0.0, because a published port reaches the container on its own network
# interface, not on its loopback. The server refuses a non-loopback listener without
# authentication, and the image does not choose --insecure-allow-remote for you: by default
# every request needs a bearer token from /etc/picomq/tokens (mount a file there, one
# `token prefix permissions` line each, see docs/api.md; reloaded on SIGHUP). For a node only
# you can reach, replace the auth flags with --insecure-allow-remote (the harness/aio compose
# files do, and publish the ports on 127.0.0.1 only).
# Data paths are the built-in defaults, relative to WORKDIR. Arguments after the image name
# replace this whole CMD (repeat the listeners then); a flag absent from it can also be set
# with its PICO_* environment variable (-e PICO_CORES=2), but a flag given here wins over it.
CMD ["serve", "--listen", "0.0.0.0:4437", "--admin-listen", "0.0.0.0:9090", "--auth", "required", "--auth-tokens", "/etc/picomq/tokens"]

# ---- runtime-prebuilt: the node image around a binary built elsewhere ----
FROM runtime-base AS runtime-prebuilt
ARG PREBUILT_BINARY=pico
COPY ${PREBUILT_BINARY} /usr/local/bin/pico

# ---- build ----
FROM rust:${RUST_VERSION}-bookworm AS build
WORKDIR /src
# The full Debian image has what the C parts need: a C compiler for SQLite (bundled) and ring,
# and sh + git for glommio's build script (it compiles its vendored liburing).
COPY . .
# Cache mounts keep the registry and the target dir between builds (BuildKit); the binary is
# copied out because the cache is not in the layer.
RUN --mount=type=cache,target=/usr/local/cargo/registry \
    --mount=type=cache,target=/src/target \
    cargo build --release --locked -p pico-cli \
    && cp target/release/pico /usr/local/bin/pico

# ---- runtime: the node image built from source (the default target) ----
FROM runtime-base AS runtime
COPY --from=build /usr/local/bin/pico /usr/local/bin/pico
