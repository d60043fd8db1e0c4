#!/bin/bash
# 800 MB from w0 to w1 over P = 1 and P = 6 concurrent connections, 6 pairs, on a 2-host rack
# at 1 Gbit/s; the machine's busy CPU-seconds (/proc/stat: user, system, irq, softirq, steal)
# around each transfer. Run as root from the repository root (2026-12-02).
set -euo pipefail
here=$(dirname "$0")
py=${PYTHON:-python3}
$py -m benchmarks.rack.cli up --workers 2 --rate 1000 --prefix fl >/dev/null
trap '$py -m benchmarks.rack.cli down --prefix fl >/dev/null' EXIT
ip=$(ip -n fl-w1 -4 addr show | grep -o '198\.1[89]\.[0-9.]*' | head -1)
busy() { head -1 /proc/stat | awk '{print $2+$4+$7+$8+$9}'; }
for rep in 1 2 3 4 5 6; do
  for p in 1 6; do
    port=$((40000 + rep * 10 + p))
    ip netns exec fl-w1 "$py" "$here/evening-flows.py" recv $port $p 800000000 &
    sleep 0.5
    b0=$(busy)
    out=$(ip netns exec fl-w0 "$py" "$here/evening-flows.py" send "$ip" $port $p 800000000)
    b1=$(busy)
    wait
    echo "rep $rep $out busy_cpu_s $(echo "($b1 - $b0) / 100" | bc -l | cut -c1-6)"
  done
done
