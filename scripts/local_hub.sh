# Sourced by demo.sh and space.sh: start the local Hub in the background and wait for it.
#   start_local_hub ROOT PORT LOG   sets HUB_PID and exports HF_ENDPOINT, HF_HUB_DISABLE_XET.

start_local_hub() {
    local root="$1" port="$2" log="$3"
    hub-export hub serve --root "$root" --port "$port" > "$log" 2>&1 &
    HUB_PID=$!
    export HF_ENDPOINT="http://127.0.0.1:$port"
    export HF_HUB_DISABLE_XET=1  # the local Hub speaks classic LFS, not Xet; the real Hub needs neither
    python - "$HF_ENDPOINT" "$log" <<'PY'
import sys, time, urllib.error, urllib.request
for _ in range(100):
    try:
        urllib.request.urlopen(sys.argv[1] + "/api/models/demo/none")
    except urllib.error.HTTPError:
        sys.exit(0)  # any HTTP answer means the server is up
    except OSError:
        time.sleep(0.2)
sys.exit(f"the local Hub did not start; see {sys.argv[2]}")
PY
}
