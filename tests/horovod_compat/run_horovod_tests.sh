#!/usr/bin/env bash
# Runs one of Horovod's own parallel test files against fastps, with `import horovod.torch`
# (etc.) mapped to fastps by the shim package next to this script. Horovod's test code stays
# in Horovod's checkout; nothing is copied into this repository.
#
# Usage: tests/horovod_compat/run_horovod_tests.sh HOROVOD_CHECKOUT [TEST_FILE] [NP] [pytest args]
#   HOROVOD_CHECKOUT  a horovod/horovod work tree (needs test/parallel and test/utils)
#   TEST_FILE         default test/parallel/test_torch.py (relative to the checkout)
#   NP                workers, default 2
# Env: PYTHON (interpreter with fastps installed, default python3), HVD_TEST_TIMEOUT (seconds
# per test, default 60), HVD_OUT (folder for the per-rank JUnit XML and logs, default a temp dir).
# Prints pass/fail/skip counts per rank and the names of the failures of rank 0.
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
hvd=${1:?usage: $0 HOROVOD_CHECKOUT [TEST_FILE] [NP] [pytest args]}
hvd=$(cd "$hvd" && pwd)
file=${2:-test/parallel/test_torch.py}
np=${3:-2}
shift $(( $# < 3 ? $# : 3 ))
py=${PYTHON:-python3}
out=${HVD_OUT:-$(mktemp -d /tmp/fastps-hvd-tests.XXXXXX)}
mkdir -p "$out"
[ -f "$hvd/$file" ] || { echo "no test file $hvd/$file" >&2; exit 2; }
launcher=$(dirname "$py")/fastpsrun
command -v "$launcher" >/dev/null 2>&1 || launcher=fastpsrun

export PYTHONPATH="$here${PYTHONPATH:+:$PYTHONPATH}"
# A test that fails on one rank leaves its peer waiting in an op: bound such waits by the
# per-test timeout so the next test starts clean (tearDown's barrier is not under it).
export FASTPS_OP_TIMEOUT=${FASTPS_OP_TIMEOUT:-${HVD_TEST_TIMEOUT:-60}}
cd "$hvd/$(dirname "$file")"
start=$(date +%s)
# Each rank writes its own report; a rank's pytest exit status must not stop the job
# (fastpsrun stops every process when one exits non-zero), so it is saved and 0 returned.
"$launcher" -np "$np" -- bash -c '
  "$0" -m pytest -q -p no:cacheprovider --timeout "$1" -o faulthandler_timeout=$(( $1 + 15 )) \
    -o junit_family=xunit2 --junitxml="$2/rank$FASTPS_RANK.xml" "$3" "${@:4}" \
    > "$2/rank$FASTPS_RANK.log" 2>&1
  echo $? > "$2/rank$FASTPS_RANK.rc"; exit 0' \
  "$py" "${HVD_TEST_TIMEOUT:-60}" "$out" "$(basename "$file")" "$@"
status=$?
echo "fastpsrun exit $status after $(( $(date +%s) - start )) s; reports in $out"
"$py" "$here/summarize_junit.py" "$out"/rank*.xml
