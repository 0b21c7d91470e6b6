#!/usr/bin/env python3
# replay-targets.py REPORT.json: issue 8's targets from a `cmd/replay --json` report, one row per
# scenario and workload (docs/benchmarks.md, "Routing quality").
# Cell: median over seeds [worst seed] and how many seeds meet the target; failing cells in bold.
import json, sys, statistics
rep = json.load(open(sys.argv[1]))
base = {s['name']: (s.get('baselinesFrom') or s['name']) for s in rep['scenarios']}
R = {(r['scenario'], r['workload'], r['seed'], r['policy']): r for r in rep['results']}
seeds = sorted({k[2] for k in R})
def cell(sc, wl, f, limit, lower=False):
    v = []
    for s in seeds:
        try: v.append(f(R[(sc, wl, s, 'kvpick')], lambda p: R[(base[sc], wl, s, p)]))
        except KeyError: pass
    if not v: return ''
    ok = sum(1 for x in v if (x >= limit if lower else x <= limit))
    worst = min(v) if lower else max(v)
    t = f'{statistics.median(v):.2f} [{worst:.2f}] {ok}/{len(v)}'
    return t if ok == len(v) else f'**{t}**'
t = lambda r, q: r['ttft'][q]
print('| scenario | workload | hit ÷ precise ≥ 0.95 | p90 ÷ precise ≤ 1.2 | p99 ÷ precise ≤ 1.3 | p50 ÷ least-loaded ≤ 1.05 | p90 ÷ least-loaded ≤ 1.05 | p99 ÷ least-loaded ≤ 1.05 | p90 ÷ gie ≤ 1 | p90 ÷ sglang ≤ 1 |')
print('|---|---|---|---|---|---|---|---|---|---|')
for sc in base:
    for wl in ['shared-prefix', 'multi-turn', 'agent', 'hot-prefix', 'no-sharing']:
        share = wl in ('shared-prefix', 'multi-turn', 'agent')
        c = [cell(sc, wl, lambda k, b: k['hitRatio'] / b('precise')['hitRatio'], 0.95, True) if share else '',
             cell(sc, wl, lambda k, b: t(k, 'p90') / t(b('precise'), 'p90'), 1.2) if share else '',
             cell(sc, wl, lambda k, b: t(k, 'p99') / t(b('precise'), 'p99'), 1.3) if share else '']
        for q in ('p50', 'p90', 'p99'):
            c.append('' if share else cell(sc, wl, lambda k, b, q=q: t(k, q) / t(b('least-loaded'), q), 1.05))
        c += [cell(sc, wl, lambda k, b: t(k, 'p90') / t(b('gie'), 'p90'), 1.0),
              cell(sc, wl, lambda k, b: t(k, 'p90') / t(b('sglang'), 'p90'), 1.0)]
        print(f'| {sc} | {wl} | ' + ' | '.join(c) + ' |')
