#!/usr/bin/env python3
"""Generate single_include/promptcache/<name>.hpp from include/promptcache/.

Each public header becomes one self-contained file: every promptcache header
it includes (directly or not) is inlined once, in include order; system
headers stay as #include lines. The output is deterministic, so `--check`
(used by the tests) can compare it byte for byte with what is checked in.

Include guards: a copied single header and the include/ headers can meet in
one translation unit (a vendored copy plus a dependency that uses the
installed package), so both use the same guard for the same header:
PROMPTCACHE_<PATH>_HPP, e.g. PROMPTCACHE_CURSOR_HPP or
PROMPTCACHE_DETAIL_MISMATCH_HPP. Every public header carries it right after
the C++20 check, written so a C++17 build stops at the check's #error instead
of compiling the body:

    #pragma once

    #if (defined(_MSVC_LANG) ? _MSVC_LANG : __cplusplus) < 202002L
    #error "promptcache requires C++20 (compile with -std=c++20 or /std:c++20)"
    #endif
    #if !defined(PROMPTCACHE_CURSOR_HPP) && (defined(_MSVC_LANG) ? _MSVC_LANG : __cplusplus) >= 202002L
    #define PROMPTCACHE_CURSOR_HPP
    ...
    #endif  // PROMPTCACHE_CURSOR_HPP

A detail header needs its own guard (`#ifndef` / `#define` after `#pragma
once`, `#endif` last) once two public headers reach it on their own paths; a
detail header that only one public header reaches is skipped together with it. The generated
files wrap every inlined header in its guard. Without --check, missing guards
are added to the include/ headers (and reported); --check reports them.

Also keeps ports/promptcache/source.sha512 (the digest of the files the
vcpkg port installs, see ports/promptcache/source_hash.cmake) up to date, so
the port's ABI hash changes whenever the headers do.

Usage: scripts/amalgamate.py [--check]
"""
import hashlib
import pathlib
import re
import sys

ROOT = pathlib.Path(__file__).resolve().parent.parent
SRC = ROOT / "include"
OUT = ROOT / "single_include" / "promptcache"
PORT_HASH = ROOT / "ports" / "promptcache" / "source.sha512"
INCLUDE = re.compile(r'^\s*#\s*include\s*([<"])([^>"]+)[>"]')
PRAGMA_ONCE = re.compile(r"^\s*#\s*pragma\s+once\b")
CXX = "(defined(_MSVC_LANG) ? _MSVC_LANG : __cplusplus)"
PROLOGUE = (
    "#pragma once\n\n"
    f"#if {CXX} < 202002L\n"
    '#error "promptcache requires C++20 (compile with -std=c++20 or /std:c++20)"\n'
    "#endif\n"
)


def guard_name(path: pathlib.Path) -> str:
    rel = path.relative_to(SRC / "promptcache").as_posix()
    return "PROMPTCACHE_" + re.sub(r"[^A-Za-z0-9]", "_", rel).upper()


def is_public(path: pathlib.Path) -> bool:
    return path.parent == SRC / "promptcache"


def guard_open(path: pathlib.Path) -> str:
    g = guard_name(path)
    if is_public(path):
        line = f"#if !defined({g}) && {CXX} >= 202002L"
        if len(line) > 100:  # broken where clang-format breaks it (ColumnLimit: 100)
            line = f"#if !defined({g}) && \\\n    {CXX} >= 202002L"
        return f"{line}\n#define {g}\n"
    return f"#ifndef {g}\n#define {g}\n"


def guard_close(path: pathlib.Path) -> str:
    return f"#endif  // {guard_name(path)}\n"


def has_guard(path: pathlib.Path, text: str) -> bool:
    return guard_open(path) in text and text.rstrip("\n").endswith(guard_close(path).rstrip("\n"))


def add_guard(path: pathlib.Path, text: str) -> str:
    """The header with its guard: opened after the C++20 check (public) or after
    #pragma once (detail), closed at the end of the file."""
    anchor = PROLOGUE if is_public(path) else "#pragma once\n"
    if anchor not in text:
        raise SystemExit(f"{path.relative_to(ROOT)}: expected this at its top:\n{anchor}")
    at = text.index(anchor) + len(anchor)
    return text[:at] + guard_open(path) + text[at:].rstrip("\n") + "\n\n" + guard_close(path)


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


