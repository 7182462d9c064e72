#!/usr/bin/env python3
"""Checks the documentation: every relative link of README.md, CHANGELOG.md and
docs/*.md points at a file that exists (and, with #anchor, at a heading of
that file, GitHub's "-1", "-2" suffixes for repeated headings included); every
repository path written in backticks or in a shell block (examples/...,
include/..., docs/..., ...) exists; every public header has its page
docs/<header>.md, listed in the docs index and in the README's table of
headers; every CMake target that table names is defined by CMakeLists.txt or
cmake/*.cmake; every test that a row of docs/bad_input.md names exists; and no
file of the repository uses words that only make sense inside the team that
wrote it.

Usage: tests/check_docs.py
"""
import pathlib
import re
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parent.parent
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")
# Words a reader outside the team cannot place (written split, so this file
# does not match itself).
INTERNAL = [r"seed" + r" 00", r"the " + r"issue\b", r"issues " + r"are silent", r"issue" + r" [0-9]",
            r"\bsess" + r"ion\b"]
failures = []


def fail(what):
    print("FAIL " + what)
    failures.append(what)


def anchors(md: pathlib.Path):
    """The anchors GitHub gives the headings of `md`: the second heading with
    the same slug gets "-1", the third "-2", and so on."""
    out = set()
    seen = {}
    text = re.sub(r"^```.*?^```", "", md.read_text(encoding="utf-8"), flags=re.S | re.M)
    for line in text.splitlines():
        m = re.match(r"^#+\s+(.*)$", line)
        if m:
            slug = re.sub(r"[^\w\- ]", "", m.group(1).strip().lower()).replace(" ", "-")
            n = seen.get(slug, 0)
            seen[slug] = n + 1
            out.add(slug if n == 0 else f"{slug}-{n}")
    return out


# A repository path: one of these directories, then path characters.
REPO_PATH = re.compile(r"^(?:examples|scripts|include|docs|tests|bench|tools|cmake|ports|single_include)/"
                       r"[\w.*/+-]*$")


def check_paths(md: pathlib.Path):
    """Every `repository/path` in inline code, and every such word of a sh
    block, names a file or directory that exists, or a program built from
    path.cpp (a * is a glob; a trailing :N line number is dropped)."""
    text = md.read_text(encoding="utf-8")
    words = []
    for block in re.findall(r"^```(?:sh|bash|console)[ \t]*\n(.*?)^```", text, flags=re.S | re.M):
        words += block.split()
    prose = re.sub(r"^```.*?^```", "", text, flags=re.S | re.M)
    for code in re.findall(r"`([^`\n]+)`", prose):
        words += code.split()
    for word in words:
        path = re.sub(r":\d+(?:-\d+)?$", "", word.rstrip(".,;:)"))
        if not REPO_PATH.match(path):
            continue
        found = (any(ROOT.glob(path.rstrip("/"))) if "*" in path
                 else (ROOT / path).exists() or (ROOT / f"{path}.cpp").is_file())
        if not found:
            fail(f"{md.relative_to(ROOT)}: no {path} in the repository")


def check_readme_targets(readme: str):
    """The last column of the README's table of headers names CMake targets
    (`promptcache::name`); each must be defined: an ALIAS or a component of
    that name in CMakeLists.txt or cmake/*.cmake (a text check)."""
    cmake = "\n".join(p.read_text(encoding="utf-8")
                      for p in [ROOT / "CMakeLists.txt", *sorted((ROOT / "cmake").glob("*.cmake"))])
    section = readme.split("\n## Headers", 1)[-1].split("\n## ", 1)[0]
    rows = [line for line in section.splitlines() if line.startswith("| [")]
    if not rows:
        fail("README.md: no table of headers under ## Headers")
    for line in rows:
        for name in re.findall(r"`promptcache::(\w+)`", line.rstrip().rstrip("|").rsplit(" | ", 1)[-1]):
            if not re.search(rf"add_library\(promptcache::{name}\s+ALIAS\b"
                             rf"|promptcache_add_component\(\s*{name}\b", cmake):
                fail(f"README.md: table of headers names promptcache::{name}, "
                     "which no CMake file defines")


