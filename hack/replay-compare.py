#!/usr/bin/env python3
# replay-compare.py OLD.json[:POLICY] NEW.json[:POLICY]: a paired comparison of two `cmd/replay
# --json` reports, seed by seed (docs/benchmarks.md, "Crowding"). Per scenario and workload, for
# TTFT p50, p90 and p99: the geometric mean of NEW / OLD over the seeds both hold, the seeds
# better and worse by more than 1%, and a 95% bootstrap interval of that geometric mean (seeds
# resampled, 2,000 draws, fixed random seed); and the hit ratio's mean change in points.
# An interval that contains 1.00 says the seeds do not show a difference. POLICY defaults to
# kvpick (compare a policy with another one in the same report: old.json:gie new.json:kvpick).
import json, math, random, sys

def load(arg):
    path, _, pol = arg.partition(':')
    try:
        results = json.load(open(path))['results']
    except (OSError, ValueError, KeyError, TypeError) as e:
        sys.exit(f'{path}: not a cmd/replay --json report ({e})')
    out = {}
    for r in results:
        if r['policy'] == (pol or 'kvpick'):
            out[(r.get('scenario', ''), r['workload'], r['seed'])] = r
    return out

def geomean(xs):
    return math.exp(sum(map(math.log, xs)) / len(xs))

def interval(ratios, rng, draws=2000):
    logs = [math.log(r) for r in ratios]
    means = sorted(sum(rng.choice(logs) for _ in logs) / len(logs) for _ in range(draws))
    return math.exp(means[int(0.025 * draws)]), math.exp(means[int(0.975 * draws) - 1])

def main():
    if len(sys.argv) != 3:
        sys.exit('usage: replay-compare.py OLD.json[:POLICY] NEW.json[:POLICY]')
    old, new = load(sys.argv[1]), load(sys.argv[2])
    rng = random.Random(1)
    groups = {}
    for key in new:
        if key in old:
            groups.setdefault(key[:2], []).append(key)
    if not groups:
        sys.exit('no scenario, workload and seed in both reports')
    print('| scenario | workload | seeds | TTFT p50 new/old [95%] (better/worse) | p90 | p99 | hit ratio |')
    print('|---|---|---|---|---|---|---|')
    for (sc, wl), keys in groups.items():
        cells = []
        for q in ('p50', 'p90', 'p99'):
            # A run with no TTFT (every request failed) has no ratio: it is left out.
            rs = [new[k]['ttft'][q] / old[k]['ttft'][q] for k in keys
                  if old[k]['ttft'][q] > 0 and new[k]['ttft'][q] > 0]
            if not rs:
                cells.append('—')
                continue
            lo, hi = interval(rs, rng)
            better = sum(r < 0.99 for r in rs)
            worse = sum(r > 1.01 for r in rs)
            cells.append(f'{geomean(rs):.2f} [{lo:.2f}-{hi:.2f}] ({better}/{worse})')
        hit = sum(100 * (new[k]['hitRatio'] - old[k]['hitRatio']) for k in keys) / len(keys)
        print(f'| {sc} | {wl} | {len(keys)} | ' + ' | '.join(cells) + f' | {hit:+.1f} points |')

main()