def includes(path: pathlib.Path):
    for line in path.read_text(encoding="utf-8").splitlines():
        m = INCLUDE.match(line)
        target = resolve(m.group(2), m.group(1), path) if m else None
        if target is not None:
            yield target


def needs_guard(all_headers):
    """Public headers, and detail headers that two public headers reach on their
    own (not through another public header, whose guard would cover them)."""
    reached_by = {}
    for public in (h for h in all_headers if is_public(h)):
        stack, seen = [public], {public}
        while stack:
            for t in includes(stack.pop()):
                if t not in seen and not is_public(t):
                    seen.add(t)
                    stack.append(t)
                    reached_by.setdefault(t, set()).add(public)
    return [h for h in all_headers if is_public(h) or len(reached_by.get(h, ())) >= 2]


def inline(path: pathlib.Path, seen: set, out: list) -> None:
    if path in seen:
        return
    seen.add(path)
    rel = path.relative_to(SRC).as_posix()
    text = path.read_text(encoding="utf-8")
    own_guard = has_guard(path, text)
    out.append(f"// ---- begin {rel} ----\n")
    if not own_guard:
        out.append(guard_open(path))
    for line in text.splitlines(keepends=True):
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
    if not own_guard:
        out.append(guard_close(path))
    out.append(f"// ---- end {rel} ----\n")


def amalgamate(header: pathlib.Path) -> str:
    out = [
        "// promptcache single-include header, generated by scripts/amalgamate.py\n",
        f"// from include/promptcache/{header.name}.\n",
        "// Do not edit: edit the sources and regenerate.\n",
        "#pragma once\n",
    ]
    inline(header.resolve(), set(), out)
    # Inlined includes leave their blank lines behind; keep at most one in a
    # row, as clang-format does, so the output stays clang-format clean.
    return re.sub(r"\n{3,}", "\n\n", "".join(out))


def port_source_files():
    """What the vcpkg port builds from; must match ports/promptcache/source_hash.cmake."""
    files = [ROOT / "CMakeLists.txt", ROOT / "LICENSE"]
    files += sorted((ROOT / "cmake").glob("*"))
    files += sorted(SRC.rglob("*.hpp"))
    return sorted((f for f in files if f.is_file()), key=lambda f: f.relative_to(ROOT).as_posix())


def port_source_hash() -> str:
    manifest = "".join(
        f"{hashlib.sha512(f.read_bytes()).hexdigest()}  {f.relative_to(ROOT).as_posix()}\n"
        for f in port_source_files())
    return hashlib.sha512(manifest.encode()).hexdigest() + "\n"


def main(argv):
    check = "--check" in argv[1:]
    problems = []

    all_headers = sorted(p.resolve() for p in (SRC / "promptcache").rglob("*.hpp"))
    for h in needs_guard(all_headers):
        text = h.read_text(encoding="utf-8")
        if has_guard(h, text):
            continue
        if check:
            problems.append(f"missing include guard {guard_name(h)}: {h.relative_to(ROOT)}")
        else:
            h.write_text(add_guard(h, text), encoding="utf-8", newline="\n")
            print(f"added include guard {guard_name(h)} to {h.relative_to(ROOT)}")

    headers = sorted((SRC / "promptcache").glob("*.hpp"))
    expected = {OUT / h.name: amalgamate(h) for h in headers}
    expected[PORT_HASH] = port_source_hash()
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
        problems += [f"out of date: {p.relative_to(ROOT)}" for p in stale]
        for p in problems:
            print(p, file=sys.stderr)
        if problems:
            print("run scripts/amalgamate.py to fix include guards and regenerate single_include/",
                  file=sys.stderr)
            return 1
        print(f"single_include/ and the port's source hash are up to date ({len(headers)} headers)")
        return 0
    print(f"wrote {len(stale)} of {len(expected)} files (single_include/, {PORT_HASH.relative_to(ROOT)})")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
