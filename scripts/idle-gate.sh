# shellcheck shell=bash
# The idle gate of the benchmark scripts, sourced by them: load1 prints the
# 1-minute load average; wait_idle waits until it is below LOAD_MAX (at most
# LOAD_WAIT seconds, then runs anyway and says so) and prints the load the
# run starts under.

load1() { cut -d' ' -f1 /proc/loadavg; }

wait_idle() {
  local t=0
  while awk -v l="$(load1)" -v m="$LOAD_MAX" 'BEGIN { exit !(l >= m) }'; do
    if ((t >= LOAD_WAIT)); then
      echo "# load $(load1) still at or above $LOAD_MAX after ${LOAD_WAIT} s: running anyway" >&2
      break
    fi
    sleep 5
    t=$((t + 5))
  done
  load1
}
