#!/usr/bin/env bash
# `make demo-quick`: the whole product on a tiny random-weight model, offline, in about two minutes.
# Starts the local Hub, creates a demo user, builds a tiny random-weight model,
# pushes it with two variants, lists them, pulls one and generates text.
set -euo pipefail

DEMO_DIR="${DEMO_DIR:-.demo}"
HUB_ROOT="$DEMO_DIR/hub"
PORT="${HUB_EXPORT_DEMO_PORT:-$(python -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')}"
source "$(dirname "$0")/local_hub.sh"
step() { printf '\n\033[1m==> %s\033[0m\n' "$*"; }

rm -rf "$DEMO_DIR"
mkdir -p "$DEMO_DIR"

step "Starting the local Hub on 127.0.0.1:$PORT (root: $HUB_ROOT)"
start_local_hub "$HUB_ROOT" "$PORT" "$DEMO_DIR/hub.log"
trap 'kill $HUB_PID 2>/dev/null || true' EXIT
export HF_HOME="$DEMO_DIR/hf-home"

step "Creating the demo user (the token is printed alone on the last line)"
export HF_TOKEN="$(hub-export hub add-user demo --root "$HUB_ROOT" | tail -n 1)"

step "Building a tiny demo model (random weights, BPE tokenizer) in $DEMO_DIR/tiny-llama"
python -c "from hub_export.quiet import quiet_libraries, quiet_torch; quiet_libraries(); quiet_torch(); from hub_export.demo import build_tiny_model; build_tiny_model('$DEMO_DIR/tiny-llama')"

step "hub-export push $DEMO_DIR/tiny-llama --qmode 8da4w --qmode fp32 --qembedding 8w --max-seq-len 128"
hub-export push "$DEMO_DIR/tiny-llama" --qmode 8da4w --qmode fp32 --qembedding 8w --max-seq-len 128

REPO="demo/tiny-llama-ExecuTorch"
step "hub-export ls $REPO"
hub-export ls "$REPO"

step "hub-export pull $REPO --variant 8da4w -o $DEMO_DIR/pulled"
hub-export pull "$REPO" --variant 8da4w -o "$DEMO_DIR/pulled"

step "hub-export generate $REPO --variant 8da4w --prompt 'Once upon a time'"
hub-export generate "$REPO" --variant 8da4w --prompt "Once upon a time" --max-new-tokens 32

step "Done"
echo "Repo:        $HF_ENDPOINT/$REPO"
echo "Model card:  $HF_ENDPOINT/$REPO/resolve/main/README.md"
echo "Pulled to:   $DEMO_DIR/pulled"
echo "(random weights: the text is gibberish; the speed figures are real)"
