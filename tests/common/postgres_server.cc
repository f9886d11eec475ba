#include "tests/common/postgres_server.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <libpq-fe.h>
#include <netinet/in.h>
#include <pwd.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "tests/common/loopback.h"
#include "tests/common/processes.h"

namespace trainyard::testing {
namespace {

namespace fs = std::filesystem;

std::string Slurp(const std::string& path) {
  std::ifstream in(path);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

// Forks `args` with its output to `log`, as uid/gid when `drop` (in a new process group).
pid_t Spawn(const std::vector<std::string>& args, const std::string& log, bool drop, uid_t uid,
            gid_t gid) {
  std::vector<std::string> owned = args;
  std::vector<char*> argv;
  for (std::string& a : owned) argv.push_back(a.data());
  argv.push_back(nullptr);
  const pid_t parent = getpid();
  const pid_t pid = fork();
  if (pid == 0) {
    setpgid(0, 0);
    const int fd = open(log.c_str(), O_WRONLY | O_CREAT | O_APPEND, 0644);
    if (fd >= 0) {
      dup2(fd, 1);
      dup2(fd, 2);
    }
    if (drop && (setgid(gid) != 0 || setuid(uid) != 0)) _exit(126);
    // The server goes with the test program, however it ends (a kill from outside included):
    // SIGQUIT is PostgreSQL's immediate shutdown, which takes its own children down too. Set
    // after the change of user, which clears it.
    if (prctl(PR_SET_PDEATHSIG, SIGQUIT) != 0 || getppid() != parent) _exit(125);
    execv(argv[0], argv.data());
    _exit(127);
  }
  return pid;
}

}  // namespace

std::string PostgresServer::BinDir() {
  std::string best;
  int best_version = -1;
  std::error_code ec;
  for (const auto& entry : fs::directory_iterator("/usr/lib/postgresql", ec)) {
    int version = 0;
    if (!absl::SimpleAtoi(entry.path().filename().string(), &version)) continue;
    const std::string bin = entry.path().string() + "/bin";
    if (access((bin + "/initdb").c_str(), X_OK) == 0 && version > best_version) {
      best = bin;
      best_version = version;
    }
  }
  return best;
}

absl::StatusOr<PostgresServer*> PostgresServer::Shared() {
  // Stopped and removed at exit, with the program's other statics.
  static const absl::StatusOr<std::unique_ptr<PostgresServer>> server = Start();
  if (!server.ok()) return server.status();
  return server->get();
}

absl::StatusOr<std::unique_ptr<PostgresServer>> PostgresServer::Start(const Options& options) {
  const std::string bin = BinDir();
  if (bin.empty()) {
    return absl::UnavailableError(
        "no PostgreSQL server under /usr/lib/postgresql (run scripts/install-deps.sh)");
  }
  char templ[] = "/tmp/trainyard-pg-XXXXXX";
  if (mkdtemp(templ) == nullptr) return absl::UnavailableError("mkdtemp failed");
  std::unique_ptr<PostgresServer> server(new PostgresServer());
  server->options_ = options;
  server->dir_ = templ;
  server->user_ = absl::StrCat("trainyard_",
                               absl::AsciiStrToLower(server->dir_.substr(server->dir_.size() - 6)));
  server->bin_ = bin;
  if (geteuid() == 0) {
    // The server refuses to run as root: as Debian's `postgres` user, or nobody.
    const passwd* pw = getpwnam("postgres");
    if (pw == nullptr) pw = getpwnam("nobody");
    if (pw == nullptr) return absl::UnavailableError("no 'postgres' or 'nobody' user to run as");
    server->drop_privileges_ = true;
    server->uid_ = pw->pw_uid;
    server->gid_ = pw->pw_gid;
    if (chown(templ, pw->pw_uid, pw->pw_gid) != 0) {
      return absl::UnavailableError(absl::StrCat("chown ", templ, " failed"));
    }
  }
  const std::string log = server->dir_ + "/initdb.log";
  const pid_t pid = Spawn({bin + "/initdb", "-D", server->dir_ + "/data", "-A", "trust", "-U",
                           server->user_, "-E", "UTF8", "--no-sync", "--no-instructions"},
                          log, server->drop_privileges_, server->uid_, server->gid_);
  int status = 0;
  if (pid < 0 || waitpid(pid, &status, 0) != pid || !WIFEXITED(status) ||
      WEXITSTATUS(status) != 0) {
    return absl::UnavailableError(absl::StrCat("initdb failed: ", Slurp(log)));
  }
  if (options.tls) {
    if (absl::Status s = server->MakeTls(); !s.ok()) return s;
  }
  if (absl::Status s = server->Launch(); !s.ok()) return s;
  return server;
}

absl::Status PostgresServer::MakeTls() {
  const std::string data = dir_ + "/data";
  const std::string script = absl::StrCat(
      "set -e; cd ", dir_, "\n",
      "openssl req -x509 -newkey rsa:2048 -nodes -days 2 -subj /CN=trainyard-test-db-ca "
      "-keyout ca.key -out ca.pem 2>/dev/null\n",
      "openssl req -x509 -newkey rsa:2048 -nodes -days 2 -subj /CN=other-ca "
      "-keyout other.key -out other-ca.pem 2>/dev/null\n",
      "openssl req -newkey rsa:2048 -nodes -subj /CN=localhost -keyout ", data,
      "/server.key -out server.csr 2>/dev/null\n",
      "printf 'subjectAltName=IP:127.0.0.1,DNS:localhost\\n' > server.ext\n",
      "openssl x509 -req -in server.csr -CA ca.pem -CAkey ca.key -CAcreateserial -days 2 "
      "-extfile server.ext -out ",
      data, "/server.crt 2>/dev/null\n", "chmod 600 ", data, "/server.key\n",
      // Only TLS from 127.0.0.1; the Unix socket as before.
      "printf 'local all all trust\\nhostssl all all 127.0.0.1/32 trust\\n"
      "hostnossl all all 127.0.0.1/32 reject\\n' > ",
      data, "/pg_hba.conf\n");
  if (std::system(script.c_str()) != 0) {
    return absl::UnavailableError("making the database's certificates with openssl failed");
  }
  if (drop_privileges_) {
    for (const char* name : {"/server.key", "/server.crt", "/pg_hba.conf"}) {
      if (chown((data + name).c_str(), uid_, gid_) != 0) {
        return absl::UnavailableError(absl::StrCat("chown ", data, name, " failed"));
      }
    }
  }
  return absl::OkStatus();
}

absl::Status PostgresServer::Launch() {
  const std::string log = dir_ + "/postgres.log";
  std::string last_log;
  for (int attempt = 0; attempt < 5; ++attempt) {
    // A new port at first and after a clash; otherwise (a restart) the same one.
    if (port_ == 0 || last_log.find("Address already in use") != std::string::npos) {
      port_ = FreeLoopbackPort();
    }
    const std::string sock = dir_;  // the Unix socket in our folder, not /var/run/postgresql
    pid_ = Spawn(
        {bin_ + "/postgres", "-D", dir_ + "/data", "-p", absl::StrCat(port_), "-k", sock, "-c",
         "listen_addresses=127.0.0.1", "-c", absl::StrCat("fsync=", options_.fsync ? "on" : "off"),
         "-c", absl::StrCat("max_connections=", options_.max_connections), "-c",
         "shared_buffers=32MB", "-c", "logging_collector=off", "-c",
         absl::StrCat("ssl=", options_.tls ? "on" : "off")},
        log, drop_privileges_, uid_, gid_);
    if (pid_ < 0) return absl::UnavailableError("fork failed");
    const std::string conninfo =
        absl::StrCat("host=127.0.0.1 port=", port_, " user=trainyard dbname=postgres");
    const absl::Time deadline = absl::Now() + absl::Seconds(60);
    bool exited = false;
    while (absl::Now() < deadline) {
      if (PQping(conninfo.c_str()) == PQPING_OK) return absl::OkStatus();
      int status;
      if (waitpid(pid_, &status, WNOHANG) == pid_) {
        exited = true;
        pid_ = -1;
        break;
      }
      absl::SleepFor(absl::Milliseconds(20));  // polling for the server to accept connections
    }
    last_log = Slurp(log);
    if (!exited) {
      Kill();
      return absl::UnavailableError(absl::StrCat("postgres did not start in 60 s: ", last_log));
    }
    // Exited: the port taken in the meantime, or the killed server's backends not yet gone.
    absl::SleepFor(absl::Milliseconds(100));
  }
  return absl::UnavailableError(absl::StrCat("postgres would not start: ", last_log));
}

void PostgresServer::Kill() {
  if (pid_ <= 0) return;
  // Each backend makes itself a process group of its own (setsid), so the postmaster's group
  // alone would leave them running: a backend that has not yet seen its postmaster die still
  // answers its client. Frozen, the postmaster forks no new child while its children are killed.
  kill(pid_, SIGSTOP);
  const std::vector<pid_t> children = ChildProcesses(pid_);
  for (pid_t child : children) kill(child, SIGKILL);
  kill(-pid_, SIGKILL);
  kill(pid_, SIGKILL);
  int status;
  waitpid(pid_, &status, 0);
  // A killed child has closed its sockets once it is a zombie or gone (reaped by init).
  const absl::Time deadline = absl::Now() + absl::Seconds(30);
  for (pid_t child : children) {
    while (ProcessAlive(child) && absl::Now() < deadline) {
      absl::SleepFor(absl::Milliseconds(5));  // polling for the kernel to end a killed process
    }
  }
  pid_ = -1;
}

absl::Status PostgresServer::StartAgain() { return Launch(); }

absl::Status PostgresServer::Restart() {
  Kill();
  return Launch();
}

PostgresServer::~PostgresServer() {
  Kill();
  std::error_code ec;
  if (!dir_.empty() && getenv("TRAINYARD_KEEP_TEST_DIRS") == nullptr) fs::remove_all(dir_, ec);
}

std::string PostgresServer::Uri(const std::string& db) const {
  return absl::StrCat("postgres://", user_, "@127.0.0.1:", port_, "/", db);
}

absl::StatusOr<std::string> PostgresServer::CreateDatabase(const std::string& name) {
  if (absl::StatusOr<std::string> out = Psql("postgres", "CREATE DATABASE " + name); !out.ok()) {
    return out.status();
  }
  return Uri(name);
}

absl::StatusOr<std::string> PostgresServer::Psql(const std::string& db,
                                                 const std::string& sql) const {
  PGconn* conn = PQconnectdb(Uri(db).c_str());
  if (PQstatus(conn) != CONNECTION_OK) {
    std::string why = PQerrorMessage(conn);
    PQfinish(conn);
    return absl::UnavailableError(absl::StrCat("connect to ", db, ": ", why));
  }
  PGresult* r = PQexec(conn, sql.c_str());
  std::string out;
  absl::Status status;
  if (PQresultStatus(r) != PGRES_COMMAND_OK && PQresultStatus(r) != PGRES_TUPLES_OK) {
    status = absl::UnavailableError(absl::StrCat(sql, ": ", PQresultErrorMessage(r)));
  } else {
    for (int i = 0; i < PQntuples(r); ++i) {
      for (int j = 0; j < PQnfields(r); ++j)
        absl::StrAppend(&out, j ? "|" : "", PQgetvalue(r, i, j));
      out += "\n";
    }
  }
  PQclear(r);
  PQfinish(conn);
  if (!status.ok()) return status;
  return out;
}

}  // namespace trainyard::testing
