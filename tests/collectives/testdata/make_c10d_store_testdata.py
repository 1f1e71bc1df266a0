#!/usr/bin/env python3
"""Records PyTorch's TCPStore client talking to PyTorch's TCPStore server, operation by
operation, into tests/collectives/testdata/c10d_store_exchange.json, the exchange
tests/collectives/c10d_store_test.cc replays to dtr's C10dStore without torch.

    ~/torch-venv/bin/python3 tests/collectives/testdata/make_c10d_store_testdata.py

A relay between the two logs every byte each way. The connection's opening (VALIDATE with
its magic number, then PyTorch's PING with a process-dependent nonce) is recorded as it is;
each operation after it is one entry: its name, the bytes the client sent (hex) and the bytes
the server answered (hex, empty for SET, which has no answer). Made with torch 2.15.0.
"""
import datetime
import json
import pathlib
import socket
import threading
import time

import torch
from torch.distributed import TCPStore

OUT = pathlib.Path(__file__).resolve().parents[3] / "tests/collectives/testdata/c10d_store_exchange.json"


class Relay:
    """Forwards one connection to the server, keeping what each side has sent since the last take()."""

    def __init__(self, server_port):
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.server_port = server_port
        self.sent = {"client": bytearray(), "server": bytearray()}
        self.lock = threading.Lock()
        threading.Thread(target=self.serve, daemon=True).start()

    def pump(self, src, dst, side):
        while data := src.recv(65536):
            with self.lock:
                self.sent[side] += data
            dst.sendall(data)

    def serve(self):
        client, _ = self.listener.accept()
        server = socket.create_connection(("127.0.0.1", self.server_port))
        threading.Thread(target=self.pump, args=(client, server, "client"), daemon=True).start()
        threading.Thread(target=self.pump, args=(server, client, "server"), daemon=True).start()

    def take(self):
        time.sleep(0.2)  # what is in flight arrives
        with self.lock:
            out = (bytes(self.sent["client"]).hex(), bytes(self.sent["server"]).hex())
            self.sent = {"client": bytearray(), "server": bytearray()}
        return out


def main():
    timeout = datetime.timedelta(seconds=30)
    server = TCPStore("127.0.0.1", 0, 1, True, timeout=timeout, wait_for_workers=False)
    relay = Relay(server.port)
    client = TCPStore("127.0.0.1", relay.port, 1, False, timeout=timeout)
    opening = relay.take()
    operations = [
        ("set k v", lambda: client.set("k", "v")),
        ("get k", lambda: client.get("k")),
        ("add n 5", lambda: client.add("n", 5)),
        ("add n 7", lambda: client.add("n", 7)),
        ("compare_set s '' a", lambda: client.compare_set("s", "", "a")),
        ("compare_set s x b", lambda: client.compare_set("s", "x", "b")),
        ("wait k n", lambda: client.wait(["k", "n"])),
        ("num_keys", lambda: client.num_keys()),
        ("delete_key k", lambda: client.delete_key("k")),
        ("delete_key k", lambda: client.delete_key("k")),
    ]
    entries = []
    for name, op in operations:
        result = op()
        request, reply = relay.take()
        entries.append({"op": name, "result": repr(result), "request": request, "reply": reply})
    OUT.parent.mkdir(parents=True, exist_ok=True)
    OUT.write_text(json.dumps({"torch": torch.__version__, "opening": {"request": opening[0], "reply": opening[1]},
                               "operations": entries}, indent=1) + "\n")
    print(f"wrote {OUT} ({len(entries)} operations)")


if __name__ == "__main__":
    main()