def check_links(md: pathlib.Path):
    text = re.sub(r"```.*?```", "", md.read_text(encoding="utf-8"), flags=re.S)
    for target in LINK.findall(text):
        if re.match(r"^[a-z]+:", target):
            continue  # an absolute URL
        path, _, anchor = target.partition("#")
        dest = (md.parent / path).resolve() if path else md
        if not dest.exists():
            fail(f"{md.relative_to(ROOT)}: link to missing {target}")
        elif anchor and dest.suffix == ".md" and anchor not in anchors(dest):
            fail(f"{md.relative_to(ROOT)}: no heading for #{anchor} in {path or md.name}")


def test_cases(cache, name):
    """The TEST_CASE names of tests/<name> (None when there is no such file)."""
    if name not in cache:
        path = ROOT / "tests" / name
        cache[name] = (set(re.findall(r'TEST_CASE\(\s*"((?:[^"\\]|\\.)*)"',
                                      path.read_text(encoding="utf-8")))
                       if path.is_file() else None)
    return cache[name]


def check_bad_input_tests():
    """Each row's last cell names tests as `file` › name; name; `file` › name ...
    (test names may hold "; " themselves), a file outside tests/, or "none"."""
    md = ROOT / "docs/bad_input.md"
    cache = {}
    for n, line in enumerate(md.read_text(encoding="utf-8").splitlines(), 1):
        if not line.startswith("| ") or line.startswith(("|---", "| operation |")):
            continue
        cell = line.rstrip().rstrip("|").rsplit(" | ", 1)[-1].strip()
        if cell == "none":
            continue
        segs = cell.split("; ")
        i, current = 0, None
        while i < len(segs):
            m = re.match(r"`([^`]+)` › (.*)$", segs[i])
            if m:
                current, first = m.group(1), m.group(2)
            elif segs[i].startswith("`"):
                other = re.match(r"`([^`]+)`", segs[i]).group(1)
                if not (ROOT / other).exists():
                    fail(f"docs/bad_input.md:{n}: no file {other}")
                current, i = None, i + 1
                continue
            else:
                first = segs[i]
            cases = test_cases(cache, current) if current else None
            if cases is None:
                fail(f"docs/bad_input.md:{n}: no test file for '{segs[i]}'")
                i += 1
                continue
            for j in range(i, len(segs)):
                name = re.sub(r"\s*\(section[^)]*\)$", "", "; ".join([first] + segs[i + 1:j + 1]))
                if name in cases:
                    i = j + 1
                    break
            else:
                fail(f"docs/bad_input.md:{n}: tests/{current} has no test case '{first}'")
                i += 1


def main():
    docs = sorted((ROOT / "docs").glob("*.md"))
    for md in [ROOT / "README.md", ROOT / "CHANGELOG.md", *docs]:
        check_links(md)
    for md in [ROOT / "README.md", *docs]:
        check_paths(md)

    check_bad_input_tests()

    index = (ROOT / "docs/README.md").read_text(encoding="utf-8")
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    check_readme_targets(readme)
    for header in sorted((ROOT / "include/promptcache").glob("*.hpp")):
        page = f"{header.stem}.md"
        if not (ROOT / "docs" / page).is_file():
            fail(f"no docs/{page} for include/promptcache/{header.name}")
        if f"]({page})" not in index:
            fail(f"docs/README.md does not list {page}")
        if f"(docs/{page})" not in readme:
            fail(f"README.md's table of headers does not link docs/{page}")

    try:
        files = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True,
                               check=True).stdout.split()
    except (OSError, subprocess.CalledProcessError):  # not a git checkout
        files = [p.relative_to(ROOT).as_posix() for p in ROOT.rglob("*")
                 if not any(part.startswith(("build", ".git")) for part in p.relative_to(ROOT).parts)]
    pattern = re.compile("|".join(INTERNAL), re.I)
    for name in files:
        path = ROOT / name
        if not path.is_file() or path.suffix not in {".md", ".hpp", ".cpp", ".h", ".py", ".txt",
                                                     ".cmake", ".in", ".json", ""}:
            continue
        try:
            lines = path.read_text(encoding="utf-8").splitlines()
        except UnicodeDecodeError:
            continue
        for n, line in enumerate(lines, 1):
            if pattern.search(line):
                fail(f"{name}:{n}: internal wording: {line.strip()[:100]}")

    print(f"{len(failures)} failed")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
