# The statusguard image for machines with a container engine:
#   docker build -t statusguard/statusguard:0.1.0 .
# image/build.sh builds the same image without one (and checks it); CI runs
# that. One static binary (glibc, crt-static: in a pod it reaches the API
# server by IP, so the static glibc's lack of NSS modules never matters) on an
# empty base, run as non-root.
FROM rust:1.95 AS build
WORKDIR /src
COPY . .
RUN target="$(uname -m)-unknown-linux-gnu" \
 && RUSTFLAGS="-C target-feature=+crt-static" cargo build --release --locked \
      --target "$target" --bin statusguard \
 && install -D -m 0755 "target/$target/release/statusguard" /out/statusguard

FROM scratch
COPY --from=build /out/statusguard /statusguard
USER 65532:65532
EXPOSE 8443 8080
ENTRYPOINT ["/statusguard"]
CMD ["serve"]
