# kvpick images: static Go binaries on an empty (scratch) base, running as a non-root user.
#
#   make image IMAGE=<registry>/kvpick:<tag> PUSH=1            # the endpoint picker (default target)
#   make image-simserver SIM_IMAGE=<registry>/simserver:<tag>   # the simulated vLLM server
#
# Multi-arch: docker buildx build --platform linux/amd64,linux/arm64 ... (the build stage runs
# on the builder's platform and cross-compiles; no emulation).

ARG GO_VERSION=1.26

FROM --platform=$BUILDPLATFORM golang:${GO_VERSION} AS build
WORKDIR /src
# Modules first, so that source edits reuse the download layer.
COPY go.mod go.sum ./
RUN --mount=type=cache,target=/go/pkg/mod go mod download
COPY . .
ARG TARGETOS=linux
ARG TARGETARCH
# CGO off: fully static binaries that run on scratch. -trimpath and -s -w: reproducible paths,
# no symbol tables. The user/group files give the runtime a named non-root user.
RUN --mount=type=cache,target=/go/pkg/mod \
    --mount=type=cache,target=/root/.cache/go-build \
    CGO_ENABLED=0 GOOS=$TARGETOS GOARCH=$TARGETARCH \
    go build -trimpath -ldflags='-s -w' -o /out/ ./cmd/extproc ./cmd/simserver \
 && mkdir -p /out/etc /out/tmp \
 && echo 'nonroot:x:65532:65532:nonroot:/home/nonroot:/sbin/nologin' >/out/etc/passwd \
 && echo 'nonroot:x:65532:' >/out/etc/group

# Common runtime base: no shell, no package manager, CA roots for outbound TLS, a writable
# /tmp (Kubernetes mounts an emptyDir there when the root filesystem is read-only).
FROM scratch AS runtime
COPY --from=build /etc/ssl/certs/ca-certificates.crt /etc/ssl/certs/ca-certificates.crt
COPY --from=build /out/etc/passwd /out/etc/group /etc/
COPY --from=build --chown=65532:65532 /out/tmp /tmp
USER 65532:65532

FROM runtime AS simserver
COPY --from=build /out/simserver /simserver
EXPOSE 8000
ENTRYPOINT ["/simserver"]
# Listen on every interface (the binary's default, 127.0.0.1:8000, suits tests on one host).
CMD ["--addr=:8000"]

# Last, so that a plain `docker build .` gives the picker.
FROM runtime AS extproc
COPY --from=build /out/extproc /extproc
# 9002 ext_proc (gRPC, TLS), 9003 gRPC health, 9090 /metrics.
EXPOSE 9002 9003 9090
ENTRYPOINT ["/extproc"]
