# A small static, non-root image of the statusguard binary.
# Build: docker build -t statusguard/statusguard:0.1.0 .
# (The development machine has no container engine; this is kept conventional
# and is not built by the tests.)
FROM rust:1.95-alpine AS build
RUN apk add --no-cache musl-dev
WORKDIR /src
COPY . .
RUN cargo build --release --locked --bin statusguard \
 && install -D target/release/statusguard /out/statusguard

FROM scratch
COPY --from=build /out/statusguard /statusguard
USER 65532:65532
EXPOSE 8443 8080
ENTRYPOINT ["/statusguard"]
CMD ["serve"]
