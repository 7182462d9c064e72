#!/usr/bin/env python3
"""Checks the vcpkg port and the Conan recipe offline (neither tool is reachable
from CI): the files parse and name the same package; the version CMake read
(the argument), the recipe's set_version() result, vcpkg.json's version and
the newest release in CHANGELOG.md agree; xxHash, msgpack-cxx and cppzmq are
dependencies of their components only; the port and the recipe's generate()
switch off every PROMPTCACHE_BUILD_* option CMakeLists.txt defines; and the
port's recorded source digest matches the checkout. The recipe's methods run
against a minimal stand-in of the Conan API (the few names the recipe imports),
to check, among others, what a default profile (gnu17) is told.

With --configure, it also configures (and installs, which compiles nothing)
what the two package managers build: the recipe's exports_sources copied alone,
with the cache variables its generate() sets and with the defaults, and the whole
checkout with the portfile's options; no developer part may be configured.

Usage: tests/check_packaging.py <cmake-version> [--configure <cmake> <c++ compiler> <work dir>]
"""
import ast
import fnmatch
import shutil
import subprocess
import importlib.util
import json
import pathlib
import re
import sys
import types

ROOT = pathlib.Path(__file__).resolve().parent.parent
failures = []


def check(cond, what):
    print(("ok   " if cond else "FAIL ") + what)
    if not cond:
        failures.append(what)


def check_vcpkg(version):
    port = json.loads((ROOT / "ports/promptcache/vcpkg.json").read_text())
    check(port.get("name") == "promptcache", "vcpkg.json names the port promptcache")
    port_version = port.get("version") or port.get("version-semver")
    check(port_version == version, f"vcpkg.json version {port_version} == CMake {version}")
    top = [d if isinstance(d, str) else d.get("name") for d in port.get("dependencies", [])]
    check("xxhash" not in top, "xxhash is not a dependency of the whole port")
    feature = port.get("features", {}).get("block-hash", {})
    xx = [d for d in feature.get("dependencies", []) if isinstance(d, dict) and d.get("name") == "xxhash"]
    check(len(xx) == 1 and xx[0].get("version>=") == "0.8.1",
          "feature block-hash depends on xxhash with version>= 0.8.1")
    check("block-hash" in port.get("default-features", []), "block-hash is a default feature")
    # The msgpack and ZeroMQ components: a feature each, needing the feature below it.
    for feature, dep, below in (("kv-event-wire", "msgpack", "block-hash"),
                                ("zmq-kv-subscriber", "cppzmq", "kv-event-wire")):
        deps = port.get("features", {}).get(feature, {}).get("dependencies", [])
        names = [d if isinstance(d, str) else d.get("name") for d in deps]
        self_dep = [d for d in deps if isinstance(d, dict) and d.get("name") == "promptcache"]
        check(dep in names and len(self_dep) == 1 and below in self_dep[0].get("features", []),
              f"feature {feature} depends on {dep} and on feature {below}")
        check(dep not in top, f"{dep} is not a dependency of the whole port")
    portfile = (ROOT / "ports/promptcache/portfile.cmake").read_text()
    check("set(VCPKG_BUILD_TYPE release)" in portfile, "portfile builds the release configuration only")
    # The port builds the whole checkout: every developer option must be off.
    port_options = dict(re.findall(r"-D(PROMPTCACHE_\w+)=(\w+)", portfile))
    for option in developer_options():
        check(port_options.get(option) == "OFF", f"portfile sets {option}=OFF (got {port_options.get(option)})")
    check(port_options.get("PROMPTCACHE_INSTALL") == "ON", "portfile sets PROMPTCACHE_INSTALL=ON")
    check("share/cmake/promptcache" in portfile, "portfile fixes up share/cmake/promptcache")
    check("source.sha512" in portfile and "FATAL_ERROR" in portfile,
          "portfile refuses a checkout that does not match source.sha512")
    sys.path.insert(0, str(ROOT / "scripts"))
    import amalgamate  # noqa: E402  (the one implementation of the digest)
    recorded = (ROOT / "ports/promptcache/source.sha512").read_text()
    check(recorded == amalgamate.port_source_hash(),
          "ports/promptcache/source.sha512 matches the headers (else run scripts/amalgamate.py)")
    usage = (ROOT / "ports/promptcache/usage").read_text()
    for component in ("block_hash", "kv_event_wire", "zmq_kv_subscriber"):
        check(f"promptcache::{component}" in usage and f"COMPONENTS {component}" in usage,
              f"usage shows the {component} component")


