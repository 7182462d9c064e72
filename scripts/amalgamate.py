#!/usr/bin/env python3
"""Generate single_include/promptcache/<name>.hpp from include/promptcache/.

Each public header becomes one self-contained file: every promptcache header
it includes (directly or not) is inlined once, in include order; system
headers stay as #include lines. The output is deterministic, so `--check`
(used by the tests) can compare it byte for byte with what is checked in.

Usage: scripts/amalgamate.py [--check]
"""
import pathlib
import re
import sys

ROOT = pathlib.Path(__file__).resolve().parent.parent
SRC = ROOT / "include"
OUT = ROOT / "single_include" / "promptcache"
INCLUDE = re.compile(r'^\s*#\s*include\s*([<"])([^>"]+)[>"]')
PRAGMA_ONCE = re.compile(r"^\s*#\s*pragma\s+once\b")


def resolve(name: str, quote: str, current: pathlib.Path):
    """The promptcache header an #include names, or None for a system header."""
    candidates = []
    if quote == '"':
        candidates.append(current.parent / name)
    candidates.append(SRC / name)
    for c in candidates:
        c = c.resolve()
        if c.is_file() and SRC in c.parents:
            return c
    return None


def inline(path: pathlib.Path, seen: set, out: list) -> None:
    if path in seen:
        return
    seen.add(path)
    rel = path.relative_to(SRC).as_posix()
    # A guard per inlined header, so two single-include files that both carry
    # (say) cursor.hpp can be included into one translation unit.
    guard = "PROMPTCACHE_SINGLE_INCLUDE_" + re.sub(r"[^A-Za-z0-9]", "_", rel).upper()
    out.append(f"// ---- begin {rel} ----\n#ifndef {guard}\n#define {guard}\n")
    for line in path.read_text(encoding="utf-8").splitlines(keepends=True):
        if PRAGMA_ONCE.match(line):
            continue
        m = INCLUDE.match(line)
        target = resolve(m.group(2), m.group(1), path) if m else None
        if target is not None:
            inline(target, seen, out)
            continue
        out.append(line)
    if out and not out[-1].endswith("\n"):
        out.append("\n")
    out.append(f"#endif  // {guard}\n// ---- end {rel} ----\n")


def amalgamate(header: pathlib.Path) -> str:
    out = [
        f"// promptcache single-include header generated from include/promptcache/{header.name}\n",
        "// by scripts/amalgamate.py. Do not edit: edit the sources and regenerate.\n",
        "#pragma once\n",
    ]
    inline(header.resolve(), set(), out)
    return "".join(out)


def main(argv):
    check = "--check" in argv[1:]
    headers = sorted((SRC / "promptcache").glob("*.hpp"))
    expected = {OUT / h.name: amalgamate(h) for h in headers}
    stale = []
    for path, text in expected.items():
        current = path.read_text(encoding="utf-8") if path.is_file() else None
        if current != text:
            stale.append(path)
            if not check:
                path.parent.mkdir(parents=True, exist_ok=True)
                path.write_text(text, encoding="utf-8", newline="\n")
    extra = [p for p in OUT.glob("*.hpp") if p not in expected] if OUT.is_dir() else []
    for p in extra:
        stale.append(p)
        if not check:
            p.unlink()
    if check:
        for p in stale:
            print(f"out of date: {p.relative_to(ROOT)}", file=sys.stderr)
        if stale:
            print("run scripts/amalgamate.py to regenerate single_include/", file=sys.stderr)
            return 1
        print(f"single_include/ is up to date ({len(expected)} headers)")
        return 0
    print(f"wrote {len(stale)} of {len(expected)} headers to {OUT.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
