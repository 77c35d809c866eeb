#!/usr/bin/env bash
# Build the worker image with podman, where no image registry is reachable: the bases are made from
# Debian packages (mmdebstrap, then podman import), once, and kept in podman's image store.
#   deploy/container/build.sh        prints the image, localhost/neardup:<version in pyproject.toml>
# Its build stages stay tagged localhost/neardup-stage:requirements and :build, the next build's cache.
#
# Needs podman, runc and mmdebstrap (Debian: apt-get install podman runc mmdebstrap), and root for
# mmdebstrap. pip in the build reaches PyPI over the host's network; PIP_CERT, when set, names a CA
# bundle that is mounted into the build at the same path.
set -euo pipefail
cd "$(dirname "$0")/../.."

# One build at a time on a machine (podman's store is the machine's): a second one waits, then
# finds every layer the first made (.ci/run starts one early, the container test asks again).
exec 9>"${TMPDIR:-/tmp}/neardup-container-build.lock"
flock 9

# bookworm's python3 is 3.11, the version pyproject.toml and the host venvs use
SUITE="${NEARDUP_BASE_SUITE:-bookworm}"
RUNTIME_PACKAGES="python3,python3-venv,ca-certificates"
BUILD_PACKAGES="$RUNTIME_PACKAGES,gcc,libc6-dev,python3-dev"
RUNTIME="${NEARDUP_PODMAN_RUNTIME:-runc}"

# A base image is named by a hash of what goes into it, so a change to the package lists makes a
# new one instead of reusing a stale one.
base_name() {  # name packages
  echo "localhost/$1:$SUITE-$(echo "$SUITE $2" | sha256sum | cut -c1-12)"
}

make_base() {  # image packages
  local image="$1" packages="$2" tarball
  if podman image exists "$image"; then
    return
  fi
  echo "build.sh: making $image from Debian $SUITE packages" >&2
  tarball="$(mktemp --suffix=.tar)"
  trap 'rm -f "$tarball"' RETURN
  mmdebstrap --quiet --variant=minbase --include="$packages" \
    --dpkgopt='path-exclude=/usr/share/doc/*' --dpkgopt='path-exclude=/usr/share/man/*' \
    --dpkgopt='path-exclude=/usr/share/locale/*' \
    "$SUITE" "$tarball" >&2
  podman import --change 'ENV LANG=C.UTF-8' --change 'CMD ["/bin/bash"]' "$tarball" "$image" >/dev/null
}

BASE="$(base_name neardup-base "$RUNTIME_PACKAGES")"
BUILD_BASE="$(base_name neardup-build-base "$BUILD_PACKAGES")"
make_base "$BASE" "$RUNTIME_PACKAGES"
make_base "$BUILD_BASE" "$BUILD_PACKAGES"

VERSION="$(python3 -c 'import tomllib; print(tomllib.load(open("pyproject.toml", "rb"))["project"]["version"])')"
IMAGE="localhost/neardup:$VERSION"

cert_args=()
if [ -n "${PIP_CERT:-}" ]; then
  cert_args=(--volume "$PIP_CERT:$PIP_CERT:ro" --build-arg "PIP_CERT=$PIP_CERT")
fi

# Build up to a stage (or the final image, without a target), tag it, and remove what the tag named
# before once replaced, with its parents that nothing else uses. Untagged, a build stage's last
# image would be left behind after every build of changed code, and its layers with it; tagged, the
# current stages stay, and the next build reuses their layers as its cache.
build() {  # tag [podman build options]
  local tag="$1" previous
  shift
  previous="$(podman image inspect --format '{{.Id}}' "$tag" 2>/dev/null || true)"
  # --format docker keeps the HEALTHCHECK (the OCI image format has no field for it)
  podman build --runtime "$RUNTIME" --network host --format docker \
    --build-arg "BASE=$BASE" --build-arg "BUILD_BASE=$BUILD_BASE" "${cert_args[@]}" \
    --ignorefile deploy/Dockerfile.dockerignore -f deploy/Dockerfile -t "$tag" "$@" . >&2
  if [ -n "$previous" ] && [ "$previous" != "$(podman image inspect --format '{{.Id}}' "$tag")" ]; then
    podman rmi "$previous" >/dev/null 2>&1 || true   # still in use by a container: left
  fi
}

build localhost/neardup-stage:requirements --target requirements
build localhost/neardup-stage:build --target build
build "$IMAGE"
echo "$IMAGE"
