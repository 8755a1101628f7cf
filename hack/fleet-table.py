#!/usr/bin/python3
# Writes the README's fleet table ("At fleet scale") from hack/fleet.sh's
# output: one row per kind and scheduler, one column per run, each cell
# the scheduler's CPU per pod of hwdra's publication and its ratio to one
# device per GPU/VF (and how many of the kind's pods the scheduler left
# pending when the harness moved on); the last rows all pods of a run. Each argument is
# COLUMN=FILE (a saved hack/fleet.sh output, e.g. hack/upstream/results/...).
#
#   hack/fleet-table.py "100 nodes=results/a.txt" "500 nodes=results/b.txt"
import re
import sys

KINDS = [
    ("gpu", "a whole GPU"),
    ("mig-1g.10gb", "a 1g.10gb MIG partition"),
    ("mig-3g.40gb", "a 3g.40gb MIG partition"),
    ("gpu-share", "a GPU share"),
    ("vgpu", "a vGPU"),
    ("vf-share", "a 10G VF share"),
    ("extended", "`nvidia.com/gpu: 1`"),
]
SCHEDULERS = [("upstream", "released"), ("patched", "patched")]
KIND = re.compile(r"^fleet (\S+) nodes=\d+ pods=(\d+) scheduler=(\S+) .*cpu-ratio=([0-9.]+) .*ours cpu/pod=([0-9.]+)(µs|ms|s) one-device=([0-9.]+)(µs|ms|s)")
PENDING = re.compile(r"LEFT PENDING: ours (\d+)")
ALL = re.compile(r"^fleet all (ours|one-device) nodes=\d+ pods=\d+ scheduler=(\S+) .* ([0-9.]+) pods/s scheduler-cpu/pod=([0-9.]+)(µs|ms|s)")
UNIT = {"µs": 1e-3, "ms": 1.0, "s": 1e3}


def ms(value, unit):
    return float(value) * UNIT[unit]


def show(v):
    if v >= 1000:
        return "%.2f s" % (v / 1000)
    if v >= 20:
        return "%.0f ms" % v
    return "%.1f ms" % v


def read(path):
    kinds, alls = {}, {}
    for line in open(path, encoding="utf-8"):
        line = line.strip()
        m = KIND.match(line)
        if m:
            p = PENDING.search(line)
            kinds[(m.group(1), m.group(3))] = (int(m.group(2)), ms(m.group(5), m.group(6)), ms(m.group(7), m.group(8)), int(p.group(1)) if p else 0)
            continue
        m = ALL.match(line)
        if m:
            alls[(m.group(1), m.group(2))] = (ms(m.group(4), m.group(5)), float(m.group(3)))
    return kinds, alls


def main(args):
    if not args:
        sys.exit("usage: hack/fleet-table.py COLUMN=FILE...")
    columns = [arg.split("=", 1) for arg in args]
    runs = [read(path) for _, path in columns]
    print("| pods asking for | scheduler | " + " | ".join(c for c, _ in columns) + " |")
    print("|---|---|" + "---|" * len(columns))
    for kind, label in KINDS:
        for i, (sched, name) in enumerate(SCHEDULERS):
            cells = []
            for kinds, _ in runs:
                if (kind, sched) in kinds:
                    pods, ours, one, pending = kinds[(kind, sched)]
                    if pods == 0:
                        cells.append("none placed (%d pending)" % pending)
                        continue
                    cell = "%s, %.1fx" % (show(ours), ours / one)
                    if pending:
                        cell += " (%d left pending)" % pending
                    cells.append(cell)
                else:
                    cells.append("-")
            print("| %s | %s | %s |" % (label if i == 0 else "", name, " | ".join(cells)))
    for sched, name in SCHEDULERS:
        cells = []
        for _, alls in runs:
            if ("ours", sched) in alls and ("one-device", sched) in alls:
                (o, op), (d, dp) = alls[("ours", sched)], alls[("one-device", sched)]
                cells.append("%s vs %s, %.1f vs %.1f pods/s" % (show(o), show(d), op, dp))
            else:
                cells.append("-")
        print("| all pods | %s | %s |" % (name, " | ".join(cells)))


if __name__ == "__main__":
    main(sys.argv[1:])
