#!/usr/bin/env python3
# Loopback only. Usage: python3 scripts/measure/silent-connections.py BINARY
# 200 silent TLS connections (handshake, then nothing) against a server on loopback;
# prints the server's descriptor count before, while held, and after 4 s.
import os, socket, ssl, subprocess, sys, time, tempfile
binary, extra = sys.argv[1], sys.argv[2:]
state = tempfile.mkdtemp()
p = subprocess.Popen([binary, "serve", "--listen", "127.0.0.1:0", "--admin-listen", "127.0.0.1:0",
                      "--state-dir", state, "--ledger", "embedded", "--read-timeout", "2s", *extra],
                     stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
line = p.stdout.readline()
port = int(line.split("https://")[1].split(" ")[0].rsplit(":", 1)[1])
fds = lambda: len(os.listdir(f"/proc/{p.pid}/fd"))
rss = lambda: [l for l in open(f"/proc/{p.pid}/status") if l.startswith("VmRSS")][0].split()[1]
ctx = ssl.create_default_context(); ctx.check_hostname = False; ctx.verify_mode = ssl.CERT_NONE
before = fds()
held = [ctx.wrap_socket(socket.create_connection(("127.0.0.1", port)), server_hostname="localhost") for _ in range(200)]
time.sleep(0.5)
during = fds()
time.sleep(4)
after = fds()
print(f"{os.path.basename(binary)}: fds idle {before}, 200 silent TLS connections {during}, 4 s later (read timeout 2 s) {after}; RSS {rss()} KiB")
p.kill()
