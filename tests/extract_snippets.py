#!/usr/bin/env python3
"""Writes the C++ snippets of the documentation that are marked to be compiled
(a fence opened with ```cpp compile) to one .cpp file each, so the build
compiles them with the project's warnings and the tests run those that have a
main(). Each marked snippet is a complete translation unit.

Usage: tests/extract_snippets.py <output-dir> <markdown files...>
Prints one line per snippet: <name>|<has main: 0 or 1>|<headers>, the last
field the promptcache headers it includes (e.g. "kv_index kv_event_wire"), from
which the build picks the optional target a snippet needs. Rewrites a file
only when its content changed, so an unchanged snippet is not rebuilt.
"""
import pathlib
import re
import sys

FENCE = re.compile(r"^```cpp[ \t]+compile[ \t]*$")


def snippets(path: pathlib.Path):
    lines = path.read_text(encoding="utf-8").splitlines(keepends=True)
    i = 0
    while i < len(lines):
        if FENCE.match(lines[i].rstrip("\n")):
            start = i + 1
            j = start
            while j < len(lines) and lines[j].rstrip() != "```":
                j += 1
            if j == len(lines):
                raise SystemExit(f"{path}:{i + 1}: unterminated ```cpp compile block")
            yield start + 1, "".join(lines[start:j])
            i = j
        i += 1


def main(argv):
    out_dir = pathlib.Path(argv[1])
    out_dir.mkdir(parents=True, exist_ok=True)
    root = pathlib.Path.cwd()
    written = set()
    for md in argv[2:]:
        md = pathlib.Path(md)
        stem = re.sub(r"[^A-Za-z0-9]", "_", md.resolve().relative_to(root.resolve()).with_suffix("").as_posix())
        for line, code in snippets(md):
            name = f"snippet_{stem}_{line}".lower()
            target = out_dir / f"{name}.cpp"
            text = f"// From {md.as_posix()}, line {line}.\n#line {line} \"{md.resolve().as_posix()}\"\n{code}"
            if not target.is_file() or target.read_text(encoding="utf-8") != text:
                target.write_text(text, encoding="utf-8")
            written.add(target)
            has_main = re.search(r"\bint\s+main\s*\(", code) is not None
            headers = re.findall(r"^\s*#\s*include\s*[<\"]promptcache/(\w+)\.hpp[>\"]", code, re.M)
            print(f"{name}|{int(has_main)}|{' '.join(headers)}")
    for stale in out_dir.glob("*.cpp"):
        if stale not in written:
            stale.unlink()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
