# busbar's container image: one static executable on an empty base.
#
#   docker build -t busbar .
#   docker run --rm -p 8080:8080 --read-only --tmpfs /tmp:rw,exec,size=96m \
#     -e ANTHROPIC_KEY -e BUSBAR_ADMIN_TOKEN busbar
#   docker run --rm -p 8080:8080 busbar serve --demo --listen 0.0.0.0:8080     # the built-in mock
#
# Started with no arguments, /busbar serves $BUSBAR_CONFIG: /etc/busbar/config.yaml, the default
# config baked in (packaging/config.default.yaml: one Anthropic provider, an open data plane, the
# admin API behind $BUSBAR_ADMIN_TOKEN), with the provider catalog beside it; mount your own file
# over it. Arguments after the image name go to /busbar (`--validate`, `serve --demo ...`), as
# with the Rust gateway's image, which has the same entrypoint and no command either.
#
# The build stage compiles the Cython extensions (profile-guided: packaging/build_ext.sh trains them
# on loopback traffic to the built-in mock) and runs packaging/build.sh (PyInstaller, then
# staticx); the final stage holds only what packaging/oci_image.py lists, which also writes this same
# image without Docker (dist/busbar-image.tar for `docker load`). /tmp (or $TMPDIR) must be writable
# and allow exec: the executable unpacks its libraries there at start (41 MB, up to 46 MB once a
# config imports what travels in its lazy.pack; removed at exit);
# Docker's --tmpfs defaults to noexec, hence the `exec` above.

FROM python:3.11.7-slim-bookworm AS build
RUN apt-get update \
 && apt-get install -y --no-install-recommends gcc libc6-dev make binutils ca-certificates \
 && rm -rf /var/lib/apt/lists/*
WORKDIR /src
# Dependencies first, in their own layer: a source change does not reinstall them.
# The runtime dependencies are pyproject.toml's [project] dependencies (packaging/runtime_deps.py).
COPY pyproject.toml requirements-build.txt ./
COPY packaging/requirements.txt packaging/runtime_deps.py packaging/
RUN python3 -m venv .venv \
 && python3 packaging/runtime_deps.py > .venv/requirements-runtime.txt \
 && .venv/bin/pip install -q --disable-pip-version-check \
      -r .venv/requirements-runtime.txt -r requirements-build.txt -r packaging/requirements.txt
COPY . .
RUN packaging/build_ext.sh \
 && packaging/build.sh \
 && .venv/bin/python packaging/oci_image.py --rootfs /rootfs

FROM scratch
COPY --from=build /rootfs/ /
ENV PATH=/ \
    SSL_CERT_FILE=/etc/ssl/certs/ca-certificates.crt \
    BUSBAR_CONFIG=/etc/busbar/config.yaml
USER 65532:65532
EXPOSE 8080
ENTRYPOINT ["/busbar"]
