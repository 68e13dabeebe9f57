#!/usr/bin/env bash
# Checks the text of the tracked files (git ls-files), listing FILE:LINE for
# each problem and exiting 1 if there is any:
#  (a) words about how the code came to be rather than what it does: work
#      periods, numbered runs, machine loans, tooling folders, issue numbers
#      (say what the code does and why; cite a measurement by machine,
#      command and date). Cargo.lock, binary files, docs/runs/*.json and
#      docs/img/* are not searched.
#  (b) relative Markdown links whose file, or whose #anchor (a heading by
#      GitHub's slug rules, or an <a id/name>), does not exist
#      (scripts/check-links.py).
# Usage: scripts/check-text.sh [--no-md] [DIR]
#   --no-md  leave *.md files out of both checks
#   DIR      the git checkout to check (default: this repository)
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$here/..
with_md=1
for arg in "$@"; do
  case $arg in
    --no-md) with_md=0 ;;
    -*) echo "check-text.sh: unknown option $arg (accepted: --no-md)" >&2; exit 2 ;;
    *) root=$arg ;;
  esac
done
cd "$root"

# The bracketed letters keep this file from matching its own pattern.
words='\bsessions?\b|\bruns? [0-9]|\blent\b|\bleases?\b|with[h]eld|device[ ]tool|dev[c]arry|\bissues? #?[0-9]|\bwork periods?\b'
skip=(':!Cargo.lock' ':!docs/runs/*.json' ':!docs/img/*')
[ "$with_md" = 1 ] || skip+=(':!*.md')

failed=0
# -I: binary files are not searched.
if hits=$(git grep -I -n -i -E "$words" -- . "${skip[@]}"); then
  echo "check-text: words about how the code was made (rewrite: what it does and why):"
  echo "$hits"
  failed=1
fi

if [ "$with_md" = 1 ]; then
  mapfile -t md_files < <(git ls-files '*.md')
  if [ ${#md_files[@]} -gt 0 ] && ! links=$(python3 "$here/check-links.py" . "${md_files[@]}"); then
    echo "check-text: broken Markdown links:"
    echo "$links"
    failed=1
  fi
fi

[ "$failed" = 0 ] && echo "check-text: OK"
exit "$failed"
