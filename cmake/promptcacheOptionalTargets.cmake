# The components for the headers that need more than xxHash, declared like
# promptcache::block_hash (installed, exported, found by
# find_package(promptcache COMPONENTS ...)), but in the build tree defined only
# when their dependencies are found: the tests, benchmarks and examples that
# need one are skipped (with a message) when it is missing.
#
#   promptcache::kv_event_wire       kv_event_wire.hpp, dynamo_kv_event.hpp,
#                                    kv_index_snapshot.hpp: msgpack-cxx (header-only,
#                                    used without Boost; cmake/FindMsgpackCxx.cmake)
#   promptcache::zmq_kv_subscriber   zmq_kv_subscriber.hpp: the above plus
#                                    cppzmq, libzmq (cmake/Findcppzmq.cmake) and
#                                    the thread library
#   promptcache::nats_kv_subscriber  nats_kv_subscriber.hpp, nats_kv_snapshot_store.hpp:
#                                    kv_event_wire plus the
#                                    NATS C client, libnats (cmake/FindNatsC.cmake),
#                                    and the thread library
#   promptcache::kv_event_publisher  kv_event_publisher.hpp: msgpack-cxx (through
#                                    kv_event_wire), cppzmq and libzmq
include_guard(GLOBAL)

promptcache_add_component(
  kv_event_wire ONLY_WHEN_FOUND
  DESCRIPTION "KV event decoding: vLLM / SGLang batches, Dynamo router events, KvIndex snapshots (kv_event_wire.hpp, dynamo_kv_event.hpp, kv_index_snapshot.hpp)"
  REQUIRES block_hash
  FIND MsgpackCxx
  LINK MsgpackCxx::headers)
# msgpack-cxx has no pkg-config module on most systems: its headers are expected
# on the default include path there.

promptcache_add_component(
  zmq_kv_subscriber ONLY_WHEN_FOUND
  DESCRIPTION "ZeroMQ subscriber of KV event streams (zmq_kv_subscriber.hpp)"
  REQUIRES kv_event_wire
  FIND cppzmq AND Threads
  LINK cppzmq Threads::Threads
  PKG_CONFIG cppzmq
  PKG_CONFIG_LIBS -pthread)

promptcache_add_component(
  nats_kv_subscriber ONLY_WHEN_FOUND
  DESCRIPTION "NATS subscriber and publisher of KV event streams, replica snapshots (nats_kv_subscriber.hpp, nats_kv_snapshot_store.hpp)"
  REQUIRES kv_event_wire
  FIND NatsC AND Threads
  LINK NatsC::nats Threads::Threads
  PKG_CONFIG libnats
  PKG_CONFIG_LIBS -pthread)

if(NOT TARGET promptcache::nats_kv_subscriber)
  message(STATUS "promptcache: the tests and examples that need the NATS C client are skipped "
                 "(Debian: libnats-dev, and nats-server to run them)")
endif()

promptcache_add_component(
  kv_event_publisher ONLY_WHEN_FOUND
  DESCRIPTION "vLLM-format KV event publisher over ZeroMQ (kv_event_publisher.hpp)"
  REQUIRES kv_event_wire
  FIND cppzmq
  LINK cppzmq
  PKG_CONFIG cppzmq)

if(NOT TARGET promptcache::zmq_kv_subscriber)
  message(STATUS "promptcache: the tests, benchmarks and examples that need msgpack-cxx or ZeroMQ are "
                 "skipped (Debian: libmsgpack-cxx-dev, cppzmq-dev, libzmq3-dev)")
endif()

# promptcache_optional_requirement(<name> <out-var>): the optional target that
# the test, benchmark, example or header called <name> needs ("" for none).
function(promptcache_optional_requirement name out)
  if(name MATCHES "kv_event_publisher")
    set(${out} promptcache::kv_event_publisher PARENT_SCOPE)
  elseif(name MATCHES "zmq")
    set(${out} promptcache::zmq_kv_subscriber PARENT_SCOPE)
  elseif(name MATCHES "nats")
    set(${out} promptcache::nats_kv_subscriber PARENT_SCOPE)
  elseif(name MATCHES "kv_event_wire|dynamo_kv_event|kv_index_snapshot")
    # The other msgpack headers: their only dependency is msgpack-cxx, which
    # this target brings (with xxHash through block_hash).
    set(${out} promptcache::kv_event_wire PARENT_SCOPE)
  else()
    set(${out} "" PARENT_SCOPE)
  endif()
endfunction()
