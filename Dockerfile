# One image with every llmq program; docker-compose.yml picks the command.
FROM golang:1.26-bookworm AS build
WORKDIR /src
COPY go.mod go.sum ./
RUN go mod download
COPY . .
RUN CGO_ENABLED=0 go build -o /out/ ./cmd/...

FROM gcr.io/distroless/static-debian12
COPY --from=build /out/ /usr/local/bin/
COPY configs/ /etc/llmq/
USER nonroot
