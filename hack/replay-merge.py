#!/usr/bin/env python3
# replay-merge.py OUT.json NAME[:BASELINES]=REPORT.json ...: merges `cmd/replay --json` reports
# of single-scenario runs (scenario "custom") into one report whose scenarios are named NAME, so
# that replay-medians.py and replay-targets.py read them like a --suite run; NAME:BASELINES says
# that scenario's baselines come from scenario BASELINES (as the suite's capacity-* scenarios
# take small-caches'). Example (docs/benchmarks.md, "Learned capacity"):
#   hack/replay-merge.py cap.json small-caches=base.json capacity-x10:small-caches=x10.json
import json, sys
out = {'scenarios': [], 'results': []}
for arg in sys.argv[2:]:
    name, path = arg.split('=', 1)
    name, _, base = name.partition(':')
    rep = json.load(open(path))
    if len(rep['scenarios']) != 1:
        sys.exit(f'{path}: {len(rep["scenarios"])} scenarios, want one run of one scenario')
    sc = dict(rep['scenarios'][0], name=name)
    if base:
        sc['baselinesFrom'] = base
    out['scenarios'].append(sc)
    for r in rep['results']:
        out['results'].append(dict(r, scenario=name))
json.dump(out, open(sys.argv[1], 'w'), indent=1)