class _Settings:
    def __init__(self, values):
        self._values = values

    def get_safe(self, name):
        return self._values.get(name)

    def __getattr__(self, name):  # settings.compiler, settings.compiler.version
        prefix = name + "."
        sub = {k[len(prefix):]: v for k, v in self._values.items() if k.startswith(prefix)}
        if sub:
            s = _Settings(sub)
            s._str = self._values.get(name)
            return s
        if name in self._values:
            return self._values[name]
        raise AttributeError(name)

    def __str__(self):
        return str(getattr(self, "_str", ""))

    def __eq__(self, other):
        return str(self) == other


class _Options(dict):
    __getattr__ = dict.__getitem__


class _Components(dict):
    def __missing__(self, key):
        self[key] = _CppInfo()
        return self[key]


class _CppInfo:
    def __init__(self):
        self.properties = {}
        self.requires = []
        self.defines = []
        self.system_libs = []
        self.components = _Components()

    def set_property(self, key, value):
        self.properties[key] = value


class _ToolchainStub:
    """CMakeToolchain: records the cache variables generate() sets."""
    last = None

    def __init__(self, conanfile):
        self.cache_variables = {}
        self.variables = {}
        self.preprocessor_definitions = {}
        _ToolchainStub.last = self

    def generate(self):
        pass


def developer_options():
    """Every PROMPTCACHE_BUILD_* option the top-level CMakeLists.txt defines."""
    text = (ROOT / "CMakeLists.txt").read_text()
    options = re.findall(r"^\s*option\(\s*(PROMPTCACHE_BUILD_\w+)", text, re.M)
    check(len(options) >= 5, f"CMakeLists.txt defines the developer options ({', '.join(options)})")
    return options


def _load_recipe():
    """The recipe class, imported against a stand-in of the Conan API."""
    conan = types.ModuleType("conan")
    errors = types.ModuleType("conan.errors")

    class ConanInvalidConfiguration(Exception):
        pass

    errors.ConanInvalidConfiguration = ConanInvalidConfiguration

    class ConanFile:
        pass

    conan.ConanFile = ConanFile

    def check_min_cppstd(conanfile, minimum):  # as Conan's: "gnu17" is 17
        cppstd = conanfile.settings.get_safe("compiler.cppstd")
        if cppstd and int(re.sub(r"^gnu", "", cppstd)) < int(minimum):
            raise ConanInvalidConfiguration(
                f"Current cppstd ({cppstd}) is lower than the required C++ standard ({minimum}).")

    build = types.ModuleType("conan.tools.build")
    build.check_min_cppstd = check_min_cppstd
    cmake = types.ModuleType("conan.tools.cmake")
    files = types.ModuleType("conan.tools.files")
    for mod, names in ((cmake, ("CMake", "cmake_layout")), (files, ("copy", "rmdir"))):
        for n in names:
            setattr(mod, n, None)
    cmake.CMakeToolchain = _ToolchainStub
    files.load = lambda conanfile, path, encoding="utf-8": pathlib.Path(path).read_text(encoding=encoding)
    modules = {"conan": conan, "conan.errors": errors, "conan.tools": types.ModuleType("conan.tools"),
               "conan.tools.build": build, "conan.tools.cmake": cmake, "conan.tools.files": files}
    saved = {k: sys.modules.get(k) for k in modules}
    sys.modules.update(modules)
    try:
        spec = importlib.util.spec_from_file_location("promptcache_recipe", ROOT / "conanfile.py")
        recipe = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(recipe)
    finally:
        for k, v in saved.items():
            if v is None:
                sys.modules.pop(k, None)
            else:
                sys.modules[k] = v
    classes = [v for v in vars(recipe).values() if isinstance(v, type) and issubclass(v, ConanFile)
               and v is not ConanFile]
    return classes, ConanInvalidConfiguration


