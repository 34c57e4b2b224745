#!/usr/bin/env bash
# `make space`: the Space (space/app.py) offline, against the local Hub, with a tiny demo model.
#   Starts `hub-export hub serve` in the background (stopped on exit), creates the user `demo`,
#   builds .demo/models/tiny-llama, and serves the app until Ctrl+C.
#   GRADIO_SERVER_NAME / GRADIO_SERVER_PORT (default 127.0.0.1:7860) and HUB_EXPORT_SPACE_HUB_PORT
#   (default: any free port) choose where things listen.
#
# `bash scripts/space.sh bundle DIR`: assemble a ready-to-upload Space repo in DIR
#   (README.md, app.py, requirements.txt, and hub-export vendored next to app.py; see space/README.md).
set -euo pipefail
cd "$(dirname "$0")/.."

source scripts/local_hub.sh
step() { printf '\n\033[1m==> %s\033[0m\n' "$*"; }
free_port() { python -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }

bundle() {
    local out="$1"
    if [ -e "$out" ] && [ -n "$(ls -A "$out")" ]; then
        echo "$out is not empty; choose a new folder" >&2
        exit 2
    fi
    mkdir -p "$out"
    cp space/README.md space/*.py space/page.css space/page.js \
        space/requirements.txt "$out/"
    # Install (not copy) the package next to app.py: the .dist-info it writes is how the
    # exported files' manifests and cards learn the hub-export version.
    BUNDLE_SRC="$(mktemp -d)"
    trap 'rm -rf "$BUNDLE_SRC"' EXIT
    cp -r pyproject.toml hub_export templates "$BUNDLE_SRC/"
    [ -f README.md ] && cp README.md "$BUNDLE_SRC/" || echo "# hub-export" > "$BUNDLE_SRC/README.md"
    find "$BUNDLE_SRC" -name __pycache__ -prune -exec rm -rf {} +
    # Quiet unless it fails: setuptools' deprecation notices are not the user's business here.
    if ! python -m pip install --quiet --no-deps --no-build-isolation --no-compile --target "$out" "$BUNDLE_SRC" \
        > "$BUNDLE_SRC/pip.log" 2>&1; then
        cat "$BUNDLE_SRC/pip.log" >&2
        exit 1
    fi
    rm -rf "$out/bin"  # console scripts: the Space runs app.py
    echo "Space repo ready in $out; upload it with: hf upload --repo-type space YOUR/SPACE $out ."
}

serve() {
    local demo=".demo"
    local hub_root="$demo/hub" model="$demo/models/tiny-llama"
    local hub_port="${HUB_EXPORT_SPACE_HUB_PORT:-$(free_port)}"
    mkdir -p "$demo"

    step "Starting the local Hub on 127.0.0.1:$hub_port (root: $hub_root, log: $demo/space-hub.log)"
    APP_PID=""
    trap stop_all EXIT
    trap 'exit 130' INT TERM  # run the EXIT trap on Ctrl+C or kill, too
    export HF_HOME="$demo/hf-home"  # keep the local Hub's files out of the real cache
    start_local_hub "$hub_root" "$hub_port" "$demo/space-hub.log"

    step "Creating the user 'demo' (its token is the server's HF_TOKEN: offline mode only)"
    HF_TOKEN="$(hub-export hub add-user demo --root "$hub_root" | tail -n 1)"
    export HF_TOKEN
    export HUB_EXPORT_SPACE_OFFLINE=1

    if [ ! -f "$model/config.json" ]; then
        step "Building a tiny demo model (random weights) in $model"
        python -c "import sys; from hub_export.models.tiny import build_tiny_model; build_tiny_model(sys.argv[1])" "$model"
    fi

    local host="${GRADIO_SERVER_NAME:-127.0.0.1}" port="${GRADIO_SERVER_PORT:-7860}"
    export GRADIO_SERVER_NAME="$host" GRADIO_SERVER_PORT="$port"
    step "Serving the Space on http://$host:$port (Ctrl+C to stop)"
    echo "Source model: $(cd "$model" && pwd)   (or any folder, or a repo id on the local Hub)"
    echo "Token field:  leave it blank to act as 'demo' (the server's HF_TOKEN), or paste another token"
    echo "Local Hub:    $HF_ENDPOINT"
    # In the background so that a signal reaches this script at once (`wait` returns) and
    # stop_all stops both servers; a foreground child would delay the trap until it exits.
    python space/app.py &
    APP_PID=$!
    wait "$APP_PID"
}

stop_all() {
    for pid in ${APP_PID:-} ${HUB_PID:-}; do
        kill "$pid" 2>/dev/null || true
        wait "$pid" 2>/dev/null || true
    done
}

case "${1:-serve}" in
    serve) serve ;;
    bundle)
        [ $# -eq 2 ] || { echo "usage: bash scripts/space.sh bundle DIR" >&2; exit 2; }
        bundle "$2"
        ;;
    *)
        echo "usage: bash scripts/space.sh [serve | bundle DIR]" >&2
        exit 2
        ;;
esac
