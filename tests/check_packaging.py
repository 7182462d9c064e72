#!/usr/bin/env python3
"""Checks the vcpkg port and the Conan recipe offline (neither tool is reachable
from CI): the files parse, name the same package, depend on xxHash, and carry
the version CMake read from version.hpp.

Usage: tests/check_packaging.py <cmake-version>
"""
import ast
import json
import pathlib
import re
import sys

ROOT = pathlib.Path(__file__).resolve().parent.parent
failures = []


def check(cond, what):
    print(("ok   " if cond else "FAIL ") + what)
    if not cond:
        failures.append(what)


def main(version):
    port = json.loads((ROOT / "ports/promptcache/vcpkg.json").read_text())
    check(port.get("name") == "promptcache", "vcpkg.json names the port promptcache")
    port_version = port.get("version-semver") or port.get("version")
    check(port_version == version, f"vcpkg.json version {port_version} == CMake {version}")
    deps = [d if isinstance(d, str) else d.get("name") for d in port.get("dependencies", [])]
    check("xxhash" in deps, "vcpkg.json depends on xxhash")
    portfile = (ROOT / "ports/promptcache/portfile.cmake").read_text()
    check("share/cmake/promptcache" in portfile, "portfile fixes up share/cmake/promptcache")

    recipe_src = (ROOT / "conanfile.py").read_text()
    tree = ast.parse(recipe_src)  # raises (and fails the test) on a syntax error
    classes = [n for n in tree.body if isinstance(n, ast.ClassDef)]
    check(len(classes) == 1, "conanfile.py defines one recipe class")
    attrs = {}
    for node in classes[0].body if classes else []:
        if isinstance(node, ast.Assign) and isinstance(node.value, ast.Constant):
            for t in node.targets:
                if isinstance(t, ast.Name):
                    attrs[t.id] = node.value.value
    check(attrs.get("name") == "promptcache", "recipe name is promptcache")
    check(attrs.get("package_type") == "header-library", "recipe is a header-library")
    check(re.search(r'requires\("xxhash/', recipe_src) is not None, "recipe requires xxhash")
    check("check_min_cppstd(self, 20)" in recipe_src, "recipe validates C++20")
    check('"cmake_target_name", "promptcache::promptcache"' in recipe_src,
          "recipe exports the promptcache::promptcache target")

    # The recipe's set_version reads version.hpp: apply the same regexes here.
    header = (ROOT / "include/promptcache/version.hpp").read_text()
    parts = [re.search(rf"#define PROMPTCACHE_VERSION_{p} (\d+)", header).group(1)
             for p in ("MAJOR", "MINOR", "PATCH")]
    check(".".join(parts) == version, f"recipe version {'.'.join(parts)} == CMake {version}")
    check("set_version" in recipe_src and "version.hpp" in recipe_src,
          "recipe takes its version from version.hpp")

    ast.parse((ROOT / "test_package/conanfile.py").read_text())
    check("find_package(promptcache CONFIG REQUIRED)" in (ROOT / "test_package/CMakeLists.txt").read_text(),
          "test_package consumes promptcache through find_package")

    print(f"{len(failures)} failed")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
