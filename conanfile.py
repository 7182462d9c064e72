import os
import re

from conan import ConanFile
from conan.errors import ConanInvalidConfiguration
from conan.tools.build import check_min_cppstd
from conan.tools.cmake import CMake, CMakeToolchain, cmake_layout
from conan.tools.files import copy, load, rmdir


class PromptcacheConan(ConanFile):
    name = "promptcache"
    description = ("Header-only C++20 library for reusing KV-cache work in LLM inference: a "
                   "prompt-prefix cache pool and a paged prefix cache for engines; Dynamo-compatible "
                   "block hashing, a KV-block index, cache-aware routing and vLLM / SGLang KV event "
                   "decoding (msgpack, ZeroMQ) for routers.")
    license = "Apache-2.0"
    topics = ("llm", "kv-cache", "prompt-cache", "inference", "header-only")
    package_type = "header-library"
    settings = "os", "arch", "compiler", "build_type"
    # Each header family with a third-party dependency is a component with an
    # option: block_hash (block_hash.hpp, paged_prefix_cache.hpp: xxHash),
    # kv_event_wire (kv_event_wire.hpp, dynamo_kv_event.hpp, kv_index_snapshot.hpp:
    # msgpack-cxx, without Boost, and xxHash)
    # and zmq_kv_subscriber (zmq_kv_subscriber.hpp: the above, cppzmq, libzmq; the option
    # also gives kv_event_publisher, kv_event_publisher.hpp, which needs the same).
    # The other headers (promptcache::promptcache) need only the standard library.
    options = {"with_block_hash": [True, False], "with_kv_event_wire": [True, False],
               "with_zmq_kv_subscriber": [True, False]}
    default_options = {"with_block_hash": True, "with_kv_event_wire": False,
                       "with_zmq_kv_subscriber": False, "msgpack-cxx/*:use_boost": False}
    exports_sources = ("CMakeLists.txt", "LICENSE", "cmake/*", "include/*")
    no_copy_source = True

    def set_version(self):
        # include/promptcache/version.hpp is the single source of the version.
        header = load(self, os.path.join(self.recipe_folder, "include", "promptcache", "version.hpp"))
        parts = [re.search(rf"#define PROMPTCACHE_VERSION_{p} (\d+)", header).group(1)
                 for p in ("MAJOR", "MINOR", "PATCH")]
        self.version = ".".join(parts)

    def requirements(self):
        if self.options.with_block_hash:
            self.requires("xxhash/[>=0.8.1 <0.9]")
        if self.options.with_kv_event_wire:
            self.requires("msgpack-cxx/[>=4.1 <8]")
        if self.options.with_zmq_kv_subscriber:
            self.requires("cppzmq/[>=4.8 <5]")

    def validate(self):
        # Conan's default profiles say compiler.cppstd=gnu17; say how to fix it.
        try:
            check_min_cppstd(self, 20)
        except ConanInvalidConfiguration as e:
            raise ConanInvalidConfiguration(
                f"promptcache is a C++20 library, but this profile has compiler.cppstd="
                f"{self.settings.get_safe('compiler.cppstd')}. Build and consume it with C++20 or "
                "later: add -s compiler.cppstd=20 (or gnu20, 23, gnu23) to the conan command, e.g. "
                "`conan create . --build=missing -s compiler.cppstd=20`, or set compiler.cppstd in "
                "your profile.") from e
        if self.options.with_kv_event_wire and not self.options.with_block_hash:
            raise ConanInvalidConfiguration("with_kv_event_wire needs with_block_hash (event block hashes)")
        if self.options.with_zmq_kv_subscriber and not self.options.with_kv_event_wire:
            raise ConanInvalidConfiguration("with_zmq_kv_subscriber needs with_kv_event_wire")
        if self.settings.compiler == "gcc" and int(str(self.settings.compiler.version).split(".")[0]) < 11:
            raise ConanInvalidConfiguration("promptcache needs GCC 11 or newer (C++20 concepts)")

    def layout(self):
        cmake_layout(self)

    def package_id(self):
        self.info.clear()

    def generate(self):
        # Every developer part off: exports_sources holds only the library.
        tc = CMakeToolchain(self)
        tc.cache_variables["PROMPTCACHE_BUILD_TESTS"] = False
        tc.cache_variables["PROMPTCACHE_BUILD_BENCHMARKS"] = False
        tc.cache_variables["PROMPTCACHE_BUILD_EXAMPLES"] = False
        tc.cache_variables["PROMPTCACHE_BUILD_TOOLS"] = False
        tc.cache_variables["PROMPTCACHE_BUILD_FUZZERS"] = False
        tc.cache_variables["PROMPTCACHE_INSTALL"] = True
        tc.generate()

    def build(self):
        cmake = CMake(self)
        cmake.configure()

    def package(self):
        cmake = CMake(self)
        cmake.install()
        copy(self, "LICENSE", self.source_folder, os.path.join(self.package_folder, "licenses"))
        # Consumers get the CMake config from Conan's generators instead.
        rmdir(self, os.path.join(self.package_folder, "share"))

    def package_info(self):
        self.cpp_info.set_property("cmake_file_name", "promptcache")
        core = self.cpp_info.components["promptcache"]
        core.set_property("cmake_target_name", "promptcache::promptcache")
        core.set_property("pkg_config_name", "promptcache")
        core.bindirs = []
        core.libdirs = []
        if self.options.with_block_hash:
            block_hash = self.cpp_info.components["block_hash"]
            block_hash.set_property("cmake_target_name", "promptcache::block_hash")
            block_hash.set_property("pkg_config_name", "promptcache-block-hash")
            block_hash.bindirs = []
            block_hash.libdirs = []
            block_hash.requires = ["promptcache", "xxhash::xxhash"]
        if self.options.with_kv_event_wire:
            wire = self.cpp_info.components["kv_event_wire"]
            wire.set_property("cmake_target_name", "promptcache::kv_event_wire")
            wire.set_property("pkg_config_name", "promptcache-kv-event-wire")
            wire.bindirs = []
            wire.libdirs = []
            wire.defines = ["MSGPACK_NO_BOOST"]
            wire.requires = ["block_hash", "msgpack-cxx::msgpack-cxx"]
        if self.options.with_zmq_kv_subscriber:
            zmq = self.cpp_info.components["zmq_kv_subscriber"]
            zmq.set_property("cmake_target_name", "promptcache::zmq_kv_subscriber")
            zmq.set_property("pkg_config_name", "promptcache-zmq-kv-subscriber")
            zmq.bindirs = []
            zmq.libdirs = []
            zmq.requires = ["kv_event_wire", "cppzmq::cppzmq"]
            if self.settings.os in ("Linux", "FreeBSD"):
                zmq.system_libs = ["pthread"]
            # kv_event_publisher.hpp needs the same libraries (no thread of its own).
            pub = self.cpp_info.components["kv_event_publisher"]
            pub.set_property("cmake_target_name", "promptcache::kv_event_publisher")
            pub.set_property("pkg_config_name", "promptcache-kv-event-publisher")
            pub.bindirs = []
            pub.libdirs = []
            pub.requires = ["kv_event_wire", "cppzmq::cppzmq"]
