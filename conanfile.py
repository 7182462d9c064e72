import os
import re

from conan import ConanFile
from conan.errors import ConanInvalidConfiguration
from conan.tools.build import check_min_cppstd
from conan.tools.cmake import CMake, CMakeToolchain, cmake_layout
from conan.tools.files import copy, load, rmdir


class PromptcacheConan(ConanFile):
    name = "promptcache"
    description = ("Header-only C++20 primitives for reusing KV-cache work in LLM inference "
                   "engines: event-stream cursors, a prompt-prefix cache pool, Dynamo-compatible "
                   "block hashing and a KV-router radix index.")
    license = "Apache-2.0"
    topics = ("llm", "kv-cache", "prompt-cache", "inference", "header-only")
    package_type = "header-library"
    settings = "os", "arch", "compiler", "build_type"
    exports_sources = ("CMakeLists.txt", "LICENSE", "cmake/*", "include/*")
    no_copy_source = True

    def set_version(self):
        # include/promptcache/version.hpp is the single source of the version.
        header = load(self, os.path.join(self.recipe_folder, "include", "promptcache", "version.hpp"))
        parts = [re.search(rf"#define PROMPTCACHE_VERSION_{p} (\d+)", header).group(1)
                 for p in ("MAJOR", "MINOR", "PATCH")]
        self.version = ".".join(parts)

    def requirements(self):
        self.requires("xxhash/[>=0.8.1 <0.9]")

    def validate(self):
        check_min_cppstd(self, 20)
        if self.settings.compiler == "gcc" and int(str(self.settings.compiler.version).split(".")[0]) < 11:
            raise ConanInvalidConfiguration("promptcache needs GCC 11 or newer (C++20 concepts)")

    def layout(self):
        cmake_layout(self)

    def package_id(self):
        self.info.clear()

    def generate(self):
        tc = CMakeToolchain(self)
        tc.cache_variables["PROMPTCACHE_BUILD_TESTS"] = False
        tc.cache_variables["PROMPTCACHE_BUILD_BENCHMARKS"] = False
        tc.cache_variables["PROMPTCACHE_BUILD_EXAMPLES"] = False
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
        self.cpp_info.set_property("cmake_target_name", "promptcache::promptcache")
        self.cpp_info.set_property("pkg_config_name", "promptcache")
        self.cpp_info.bindirs = []
        self.cpp_info.libdirs = []
        self.cpp_info.requires = ["xxhash::xxhash"]
