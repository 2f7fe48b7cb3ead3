# replvol in a container: replnode, replctl and replcsi, static
# (CGO_ENABLED=0), on distroless/static (no shell, no libc: CA certificates,
# /etc/passwd, tzdata).
#
#   docker build -t replvol .                  (deploy/compose.yaml does it too)
#   docker run --rm replvol --version
#
# The same build makes the image of replcsi, the CSI driver that
# deploy/kubernetes runs (its node service needs a shell's tools, which
# distroless lacks: see the stage replcsi below):
#
#   docker build --target replcsi -t replvol/replcsi .
#
# The image runs replnode with its state in /var/lib/replvol (a volume);
# give it the cluster file at /etc/replvol/cluster.yaml and its node name:
#   docker run -v ./cluster.yaml:/etc/replvol/cluster.yaml:ro -v alpha-state:/var/lib/replvol \
#     -v alpha-data:/data replvol --config /etc/replvol/cluster.yaml --node alpha
# It runs as root: replnode opens the backing files or devices given in the
# cluster file (a block device needs --device). replctl in the container
# reaches the node through its unix socket: docker exec NAME replctl status.
#
# The builder is pinned to the Go every make target uses (Makefile).
FROM golang:1.27.3-bookworm AS build
WORKDIR /src
COPY go.mod go.sum ./
RUN go mod download
COPY . .
# The release comes from the checkout copied in (its tags and commit, as
# make builds it); --build-arg VERSION=1.4.0 sets it for a tree without .git.
ARG VERSION=
RUN CGO_ENABLED=0 go build -trimpath -buildvcs=auto -ldflags "-s -w -X main.version=${VERSION}" -o /out/ ./cmd/replnode ./cmd/replctl ./cmd/replcsi
RUN mkdir -m 0700 /out/state

# The image of replcsi (docker build --target replcsi): replcsi and replctl
# (which attaches volumes) on Debian, with the tools the node service runs:
# blkid, losetup, mount (util-linux, mount), mkfs.ext4 and resize2fs
# (e2fsprogs), mkfs.xfs and xfs_growfs (xfsprogs), fuse3. The controller
# runs it too (deploy/kubernetes names one image for both).
FROM debian:bookworm-slim AS replcsi
RUN apt-get update && apt-get install -y --no-install-recommends util-linux mount e2fsprogs xfsprogs fuse3 ca-certificates \
	&& rm -rf /var/lib/apt/lists/*
COPY --from=build /out/replcsi /out/replctl /usr/bin/
ENTRYPOINT ["/usr/bin/replcsi"]

# The default image: replnode.
FROM gcr.io/distroless/static-debian12
COPY --from=build /out/replnode /out/replctl /out/replcsi /usr/bin/
COPY --from=build /out/state /var/lib/replvol
COPY deploy/cluster.example.yaml /etc/replvol/cluster.example.yaml
ENV REPLCTL_ADDR=unix:///var/lib/replvol/control.sock
VOLUME ["/var/lib/replvol"]
# control (HTTP page, /metrics, gRPC), replication, NBD, raft, gossip (TCP and UDP)
EXPOSE 7800 7801 7802 7803 7804 7804/udp
STOPSIGNAL SIGTERM
ENTRYPOINT ["/usr/bin/replnode", "--state-dir", "/var/lib/replvol"]
CMD ["--help"]
