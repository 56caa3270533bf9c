# ip-webhook container image: a release build (the `dist` profile: no debug info, see
# Cargo.toml) on the Rust image, copied into a distroless base (glibc and CA roots, no shell,
# no package manager) that runs as the non-root user 65532, the UID the Helm chart's
# securityContext expects.
#
#   docker build -t <registry>/ip-webhook:0.1.0 \
#     --build-arg IP_WEBHOOK_GIT_COMMIT=$(git rev-parse --short=12 HEAD) .
#
# (.git stays out of the build context: the commit that ip_webhook_build_info reports comes
# from the build argument, else it is "unknown".)
#
# Built and published by .github/workflows/release.yml for a release tag (linux/amd64 and
# linux/arm64, each on a native runner), as the chart's default image. This repository's CI
# runs no container engine: tests/chart/deployment.rs checks that the user and entrypoint match what the
# chart assumes, and tests/release.rs lints the workflow.

FROM rust:1.90-bookworm AS build
# protoc: the shipped image has the etcd ledger (the `etcd` cargo feature), whose etcd-client
# compiles etcd's protobuf API at build time. A build without it needs only the Rust toolchain.
RUN apt-get update \
    && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends protobuf-compiler \
    && rm -rf /var/lib/apt/lists/*
WORKDIR /src
ARG IP_WEBHOOK_GIT_COMMIT
COPY . .
RUN --mount=type=cache,target=/usr/local/cargo/registry \
    --mount=type=cache,target=/src/target \
    cargo build --profile dist --locked --features etcd --bin ip-webhook \
    && cp target/dist/ip-webhook /ip-webhook

FROM gcr.io/distroless/cc-debian12:nonroot
COPY --from=build /ip-webhook /ip-webhook
USER 65532:65532
EXPOSE 8443 8080
ENTRYPOINT ["/ip-webhook"]
CMD ["serve"]