def _instance(cls, cppstd, with_block_hash=True, with_kv_event_wire=False, with_zmq_kv_subscriber=False):
    r = cls()
    r.settings = _Settings({"os": "Linux", "compiler": "gcc", "compiler.version": "12", "compiler.cppstd": cppstd})
    r.options = _Options(with_block_hash=with_block_hash, with_kv_event_wire=with_kv_event_wire,
                         with_zmq_kv_subscriber=with_zmq_kv_subscriber)
    r.cpp_info = _CppInfo()
    r.required = []
    r.requires = lambda ref: r.required.append(ref)
    return r


def check_conan(version):
    recipe_src = (ROOT / "conanfile.py").read_text()
    tree = ast.parse(recipe_src)  # raises (and fails the test) on a syntax error
    check(len([n for n in tree.body if isinstance(n, ast.ClassDef)]) == 1,
          "conanfile.py defines one recipe class")
    classes, invalid = _load_recipe()
    if len(classes) != 1:
        check(False, "the recipe class imports against the Conan API")
        return
    cls = classes[0]
    check(getattr(cls, "name", None) == "promptcache", "recipe name is promptcache")
    check(getattr(cls, "package_type", None) == "header-library", "recipe is a header-library")

    # The recipe's own set_version(), run against the recipe folder.
    r = _instance(cls, "20")
    r.recipe_folder = str(ROOT)
    r.version = None
    try:
        r.set_version()
    except Exception as e:  # noqa: BLE001  (a broken set_version is a failure, not a crash)
        check(False, f"the recipe's set_version() runs ({e!r})")
    check(r.version == version, f"recipe set_version() gives {r.version} == CMake {version}")

    # Every developer option the top-level CMakeLists.txt defines is switched off
    # by generate(): exports_sources holds only the library.
    r = _instance(cls, "20")
    r.generate()
    cache = _ToolchainStub.last.cache_variables if _ToolchainStub.last else {}
    for option in developer_options():
        check(cache.get(option) is False, f"recipe generate() sets {option}=False (got {cache.get(option)!r})")
    check(cache.get("PROMPTCACHE_INSTALL") is True, "recipe generate() sets PROMPTCACHE_INSTALL=True")

    # A default profile (gnu17) is refused with instructions; C++20 and later pass.
    try:
        _instance(cls, "gnu17").validate()
        message = None
    except invalid as e:
        message = str(e)
    check(message is not None and "-s compiler.cppstd=20" in message,
          f"a gnu17 profile is told to pass -s compiler.cppstd=20 (got: {message})")
    for ok_std in ("20", "gnu20", "23"):
        try:
            _instance(cls, ok_std).validate()
            passed = True
        except invalid:
            passed = False
        check(passed, f"compiler.cppstd={ok_std} is accepted")

    # xxHash belongs to the block_hash component only.
    for with_bh in (True, False):
        r = _instance(cls, "20", with_bh)
        r.requirements()
        r.package_info()
        comps = r.cpp_info.components
        core = comps.get("promptcache")
        check(core is not None and core.properties.get("cmake_target_name") == "promptcache::promptcache"
              and not core.requires, f"with_block_hash={with_bh}: promptcache::promptcache needs nothing")
        has_xx = any(ref.startswith("xxhash/") for ref in r.required)
        bh = comps.get("block_hash")
        if with_bh:
            check(has_xx and bh is not None
                  and bh.properties.get("cmake_target_name") == "promptcache::block_hash"
                  and "xxhash::xxhash" in bh.requires,
                  "with_block_hash=True: promptcache::block_hash requires xxhash::xxhash")
        else:
            check(not has_xx and bh is None, "with_block_hash=False: no xxhash, no block_hash component")

    # The msgpack and ZeroMQ components: one option each, off by default, each
    # adding its requirement and a component that requires the one below it.
    defaults = getattr(cls, "default_options", {})
    check(defaults.get("with_kv_event_wire") is False and defaults.get("with_zmq_kv_subscriber") is False,
          "with_kv_event_wire and with_zmq_kv_subscriber default to False")
    check(defaults.get("msgpack-cxx/*:use_boost") is False, "msgpack-cxx is required without Boost")
    r = _instance(cls, "20", True, True, True)
    r.validate()
    r.requirements()
    r.package_info()
    comps = r.cpp_info.components
    wire, zmq = comps.get("kv_event_wire"), comps.get("zmq_kv_subscriber")
    check(any(ref.startswith("msgpack-cxx/") for ref in r.required) and wire is not None
          and wire.properties.get("cmake_target_name") == "promptcache::kv_event_wire"
          and wire.properties.get("pkg_config_name") == "promptcache-kv-event-wire"
          and set(wire.requires) == {"block_hash", "msgpack-cxx::msgpack-cxx"},
          "with_kv_event_wire: promptcache::kv_event_wire requires block_hash and msgpack-cxx")
    check(any(ref.startswith("cppzmq/") for ref in r.required) and zmq is not None
          and zmq.properties.get("cmake_target_name") == "promptcache::zmq_kv_subscriber"
          and zmq.properties.get("pkg_config_name") == "promptcache-zmq-kv-subscriber"
          and set(zmq.requires) == {"kv_event_wire", "cppzmq::cppzmq"},
          "with_zmq_kv_subscriber: promptcache::zmq_kv_subscriber requires kv_event_wire and cppzmq")
    for bad in ((False, True, False), (True, False, True)):
        try:
            _instance(cls, "20", *bad).validate()
            refused = False
        except invalid:
            refused = True
        check(refused, f"options {bad} (a component without the one it needs) are refused")

    ast.parse((ROOT / "test_package/conanfile.py").read_text())
    check("find_package(promptcache CONFIG REQUIRED)" in (ROOT / "test_package/CMakeLists.txt").read_text(),
          "test_package consumes promptcache through find_package")


