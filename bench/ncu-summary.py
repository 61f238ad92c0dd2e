# Sums Nsight Compute's CSV (--metrics gpu__time_duration.sum --csv) by kernel name:
#   python3 bench/ncu-summary.py ncu.csv [steps]
import csv, sys
from collections import defaultdict
rows = [r for r in csv.reader(open(sys.argv[1])) if len(r) > 5]
head = rows[0]
name_i, value_i, unit_i = head.index("Kernel Name"), head.index("Metric Value"), head.index("Metric Unit")
steps = int(sys.argv[2]) if len(sys.argv) > 2 else 1
total, count = defaultdict(float), defaultdict(int)
for r in rows[1:]:
    v = float(r[value_i].replace(",", ""))
    unit = r[unit_i]
    us = v / 1000 if unit in ("nsecond", "ns") else v * 1000 if unit in ("msecond", "ms") else v
    total[r[name_i]] += us
    count[r[name_i]] += 1
all_us = sum(total.values())
print(f"{sum(count.values()) // steps} kernels, {all_us / steps:.1f} us of kernel time per step")
for name, us in sorted(total.items(), key=lambda kv: -kv[1]):
    print(f"{us / steps:9.1f} us  {count[name] // steps:4d} x  {us / count[name]:7.2f} us  {name}")
