#!/usr/bin/env bash
# oxccl host all_reduce beside Gloo (torch.distributed, backend gloo), same
# machine, same run: 2 processes, float32, 8 B to 128 MB, both alternated
# ROUNDS times with the median per size kept.
#
# Usage: bench/host_vs_gloo.sh [ROUNDS]   (env: GLOO_PYTHON=python with torch)
# Needs torch for the Gloo side: python3 -m venv /tmp/t && /tmp/t/bin/pip install torch
set -euo pipefail
cd "$(dirname "$0")/.."
ROUNDS=${1:-3}
PY=${GLOO_PYTHON:-python3}
MAX=$((128 << 20))
out=$(mktemp -d)
cargo build --release -q --bin oxccl
OXCCL="${CARGO_TARGET_DIR:-target}/release/oxccl"
if ! "$PY" -c "import torch.distributed" 2>/dev/null; then
  echo "no torch for $PY: set GLOO_PYTHON to a python with torch installed" >&2
  exit 2
fi
for r in $(seq 1 "$ROUNDS"); do
  "$OXCCL" perf all_reduce --ranks 2 -b 8 -e $MAX -f 2 -n 50 -w 10 -c 1 \
    -J "$out/oxccl.$r.json" > "$out/oxccl.$r.txt"
  "$PY" bench/gloo_all_reduce.py 2 8 $MAX 2>/dev/null | grep -v '^#' > "$out/gloo.$r.txt"
done
python3 - "$out" "$ROUNDS" <<'PY'
import json, statistics, sys
out, rounds = sys.argv[1], int(sys.argv[2])
ox, gl = {}, {}
for r in range(1, rounds + 1):
    d = json.load(open(f"{out}/oxccl.{r}.json"))
    for rec in d["results"]:
        o, i = rec["out_of_place"], rec["in_place"]
        ox.setdefault(rec["size"], []).append((o["time_us"], o["busbw_gbps"], i["time_us"], i["busbw_gbps"]))
    for line in open(f"{out}/gloo.{r}.txt"):
        f = line.split()
        if len(f) == 4:
            gl.setdefault(int(f[0]), []).append((float(f[1]), float(f[3])))
med = statistics.median
print(f"# host all_reduce, 2 processes, float32, median of {rounds} alternated rounds")
print("# torch.distributed.all_reduce is in place, so the ratio compares oxccl's in-place column with Gloo")
print("#      bytes  oxccl_us(oop)  oxccl_us(ip)   gloo_us   busbw(oop)   busbw(ip)  gloo_busbw   ratio(ip)")
for size in sorted(ox):
    if size not in gl:
        continue
    v = ox[size]
    ot, ob = med(x[0] for x in v), med(x[1] for x in v)
    it, ib = med(x[2] for x in v), med(x[3] for x in v)
    gt, gb = med(t for t, _ in gl[size]), med(b for _, b in gl[size])
    ratio = f"{ib / gb:8.1f}x" if gb > 0.0005 else f"{gt / it:6.0f}x(t)"
    print(f"{size:12d} {ot:14.2f} {it:13.2f} {gt:9.1f} {ob:12.3f} {ib:11.3f} {gb:11.3f} {ratio:>11}")
PY
