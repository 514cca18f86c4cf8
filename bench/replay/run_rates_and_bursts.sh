#!/usr/bin/env bash
# The replay bench of bench/results/replay.md: tailtune (one child process, as a worker runs it),
# tailtune over two processes, and `vllm bench serve`, at 200/400/600/800 req/s against the mock,
# then tailtune's bursts (40 and 100 requests planned at one instant every 0.5 s); each repeat
# in its own JSON file, all rendered by report.py in one table.
#   bash bench/replay/run_rates_and_bursts.sh [REPEATS] [DURATION_S]
set -euo pipefail
cd "$(dirname "$0")/../.."
repeats="${1:-3}"
duration="${2:-15}"
out=bench/results
for rep in $(seq 1 "$repeats"); do
  .venv/bin/python bench/replay/compare.py --rates 200,400,600,800 \
    --clients tailtune,tailtune-2proc,vllm-bench-serve --duration "$duration" \
    --out "$out/replay-rates-$rep.json" --work /tmp/tailtune-bench
  for size in 40 100; do
    .venv/bin/python bench/replay/compare.py --burst-size "$size" --burst-every 0.5 \
      --clients tailtune --duration "$duration" --out "$out/replay-bursts-$rep.json" --work /tmp/tailtune-bench
  done
done
files=()
for rep in $(seq 1 "$repeats"); do files+=("$out/replay-rates-$rep.json"); done
for rep in $(seq 1 "$repeats"); do files+=("$out/replay-bursts-$rep.json"); done
.venv/bin/python bench/replay/report.py "${files[@]}" > "$out/replay-table.md"
echo "wrote $out/replay-table.md"
