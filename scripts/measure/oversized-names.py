#!/usr/bin/env python3
# Loopback only. Usage: python3 scripts/measure/oversized-names.py BINARY
# The disk and metrics findings: 50 CREATEs with 1 MB generateName/app/uid, then 50 exhaustion
# denials with unique 1 MB namespaces. Prints ledger.redb size, /metrics size and RSS.
import http.client, json, os, ssl, subprocess, sys, tempfile, urllib.request
binary = sys.argv[1]
state = tempfile.mkdtemp()
p = subprocess.Popen([binary, "serve", "--listen", "127.0.0.1:0", "--admin-listen", "127.0.0.1:0",
                      "--state-dir", state, "--ledger", "embedded"], stdout=subprocess.PIPE,
                     stderr=subprocess.DEVNULL, text=True)
line = p.stdout.readline()
port = int(line.split("https://")[1].split(" ")[0].rsplit(":", 1)[1])
admin = line.split("admin http://")[1].split(")")[0]
ctx = ssl.create_default_context(); ctx.check_hostname = False; ctx.verify_mode = ssl.CERT_NONE
def post(review):
    c = http.client.HTTPSConnection("127.0.0.1", port, context=ctx, timeout=60)
    c.request("POST", "/mutate", json.dumps(review), {"Content-Type": "application/json"})
    r = c.getresponse(); body = r.read(); c.close(); return r.status, body
def review(uid, ns, app, gen, lst):
    return {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": {
        "uid": uid, "kind": {"group": "", "version": "v1", "kind": "Pod"}, "namespace": ns,
        "operation": "CREATE", "object": {"metadata": {"generateName": gen, "namespace": ns,
        "labels": {"app": app}, "annotations": {"ip-webhook.io/allocatable-ips": lst}}, "spec": {}}}}
rss = lambda: int([l for l in open(f"/proc/{p.pid}/status") if l.startswith("VmRSS")][0].split()[1]) // 1024
size = lambda: os.path.getsize(os.path.join(state, "ledger.redb")) // 1024
post(review("real", "team", "web", "web-", "10.9.0.1"))
print(f"start: ledger {size()} KiB, RSS {rss()} MiB")
big = "a" * (1 << 20)
for i in range(50):
    f = i % 3
    post(review(big + str(i) if f == 2 else f"u{i}", "team", big if f == 1 else "web",
                big if f == 0 else "web-", "10.8.0.0/16"))
print(f"50 CREATEs with 1 MB generateName/app/uid: ledger {size()} KiB, RSS {rss()} MiB")
for i in range(50):
    post(review(f"x{i}", f"{i}{big}", "x", "x-", "10.9.0.1"))
m = urllib.request.urlopen(f"http://{admin}/metrics").read()
print(f"50 exhaustion denials with 1 MB namespaces: /metrics {len(m)} bytes, RSS {rss()} MiB")
p.kill()
