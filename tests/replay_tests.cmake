# tests/test_replay*.cpp test the replay tool's logic (tools/replay/, header-only):
# they build as one executable, test_replay (tests/test_groups.cmake), so that the
# tool's code (and nlohmann-json) is parsed, instantiated and optimized once
# instead of once per file. Each file keeps its ctest entry, test_replay_<x>.
# Expects _pc_replay_sources (the files) from tests/CMakeLists.txt.
promptcache_add_test_group(test_replay ${_pc_replay_sources})
target_link_libraries(test_replay PRIVATE promptcache::replay_core)
