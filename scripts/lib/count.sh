# shellcheck shell=bash
# Pass/fail counting of the bash suites (test-fresh-machine.sh, test-nginx-versions.sh,
# test-packages.sh): sourced once, then `count_pass NAME` / `count_fail NAME` per check (or
# `count_step NAME CMD...`, which runs CMD and counts it by its exit status), and `count_summary
# [PREFIX] [SUFFIX]` at the end: prints the one `N passed, N failed` line (between PREFIX and SUFFIX)
# and a `   failed: NAME` line per failed check, and returns non-zero when a check failed.
# (scripts/soak.sh counts in its Rust driver, crates/daemon/benches/soak/.)
passed=0
failed=0
failures=()

count_pass() { # NAME
  passed=$((passed + 1))
}

count_fail() { # NAME
  failed=$((failed + 1))
  failures+=("$1")
}

count_step() { # NAME COMMAND...: runs COMMAND, counts it, returns its exit status
  local name=$1 rc
  shift
  "$@"
  rc=$?
  if [ $rc -eq 0 ]; then count_pass "$name"; else count_fail "$name"; fi
  return $rc
}

count_summary() { # [PREFIX] [SUFFIX]
  echo "${1:-}$passed passed, $failed failed${2:-}"
  local f
  for f in "${failures[@]}"; do echo "   failed: $f"; done
  [ "$failed" -eq 0 ]
}
