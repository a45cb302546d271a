"""Wait for a just-built llama-server to be healthy, then generate two tokens; print how many it made.

    smoke_llama_server.py PORT PID    (exits non-zero when the server died or did not answer in 120 s)
"""

import json
import os
import sys
import time
import urllib.request


def main() -> int:
    port, pid = sys.argv[1], int(sys.argv[2])
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        try:
            os.kill(pid, 0)
        except OSError:
            print("llama-server exited", file=sys.stderr)
            return 1
        try:
            urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2).read()
            body = json.dumps({"prompt": "Hello", "n_predict": 2}).encode()
            request = urllib.request.Request(f"http://127.0.0.1:{port}/completion", body,
                                             {"Content-Type": "application/json"})
            print(json.loads(urllib.request.urlopen(request, timeout=60).read())["tokens_predicted"])
            return 0
        except OSError:  # not listening yet, or loading (503)
            time.sleep(0.5)
    print("llama-server did not answer within 120 s", file=sys.stderr)
    return 1


if __name__ == "__main__":
    sys.exit(main())
