#!/usr/bin/env bash
# replay-ab.sh OUTDIR OLD_PICKER NEW_PICKER [cmd/replay flags...]
#
# Runs the same replay (virtual clock, kvpick only unless --policies is given) against two picker
# binaries side by side, one lane each, and prints hack/replay-compare.py's seed-by-seed
# comparison (NEW ÷ OLD). The two lanes run in network namespaces of their own (unshare -n, as
# root) so that both can hold the engines' fixed loopback addresses at once, which keeps each run
# reproducible (docs/replay.md, "Virtual clock"). Without root the lanes run one after the other.
#
#   go build -o /tmp/old ./cmd/extproc   # at the baseline commit
#   go build -o /tmp/new ./cmd/extproc   # at the candidate
#   hack/replay-ab.sh /tmp/ab /tmp/old /tmp/new --kv-blocks 768-1856 --load-scale 0.7 \
#       --workloads multi-turn --seeds 1-6
#
# OUTDIR gets old.json, new.json and each run's report and stderr. REPLAY (default: a binary
# built from this tree into OUTDIR) is the replay to use; both lanes use the same one.
set -euo pipefail
if [ $# -lt 3 ]; then
	sed -n '2,16p' "$0" | sed 's/^# \{0,1\}//' >&2
	exit 2
fi
out=$1 old=$2 new=$3
shift 3
root=$(cd "$(dirname "$0")/.." && pwd)
mkdir -p "$out"
out=$(cd "$out" && pwd)
for b in "$old" "$new"; do
	[ -x "$b" ] || { echo "replay-ab: $b: not an executable picker binary" >&2; exit 2; }
done
replay=${REPLAY:-}
if [ -z "$replay" ]; then
	replay=$out/replay
	(cd "$root" && go build -o "$replay" ./cmd/replay)
fi
policies=kvpick
for a in "$@"; do
	case $a in --policies | --policies=*) policies= ;; esac
done
args=(--quiet --clock virtual "$@")
[ -n "$policies" ] && args+=(--policies "$policies")
ns=false
if [ "$(id -u)" = 0 ] && command -v unshare >/dev/null; then ns=true; fi

lane() { # lane NAME PICKER
	local cmd
	cmd=$(printf '%q ' "$replay" "${args[@]}" --picker-bin "$2" --json "$out/$1.json")
	if $ns; then
		unshare -n sh -c "ip link set lo up && $cmd" >"$out/$1.txt" 2>"$out/$1.err"
	else
		sh -c "$cmd" >"$out/$1.txt" 2>"$out/$1.err"
	fi
}
if $ns; then
	lane old "$old" & a=$!
	lane new "$new" & b=$!
	wait $a || { echo "replay-ab: the old lane failed: $out/old.err" >&2; exit 1; }
	wait $b || { echo "replay-ab: the new lane failed: $out/new.err" >&2; exit 1; }
else
	lane old "$old" || { echo "replay-ab: the old lane failed: $out/old.err" >&2; exit 1; }
	lane new "$new" || { echo "replay-ab: the new lane failed: $out/new.err" >&2; exit 1; }
fi
python3 "$root/hack/replay-compare.py" "$out/old.json" "$out/new.json"
