#ifndef TRAINYARD_TESTS_COMMON_POSTGRES_SERVER_H_
#define TRAINYARD_TESTS_COMMON_POSTGRES_SERVER_H_

// A PostgreSQL server of the tests' own (Debian's binaries, installed by scripts/install-deps.sh):
// a new cluster in a temporary folder, on 127.0.0.1 with a free port, run as the `postgres` user
// when the tests run as root (the server refuses root), stopped and removed at the end. No system
// service is used or needed.

#include <sys/types.h>

#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace trainyard::testing {

class PostgresServer {
 public:
  struct Options {
    // fsync off: fast, for tests that do not measure durability; benchmarks leave it on.
    bool fsync = false;
    int max_connections = 100;
    // TLS: a CA and a server certificate for 127.0.0.1 and localhost made with openssl, and
    // connections without TLS refused (pg_hba hostnossl reject).
    bool tls = false;
  };
  // The folder of Debian's server binaries (initdb, postgres), the newest version installed;
  // empty when there is none.
  static std::string BinDir();

  // initdb and start; returns once it accepts connections. UNAVAILABLE naming what failed (no
  // binaries: run scripts/install-deps.sh).
  static absl::StatusOr<std::unique_ptr<PostgresServer>> Start(const Options& options);
  static absl::StatusOr<std::unique_ptr<PostgresServer>> Start() { return Start(Options()); }
  ~PostgresServer();  // stops the server (immediately) and removes its folder
  PostgresServer(const PostgresServer&) = delete;
  PostgresServer& operator=(const PostgresServer&) = delete;

  // One server for the whole test program, started on first use (Start's error, every time,
  // when it cannot start); stopped and removed at exit.
  static absl::StatusOr<PostgresServer*> Shared();

  // A new, empty database; returns its URI (postgres://USER@127.0.0.1:PORT/NAME).
  absl::StatusOr<std::string> CreateDatabase(const std::string& name);
  // Runs `sql` in database `db` with psql; its output, or UNAVAILABLE with psql's.
  absl::StatusOr<std::string> Psql(const std::string& db, const std::string& sql) const;

  int port() const { return port_; }
  // The superuser the server was made with: "trainyard_" and its folder's unique suffix, so that
  // a client of this server never lands on another test's that took its port after a kill.
  const std::string& user() const { return user_; }
  // The postmaster's process: it dies with the process that started the server (its parent).
  pid_t pid() const { return pid_; }
  // With Options::tls: the CA that signed the server's certificate, and one that did not.
  std::string ca_file() const { return dir_ + "/ca.pem"; }
  std::string other_ca_file() const { return dir_ + "/other-ca.pem"; }
  std::string Uri(const std::string& db) const;

  // Stops the server at once, as a crash would (SIGKILL of the postmaster and its children), and
  // starts it again on the same folder and port: committed transactions survive.
  absl::Status Restart();
  // Stops it (SIGKILL) without starting it again.
  void Kill();
  // Starts it again after Kill().
  absl::Status StartAgain();

 private:
  PostgresServer() = default;
  absl::Status Launch();
  absl::Status MakeTls();

  Options options_;
  std::string dir_;
  std::string user_;
  std::string bin_;
  int port_ = 0;
  pid_t pid_ = -1;
  uid_t uid_ = 0;
  gid_t gid_ = 0;
  bool drop_privileges_ = false;
};

}  // namespace trainyard::testing

#endif  // TRAINYARD_TESTS_COMMON_POSTGRES_SERVER_H_