def check_changelog(version):
    """The newest released version in CHANGELOG.md is the version being built."""
    headings = re.findall(r"^## \[?(\d+\.\d+\.\d+)\]?", (ROOT / "CHANGELOG.md").read_text(), re.M)
    newest = headings[0] if headings else None
    check(newest == version, f"newest CHANGELOG.md release {newest} == CMake {version}")


def _cmake_value(value):
    return ("ON" if value else "OFF") if isinstance(value, bool) else str(value)


def _configure(cmake, cxx, source, build, options, what):
    """Configures source into build; returns the cache as a dict, or None on failure."""
    shutil.rmtree(build, ignore_errors=True)
    cmd = [cmake, "-S", str(source), "-B", str(build), f"-DCMAKE_CXX_COMPILER={cxx}"]
    cmd += [f"-D{k}={_cmake_value(v)}" for k, v in options.items()]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    check(proc.returncode == 0, f"{what}: configures" + ("" if proc.returncode == 0 else
                                                          f"\n{proc.stdout}\n{proc.stderr}"))
    if proc.returncode != 0:
        return None
    cache = {}
    for line in (pathlib.Path(build) / "CMakeCache.txt").read_text().splitlines():
        m = re.match(r"^(PROMPTCACHE_\w+):\w+=(.*)$", line)
        if m:
            cache[m.group(1)] = m.group(2)
    return cache


