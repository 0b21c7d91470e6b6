#!/usr/bin/env python3
# replay-medians.py REPORT.json: medians over the seeds of a `cmd/replay --json` report, one row per
# scenario and workload (docs/benchmarks.md, "Routing quality").
import json, sys, statistics
rep = json.load(open(sys.argv[1]))
base = {s['name']: (s.get('baselinesFrom') or s['name']) for s in rep['scenarios']}
R = {}
for r in rep['results']:
    R.setdefault((r['scenario'], r['workload'], r['policy']), []).append(r)
unit = lambda v: '—' if v is None else f'{v:.2f} s' if v >= 1 else f'{v*1000:.0f}'
pct = lambda v: '—' if v is None else f'{v:.1f}'  # a policy the report does not hold
def med(sc, wl, pol, f):
    rs = R.get((sc, wl, pol))
    return statistics.median(f(r) for r in rs) if rs else None
print('| scenario | workload | hit %: precise / gie / sglang / kvpick | TTFT p90 ms: round-robin | least-loaded | precise | gie | sglang | **kvpick** | kvpick p50 / p99 (precise p99) |')
print('|---|---|---|---|---|---|---|---|---|---|')
for sc in base:
    b = base[sc]
    for wl in ['shared-prefix', 'multi-turn', 'agent', 'hot-prefix', 'no-sharing']:
        if not R.get((sc, wl, 'kvpick')): continue
        hit = lambda pol, s=sc: pct(med(s, wl, pol, lambda r: 100 * r['hitRatio']))
        p = lambda pol, q, s=b: unit(med(s, wl, pol, lambda r: r['ttft'][q]))
        print(f"| {sc} | {wl} | {hit('precise', b)} / {hit('gie', b)} / {hit('sglang', b)} / **{hit('kvpick')}** | "
              f"{p('round-robin','p90')} | {p('least-loaded','p90')} | {p('precise','p90')} | {p('gie','p90')} | {p('sglang','p90')} | "
              f"**{p('kvpick','p90',sc)}** | {p('kvpick','p50',sc)} / {p('kvpick','p99',sc)} ({p('precise','p99')}) |")
