#!/usr/bin/env python3
# replay-merge.py OUT.json NAME[:BASELINES]=REPORT.json[@SCENARIO] ...: merges `cmd/replay --json`
# reports into one report whose scenarios are named NAME, so that replay-medians.py and
# replay-targets.py read them like a --suite run.
# - NAME:BASELINES says that scenario's baselines come from scenario BASELINES (as the suite's
#   capacity-* scenarios take small-caches').
# - REPORT.json@SCENARIO takes one scenario of a multi-scenario report (a --suite run); a
#   report of one scenario needs no @.
# - The same NAME given again adds that report's results to the scenario; a result for the same
#   workload, seed and policy replaces the earlier one. So a new build's kvpick-only runs can be
#   put beside an older run's baselines, which do not depend on the picker.
# Examples (docs/benchmarks.md):
#   hack/replay-merge.py cap.json small-caches=base.json capacity-x10:small-caches=x10.json
#   hack/replay-merge.py new.json default=held.json@default default=kvpick-default.json
import json, sys
out = {'scenarios': [], 'results': []}
named = {}
for arg in sys.argv[2:]:
    name, path = arg.split('=', 1)
    name, _, base = name.partition(':')
    path, _, pick = path.partition('@')
    rep = json.load(open(path))
    scens = rep['scenarios']
    if pick:
        scens = [s for s in scens if s['name'] == pick]
        if not scens:
            sys.exit(f'{path}: no scenario {pick!r}')
        results = [r for r in rep['results'] if r.get('scenario') == pick]
    else:
        if len(scens) != 1:
            sys.exit(f'{path}: {len(scens)} scenarios, name one with @SCENARIO')
        results = rep['results']
    if name not in named:
        sc = dict(scens[0], name=name)
        sc.pop('baselinesFrom', None)
        if base:
            sc['baselinesFrom'] = base
        out['scenarios'].append(sc)
        named[name] = {}
    for r in results:
        named[name][(r['workload'], r['seed'], r['policy'])] = dict(r, scenario=name)
for sc in out['scenarios']:
    out['results'].extend(named[sc['name']].values())
json.dump(out, open(sys.argv[1], 'w'), indent=1)
