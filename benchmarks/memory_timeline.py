"""Where an export's memory goes: each progress line with the export process's resident memory and its children's.

    python -m benchmarks.memory_timeline -- hub-export export FOLDER -o OUT --qmode 8da4w --qembedding 8w

runs the command and prints, for every line it writes, the seconds since the start, the
command's own resident set and that of its child processes (summed), each with its peak
since the previous line: the phase a peak belongs to is the line after it.
"""

from __future__ import annotations

import subprocess
import sys
import threading
import time

GIB = 1 << 30


def main(argv: list[str] | None = None) -> int:
    import psutil

    command = list(argv if argv is not None else sys.argv[1:])
    if command[:1] == ["--"]:
        command = command[1:]
    if not command:
        sys.exit(__doc__)
    started = time.time()
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, bufsize=1)
    watched = psutil.Process(process.pid)
    now, peak, done = {"main": 0, "children": 0}, {"main": 0, "children": 0}, threading.Event()

    def sample() -> None:
        while not done.is_set():
            try:
                children = 0
                for child in watched.children(recursive=True):
                    try:
                        children += child.memory_info().rss
                    except psutil.Error:
                        pass
                now["main"], now["children"] = watched.memory_info().rss, children
                for key in now:
                    peak[key] = max(peak[key], now[key])
            except psutil.Error:
                pass
            done.wait(0.25)

    threading.Thread(target=sample, daemon=True).start()
    for line in process.stdout:
        if line.strip():
            print(f"{time.time() - started:7.1f}s  main {now['main'] / GIB:5.2f} GiB (peak {peak['main'] / GIB:5.2f})  "
                  f"children {now['children'] / GIB:5.2f} GiB (peak {peak['children'] / GIB:5.2f})  | {line.rstrip()}",
                  flush=True)  # fmt: skip
            peak.update(now)
    code = process.wait()
    done.set()
    print(f"exit {code} after {time.time() - started:.0f} s")
    return code


if __name__ == "__main__":
    sys.exit(main())
