# Sums Nsight Compute's CSV (--metrics gpu__time_duration.sum[,dram__bytes_read.sum] --csv) by kernel:
#   python3 bench/ncu-summary.py ncu.csv [steps]
# With dram__bytes_read.sum in the CSV, each kernel's DRAM read rate (GB/s) is printed too.
import csv, sys
from collections import defaultdict
rows = [r for r in csv.reader(open(sys.argv[1])) if len(r) > 5]
head = rows[0]
name_i, value_i, unit_i = head.index("Kernel Name"), head.index("Metric Value"), head.index("Metric Unit")
metric_i = head.index("Metric Name")
steps = int(sys.argv[2]) if len(sys.argv) > 2 else 1
SCALE = {"nsecond": 1e-3, "ns": 1e-3, "usecond": 1, "us": 1, "msecond": 1e3, "ms": 1e3,
         "byte": 1, "Kbyte": 1e3, "Mbyte": 1e6, "Gbyte": 1e9}
total, count, read = defaultdict(float), defaultdict(int), defaultdict(float)
for r in rows[1:]:
    v = float(r[value_i].replace(",", "")) * SCALE.get(r[unit_i], 1)
    if r[metric_i] == "gpu__time_duration.sum":
        total[r[name_i]] += v
        count[r[name_i]] += 1
    elif r[metric_i] == "dram__bytes_read.sum":
        read[r[name_i]] += v
all_us = sum(total.values())
all_bytes = sum(read.values())
rate = f", DRAM read {all_bytes / steps / 1e6:.1f} MB at {all_bytes / all_us / 1e3:.0f} GB/s" if read else ""
print(f"{sum(count.values()) // steps} kernels, {all_us / steps:.1f} us of kernel time per step{rate}")
for name, us in sorted(total.items(), key=lambda kv: -kv[1]):
    gbs = f"  {read[name] / us / 1e3:6.0f} GB/s" if read else ""
    print(f"{us / steps:9.1f} us  {count[name] // steps:4d} x  {us / count[name]:7.2f} us{gbs}  {name}")
