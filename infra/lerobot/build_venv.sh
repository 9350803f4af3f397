#!/usr/bin/env bash
# Builds the separate venv in which the `lerobot` package runs for tests/lerobot_interop/.
# It cannot share .venv: lerobot 0.4.x needs torch<2.11 and torchvision<0.26, the project pins
# torch 2.13 (CPU), and torchvision does not import beside a torch it was not built for.
# Usage: infra/lerobot/build_venv.sh [VENV_DIR]   (default build/lerobot-venv, an ignored path)
# The tests use the venv only once its stamp file exists, so a half-built venv is never used.
set -euo pipefail
cd "$(dirname "$0")/../.."
VENV="${1:-build/lerobot-venv}"
PYTHON="${PYTHON:-python3.11}"
LEROBOT_SPEC="${LEROBOT_SPEC:-lerobot==0.4.4}"
STAMP="$VENV/.lerobot-stamp"

# torchcodec (lerobot's default video decoder) loads the system's FFmpeg libraries.
if ! ldconfig -p | grep -q 'libavcodec\.so\.'; then
    if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
        echo "installing Debian's ffmpeg (torchcodec loads its libraries) ..."
        apt-get update -qq
        DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends ffmpeg >/dev/null
    else
        echo "FFmpeg libraries missing and not root: install Debian's ffmpeg for torchcodec" >&2
        exit 1
    fi
fi

# DEPS_ONLY=1: only the system libraries above (CI installs them once, then builds both venvs at once)
if [ "${DEPS_ONLY:-0}" = 1 ]; then exit 0; fi

start=$(date +%s)
rm -rf "$VENV"
"$PYTHON" -m venv "$VENV"
"$VENV/bin/python" -m pip install --quiet --upgrade pip
# PyPI's Linux torch wheel is a CUDA build (~3 GB with its nvidia-* libraries); no CPU-only build
# is reachable from here. lerobot's dataset loader runs on the CPU all the same.
"$VENV/bin/python" -m pip install --quiet $LEROBOT_SPEC
"$VENV/bin/python" - <<'PY'
import importlib.metadata as md
import lerobot.datasets.lerobot_dataset, torchcodec.decoders  # noqa: F401  (fails loudly if FFmpeg is unusable)
print(", ".join(f"{p} {md.version(p)}" for p in ("lerobot", "torch", "torchvision", "torchcodec", "av")))
PY
"$VENV/bin/python" -m pip freeze > "$STAMP"
echo "built $VENV in $(( $(date +%s) - start )) s, $(du -sh "$VENV" | cut -f1)"
