"""One c10d store call to a frozen store from a thread while the main thread runs Python: does the call hold
Python's lock? Serves a TCPStore in a child process, stops it (SIGSTOP: a frozen machine looks the same), then calls
``CALL`` (``connect``, ``multi_get`` or ``list_keys``) from a daemon thread and prints, every 0.1 s of the main
thread's loop, ``tick <longest pause so far>``; after 3 s it prints ``done`` and kills the server (in this process's
group: a caller that kills the group kills it too, when this process stalls).

Usage: python frozen_store_call.py CALL
"""
import os
import signal
import subprocess
import sys
import threading
import time
from datetime import timedelta

import torch.distributed as dist

SERVE = ("import torch.distributed as d, time\n"
         "s = d.TCPStore('127.0.0.1', 0, is_master=True, wait_for_workers=False)\n"
         "print(s.port, flush=True)\ntime.sleep(60)")


def main(call: str) -> None:
    server = subprocess.Popen([sys.executable, "-c", SERVE], stdout=subprocess.PIPE, text=True)
    try:
        port = int(server.stdout.readline())
        client = dist.TCPStore("127.0.0.1", port, is_master=False, wait_for_workers=False,
                               timeout=timedelta(seconds=2))
        client.set("k", "1")
        os.kill(server.pid, signal.SIGSTOP)

        def run() -> None:
            try:
                if call == "connect":
                    dist.TCPStore("127.0.0.1", port, is_master=False, wait_for_workers=False,
                                  timeout=timedelta(seconds=2))
                elif call == "multi_get":
                    client.multi_get(["k"])
                else:
                    client.list_keys()
            except Exception:  # noqa: BLE001 - a timeout is an answer too; only the main thread's pauses count
                pass

        threading.Thread(target=run, daemon=True).start()
        last = start = next_tick = time.perf_counter()
        longest = 0.0
        while time.perf_counter() - start < 3.0:
            now = time.perf_counter()
            longest, last = max(longest, now - last), now
            if now >= next_tick:
                print(f"tick {longest:.3f}", flush=True)
                next_tick = now + 0.1
        print("done", flush=True)
    finally:
        server.kill()


if __name__ == "__main__":
    main(sys.argv[1])
