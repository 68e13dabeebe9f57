#!/usr/bin/env python3
"""Checks the relative links of Markdown files: `[text](path)` and
`[text](path#anchor)` must name a file or folder that exists, and an anchor
must be a heading of the target Markdown file (GitHub's slugs) or an explicit
`<a id=...>`/`<a name=...>` there. Links to http(s):, mailto: and other
schemes are not followed. Code blocks and code spans are skipped.

Usage: check-links.py ROOT FILE.md...   (FILE relative to ROOT)
Prints FILE:LINE: what is wrong, one a line; exits 1 if anything was.
"""
import os
import re
import sys
import unicodedata
import urllib.parse

LINK = re.compile(r"!?\[[^\]]*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
FENCE = re.compile(r"^\s{0,3}(```|~~~)")
CODE_SPAN = re.compile(r"(`+).*?\1")
ATX_HEADING = re.compile(r"^\s{0,3}#{1,6}\s+(.*?)(?:\s+#+)?\s*$")
EXPLICIT_ANCHOR = re.compile(r"<a\s[^>]*\b(?:id|name)\s*=\s*[\"']?([^\"'\s>]+)", re.I)
SCHEME = re.compile(r"^[a-zA-Z][a-zA-Z0-9+.-]*:")


def text_lines(path):
    """(line number, text) of the lines outside fenced code blocks."""
    fence = None
    with open(path, encoding="utf-8") as f:
        for number, line in enumerate(f, 1):
            m = FENCE.match(line)
            if m:
                if fence is None:
                    fence = m.group(1)
                elif m.group(1) == fence:
                    fence = None
                continue
            if fence is None:
                yield number, line.rstrip("\n")


def slug(heading):
    """GitHub's anchor for a heading: the rendered text lowercased, letters,
    digits, hyphens, underscores and spaces kept, spaces made hyphens."""
    text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # links -> their text
    text = re.sub(r"<[^>]+>", "", text)  # inline HTML
    text = text.replace("`", "").replace("*", "")
    kept = []
    for ch in text.strip().lower():
        category = unicodedata.category(ch)
        if ch in "-_ " or category[0] in "LNM":
            kept.append("-" if ch == " " else ch)
    return "".join(kept)


def anchors(path):
    """Every anchor of a Markdown file: heading slugs (repeats get -1, -2,
    ...) and explicit <a id/name>."""
    found = set()
    counts = {}
    for _, line in text_lines(path):
        for m in EXPLICIT_ANCHOR.finditer(line):
            found.add(m.group(1))
        m = ATX_HEADING.match(line)
        if not m:
            continue
        base = slug(m.group(1))
        s = base
        while s in found:
            counts[base] = counts.get(base, 0) + 1
            s = f"{base}-{counts[base]}"
        found.add(s)
    return found


def check(root, md_file, anchor_cache):
    problems = []
    here = os.path.dirname(md_file)
    for number, line in text_lines(os.path.join(root, md_file)):
        for m in LINK.finditer(CODE_SPAN.sub("", line)):
            target = m.group(1)
            if SCHEME.match(target):
                continue
            path, _, anchor = target.partition("#")
            path = urllib.parse.unquote(path)
            if path.startswith("/"):
                rel = os.path.normpath(path.lstrip("/"))
            elif path:
                rel = os.path.normpath(os.path.join(here, path))
            else:
                rel = md_file
            where = f"{md_file}:{number}"
            full = os.path.join(root, rel)
            if not os.path.exists(full):
                problems.append(f"{where}: link to {target}: no such file ({rel})")
                continue
            if not anchor or not rel.endswith(".md"):
                continue
            if rel not in anchor_cache:
                anchor_cache[rel] = anchors(full)
            if urllib.parse.unquote(anchor).lower() not in anchor_cache[rel]:
                problems.append(f"{where}: link to {target}: no heading or <a id> '#{anchor}' in {rel}")
    return problems


def main(argv):
    if len(argv) < 2:
        print(__doc__.strip(), file=sys.stderr)
        return 2
    root, files = argv[1], argv[2:]
    cache = {}
    problems = [p for f in files for p in check(root, f, cache)]
    for p in problems:
        print(p)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
