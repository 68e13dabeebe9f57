#!/usr/bin/env bash
# Tests scripts/check-text.sh on small git checkouts made here: it must fail,
# naming the file, on a broken link, a broken anchor and a history word, and
# pass on a clean set of files (anchors of repeated headings, <a id>, links
# in code blocks and to web pages). Usage: scripts/check-text-selftest.sh
set -euo pipefail
checker=$(cd "$(dirname "$0")" && pwd)/check-text.sh
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
failures=0

# Makes a git checkout named $1 holding the files given as NAME CONTENT pairs.
make_repo() {
  local dir=$work/$1
  shift
  mkdir -p "$dir/docs"
  while [ $# -gt 0 ]; do
    printf '%s\n' "$2" >"$dir/$1"
    shift 2
  done
  git -C "$dir" init -q
  git -C "$dir" add -A
  echo "$dir"
}

# expect pass|fail NAME WANT_TEXT DIR: runs the checker on DIR.
expect() {
  local want=$1 name=$2 text=$3 dir=$4 out rc=0
  out=$("$checker" "$dir" 2>&1) || rc=$?
  if [ "$want" = pass ] && [ $rc -ne 0 ]; then
    echo "FAIL $name: checker failed on clean files:"; echo "$out"; failures=$((failures + 1))
  elif [ "$want" = fail ] && [ $rc -ne 1 ]; then
    echo "FAIL $name: checker exited $rc, want 1:"; echo "$out"; failures=$((failures + 1))
  elif ! grep -qF -- "$text" <<<"$out"; then
    echo "FAIL $name: output lacks '$text':"; echo "$out"; failures=$((failures + 1))
  else
    echo "ok   $name"
  fi
}

target='# Guide

## Install it

## Install it

<a id="by-hand"></a>
## Numbers: 2×H200, `nccl-tests` (µs)'

expect fail "broken link" "README.md:3: link to docs/missing.md" "$(make_repo bad-link \
  README.md $'# Top\n\nsee [the guide](docs/missing.md)' docs/guide.md "$target")"

expect fail "broken anchor" "README.md:2: link to docs/guide.md#install-it-2" "$(make_repo bad-anchor \
  README.md $'# Top\n[second install](docs/guide.md#install-it-2)' docs/guide.md "$target")"

# Built from two parts so this file does not hold the word itself.
word="with""held"
expect fail "history word" "notes.rs:2:" "$(make_repo bad-word \
  notes.rs $'// Ring steps.\n// The machine was '"$word"$' here.' README.md '# Top')"

clean_readme='# Top
[guide](docs/guide.md), [first](docs/guide.md#install-it),
[repeat](docs/guide.md#install-it-1), [by hand](docs/guide.md#by-hand),
[numbers](docs/guide.md#numbers-2h200-nccl-tests-µs), [here](#top),
[web](https://example.com/none.md), [folder](docs/)
```sh
[not a link](nowhere.md)
```
`[code](nowhere.md)`'
expect pass "clean files" "check-text: OK" "$(make_repo clean \
  README.md "$clean_readme" docs/guide.md "$target" src.rs '// A run of 4 ranks; rank 3 sends.')"

if [ $failures -ne 0 ]; then
  echo "check-text-selftest: $failures failed"
  exit 1
fi
echo "check-text-selftest: OK"