def _developer_parts_off(cache, what):
    on = [o for o in developer_options() if cache.get(o, "OFF").upper() not in ("OFF", "FALSE", "0", "")]
    check(not on, f"{what}: no developer part configured (ON: {', '.join(on) or 'none'})")


def _exported_sources(cls, dest):
    """Copies what the recipe's exports_sources selects (Conan matches each
    pattern with fnmatch against the path relative to the recipe folder)."""
    patterns = cls.exports_sources
    patterns = (patterns,) if isinstance(patterns, str) else tuple(patterns)
    shutil.rmtree(dest, ignore_errors=True)
    copied = 0
    for pattern in patterns:
        top = ROOT / pattern.split("/")[0]
        candidates = [top] if top.is_file() else (top.rglob("*") if top.is_dir() else [])
        for f in candidates:
            rel = f.relative_to(ROOT).as_posix()
            if f.is_file() and fnmatch.fnmatch(rel, pattern):
                (dest / rel).parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(f, dest / rel)
                copied += 1
    return copied


def check_configure(cmake, cxx, work):
    work = pathlib.Path(work)
    classes, _ = _load_recipe()
    if len(classes) != 1:
        check(False, "the recipe class imports against the Conan API")
        return
    cls = classes[0]
    src = work / "conan_sources"
    check(_exported_sources(cls, src) > 0, f"recipe exports_sources copied to {src}")
    r = _instance(cls, "20")
    r.generate()
    recipe_vars = _ToolchainStub.last.cache_variables
    cache = _configure(cmake, cxx, src, work / "conan_build", recipe_vars,
                       "exports_sources with the recipe's cache variables")
    if cache is not None:
        _developer_parts_off(cache, "exports_sources with the recipe's cache variables")
        proc = subprocess.run([cmake, "--install", str(work / "conan_build"), "--prefix",
                               str(work / "conan_prefix")], capture_output=True, text=True)
        config = work / "conan_prefix/share/cmake/promptcache/promptcacheConfig.cmake"
        check(proc.returncode == 0 and config.is_file(),
              f"exports_sources installs the CMake package\n{proc.stderr}".rstrip())
    cache = _configure(cmake, cxx, src, work / "conan_defaults", {}, "exports_sources with default options")
    if cache is not None:
        _developer_parts_off(cache, "exports_sources with default options")

    # The port configures the whole checkout with its options.
    port_options = dict(re.findall(r"-D(PROMPTCACHE_\w+)=(\w+)",
                                   (ROOT / "ports/promptcache/portfile.cmake").read_text()))
    cache = _configure(cmake, cxx, ROOT, work / "vcpkg_build", port_options, "the checkout with the port's options")
    if cache is not None:
        _developer_parts_off(cache, "the checkout with the port's options")
    # The tools follow the values of the tests and examples options, not their defaults.
    off = {"PROMPTCACHE_BUILD_TESTS": False, "PROMPTCACHE_BUILD_BENCHMARKS": False,
           "PROMPTCACHE_BUILD_EXAMPLES": False}
    cache = _configure(cmake, cxx, ROOT, work / "no_tests_no_examples", off,
                       "the checkout with tests, benchmarks and examples OFF")
    if cache is not None:
        _developer_parts_off(cache, "the checkout with tests, benchmarks and examples OFF")


def main(version, configure=None):
    check_changelog(version)
    check_vcpkg(version)
    check_conan(version)
    if configure:
        check_configure(*configure)
    print(f"{len(failures)} failed")
    return 1 if failures else 0


if __name__ == "__main__":
    args = sys.argv[1:]
    if len(args) == 5 and args[1] == "--configure":
        sys.exit(main(args[0], args[2:]))
    if len(args) != 1:
        sys.exit(__doc__)
    sys.exit(main(args[0]))
