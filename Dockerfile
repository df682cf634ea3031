# The authplane binary on a small base, run as a non-root user.
#   docker build --build-arg REVISION=$(git rev-parse HEAD) -t cotal/authplane .
# (docker-compose.yml builds it for you: REVISION=$(git rev-parse HEAD) docker compose up --build)

FROM golang:1.26 AS build
# The revision the image is built from, which `authplane version` reports: .dockerignore keeps
# .git out of the build context, so the Go toolchain has no VCS to stamp it from.
ARG REVISION=unknown
WORKDIR /src
COPY go.mod go.sum ./
RUN go mod download
COPY . .
RUN CGO_ENABLED=0 go build -trimpath -ldflags="-s -w -X main.revision=${REVISION}" -o /out/authplane ./cmd/authplane

FROM alpine:3.22
# /space, /conf and /state belong to the plane's user, so a fresh named volume mounted there starts
# out writable by it (Docker copies the image's directory, owner included, into an empty volume).
RUN addgroup -S -g 10001 authplane \
 && adduser -S -D -H -u 10001 -G authplane authplane \
 && mkdir -p /space /conf /state \
 && chown authplane:authplane /space /conf /state
COPY --from=build /out/authplane /usr/local/bin/authplane
USER 10001:10001
WORKDIR /state
ENTRYPOINT ["authplane"]
CMD ["serve", "--dir", "/state"]
