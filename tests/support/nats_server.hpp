// A nats-server child for the NATS tests: JetStream on, listening on
// 127.0.0.1 on a free port, its store and log in a temporary directory.
// Killed by pid (SIGKILL) in the destructor, and on Linux by the kernel
// should the test process die first. start() again after kill_now() reuses
// the port and the store. PROMPTCACHE_NATS_SERVER names the program.
#pragma once

#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>
#if defined(__linux__)
#include <sys/prctl.h>
#endif

#include <nats/nats.h>

#include <cstdlib>
#include <filesystem>
#include <string>
#include <system_error>
#include <vector>

#include "catch.hpp"

#ifndef PROMPTCACHE_NATS_SERVER
#error "PROMPTCACHE_NATS_SERVER must name the nats-server program"
#endif

namespace promptcache_test {

// A free loopback TCP port (the kernel's choice for port 0, released).
inline int free_loopback_port() {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  REQUIRE(fd >= 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  a.sin_port = 0;
  REQUIRE(bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0);
  socklen_t len = sizeof a;
  REQUIRE(getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len) == 0);
  close(fd);
  return ntohs(a.sin_port);
}

class NatsServerProcess {
 public:
  NatsServerProcess() : port_(free_loopback_port()) {
    char tmpl[] = "/tmp/promptcache_nats_XXXXXX";
    REQUIRE(mkdtemp(tmpl) != nullptr);
    dir_ = tmpl;
    start();
  }
  NatsServerProcess(const NatsServerProcess&) = delete;
  NatsServerProcess& operator=(const NatsServerProcess&) = delete;
  ~NatsServerProcess() {
    kill_now();
    std::error_code ec;
    std::filesystem::remove_all(dir_, ec);
  }

  std::string url() const { return "nats://127.0.0.1:" + std::to_string(port_); }

  // Starts the server (again, on the same port and store) and waits until it
  // accepts a connection.
  void start() {
    REQUIRE(pid_ <= 0);
    const std::string port = std::to_string(port_);
    const std::string store = dir_ + "/store";
    const std::string log = dir_ + "/server.log";
    std::vector<std::string> argv = {
        PROMPTCACHE_NATS_SERVER, "-js", "-a", "127.0.0.1", "-p", port, "-sd", store};
    std::vector<char*> args;
    for (auto& a : argv)
      args.push_back(a.data());
    args.push_back(nullptr);
    pid_ = fork();
    REQUIRE(pid_ >= 0);
    if (pid_ == 0) {
#if defined(__linux__)
      prctl(PR_SET_PDEATHSIG, SIGKILL);
#endif
      const int fd = open(log.c_str(), O_WRONLY | O_CREAT | O_APPEND, 0644);
      if (fd >= 0) {
        dup2(fd, 1);
        dup2(fd, 2);
      }
      execv(args[0], args.data());
      _exit(127);
    }
    wait_ready();
  }

  // SIGKILL, then reaps it.
  void kill_now() {
    if (pid_ <= 0) return;
    ::kill(pid_, SIGKILL);
    int status = 0;
    waitpid(pid_, &status, 0);
    pid_ = -1;
  }

 private:
  // A connection with bounded retries (libnats waits between attempts).
  void wait_ready() {
    natsOptions* o = nullptr;
    REQUIRE(natsOptions_Create(&o) == NATS_OK);
    natsOptions_SetURL(o, url().c_str());
    natsOptions_SetMaxReconnect(o, 1000);
    natsOptions_SetReconnectWait(o, 5);
    natsOptions_SetRetryOnFailedConnect(o, true, nullptr, nullptr);
    natsConnection* nc = nullptr;
    const natsStatus s = natsConnection_Connect(&nc, o);
    natsOptions_Destroy(o);
    if (nc != nullptr) natsConnection_Destroy(nc);
    REQUIRE(s == NATS_OK);
  }

  int port_;
  std::string dir_;
  pid_t pid_ = -1;
};

}  // namespace promptcache_test
